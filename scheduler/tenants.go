package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Tenants (design §15). A request may name the tenant it is admitted for;
// the Core that owns its class then enforces the tenant's quota like a class
// limit, and shares each class between its tenants by deficit round robin.
// Requests without a tenant (Tenant.ID "") are untouched by all of this: a
// class whose queue never held a tenant's request keeps the single-queue
// behaviour exactly.
//
// Quotas live at the owner, so N entry replicas do not grant N times the
// quota: concurrency is counted in this Core (queued entries plus bookings,
// so it is rebuilt from adopted bookings after an ownership move); requests
// and tokens per minute are token buckets here, charged when a request is
// booked (requests: one; tokens: prompt plus expected output) and corrected
// with the engine's reported usage when the request ends (FinishUsage). The
// admission check counts what is already queued for the tenant against the
// buckets, so a queue cannot run past them.
//
// At an ownership move (design §16) the new owner holds a tenant's requests
// that have a concurrency quota until the bookings are adopted (the
// admission layer's adoption hold), and the buckets travel with the class:
// TenantBuckets exports the levels of the tenants a class charged, the
// replica persists them (etcd), and the next owner merges them
// (MergeTenantBuckets), keeping the lower of its own level and the carried
// one, so a move never refills a bucket.

// TenantQuota bounds one tenant at the owner of a class. 0 is unlimited.
type TenantQuota struct {
	Concurrent        int // queued plus in-flight requests
	RequestsPerMinute int // admitted requests, token bucket of this capacity
	TokensPerMinute   int // prompt plus output tokens, token bucket of this capacity
}

// Tenant names the tenant a request is admitted for. ID "" is no tenant.
type Tenant struct {
	ID string
	// Weight is the tenant's share of a contended class relative to the
	// class's other tenants (deficit round robin); values < 1 count as 1.
	Weight int
	Quota  TenantQuota
}

// Names of the tenant quotas, as carried in RejectError.Limit.
const (
	LimitTenantConcurrent        = "concurrent"
	LimitTenantRequestsPerMinute = "requests_per_minute"
	LimitTenantTokensPerMinute   = "tokens_per_minute"
)

// bucket is a token bucket of capacity per minute, refilled continuously.
// The level may go below zero when a request used more than estimated.
type bucket struct {
	level float64
	at    int64 // Unix ns of the last refill
}

// refill brings the bucket to now for capacity cap (per minute).
func (b *bucket) refill(capacity int, now int64) {
	if b.at == 0 {
		b.level, b.at = float64(capacity), now
		return
	}
	if now > b.at {
		b.level = min(float64(capacity), b.level+float64(capacity)*float64(now-b.at)/float64(time.Minute))
		b.at = now
	}
	b.level = min(b.level, float64(capacity))
}

// wait is how long until the bucket holds need tokens; 0 when it holds
// them now.
func (b *bucket) wait(capacity int, need float64) time.Duration {
	if b.level >= need {
		return 0
	}
	d := (need - b.level) / float64(capacity) * float64(time.Minute)
	return time.Duration(math.Ceil(d))
}

// tenantState is one tenant's accounting in this Core.
type tenantState struct {
	id       string
	quota    TenantQuota // as carried by the latest request
	inflight int         // queued entries plus bookings
	queued   int         // queued entries (not yet charged to the buckets)
	pending  int64       // estimated tokens of the queued entries
	rpm, tpm bucket
	// classes are the classes whose bookings charged the buckets: their
	// owner carries the levels with them (TenantBuckets).
	classes map[string]struct{}
}

// TenantEstimate is what r is charged to its tenant's tokens bucket when it
// is booked: prompt plus the most output it can produce (OutputBound, else
// the expected output). The admission layer's quota leases charge the same.
func (r *Request) TenantEstimate() int64 {
	out := r.OutputBound
	if out <= 0 {
		out = r.ExpectedOutputTokens
	}
	return int64(max(0, r.PromptTokens)) + int64(max(0, out))
}

func (c *Core) tenantFor(id string) *tenantState {
	if c.tenants == nil {
		c.tenants = make(map[string]*tenantState)
	}
	t := c.tenants[id]
	if t == nil {
		t = &tenantState{id: id}
		c.tenants[id] = t
	}
	return t
}

