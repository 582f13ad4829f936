package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"
)

// Policy orders the requests of one class that tie on strict priority and due
// time. Values start at one so the zero value is recognisably unset.
type Policy int

// Policies (design §5).
const (
	// PolicyFCFS serves earlier arrivals first: score max(pj,0) − arrival_offset_s.
	PolicyFCFS Policy = iota + 1
	// PolicyLCFS serves later arrivals first: score max(pj,0) + arrival_offset_s.
	PolicyLCFS
	// PolicyWSPT serves the shortest uncached prefill first:
	// score (1+max(pj,0)) / max(1, isl − cached).
	PolicyWSPT
)

// String returns the policy's lower-case name, as accepted by ParsePolicy.
func (p Policy) String() string {
	switch p {
	case PolicyFCFS:
		return "fcfs"
	case PolicyLCFS:
		return "lcfs"
	case PolicyWSPT:
		return "wspt"
	}
	return fmt.Sprintf("policy(%d)", int(p))
}

// ParsePolicy parses "fcfs", "lcfs" or "wspt" (case-insensitive).
func ParsePolicy(s string) (Policy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "fcfs":
		return PolicyFCFS, nil
	case "lcfs":
		return PolicyLCFS, nil
	case "wspt":
		return PolicyWSPT, nil
	}
	return 0, fmt.Errorf("%w: unknown policy %q (want fcfs, lcfs or wspt)", ErrInvalidConfig, s)
}

// Unlimited disables one queue limit.
const Unlimited = -1

// Limits bound one class's queue. Each value is per worker and is multiplied,
// when a request arrives, by the number of registered workers that request
// may run on (one when pinned, its registered allowed workers, else all). Unlimited (-1) turns a
// limit off; any limit of exactly 0 makes the class a zero-limit class, which
// never queues: it admits when a worker is free and rejects otherwise.
type Limits struct {
	Requests     int // queued requests
	ISLTokens    int // sum of queued raw prompt tokens
	CachedTokens int // sum of queued requests' best cached tokens
}

// zero reports which limit is 0 ("" when none is): such a class never queues.
func (l Limits) zero() string {
	switch {
	case l.Requests == 0:
		return LimitRequests
	case l.ISLTokens == 0:
		return LimitISLTokens
	case l.CachedTokens == 0:
		return LimitCachedTokens
	}
	return ""
}

// Split returns the limits one of n replicas admitting side by side may
// use: each limit divided by n, rounded down but never below 1, so that n
// replicas never queue more than the whole (when the limit is at least n)
// and a limited class is never closed by rounding. 0 (a zero-limit class)
// and Unlimited are kept; n <= 1 returns l.
func (l Limits) Split(n int) Limits {
	if n <= 1 {
		return l
	}
	part := func(v int) int {
		if v <= 0 {
			return v
		}
		return max(1, v/n)
	}
	return Limits{Requests: part(l.Requests), ISLTokens: part(l.ISLTokens), CachedTokens: part(l.CachedTokens)}
}

// Names of the queue limits, as carried in RejectError.Limit.
const (
	LimitRequests     = "requests"
	LimitISLTokens    = "isl_tokens"
	LimitCachedTokens = "cached_tokens"
)

// ClassConfig configures one policy class.
type ClassConfig struct {
	Name    string
	Quantum int64 // DRR quantum in tokens of uncached prefill per round
	Policy  Policy
	Limits  Limits
	// BusyPrefillTokens marks a worker busy for this class when its projected
	// prefill tokens (active + this request's uncached prefill) exceed it.
	// 0 turns the check off.
	BusyPrefillTokens int
	// BusyDecodeFraction marks a worker busy for this class when its projected
	// decode blocks divided by its KV blocks exceed it. 0 turns the check off.
	BusyDecodeFraction float64
	// DisaggMinTokens overrides Config.Disagg.MinTokens for this class's
	// requests (disagg.go): 0 keeps it, -1 never disaggregates (a model
	// without both-workers then runs the request on a decode worker).
	DisaggMinTokens int
}

