package wire

import (
	"encoding/json"
	"fmt"
	"math"
	"time"
)

// Admission protocol messages (design §4), JSON with a version field. They
// travel between an entry replica E and the owner O of a request's class:
//
//	E → O  admit.<class>   AdmitRequest   (request-reply; the reply is AdmitReply)
//	E → O  cancel.<class>  CancelRequest  (the client went away while queued)
//	E → O  life.<owner>    LifeMark       (dispatched = ack, first_token, done, aborted, renew)
//	E → O  adopt.<class>   AdoptRequest   (request-reply: re-home in-flight bookings)
const admissionVersion = 1

// AdmitOverlap is one worker's matched prefix depth, in blocks.
type AdmitOverlap struct {
	Worker string `json:"w"`
	Blocks int    `json:"b"`
}

// AdmitRequest asks the owner of Class to admit one request.
type AdmitRequest struct {
	Version         int      `json:"v"`
	ID              string   `json:"id"`
	Class           string   `json:"class"`
	Entry           string   `json:"entry"` // entry replica id: where lifecycle marks come from
	Attempt         int      `json:"attempt,omitempty"`
	StrictPriority  int32    `json:"prio,omitempty"`
	PriorityJump    float64  `json:"pj,omitempty"`
	IngressUnixNano int64    `json:"ingress"`
	DueUnixNano     int64    `json:"due,omitempty"` // 0: no deadline
	PromptTokens    int      `json:"isl"`
	BlockHashes     []uint64 `json:"blocks,omitempty"`
	// SizedBlocks are the prompt's hashes at the model's other block sizes
	// (scheduler.Request.SizedHashes); older owners ignore them.
	SizedBlocks    []AdmitBlocks  `json:"sized,omitempty"`
	Overlaps       []AdmitOverlap `json:"overlaps,omitempty"`
	Pinned         string         `json:"pinned,omitempty"`
	Allowed        []string       `json:"allowed,omitempty"`
	ExpectedOutput int            `json:"osl,omitempty"`
	// OutputBound and Sequences: scheduler.Request's (0: unset; older
	// entries send neither).
	OutputBound int `json:"obound,omitempty"`
	Sequences   int `json:"seqs,omitempty"`
	// Tenant is who the request is admitted for ("": nobody; design §15).
	// The owner enforces TenantQuota and shares the class by TenantWeight.
	// Older owners ignore these fields; older entries send none.
	Tenant       string      `json:"tenant,omitempty"`
	TenantWeight int         `json:"tw,omitempty"`
	TenantQuota  *AdmitQuota `json:"tq,omitempty"`
	// Session is scheduler.Request's session affinity (nil: none). Older
	// owners ignore it and route by cache and load alone.
	Session *AdmitSession `json:"sess,omitempty"`
}

// AdmitSession is the worker a request's session last ran on and how
// strongly to prefer it (scheduler.SessionAffinity).
type AdmitSession struct {
	Worker      string  `json:"w"`
	Hard        bool    `json:"hard,omitempty"`
	MarginRatio float64 `json:"mr,omitempty"`
	MarginCost  float64 `json:"mc,omitempty"`
}

// MaxBlockSizes bounds the distinct block sizes one request is hashed at.
const MaxBlockSizes = 8

// AdmitBlocks is a prompt's sequence hashes cut at one block size.
type AdmitBlocks struct {
	BlockSize int      `json:"bs"`
	Hashes    []uint64 `json:"blocks"`
}

// AdmitQuota is a tenant's quota as the entry replica knows it (0 is
// unlimited).
type AdmitQuota struct {
	Concurrent        int `json:"conc,omitempty"`
	RequestsPerMinute int `json:"rpm,omitempty"`
	TokensPerMinute   int `json:"tpm,omitempty"`
}

// MaxTenantWeight bounds a tenant's weight on the wire.
const MaxTenantWeight = 1000