// tenantCheck reports the first quota r would exceed ("" when none) and how
// long until it would not (0 when unknown: a concurrency slot frees when
// another request ends).
func (c *Core) tenantCheck(r *Request, now time.Time) (string, time.Duration) {
	if r.Tenant.ID == "" {
		return "", 0
	}
	t := c.tenantFor(r.Tenant.ID)
	t.quota = r.Tenant.Quota
	q := t.quota
	if q.Concurrent > 0 && t.inflight+1 > q.Concurrent {
		return LimitTenantConcurrent, 0
	}
	ns := now.UnixNano()
	if q.RequestsPerMinute > 0 {
		t.rpm.refill(q.RequestsPerMinute, ns)
		// The queued entries will each take one when booked.
		if d := t.rpm.wait(q.RequestsPerMinute, float64(t.queued+1)); d > 0 {
			return LimitTenantRequestsPerMinute, d
		}
	}
	if q.TokensPerMinute > 0 {
		t.tpm.refill(q.TokensPerMinute, ns)
		// One request larger than the whole bucket passes when nothing else
		// of the tenant's is queued and the bucket is full.
		need := t.pending + min(r.TenantEstimate(), int64(q.TokensPerMinute))
		if d := t.tpm.wait(q.TokensPerMinute, float64(need)); d > 0 {
			return LimitTenantTokensPerMinute, d
		}
	}
	return "", 0
}

// rejectQuota rejects r for its tenant's quota.
func (c *Core) rejectQuota(cls *class, r *Request, respond Responder, limit string, retry time.Duration) {
	if !r.Probe {
		if cls.counters.Rejected == nil {
			cls.counters.Rejected = make(map[Reason]uint64, len(Reasons))
		}
		cls.counters.Rejected[ReasonQuotaExceeded]++
	}
	respond(Grant{}, &RejectError{Reason: ReasonQuotaExceeded, Limit: limit, RetryAfter: retry,
		Detail: fmt.Sprintf("tenant %s is over its %s quota", r.Tenant.ID, limit)})
}

// tenantQueued accounts a queued entry to its tenant (push).
// push calls it for every entry; an entry without a tenant joins the
// tenant "" of a class shared between tenants.
func (c *Core) tenantQueued(e *entry) {
	if id := e.req.Tenant.ID; id != "" {
		t := c.tenantFor(id)
		e.cold.tenant = t
		t.inflight++
		t.queued++
		t.pending += e.req.TenantEstimate()
	}
	if cls := e.cold.cls; cls.tr == nil {
		// Without a ring every queued entry has the same tenant: the class
		// needs one only when e brings a second.
		if len(cls.q) < 2 {
			return
		}
		other := cls.q[0]
		if other == e {
			other = cls.q[1]
		}
		if other.req.Tenant.ID == e.req.Tenant.ID {
			return
		}
	}
	c.tenantPush(e)
}

// tenantUnqueued undoes tenantQueued (unqueue).
func (c *Core) tenantUnqueued(e *entry) {
	if e.cold.tq != nil {
		c.tenantRemove(e)
	}
	if t := e.cold.tenant; t != nil {
		t.inflight--
		t.queued--
		t.pending -= e.req.TenantEstimate()
	}
}

// tenantBooked charges a new booking of r to its tenant: a concurrency slot
// until the booking is freed, one request and the estimated tokens from the
// buckets.
func (c *Core) tenantBooked(b *booking, r *Request, now time.Time) {
	if r.Tenant.ID == "" {
		return
	}
	t := c.tenantFor(r.Tenant.ID)
	b.tenant = t
	t.inflight++
	t.charged(r.Class)
	ns := now.UnixNano()
	if q := r.Tenant.Quota; q.RequestsPerMinute > 0 {
		t.rpm.refill(q.RequestsPerMinute, ns)
		t.rpm.level--
	}
	if q := r.Tenant.Quota; q.TokensPerMinute > 0 {
		t.tpm.refill(q.TokensPerMinute, ns)
		b.estimate = r.TenantEstimate()
		t.tpm.level -= float64(b.estimate)
	}
}

func (t *tenantState) charged(class string) {
	if t.classes == nil {
		t.classes = make(map[string]struct{}, 1)
	}
	t.classes[class] = struct{}{}
}