// Validate reports the first bad field.
func (c ClassConfig) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: class name is empty", ErrInvalidConfig)
	case c.Quantum <= 0:
		return fmt.Errorf("%w: class %s: Quantum must be > 0, got %d", ErrInvalidConfig, c.Name, c.Quantum)
	case c.Policy < PolicyFCFS || c.Policy > PolicyWSPT:
		return fmt.Errorf("%w: class %s: Policy %d is not fcfs, lcfs or wspt", ErrInvalidConfig, c.Name, int(c.Policy))
	case c.Limits.Requests < Unlimited:
		return fmt.Errorf("%w: class %s: Limits.Requests must be -1 or >= 0, got %d", ErrInvalidConfig, c.Name, c.Limits.Requests)
	case c.Limits.ISLTokens < Unlimited:
		return fmt.Errorf("%w: class %s: Limits.ISLTokens must be -1 or >= 0, got %d", ErrInvalidConfig, c.Name, c.Limits.ISLTokens)
	case c.Limits.CachedTokens < Unlimited:
		return fmt.Errorf("%w: class %s: Limits.CachedTokens must be -1 or >= 0, got %d", ErrInvalidConfig, c.Name, c.Limits.CachedTokens)
	case c.BusyPrefillTokens < 0:
		return fmt.Errorf("%w: class %s: BusyPrefillTokens must be >= 0, got %d", ErrInvalidConfig, c.Name, c.BusyPrefillTokens)
	case c.DisaggMinTokens < -1:
		return fmt.Errorf("%w: class %s: DisaggMinTokens must be -1 or >= 0, got %d", ErrInvalidConfig, c.Name, c.DisaggMinTokens)
	case c.BusyDecodeFraction < 0 || c.BusyDecodeFraction != c.BusyDecodeFraction:
		return fmt.Errorf("%w: class %s: BusyDecodeFraction must be >= 0, got %v", ErrInvalidConfig, c.Name, c.BusyDecodeFraction)
	}
	return nil
}

// Worker is one registered inference worker as the scheduler sees it.
type Worker struct {
	ID, URL    string
	BlockSize  int // tokens per KV block; must be > 0
	KVBlocks   int // KV cache capacity in blocks (0 = unknown: the decode busy check is off)
	MaxRunning int // concurrent requests (local + remote bookings); 0 = unlimited
	// Role is the worker's part in a disaggregated fleet (wire.RoleBoth,
	// wire.RolePrefill, wire.RoleDecode; "" reads as both).
	Role string
}

// Overlap is one worker's matched prefix depth for a request, in blocks.
type Overlap struct {
	Worker string
	Blocks int
	// Tier is where those blocks are (TierGPU, the zero value, or a lower
	// tier the engine would load them from: tiers.go).
	Tier Tier
}

// BlockSequence is a prompt's sequence hashes cut at one block size.
type BlockSequence struct {
	BlockSize int
	Hashes    []uint64
}

// Request is one admission attempt. The caller must not mutate it (nor the
// slices it holds) after handing it to Enqueue or Admit.
type Request struct {
	ID             string
	Class          string
	StrictPriority int32   // higher is served first, before anything else
	PriorityJump   float64 // raises the policy score; negative values count as 0
	Ingress        time.Time
	Due            time.Time // zero: no deadline

	PromptTokens int
	BlockHashes  []uint64 // sequence hashes of the prompt's full blocks, in order
	// SizedHashes are the prompt's sequence hashes at the other block
	// sizes of the workers serving its model, when those differ (SGLang at
	// page size 1 beside vLLM at 16): a worker of such a size is costed
	// and booked with its own sequence (HashesFor). BlockHashes is then
	// the smallest size's, the longest sequence, so it bounds every
	// worker's overlap.
	SizedHashes []BlockSequence
	Overlaps    []Overlap
	Pinned      string   // "" = not pinned
	Allowed     []string // empty = any registered worker
	// Session prefers the worker of the request's session (sessions.go).
	Session SessionAffinity

	// ExpectedOutputTokens is the output booked for the request: of all its
	// sequences together.
	ExpectedOutputTokens int
	// OutputBound is the most output tokens the request can produce (its
	// max_tokens, or the model's context, times its sequences): the
	// estimate its tenant's tokens bucket is charged until the engine
	// reports usage. 0: ExpectedOutputTokens.
	OutputBound int
	// Sequences is how many sequences the engine generates for the request
	// (OpenAI's n, best_of); the ledger counts each as a running request.
	// 0 counts as 1.
	Sequences int

	Attempt int  // 0 = first attempt; > 0 = retry: counted in Retried, not Received
	Probe   bool // advisory probe: excluded from every counter

	// Tenant is who the request is admitted for (ID "": nobody): the Core
	// enforces its quota and shares the class between tenants by weight
	// (tenants.go).
	Tenant Tenant

	// LimitDivisor, when > 1, says this replica admits the request in a
	// degraded mode beside LimitDivisor-1 others that do the same (the
	// admission layer's split quota policy): the class's queue limits
	// count Limits.Split(LimitDivisor) for it.
	LimitDivisor int
}