// AdmitReply is the owner's answer: a grant (OK) or a typed rejection.
type AdmitReply struct {
	Version int    `json:"v"`
	OK      bool   `json:"ok"`
	Owner   string `json:"owner"`
	Epoch   int64  `json:"epoch"`
	// Instance names the owner's current life (random per process): the
	// entry sends it back with every lifecycle mark of the booking.
	Instance     uint64 `json:"instance,omitempty"`
	Worker       string `json:"worker,omitempty"`
	WorkerURL    string `json:"url,omitempty"`
	Booking      uint64 `json:"booking,omitempty"`
	CachedTokens int    `json:"cached,omitempty"`
	// TierCredit is scheduler.Grant.TierCreditTokens: lower-tier prompt
	// tokens the booking does not count as prefill.
	TierCredit    int   `json:"tier,omitempty"`
	OverlapBlocks int   `json:"overlap,omitempty"`
	BlockSize     int   `json:"bs,omitempty"` // the worker's (0: an older owner)
	QueueWaitNano int64 `json:"wait,omitempty"`
	// Reachable is the most prompt tokens any worker held cached and
	// Shortfall why the grant holds fewer (scheduler.Shortfall's label).
	Reachable int    `json:"reach,omitempty"`
	Shortfall string `json:"short,omitempty"`
	// PredictedTTFTNano is the owner's predicted grant-to-first-token time
	// (0: none); the entry derives its first-byte timeout from it.
	PredictedTTFTNano int64 `json:"ttft,omitempty"`
	// Candidates are the workers the decision weighed, the winner first
	// (at most MaxCandidates), for the operators' page.
	Candidates []Candidate `json:"cands,omitempty"`
	// Decode is the decode worker of a disaggregated grant (nil:
	// aggregated); Decision is the decider's label (scheduler.Decision).
	Decode   *AdmitDecode `json:"decode,omitempty"`
	Decision string       `json:"decision,omitempty"`
	// Reason is the scheduler's rejection reason label (e.g. "queue_full").
	Reason string `json:"reason,omitempty"`
	Limit  string `json:"limit,omitempty"`
	Detail string `json:"detail,omitempty"`
	// RetryAfterMs is, for a quota_exceeded rejection, when the tenant's
	// quota will let the request in (0: unknown).
	RetryAfterMs int64 `json:"retry_ms,omitempty"`
	// Uncounted marks a rejection issued before the owner's scheduler saw
	// the request (it no longer owned the class): the resubmission is then
	// still a first attempt, so the request is counted as received exactly
	// once cluster-wide.
	Uncounted bool `json:"uncounted,omitempty"`
}

// Candidate is one worker a routing decision weighed: its cached prompt
// tokens and the owner's predicted grant-to-first-token time there.
type Candidate struct {
	Worker            string `json:"w"`
	CachedTokens      int    `json:"cached,omitempty"`
	PredictedTTFTNano int64  `json:"ttft,omitempty"`
}

// MaxCandidates bounds AdmitReply.Candidates.
const MaxCandidates = 8

// CancelRequest withdraws a queued request from the owner the entry sent
// it to. Owner names that replica: a cancel that reaches another replica
// (the class moved meanwhile) is dropped, so it can never withdraw the
// request's resubmission at the new owner. Attempt names the attempt that
// was sent: a late cancel that reaches the same owner after the request was
// resubmitted there (it owns the class again) must not withdraw the newer
// attempt.
type CancelRequest struct {
	Version int    `json:"v"`
	ID      string `json:"id"`
	Attempt int    `json:"attempt,omitempty"`
	Entry   string `json:"entry"`
	Owner   string `json:"owner"`
}

// LifeKind is the kind of a lifecycle mark.
type LifeKind string

// Lifecycle marks an entry replica sends to an owner.
const (
	LifeDispatched LifeKind = "dispatched" // the grant reached the entry: the booking is final
	LifeFirstToken LifeKind = "first_token"
	LifeDone       LifeKind = "done"
	LifeAborted    LifeKind = "aborted"
	LifeRenew      LifeKind = "renew" // the bookings are still in flight
)

// LifeMark reports lifecycle events for one or more bookings of one owner.
type LifeMark struct {
	Version int      `json:"v"`
	Entry   string   `json:"entry"`
	Kind    LifeKind `json:"kind"`
	Epoch   int64    `json:"epoch,omitempty"`
	// Instance is the owner instance that granted (or adopted) the
	// bookings; an owner drops marks of another instance (its previous
	// life under the same replica id). 0: unknown, accepted.
	Instance uint64   `json:"instance,omitempty"`
	Bookings []uint64 `json:"bookings"`
	// Used reports, with a done mark, the tokens (prompt plus output) the
	// engine said a booking's request used, so the owner corrects the
	// tenant's tokens-per-minute bucket. Bookings not listed: unknown.
	Used []LifeUsage `json:"used,omitempty"`
}

// LifeUsage is one booking's reported token usage.
type LifeUsage struct {
	Booking uint64 `json:"b"`
	Tokens  int    `json:"t"`
}