// TenantBucket is one tenant's bucket levels as a class's owner carries
// them to the next owner. A capacity of 0 means the bucket is not limited
// (its level is meaningless).
type TenantBucket struct {
	Tenant            string  `json:"tenant"`
	RequestsPerMinute int     `json:"rpm,omitempty"`
	Requests          float64 `json:"requests"`
	TokensPerMinute   int     `json:"tpm,omitempty"`
	Tokens            float64 `json:"tokens"`
	// At is when the levels were read (Unix ns, the exporting owner's
	// clock): the importing owner refills them from then.
	At int64 `json:"at"`
}

// TenantBuckets returns, as of now, the bucket levels of the tenants whose
// bookings of class charged this Core's buckets and are not full (a full
// bucket is what a new owner starts with anyway). Sorted by tenant.
func (c *Core) TenantBuckets(class string) []TenantBucket {
	now := c.clock.Now().UnixNano()
	var out []TenantBucket
	for id, t := range c.tenants {
		if _, ok := t.classes[class]; !ok {
			continue
		}
		tb := TenantBucket{Tenant: id, At: now}
		full := true
		if q := t.quota.RequestsPerMinute; q > 0 {
			t.rpm.refill(q, now)
			tb.RequestsPerMinute, tb.Requests = q, t.rpm.level
			full = full && t.rpm.level >= float64(q)
		}
		if q := t.quota.TokensPerMinute; q > 0 {
			t.tpm.refill(q, now)
			tb.TokensPerMinute, tb.Tokens = q, t.tpm.level
			full = full && t.tpm.level >= float64(q)
		}
		if !full {
			out = append(out, tb)
		}
	}
	slices.SortFunc(out, func(a, b TenantBucket) int { return strings.Compare(a.Tenant, b.Tenant) })
	return out
}

// MergeTenantBuckets takes over the bucket levels a previous owner of class
// carried (TenantBuckets): each carried level, refilled from its At to now,
// lowers this Core's level when it is lower, never raises it, so a move
// never refills a bucket. A carried bucket without a capacity is skipped.
func (c *Core) MergeTenantBuckets(class string, carried []TenantBucket) {
	now := c.clock.Now().UnixNano()
	for _, tb := range carried {
		if tb.Tenant == "" || (tb.RequestsPerMinute <= 0 && tb.TokensPerMinute <= 0) {
			continue
		}
		t := c.tenantFor(tb.Tenant)
		t.charged(class)
		mergeBucket(&t.rpm, &t.quota.RequestsPerMinute, tb.RequestsPerMinute, tb.Requests, tb.At, now)
		mergeBucket(&t.tpm, &t.quota.TokensPerMinute, tb.TokensPerMinute, tb.Tokens, tb.At, now)
	}
}

// mergeBucket lowers b to the carried level (capacity cap, read at at)
// refilled to now. quota is the tenant's known capacity: a tenant this Core
// has not seen yet takes the carried one, so its bucket refills (and is
// swept) like a seen tenant's.
func mergeBucket(b *bucket, quota *int, capacity int, level float64, at, now int64) {
	if capacity <= 0 {
		return
	}
	if *quota <= 0 {
		*quota = capacity
	}
	carried := bucket{level: level, at: at}
	if at <= 0 {
		carried.at = now
	}
	carried.refill(capacity, now)
	b.refill(*quota, now)
	b.level = min(b.level, carried.level)
}

// tenantAdopted gives an adopted booking its tenant's concurrency slot. The
// buckets were charged by the owner that granted it.
func (c *Core) tenantAdopted(b *booking, tenant string) {
	if tenant == "" {
		return
	}
	t := c.tenantFor(tenant)
	b.tenant = t
	t.inflight++
	if c.tenantHook != nil {
		c.tenantHook.BookingAdopted(b.id, tenant)
	}
}

// tenantFreed releases a booking's concurrency slot (free).
func (c *Core) tenantFreed(b *booking) {
	if b.tenant != nil {
		b.tenant.inflight--
		if c.tenantHook != nil {
			c.tenantHook.BookingFreed(b.id, b.tenant.id, c.usedAtFree-1)
		}
	}
}

