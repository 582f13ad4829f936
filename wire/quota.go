package wire

import (
	"encoding/json"
	"fmt"
)

// Capacity leasing of tenant quotas (design §16): the class owners that
// admit a tenant's requests (holders) lease slices of its concurrency,
// requests and tokens from the tenant's quota owner, the owner of its home
// class. A holder asks with a QuotaLease on Quota(<owner replica>) and gets
// a QuotaGrant; the quota owner takes idle slack back with a QuotaRecall on
// QuotaRecall(<holder replica>), answered by a QuotaReturn.

// Quota is the request-reply subject on which replica answers lease
// requests for the tenants whose home class it owns.
func (s Subjects) Quota(replica string) string { return s.prefix + "quota." + replica }

// QuotaRecall is the request-reply subject on which holder gives back its
// idle leases of a tenant.
func (s Subjects) QuotaRecall(holder string) string { return s.prefix + "quotarecall." + holder }

// QuotaLimits is a tenant's quota as the holder knows it (0: unlimited).
type QuotaLimits struct {
	Concurrent        int `json:"c,omitempty"`
	RequestsPerMinute int `json:"rpm,omitempty"`
	TokensPerMinute   int `json:"tpm,omitempty"`
}

// QuotaLease reports a holder's lease of one tenant and asks for more. Have
// is absolute (the slots the holder holds now): the quota owner replaces its
// count with it, so a lost grant or a new quota owner heals on the next
// lease. Returns give unused requests and tokens back to the central
// buckets; ReturnTokens may be negative (the tenant used more than was
// estimated: a debt).
type QuotaLease struct {
	Version        int         `json:"v"`
	Tenant         string      `json:"tenant"`
	Home           string      `json:"home"`
	Holder         string      `json:"holder"`
	Quota          QuotaLimits `json:"quota"`
	Have           int         `json:"have"`
	Want           int         `json:"want,omitempty"`
	WantRequests   int64       `json:"wreq,omitempty"`
	WantTokens     int64       `json:"wtok,omitempty"`
	SlackSlots     int         `json:"sslots,omitempty"`
	SlackRequests  int64       `json:"sreq,omitempty"`
	SlackTokens    int64       `json:"stok,omitempty"`
	ReturnRequests int64       `json:"rreq,omitempty"`
	ReturnTokens   int64       `json:"rtok,omitempty"`
}

// QuotaGrant answers a QuotaLease. OK grants Slots, Requests and Tokens
// (at least what was wanted); otherwise Limit names the quota that refused
// (RetryAfterMs: when it may not), or NotOwner says the replica does not
// own the home class (ask the current owner), or HoldMs asks the holder to
// ask again after that long (a new quota owner rebuilding its count).
type QuotaGrant struct {
	Version      int    `json:"v"`
	Owner        string `json:"owner"`
	Epoch        int64  `json:"epoch,omitempty"`
	OK           bool   `json:"ok,omitempty"`
	Slots        int    `json:"slots,omitempty"`
	Requests     int64  `json:"req,omitempty"`
	Tokens       int64  `json:"tok,omitempty"`
	Limit        string `json:"limit,omitempty"`
	RetryAfterMs int64  `json:"retry_ms,omitempty"`
	HoldMs       int64  `json:"hold_ms,omitempty"`
	NotOwner     bool   `json:"not_owner,omitempty"`
}

// QuotaRecall asks a holder for its idle leases of Tenant.
type QuotaRecall struct {
	Version int    `json:"v"`
	Tenant  string `json:"tenant"`
	Owner   string `json:"owner"`
}

// QuotaReturn answers a QuotaRecall: Have is what the holder still holds
// (absolute), Requests and Tokens what it gives back (Tokens may be
// negative: a debt). Busy: the holder is asking for more itself and
// returns nothing now.
type QuotaReturn struct {
	Version  int    `json:"v"`
	Holder   string `json:"holder"`
	Have     int    `json:"have"`
	Requests int64  `json:"req,omitempty"`
	Tokens   int64  `json:"tok,omitempty"`
	Busy     bool   `json:"busy,omitempty"`
}

// MaxQuotaAmount bounds every count of a quota message: far above any real
// quota per minute, far below where float64 arithmetic loses units.
const MaxQuotaAmount = 1 << 40