// The Request methods below are the single source of the request-side
// arithmetic (overlap, cached tokens, cost): policies, the selector, the
// ledger and the queue all call them, or the unexported helpers they are
// built on, and never redo it.

// HashesFor is the prompt's sequence hashes as a worker with blockSize
// tokens per block holds them: its SizedHashes entry, else BlockHashes.
func (r *Request) HashesFor(blockSize int) []uint64 {
	for i := range r.SizedHashes {
		if r.SizedHashes[i].BlockSize == blockSize {
			return r.SizedHashes[i].Hashes
		}
	}
	return r.BlockHashes
}

// effectiveOverlap caps a reported overlap to the blocks the prompt has.
func (r *Request) effectiveOverlap(raw int) int {
	if raw <= 0 {
		return 0
	}
	return min(raw, len(r.BlockHashes))
}

// cachedFromOverlap converts an effective overlap into cached prompt tokens.
func (r *Request) cachedFromOverlap(blocks, blockSize int) int {
	return min(r.PromptTokens, blocks*blockSize)
}

// eachOverlap calls fn with the effective overlap of every report, in
// order; a worker's overlap is the deepest of its reports. OverlapBlocks,
// the selector and the cached-token figures all read overlaps through it.
func (r *Request) eachOverlap(fn func(worker string, blocks int)) {
	for _, o := range r.Overlaps {
		if o.Tier != TierGPU {
			continue // priced apart, as a load (tiers.go)
		}
		fn(o.Worker, r.effectiveOverlap(o.Blocks))
	}
}

// OverlapBlocks is the effective prefix overlap on worker, in blocks: the
// reported depth (the deepest, if reported twice) capped to the prompt's
// full blocks.
func (r *Request) OverlapBlocks(worker string) int {
	best := 0
	r.eachOverlap(func(w string, blocks int) {
		if w == worker {
			best = max(best, blocks)
		}
	})
	return best
}

// CachedTokens is the prompt tokens already cached on worker.
func (r *Request) CachedTokens(worker string, blockSize int) int {
	return r.cachedFromOverlap(r.OverlapBlocks(worker), blockSize)
}

// PrefillTokens is the prefill work the request adds to worker: the prompt
// minus what the worker has cached (the ledger's prefill hint).
func (r *Request) PrefillTokens(worker string, blockSize int) int {
	return r.PromptTokens - r.CachedTokens(worker, blockSize)
}

// Allows reports whether the request may run on worker: the pinned worker
// only when pinned, else any worker in Allowed (any at all when empty).
func (r *Request) Allows(worker string) bool {
	if r.Pinned != "" {
		return worker == r.Pinned
	}
	if len(r.Allowed) == 0 {
		return true
	}
	for _, a := range r.Allowed {
		if a == worker {
			return true
		}
	}
	return false
}

// BlockCount is the number of KV blocks the prompt occupies on a worker with
// blockSize tokens per block (full blocks plus a partial tail).
func (r *Request) BlockCount(blockSize int) int {
	if blockSize <= 0 {
		return len(r.BlockHashes)
	}
	return max(len(r.HashesFor(blockSize)), (r.PromptTokens+blockSize-1)/blockSize)
}

// privateBlocks is what the request occupies beyond its hashed prompt blocks:
// the partial tail and the expected output. They are never shared.
func (r *Request) privateBlocks(blockSize int) int {
	return privateBlocks(len(r.HashesFor(blockSize)), r.PromptTokens, r.ExpectedOutputTokens, blockSize)
}

func privateBlocks(hashed, prompt, output, blockSize int) int {
	if blockSize <= 0 {
		return 0
	}
	total := (max(prompt, 0) + max(output, 0) + blockSize - 1) / blockSize
	return max(0, total-hashed)
}

// BestCachedTokens is the cached-token figure WSPT and DRR use: the pinned
// worker's cached tokens when pinned, else the best over the allowed workers
// among workers.
func (r *Request) BestCachedTokens(workers []Worker) int {
	return bestCachedTokens(r, workerList(workers))
}

// blockSizer resolves a worker to its block size when it is known.
type blockSizer interface {
	blockSizeOf(worker string) (int, bool)
}