// AdmitDecode is the decode half of a disaggregated grant: the decode
// worker and its booking, linked to the reply's (prefill) booking.
type AdmitDecode struct {
	Worker    string `json:"worker"`
	URL       string `json:"url,omitempty"`
	BlockSize int    `json:"bs,omitempty"`
	Booking   uint64 `json:"booking,omitempty"`
	// TransferNano is the owner's predicted KV transfer time.
	TransferNano int64 `json:"xfer,omitempty"`
}

// AdoptedDecode is the decode side of an adopted pair: re-homed with its
// booking, as one.
type AdoptedDecode struct {
	Worker      string   `json:"worker"`
	BlockHashes []uint64 `json:"blocks,omitempty"`
}

// AdoptedBooking describes one in-flight request whose booking moves to a new
// owner, so its load stays on the ledger.
type AdoptedBooking struct {
	RequestID      string   `json:"id"`
	Worker         string   `json:"worker"`
	BlockHashes    []uint64 `json:"blocks,omitempty"`
	PromptTokens   int      `json:"isl,omitempty"`
	CachedTokens   int      `json:"cached,omitempty"`
	TierCredit     int      `json:"tier,omitempty"` // BookingRecord.TierCreditTokens
	ExpectedOutput int      `json:"osl,omitempty"`
	Sequences      int      `json:"seqs,omitempty"`        // 0 counts as 1
	FirstTokenSeen bool     `json:"first_token,omitempty"` // no prefill load remains
	// Tenant holds one of the tenant's concurrency slots at the new owner.
	Tenant string `json:"tenant,omitempty"`
	// Decode is the decode side of a disaggregated grant (nil: none).
	Decode *AdoptedDecode `json:"decode,omitempty"`
}

// AdoptRequest re-homes bookings to the owner of Class.
//
// Done (with Epoch, the ownership epoch the entry saw) says that the
// request completes the entry's re-home round for the class under that
// owner: every booking of the entry's that belongs there is in it or was
// adopted before. An entry sends one even with no bookings, so that a new
// owner can end its adoption hold as soon as every live entry has. Both
// fields are optional and ignored by owners that predate them (JSON drops
// unknown fields): such an owner holds for its whole bound, as before.
type AdoptRequest struct {
	Version  int              `json:"v"`
	Entry    string           `json:"entry"`
	Class    string           `json:"class"`
	Bookings []AdoptedBooking `json:"bookings"`
	Epoch    int64            `json:"epoch,omitempty"`
	Done     bool             `json:"done,omitempty"`
}

// AdoptReply returns the new booking ids, in request order.
type AdoptReply struct {
	Version  int      `json:"v"`
	Owner    string   `json:"owner"`
	Epoch    int64    `json:"epoch"`
	Instance uint64   `json:"instance,omitempty"` // as in AdmitReply
	Bookings []uint64 `json:"bookings"`
	Error    string   `json:"error,omitempty"`
}

// EncodeAdmission marshals any admission message, stamping its version.
func EncodeAdmission(m any) ([]byte, error) {
	switch v := m.(type) {
	case *AdmitRequest:
		v.Version = admissionVersion
	case *AdmitReply:
		v.Version = admissionVersion
	case *CancelRequest:
		v.Version = admissionVersion
	case *LifeMark:
		v.Version = admissionVersion
	case *AdoptRequest:
		v.Version = admissionVersion
	case *AdoptReply:
		v.Version = admissionVersion
	default:
		return nil, fmt.Errorf("wire: %T is not an admission message", m)
	}
	return json.Marshal(m)
}