// TenantHook learns, on the actor's turn, of the tenant bookings that end
// and of those adopted from another owner: the admission layer leases a
// tenant's quota across the class owners (capacity leasing, design §16) and
// releases a lease when its booking ends. Its methods must not block.
type TenantHook interface {
	// BookingFreed: booking id of tenant ended; used is the tokens the
	// engine reported (prompt plus output), < 0 when unknown.
	BookingFreed(id BookingID, tenant string, used int)
	// BookingAdopted: booking id of tenant was adopted here.
	BookingAdopted(id BookingID, tenant string)
}

// SetTenantHook installs h (nil: none). Call it before the Core is shared
// (before its actor runs).
func (c *Core) SetTenantHook(h TenantHook) { c.tenantHook = h }

// FinishUsage frees a booking (as Finish) and corrects its tenant's tokens
// bucket with the tokens the engine reported (prompt plus output): the
// estimate charged at booking is replaced by what was used. used < 0 is
// unknown: the estimate stands.
func (c *Core) FinishUsage(id BookingID, used int) {
	b := c.bookings[id]
	if b == nil {
		return
	}
	if t := b.tenant; t != nil && used >= 0 && b.estimate > 0 && t.quota.TokensPerMinute > 0 {
		t.tpm.refill(t.quota.TokensPerMinute, c.clock.Now().UnixNano())
		t.tpm.level = min(float64(t.quota.TokensPerMinute), t.tpm.level+float64(b.estimate-int64(used)))
	}
	if used >= 0 {
		c.usedAtFree = used + 1
		defer func() { c.usedAtFree = 0 }()
	}
	c.Finish(id)
}

// TenantInflight returns the tenant's queued plus in-flight requests in this
// Core (0 for an unknown tenant).
func (c *Core) TenantInflight(id string) int {
	if t := c.tenants[id]; t != nil {
		return t.inflight
	}
	return 0
}

// sweepTenants forgets tenants with nothing queued or booked whose buckets
// have refilled: their state equals a fresh one's. Called from Snapshot, so
// the map stays bounded by the tenants that are active.
func (c *Core) sweepTenants(now int64) {
	for id, t := range c.tenants {
		if t.inflight != 0 {
			continue
		}
		if q := t.quota.RequestsPerMinute; q > 0 {
			t.rpm.refill(q, now)
			if t.rpm.level < float64(q) {
				continue
			}
		}
		if q := t.quota.TokensPerMinute; q > 0 {
			t.tpm.refill(q, now)
			if t.tpm.level < float64(q) {
				continue
			}
		}
		delete(c.tenants, id)
	}
}

// ---------------------------------------------------------------- DRR across tenants

// tenantQueue is one tenant's queued entries of one class, in class order.
type tenantQueue struct {
	id      string
	weight  int64
	q       tenantHeap
	deficit int64
	ri      int // position in tenantRing.ring; -1 when not in it
}

// tenantRing shares one class between its tenants by deficit round robin,
// each tenant's quantum being the class quantum times its weight. It exists
// from when the class's queue holds requests of two tenants until the queue
// is empty; requests without a tenant form the tenant "" with weight 1.
type tenantRing struct {
	byID   map[string]*tenantQueue
	ring   []*tenantQueue // tenants with queued entries, in arrival order
	cursor int
	turn   bool // the cursor tenant has received its quantum this turn
}

// tenantHeap is one tenant's queue of one class, ordered like the class's.
type tenantHeap = indexedHeap[*entry, byTenantQueueOrder]

type byTenantQueueOrder struct{}

func (byTenantQueueOrder) less(a, b *entry) bool  { return a.before(b) }
func (byTenantQueueOrder) setPos(e *entry, i int) { e.cold.ti = int32(i) }

func tenantKey(r *Request) (string, int64) {
	return r.Tenant.ID, int64(max(1, r.Tenant.Weight))
}

// tenantPush adds e to its class's tenant queues, creating them (with every
// entry already queued) when e is the class's first tenant request.
func (c *Core) tenantPush(e *entry) {
	cls := e.cold.cls
	if cls.tr == nil {
		cls.tr = &tenantRing{byID: map[string]*tenantQueue{}}
		for _, x := range cls.q {
			if x != e {
				cls.tr.add(x)
			}
		}
	}
	cls.tr.add(e)
}