type workerList []Worker

func (l workerList) blockSizeOf(id string) (int, bool) {
	for _, w := range l {
		if w.ID == id {
			return w.BlockSize, true
		}
	}
	return 0, false
}

// bestCachedTokens is BestCachedTokens over any worker set: the Core calls
// it with its registered workers, so there is one implementation. Only
// reported overlaps can cache anything, so it walks those, not the workers.
func bestCachedTokens[B blockSizer](r *Request, ws B) int {
	best := 0
	r.eachOverlap(func(w string, blocks int) {
		if !r.Allows(w) {
			return
		}
		if bs, ok := ws.blockSizeOf(w); ok {
			best = max(best, r.cachedFromOverlap(blocks, bs))
		}
	})
	return best
}

// BookingID names one booking in one Core's ledger. Each Core starts its
// ids at a random point, so ids of different Cores (and of one replica's
// successive lives) do not collide.
type BookingID uint64

// Grant is an admitted request's placement. The booking is provisional until
// acknowledged (Ack, FirstToken or Renew).
type Grant struct {
	RequestID    string
	Worker       string
	WorkerURL    string
	Booking      BookingID
	CachedTokens int // prompt tokens cached on Worker when selected
	// TierCreditTokens are the prompt tokens beyond CachedTokens that
	// Worker holds on a lower tier (host memory, disk) and the booking
	// does not count as prefill: the tokens loaded back less the tokens
	// the engine could prefill in their load time (docs/architecture.md,
	// "The selector"). A re-homed booking carries it (BookingRecord).
	TierCreditTokens int
	OverlapBlocks    int
	// BlockSize is Worker's tokens per block (0: unknown, from an older
	// owner): Request.HashesFor(BlockSize) is the prompt as Worker holds it.
	BlockSize int
	QueueWait time.Duration // time from Enqueue to the grant
	// ReachableTokens is the most prompt tokens any registered worker held
	// cached (the request's deepest overlap): the hit the router could
	// have had. CachedTokens is the hit it chose (achieved); Shortfall
	// says why achieved fell below reachable (ShortfallNone when equal).
	ReachableTokens int
	Shortfall       Shortfall
	// PredictedTTFT is the selector's prediction of the time from the
	// grant to the worker's first token, with the worker's calibration
	// (overhead + scale × model); 0 when the selector has no TTFT model
	// (SelectorCost). The entry replica derives its first-byte timeout
	// from it and the operators' page shows it.
	PredictedTTFT time.Duration
	// Candidates are the workers the decision weighed that the operators'
	// page shows: Worker first, then the deepest other holders of the
	// prompt's prefix, each with its cached tokens and calibrated
	// predicted TTFT (0 without a TTFT model). The first NumCandidates
	// are set (CandidateList); an array, so a grant allocates nothing.
	Candidates    [MaxGrantCandidates]GrantCandidate
	NumCandidates int
	// Decode is the decode worker of a disaggregated grant (zero:
	// aggregated; disagg.go): Worker then prefills and Decode.Worker
	// decodes. Decision is why (DecisionNone in a fleet without roles).
	Decode   GrantDecode
	Decision Decision
}

// Disaggregated reports whether the grant is a prefill/decode pair.
func (g Grant) Disaggregated() bool { return g.Decode.Worker != "" }

// GrantDecode is the decode half of a disaggregated grant.
type GrantDecode struct {
	Worker, URL string
	BlockSize   int
	// Booking is the decode worker's booking, linked to Grant.Booking:
	// marks name Grant.Booking, and free or keep both.
	Booking BookingID
	// Transfer is the timing model's KV transfer time (included in
	// Grant.PredictedTTFT).
	Transfer time.Duration
}

// CandidateList returns the set part of g.Candidates.
func (g *Grant) CandidateList() []GrantCandidate {
	return g.Candidates[:min(max(g.NumCandidates, 0), MaxGrantCandidates)]
}

// GrantCandidate is one worker a decision weighed (Grant.Candidates).
type GrantCandidate struct {
	Worker        string
	CachedTokens  int
	PredictedTTFT time.Duration
}

// MaxGrantCandidates bounds Grant.Candidates.
const MaxGrantCandidates = 4