// DecodeAdmitRequest parses and validates an AdmitRequest.
func DecodeAdmitRequest(p []byte) (*AdmitRequest, error) {
	var m AdmitRequest
	if err := decodeVersioned(p, &m, &m.Version, "admit request"); err != nil {
		return nil, err
	}
	switch {
	case m.ID == "" || len(m.ID) > 256:
		return nil, fmt.Errorf("%w: admit request id %q", ErrMalformed, m.ID)
	case !ValidName(m.Class):
		return nil, fmt.Errorf("%w: admit request class %q", ErrMalformed, m.Class)
	case !ValidName(m.Entry):
		return nil, fmt.Errorf("%w: admit request entry %q", ErrMalformed, m.Entry)
	case m.PromptTokens < 0 || m.ExpectedOutput < 0 || m.Attempt < 0 || m.OutputBound < 0 || m.Sequences < 0:
		return nil, fmt.Errorf("%w: admit request %s has negative counts", ErrMalformed, m.ID)
	case m.IngressUnixNano <= 0:
		// The FCFS/LCFS score is measured from ingress: a zero or negative
		// one would put the request ahead of everything queued.
		return nil, fmt.Errorf("%w: admit request %s has ingress time %d", ErrMalformed, m.ID, m.IngressUnixNano)
	case m.DueUnixNano < 0:
		return nil, fmt.Errorf("%w: admit request %s has a negative due time", ErrMalformed, m.ID)
	case len(m.BlockHashes) > MaxBlocksPerMessage:
		return nil, fmt.Errorf("%w: admit request %s has too many blocks", ErrMalformed, m.ID)
	case len(m.SizedBlocks) > MaxBlockSizes:
		return nil, fmt.Errorf("%w: admit request %s has too many block sizes", ErrMalformed, m.ID)
	}
	for _, b := range m.SizedBlocks {
		if b.BlockSize <= 0 || len(b.Hashes) > MaxBlocksPerMessage {
			return nil, fmt.Errorf("%w: admit request %s has a bad sized block sequence", ErrMalformed, m.ID)
		}
	}
	for _, o := range m.Overlaps {
		if o.Blocks < 0 || o.Worker == "" {
			return nil, fmt.Errorf("%w: admit request %s has a bad overlap", ErrMalformed, m.ID)
		}
	}
	if err := m.checkTenant(); err != nil {
		return nil, err
	}
	if a := m.Session; a != nil && (a.Worker == "" || len(a.Worker) > 256 ||
		!(a.MarginRatio >= 0) || !(a.MarginCost >= 0) || math.IsInf(a.MarginRatio, 0) || math.IsInf(a.MarginCost, 0)) {
		// NaN fails both comparisons: a margin that is not a finite number
		// >= 0 would make every cost stick or none.
		return nil, fmt.Errorf("%w: admit request %s has a bad session", ErrMalformed, m.ID)
	}
	return &m, nil
}

func (m *AdmitRequest) checkTenant() error {
	if m.Tenant == "" {
		if m.TenantWeight != 0 || m.TenantQuota != nil {
			return fmt.Errorf("%w: admit request %s has a tenant weight or quota but no tenant", ErrMalformed, m.ID)
		}
		return nil
	}
	if !ValidName(m.Tenant) {
		return fmt.Errorf("%w: admit request %s tenant %q", ErrMalformed, m.ID, m.Tenant)
	}
	if m.TenantWeight < 0 || m.TenantWeight > MaxTenantWeight {
		return fmt.Errorf("%w: admit request %s tenant weight %d is outside 0..%d", ErrMalformed, m.ID, m.TenantWeight, MaxTenantWeight)
	}
	if q := m.TenantQuota; q != nil && (q.Concurrent < 0 || q.RequestsPerMinute < 0 || q.TokensPerMinute < 0) {
		return fmt.Errorf("%w: admit request %s has a negative tenant quota", ErrMalformed, m.ID)
	}
	return nil
}

// MaxIngressAhead is how far in the future of the owner's clock an admit
// request's ingress time may lie: generous for clock skew between replicas,
// small enough that a bogus ingress cannot reorder an LCFS queue for long.
const MaxIngressAhead = time.Minute

// CheckIngress reports (ErrMalformed) an ingress time more than
// MaxIngressAhead after now, the receiving owner's clock. The decoder checks
// what needs no clock (ingress > 0).
func (m *AdmitRequest) CheckIngress(now time.Time) error {
	if m.IngressUnixNano > now.Add(MaxIngressAhead).UnixNano() {
		return fmt.Errorf("%w: admit request %s has ingress %v, more than %v after the owner's clock",
			ErrMalformed, m.ID, time.Unix(0, m.IngressUnixNano).UTC(), MaxIngressAhead)
	}
	return nil
}

// DecodeAdmitReply parses an AdmitReply.
func DecodeAdmitReply(p []byte) (*AdmitReply, error) {
	var m AdmitReply
	if err := decodeVersioned(p, &m, &m.Version, "admit reply"); err != nil {
		return nil, err
	}
	if m.OK && (m.Worker == "" || m.Booking == 0) {
		return nil, fmt.Errorf("%w: admit reply grants no worker or booking", ErrMalformed)
	}
	if !m.OK && m.Reason == "" {
		return nil, fmt.Errorf("%w: admit reply rejects without a reason", ErrMalformed)
	}
	if m.RetryAfterMs < 0 {
		return nil, fmt.Errorf("%w: admit reply has a negative retry-after", ErrMalformed)
	}
	if m.TierCredit < 0 {
		return nil, fmt.Errorf("%w: admit reply has a negative tier credit", ErrMalformed)
	}
	if len(m.Candidates) > MaxCandidates {
		return nil, fmt.Errorf("%w: admit reply has %d candidates, more than %d", ErrMalformed, len(m.Candidates), MaxCandidates)
	}
	for _, c := range m.Candidates {
		if c.Worker == "" || c.CachedTokens < 0 || c.PredictedTTFTNano < 0 {
			return nil, fmt.Errorf("%w: admit reply has a bad candidate", ErrMalformed)
		}
	}
	if d := m.Decode; d != nil && (!m.OK || d.Worker == "" || d.BlockSize < 0 || d.TransferNano < 0) {
		return nil, fmt.Errorf("%w: admit reply has a bad decode worker", ErrMalformed)
	}
	return &m, nil
}