func (tr *tenantRing) add(e *entry) {
	id, w := tenantKey(e.req)
	tq := tr.byID[id]
	if tq == nil {
		tq = &tenantQueue{id: id, ri: -1}
		tr.byID[id] = tq
	}
	tq.weight = w // the latest request's weight
	e.cold.tq = tq
	tq.q.push(e)
	if tq.ri < 0 {
		tq.ri = len(tr.ring)
		tr.ring = append(tr.ring, tq)
	}
}

// tenantRemove takes e out of its tenant queue (when the class has them).
func (c *Core) tenantRemove(e *entry) {
	cls := e.cold.cls
	tq := e.cold.tq
	if cls.tr == nil || tq == nil {
		return
	}
	tq.q.remove(int(e.cold.ti))
	e.cold.tq = nil
	if len(tq.q) == 0 {
		cls.tr.drop(tq)
	}
}

// drop removes an emptied tenant from the ring; an idle tenant banks no
// credit (standard DRR).
func (tr *tenantRing) drop(tq *tenantQueue) {
	i := tq.ri
	tr.ring = append(tr.ring[:i], tr.ring[i+1:]...)
	for j := i; j < len(tr.ring); j++ {
		tr.ring[j].ri = j
	}
	tq.ri, tq.deficit = -1, 0
	delete(tr.byID, tq.id)
	switch {
	case i < tr.cursor:
		tr.cursor--
	case i == tr.cursor:
		tr.turn = false
	}
	if tr.cursor >= len(tr.ring) {
		tr.cursor, tr.turn = 0, false
	}
}

// untenanted is called when a class queue empties: the class returns to its
// single-queue behaviour.
func (cls *class) untenanted() { cls.tr = nil }

// multiTenant reports whether candidate must share the class between
// tenants: more than one tenant has entries queued.
func (cls *class) multiTenant() bool { return cls.tr != nil && len(cls.tr.ring) > 1 }

// tenantCandidate is candidate for a class shared by several tenants: the
// tenants take turns by deficit round robin (quantum × weight per turn; the
// entry's DRR cost is charged when it is popped, tenantServed), and within
// a tenant the entries go in class order with the same constrained
// look-ahead as a single queue. A tenant with nothing dispatchable keeps but
// does not grow its deficit. When a whole cycle passes without a pick, the
// bulk-credit step skips the rounds in which no tenant could afford its
// entry.
func (c *Core) tenantCandidate(cls *class) (*entry, int) {
	tr := cls.tr
	n := len(tr.ring)
	if tr.cursor >= n {
		tr.cursor, tr.turn = 0, false
	}
	// Heads are found lazily: a turn that finds its tenant's head
	// affordable looks at no other tenant's queue.
	heads := append(c.tenantHeads[:0], make([]tenantHead, n)...)
	c.tenantHeads = heads
	head := func(i int) *tenantHead {
		h := &heads[i]
		if !h.done {
			h.e, h.idx = c.walkQueue(cls, tr.ring[i].q)
			h.done = true
		}
		return h
	}
	// A scan that finds nothing dispatchable leaves the rotation as it was:
	// passing over blocked tenants is not a turn.
	cursor, turn := tr.cursor, tr.turn
	for idle := 0; ; {
		tq := tr.ring[tr.cursor]
		if h := head(tr.cursor); h.e != nil {
			if !tr.turn {
				tq.deficit += cls.cfg.Quantum * tq.weight
				tr.turn = true
			}
			if tq.deficit >= h.e.cost {
				return h.e, h.idx
			}
		}
		tr.cursor = (tr.cursor + 1) % n
		tr.turn = false
		if idle++; idle < n {
			continue
		}
		if !drrSkipAhead(n, func(i int) (*int64, int64, int64, bool) {
			h := head(i)
			if h.e == nil {
				return nil, 0, 0, false
			}
			x := tr.ring[i]
			return &x.deficit, cls.cfg.Quantum * x.weight, h.e.cost, true
		}) {
			tr.cursor, tr.turn = cursor, turn
			return nil, -1
		}
		idle = 0
	}
}

type tenantHead struct {
	e    *entry
	idx  int
	done bool
}

// tenantServed charges a popped entry's DRR cost to its tenant, before the
// entry leaves the queue.
func (c *Core) tenantServed(e *entry) {
	if tq := e.cold.tq; tq != nil && e.cold.cls.multiTenant() {
		tq.deficit -= e.cost
	}
}