// BookingRecord describes an in-flight request to re-home on a new owner
// (Adopt), as the entry replica knows it.
type BookingRecord struct {
	RequestID    string
	Class        string
	Worker       string
	BlockHashes  []uint64
	PromptTokens int
	CachedTokens int // from the original grant
	// TierCreditTokens is the original grant's (Grant.TierCreditTokens):
	// 0 books every uncached token as prefill.
	TierCreditTokens     int
	ExpectedOutputTokens int
	Sequences            int  // 0 counts as 1
	FirstTokenSeen       bool // prefill already done: no prefill load remains
	// Tenant holds one of the tenant's concurrency slots at the new owner.
	Tenant string
	// Decode is the decode side of a disaggregated grant (zero: none):
	// adopted with the booking, as one.
	Decode DecodeRecord
}

// DecodeRecord is the decode worker's booking of a pair (BookingRecord).
type DecodeRecord struct {
	Worker      string
	BlockHashes []uint64 // the prompt at the decode worker's block size
}

// Reason is why a request was rejected. Values start at one.
type Reason int

// Rejection reasons. String gives the metric label.
const (
	ReasonDueTimePassed Reason = iota + 1
	// ReasonPredictedMiss is reserved for a deadline-miss predictor; the
	// scheduler never produces it, but its metric series exists at zero.
	ReasonPredictedMiss
	ReasonQueueFull
	ReasonNoEndpoints
	// ReasonOverloaded is not produced by the Core (its busy thresholds make
	// requests wait); it is here for adapters that shed load themselves.
	ReasonOverloaded
	ReasonOwnershipLost
	ReasonInvalidConstraint
	ReasonUnknownClass
	// ReasonQuotaExceeded: the request's tenant is over a quota
	// (RejectError.Limit names which; tenants.go).
	ReasonQuotaExceeded
)

// Reasons lists every reason, in label export order.
var Reasons = []Reason{
	ReasonDueTimePassed, ReasonPredictedMiss, ReasonQueueFull, ReasonNoEndpoints,
	ReasonOverloaded, ReasonOwnershipLost, ReasonInvalidConstraint, ReasonUnknownClass,
	ReasonQuotaExceeded,
}