// DecodeCancelRequest parses a CancelRequest.
func DecodeCancelRequest(p []byte) (*CancelRequest, error) {
	var m CancelRequest
	if err := decodeVersioned(p, &m, &m.Version, "cancel"); err != nil {
		return nil, err
	}
	if m.ID == "" {
		return nil, fmt.Errorf("%w: cancel without id", ErrMalformed)
	}
	if m.Attempt < 0 {
		return nil, fmt.Errorf("%w: cancel of %s has attempt %d", ErrMalformed, m.ID, m.Attempt)
	}
	return &m, nil
}

// DecodeLifeMark parses and validates a LifeMark.
func DecodeLifeMark(p []byte) (*LifeMark, error) {
	var m LifeMark
	if err := decodeVersioned(p, &m, &m.Version, "life mark"); err != nil {
		return nil, err
	}
	switch m.Kind {
	case LifeDispatched, LifeFirstToken, LifeDone, LifeAborted, LifeRenew:
	default:
		return nil, fmt.Errorf("%w: life mark kind %q", ErrMalformed, m.Kind)
	}
	if len(m.Bookings) > MaxBlocksPerMessage {
		return nil, fmt.Errorf("%w: life mark has too many bookings", ErrMalformed)
	}
	if len(m.Used) > 0 && m.Kind != LifeDone {
		return nil, fmt.Errorf("%w: life mark %s reports usage (only done may)", ErrMalformed, m.Kind)
	}
	if len(m.Used) > len(m.Bookings) {
		return nil, fmt.Errorf("%w: life mark reports usage of more bookings than it names", ErrMalformed)
	}
	for _, u := range m.Used {
		if u.Tokens < 0 {
			return nil, fmt.Errorf("%w: life mark reports negative usage for booking %d", ErrMalformed, u.Booking)
		}
	}
	return &m, nil
}

// DecodeAdoptRequest parses and validates an AdoptRequest.
func DecodeAdoptRequest(p []byte) (*AdoptRequest, error) {
	var m AdoptRequest
	if err := decodeVersioned(p, &m, &m.Version, "adopt request"); err != nil {
		return nil, err
	}
	if !ValidName(m.Class) || !ValidName(m.Entry) {
		return nil, fmt.Errorf("%w: adopt request class %q entry %q", ErrMalformed, m.Class, m.Entry)
	}
	if m.Epoch < 0 || (m.Done && m.Epoch == 0) {
		return nil, fmt.Errorf("%w: adopt request epoch %d (done %v): a done report names the owner's epoch", ErrMalformed, m.Epoch, m.Done)
	}
	for _, b := range m.Bookings {
		if b.Worker == "" || b.PromptTokens < 0 || b.CachedTokens < 0 || b.TierCredit < 0 || b.ExpectedOutput < 0 || b.Sequences < 0 {
			return nil, fmt.Errorf("%w: adopt request has a bad booking", ErrMalformed)
		}
		if b.Tenant != "" && !ValidName(b.Tenant) {
			return nil, fmt.Errorf("%w: adopt request booking %s tenant %q", ErrMalformed, b.RequestID, b.Tenant)
		}
		if b.Decode != nil && (b.Decode.Worker == "" || b.Decode.Worker == b.Worker) {
			return nil, fmt.Errorf("%w: adopt request booking %s has a bad decode worker", ErrMalformed, b.RequestID)
		}
	}
	return &m, nil
}

// DecodeAdoptReply parses an AdoptReply.
func DecodeAdoptReply(p []byte) (*AdoptReply, error) {
	var m AdoptReply
	if err := decodeVersioned(p, &m, &m.Version, "adopt reply"); err != nil {
		return nil, err
	}
	return &m, nil
}

func decodeVersioned(p []byte, dst any, version *int, what string) error {
	if err := json.Unmarshal(p, dst); err != nil {
		return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
	}
	if *version != admissionVersion {
		return fmt.Errorf("%w: %s version %d", ErrVersion, what, *version)
	}
	return nil
}