// EncodeQuota marshals a quota message, stamping its version.
func EncodeQuota(m any) ([]byte, error) {
	switch v := m.(type) {
	case *QuotaLease:
		v.Version = admissionVersion
	case *QuotaGrant:
		v.Version = admissionVersion
	case *QuotaRecall:
		v.Version = admissionVersion
	case *QuotaReturn:
		v.Version = admissionVersion
	default:
		return nil, fmt.Errorf("wire: %T is not a quota message", m)
	}
	return json.Marshal(m)
}

func inRange(lo int64, vs ...int64) bool {
	for _, v := range vs {
		if v < lo || v > MaxQuotaAmount {
			return false
		}
	}
	return true
}

// DecodeQuotaLease parses and validates a QuotaLease.
func DecodeQuotaLease(p []byte) (*QuotaLease, error) {
	var m QuotaLease
	if err := decodeVersioned(p, &m, &m.Version, "quota lease"); err != nil {
		return nil, err
	}
	q := m.Quota
	switch {
	case !ValidName(m.Tenant):
		return nil, fmt.Errorf("%w: quota lease tenant %q", ErrMalformed, m.Tenant)
	case !ValidName(m.Home):
		return nil, fmt.Errorf("%w: quota lease of %s home class %q", ErrMalformed, m.Tenant, m.Home)
	case !ValidName(m.Holder):
		return nil, fmt.Errorf("%w: quota lease of %s holder %q", ErrMalformed, m.Tenant, m.Holder)
	case !inRange(0, int64(q.Concurrent), int64(q.RequestsPerMinute), int64(q.TokensPerMinute),
		int64(m.Have), int64(m.Want), m.WantRequests, m.WantTokens, int64(m.SlackSlots), m.SlackRequests, m.SlackTokens, m.ReturnRequests):
		return nil, fmt.Errorf("%w: quota lease of %s has a count out of range", ErrMalformed, m.Tenant)
	case !inRange(-MaxQuotaAmount, m.ReturnTokens):
		return nil, fmt.Errorf("%w: quota lease of %s returns %d tokens", ErrMalformed, m.Tenant, m.ReturnTokens)
	}
	return &m, nil
}

// DecodeQuotaGrant parses and validates a QuotaGrant.
func DecodeQuotaGrant(p []byte) (*QuotaGrant, error) {
	var m QuotaGrant
	if err := decodeVersioned(p, &m, &m.Version, "quota grant"); err != nil {
		return nil, err
	}
	switch {
	case !inRange(0, int64(m.Slots), m.Requests, m.Tokens, m.RetryAfterMs, m.HoldMs):
		return nil, fmt.Errorf("%w: quota grant has a count out of range", ErrMalformed)
	case !m.OK && !m.NotOwner && m.HoldMs == 0 && m.Limit == "":
		return nil, fmt.Errorf("%w: quota grant refuses without a limit", ErrMalformed)
	case m.OK && (m.NotOwner || m.Limit != ""):
		return nil, fmt.Errorf("%w: quota grant both grants and refuses", ErrMalformed)
	}
	return &m, nil
}

// DecodeQuotaRecall parses and validates a QuotaRecall.
func DecodeQuotaRecall(p []byte) (*QuotaRecall, error) {
	var m QuotaRecall
	if err := decodeVersioned(p, &m, &m.Version, "quota recall"); err != nil {
		return nil, err
	}
	if !ValidName(m.Tenant) || !ValidName(m.Owner) {
		return nil, fmt.Errorf("%w: quota recall of tenant %q from %q", ErrMalformed, m.Tenant, m.Owner)
	}
	return &m, nil
}

// DecodeQuotaReturn parses and validates a QuotaReturn.
func DecodeQuotaReturn(p []byte) (*QuotaReturn, error) {
	var m QuotaReturn
	if err := decodeVersioned(p, &m, &m.Version, "quota return"); err != nil {
		return nil, err
	}
	switch {
	case !ValidName(m.Holder):
		return nil, fmt.Errorf("%w: quota return holder %q", ErrMalformed, m.Holder)
	case !inRange(0, int64(m.Have), m.Requests) || !inRange(-MaxQuotaAmount, m.Tokens):
		return nil, fmt.Errorf("%w: quota return of %s has a count out of range", ErrMalformed, m.Holder)
	}
	return &m, nil
}