// String returns the snake_case metric label.
func (r Reason) String() string {
	switch r {
	case ReasonDueTimePassed:
		return "due_time_passed"
	case ReasonPredictedMiss:
		return "predicted_miss"
	case ReasonQueueFull:
		return "queue_full"
	case ReasonNoEndpoints:
		return "no_endpoints"
	case ReasonOverloaded:
		return "overloaded"
	case ReasonOwnershipLost:
		return "ownership_lost"
	case ReasonInvalidConstraint:
		return "invalid_constraint"
	case ReasonUnknownClass:
		return "unknown_class"
	case ReasonQuotaExceeded:
		return "quota_exceeded"
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// MarshalText makes reasons readable as JSON map keys (snapshots in
// /debug/cluster) and values.
func (r Reason) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// ParseReason is the inverse of Reason.String (for rejections that crossed
// the wire).
func ParseReason(s string) (Reason, error) {
	for _, r := range Reasons {
		if r.String() == s {
			return r, nil
		}
	}
	return 0, fmt.Errorf("%w: unknown rejection reason %q", ErrInvalidConfig, s)
}

// sentinel maps a reason to the package error errors.Is matches.
func (r Reason) sentinel() error {
	switch r {
	case ReasonDueTimePassed:
		return ErrDeadlineExceeded
	case ReasonPredictedMiss:
		return ErrPredictedMiss
	case ReasonQueueFull:
		return ErrQueueFull
	case ReasonNoEndpoints:
		return ErrNoEndpoints
	case ReasonOverloaded:
		return ErrOverloaded
	case ReasonOwnershipLost:
		return ErrOwnershipMoved
	case ReasonInvalidConstraint:
		return ErrInvalidConstraint
	case ReasonUnknownClass:
		return ErrUnknownClass
	case ReasonQuotaExceeded:
		return ErrQuotaExceeded
	}
	return errUnknownReason
}

// RejectError is every rejection the scheduler produces. errors.Is matches it
// against the sentinel of its Reason (ErrQueueFull, ErrDeadlineExceeded, ...).
type RejectError struct {
	Reason Reason
	Limit  string // for ReasonQueueFull: LimitRequests, LimitISLTokens or LimitCachedTokens; for ReasonQuotaExceeded: LimitTenant*
	Detail string
	// RetryAfter is, for ReasonQuotaExceeded, when the quota will let the
	// request in (0: unknown, e.g. until a concurrent request ends).
	RetryAfter time.Duration
}

func (e *RejectError) Error() string {
	var b strings.Builder
	b.WriteString("rejected: ")
	b.WriteString(e.Reason.String())
	if e.Limit != "" {
		b.WriteString(" (limit ")
		b.WriteString(e.Limit)
		b.WriteString(")")
	}
	if e.Detail != "" {
		b.WriteString(": ")
		b.WriteString(e.Detail)
	}
	return b.String()
}

// Unwrap lets errors.Is match the reason's sentinel.
func (e *RejectError) Unwrap() error { return e.Reason.sentinel() }

// Reject builds a RejectError; a convenience for adapters that rebuild a
// rejection received over the wire.
func Reject(reason Reason, limit, detail string) error {
	return &RejectError{Reason: reason, Limit: limit, Detail: detail}
}

// ReasonOf returns the Reason of a rejection error, or 0 when err is not one.
func ReasonOf(err error) Reason {
	var rej *RejectError
	if errors.As(err, &rej) {
		return rej.Reason
	}
	return 0
}

// WorkerLoad is the booked load on one worker.
type WorkerLoad struct {
	ActiveRequests int // bookings not yet finished
	PrefillTokens  int // uncached prompt tokens of bookings before their first token
	DecodeBlocks   int // unique prompt blocks plus private (tail and output) blocks
}

// Add returns the element-wise sum.
func (l WorkerLoad) Add(o WorkerLoad) WorkerLoad {
	return WorkerLoad{
		ActiveRequests: l.ActiveRequests + o.ActiveRequests,
		PrefillTokens:  l.PrefillTokens + o.PrefillTokens,
		DecodeBlocks:   l.DecodeBlocks + o.DecodeBlocks,
	}
}

// Counters are one class's cumulative admission counters. Probes are never
// counted. Once a request has left the queue,
// Received + Retried = Admitted + Cancelled + sum(Rejected).
type Counters struct {
	Received  uint64 // first attempts
	Retried   uint64 // attempts with Attempt > 0
	Admitted  uint64
	Cancelled uint64
	Rejected  map[Reason]uint64
}

// ClassSnapshot is one class's state at snapshot time.
type ClassSnapshot struct {
	QueueDepth    int
	PendingTokens int64 // sum of queued requests' raw prompt tokens
	Counters      Counters
	// QueueByPriority is QueueDepth by strict priority tier
	// (Request.StrictPriority); empty when nothing is queued.
	QueueByPriority map[int32]int
}

// TenantSnapshot is one tenant's use of its quota in this Core, for the
// operators' page: what the owner of the tenant's classes enforces.
type TenantSnapshot struct {
	ID    string
	Quota TenantQuota // as carried by the tenant's latest request
	// InFlight is queued plus booked requests (against Quota.Concurrent);
	// Queued the part still waiting.
	InFlight, Queued int
	// Requests and Tokens are the bucket levels now (against
	// Quota.RequestsPerMinute and TokensPerMinute; meaningless when that
	// quota is 0). A level may be negative after an underestimate.
	Requests, Tokens float64
	Classes          []string // classes whose bookings charged the buckets, sorted
}

// Calibration is a worker's TTFT calibration in this Core's selector:
// observed grant-to-first-token time = Overhead + Scale × predicted.
type Calibration struct {
	Scale    float64
	Overhead time.Duration
	// Marks is the decayed number of first-token marks the fit holds
	// (0: never calibrated; at most about TTFTModel.CalibrationWindow).
	Marks float64
}

// Snapshot is an immutable view of a Core. Readers must not mutate it.
type Snapshot struct {
	Instance uint64 // unique per Core: counters restart when it changes
	Seq      uint64 // increases with every snapshot of one Core
	At       time.Time
	Classes  map[string]ClassSnapshot
	Workers  map[string]WorkerLoad // local ledger only (what this replica booked)
	Bookings int
	// Tenants are the tenants this Core accounts (queued, booked, or with
	// buckets not yet refilled), sorted by ID.
	Tenants []TenantSnapshot
	// Calibration is the TTFT calibration of every worker with a ledger.
	Calibration map[string]Calibration
	// UnknownClass counts requests naming a class this Core does not
	// have (they have no class to be counted in).
	UnknownClass uint64
	// InvalidConfigs counts worker registrations and class configs that
	// failed validation and were skipped.
	InvalidConfigs uint64
}
