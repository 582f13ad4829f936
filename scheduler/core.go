package scheduler

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync/atomic"
	"time"
)

// Responder completes one request. The Core calls it exactly once per
// Enqueue: with a Grant and nil error when admitted, or with a zero Grant and
// a *RejectError (or an error wrapping ErrCancelled) otherwise. It runs on
// the Core's turn, so it must not block and must not call back into the Core.
// For a grant it returns false when the requester is gone; the Core then rolls
// the booking back and counts the request cancelled instead of admitted. The
// return value is ignored for errors.
type Responder func(Grant, error) bool

// class is one policy class: its queue, DRR state and counters. A class stays
// known after it is removed so its cumulative counters never go backwards.
type class struct {
	cfg     ClassConfig
	active  bool
	q       entryHeap
	deficit int64

	pendingISL    int64
	pendingCached int64
	counters      Counters

	// candidate cached for one popNext call (selGen == Core.gen)
	selGen   uint64
	selEntry *entry
	selIdx   int

	// The class was found blocked at capacity epoch blockedAt; it stays
	// blocked until capacity frees (Core.capEpoch moves) or its queue changes.
	blocked   bool
	blockedAt uint64
	// What the blocked walk depended on: every worker (an unconstrained
	// entry was blocked), or only the pinned/allowed workers of the
	// constrained entries it stepped over (blockedOn, worker indices).
	blockedAll bool
	blockedOn  []int32

	// tr shares the class between tenants (tenants.go); nil while no
	// tenant's request is queued.
	tr *tenantRing
}

// workerSlot is one registered worker with its ledger and what the selector
// precomputes for it.
type workerSlot struct {
	// What the selector reads for every worker comes first, within one
	// cache line; the registration (strings) follows.
	ledger     *workerLedger
	invB       float64    // 1 / BlockSize
	remote     WorkerLoad // cached RemoteLoad, valid while remoteVer matches
	blockSize  int32
	maxRunning int32
	kvBlocks   int32
	Worker
}

func newWorkerSlot(w Worker, l *workerLedger) workerSlot {
	return workerSlot{
		ledger: l, invB: 1 / float64(w.BlockSize), Worker: w,
		blockSize: int32(min(w.BlockSize, math.MaxInt32)), maxRunning: int32(min(w.MaxRunning, math.MaxInt32)),
		kvBlocks: int32(min(w.KVBlocks, math.MaxInt32)),
	}
}

// instanceSeq makes Snapshot.Instance unique per Core within a process; the
// start time makes it unique across restarts.
var instanceSeq atomic.Uint64

func init() { instanceSeq.Store(uint64(time.Now().UnixNano()) << 8) }

// Core is the synchronous scheduler: policy queues, DRR across classes, the
// worker selector and the booking ledger. It starts nothing and is not safe
// for concurrent use: one owner (the Actor's goroutine, or the simulator)
// calls it. Every method runs one complete turn: it settles everything it
// can and returns; time passes only through the injected Clock.
type Core struct {
	cfg   Config
	clock Clock
	load  LoadView
	vload VersionedLoadView // load, when it is versioned
	rng   *rand.Rand

	remoteVer   uint64 // LoadVersion the cached remote loads reflect
	remoteValid bool
	// capEpoch moves whenever capacity may have been freed (a booking ended,
	// prefill finished, workers, classes or remote load changed). Nothing
	// else can unblock a waiting class, so blocked classes are not
	// re-evaluated until it moves or their own queue changes.
	capEpoch uint64
	// capAll is the capEpoch of the last change that may free capacity on
	// every worker; capAt[i] that of the last on worker i alone. A class
	// blocked on a few pinned workers stays blocked while theirs and capAll
	// have not moved since (stillBlocked).
	capAll uint64
	capAt  []uint64

	epoch    time.Time // arrival offsets are measured from here
	instance uint64
	snapSeq  uint64

	classes map[string]*class
	ring    []*class // active classes in configuration order, for DRR
	cursor  int
	turn    bool // the cursor class has received its quantum this turn
	gen     uint64

	entries map[string]*entry // queued, by request ID
	due     dueHeap
	queued  int
	seq     uint64

	workers   []workerSlot
	workerIdx map[string]int
	ledgers   map[string]*workerLedger // includes unregistered workers with bookings

	bookings    map[BookingID]*booking
	nextBooking BookingID
	// unacked holds the grants not yet acknowledged, by the attempt they
	// granted, so that the entry's cancel of an attempt whose reply it
	// lost frees the grant at once (CancelAttempt).
	unacked map[grantKey]*booking
	expiry  expiryHeap

	unknownClass   uint64
	invalidConfigs uint64

	// ix indexes the workers by load for selection (selindex.go);
	// scanOnly makes every selection the full scan and a blocked class
	// wait for any freed capacity (tests: the Core as it was, the
	// reference the index and the per-worker memo are checked against).
	ix       selIndex
	scanOnly bool
	// tenants: quota accounting by tenant id (tenants.go); tenantHeads is
	// tenantCandidate's scratch
	tenants     map[string]*tenantState
	tenantHeads []tenantHead

	// scratch for the selector, sized to the worker count
	ovl      []int32  // effective overlap per worker index
	allow    []uint64 // allow-list stamp per worker index
	stamp    uint64
	touched  []int
	front    []int // candidate's heap walk
	cands    []int // allowed worker indices of the request being selected
	ties     []int
	costs    []float64
	ttft     ttftScratch
	freeEnt  []*entry
	freeBook []*booking
}

// NewCore returns an empty Core: no classes, no workers. load may be nil (no
// other replicas); rng may be nil (seeded from the clock). An invalid cfg is
// replaced field by field with defaults; call cfg.Validate first to reject it.
func NewCore(cfg Config, clock Clock, load LoadView, rng *rand.Rand) *Core {
	cfg = sanitize(cfg)
	if clock == nil {
		clock = RealClock{}
	}
	now := clock.Now()
	if rng == nil {
		rng = rand.New(rand.NewPCG(uint64(now.UnixNano()), 0x5157))
	}
	vload, _ := load.(VersionedLoadView)
	return &Core{
		// Booking ids start at a random point so that no two Cores share
		// them, also across restarts under the same replica id: a late
		// lifecycle mark meant for a previous life then matches nothing.
		nextBooking: BookingID(rand.Uint64() >> 2),
		vload:       vload,
		cfg:         cfg,
		clock:       clock,
		load:        load,
		rng:         rng,
		epoch:       now,
		instance:    instanceSeq.Add(1),
		classes:     make(map[string]*class),
		entries:     make(map[string]*entry),
		workerIdx:   make(map[string]int),
		ledgers:     make(map[string]*workerLedger),
		bookings:    make(map[BookingID]*booking),
		unacked:     make(map[grantKey]*booking),
	}
}

// grantKey names one granted attempt of a request.
type grantKey struct {
	requestID string
	attempt   int
}

func sanitize(cfg Config) Config {
	d := DefaultConfig()
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) || f < 0 }
	if bad(cfg.OverlapCredit) {
		cfg.OverlapCredit = d.OverlapCredit
	}
	if bad(cfg.PrefillScale) {
		cfg.PrefillScale = d.PrefillScale
	}
	if bad(cfg.Temperature) {
		cfg.Temperature = d.Temperature
	}
	if cfg.AckTimeout <= 0 {
		cfg.AckTimeout = d.AckTimeout
	}
	if cfg.BookingExpiry <= 0 {
		cfg.BookingExpiry = d.BookingExpiry
	}
	if cfg.SnapshotInterval <= 0 {
		cfg.SnapshotInterval = d.SnapshotInterval
	}
	return sanitizeSelector(cfg)
}

// Config returns the configuration in use.
func (c *Core) Config() Config { return c.cfg }

// ---------------------------------------------------------------- enqueue

// Enqueue validates r, queues it and drains whatever is dispatchable in the
// same turn, r included if it is at the head. respond is called exactly once,
// possibly before Enqueue returns (see Responder). The checks, in order:
// unknown class; counted received (or retried); malformed request or
// duplicate queued ID (invalid_constraint); zero registered workers
// (no_endpoints); pinned/allowed validation; already past due
// (due_time_passed); the zero-limit carve-out (admit now or reject, never
// queue); queue limits (queue_full naming the limit).
func (c *Core) Enqueue(r *Request, respond Responder) {
	if respond == nil {
		respond = func(Grant, error) bool { return false }
	}
	if r == nil {
		c.unknownClass++
		respond(Grant{}, &RejectError{Reason: ReasonUnknownClass, Detail: "nil request"})
		return
	}
	cls := c.classes[r.Class]
	if cls == nil || !cls.active {
		if !r.Probe {
			c.unknownClass++
		}
		respond(Grant{}, &RejectError{Reason: ReasonUnknownClass, Detail: fmt.Sprintf("class %q is not served here", r.Class)})
		return
	}
	if !r.Probe {
		if r.Attempt > 0 {
			cls.counters.Retried++
		} else {
			cls.counters.Received++
		}
	}
	now := c.clock.Now()
	if old := c.entries[r.ID]; old != nil && old.req.Attempt < r.Attempt {
		// A resubmission supersedes its earlier attempt, still queued here
		// because the entry gave up waiting for the answer (lost reply) or
		// its cancel has not arrived yet: withdraw the old one first.
		c.Cancel(r.ID)
	}
	if reason, detail := c.validate(r); reason != 0 {
		c.reject(cls, r, respond, reason, "", detail)
		return
	}
	if !r.Due.IsZero() && !now.Before(r.Due) {
		c.reject(cls, r, respond, ReasonDueTimePassed, "", "due time passed before admission")
		return
	}
	e := c.newEntry(r, respond, cls, now)
	if lim := cls.cfg.Limits.zero(); lim != "" {
		// Zero-limit carve-out: such a class can never hold a queued entry.
		idx, ok := c.selectWorker(r, &cls.cfg)
		if !ok {
			c.release(e)
			c.reject(cls, r, respond, ReasonQueueFull, lim, "zero-limit class and no worker is free")
			return
		}
		if lim, retry := c.tenantCheck(r, now); lim != "" {
			c.release(e)
			c.rejectQuota(cls, r, respond, lim, retry)
			return
		}
		c.admit(e, idx, now)
		return
	}
	if lim := c.overLimit(cls, e); lim != "" {
		c.release(e)
		c.reject(cls, r, respond, ReasonQueueFull, lim, fmt.Sprintf("class %s queue limit %s reached", cls.cfg.Name, lim))
		return
	}
	if lim, retry := c.tenantCheck(r, now); lim != "" {
		c.release(e)
		c.rejectQuota(cls, r, respond, lim, retry)
		return
	}
	c.push(e)
	c.drain()
}

// validate checks the request's shape and its worker constraints against the
// registered workers. It returns 0 when the request may be queued.
func (c *Core) validate(r *Request) (Reason, string) {
	switch {
	case r.ID == "":
		return ReasonInvalidConstraint, "request ID is empty"
	case r.PromptTokens < 0 || r.ExpectedOutputTokens < 0:
		return ReasonInvalidConstraint, "negative token count"
	case math.IsNaN(r.PriorityJump) || math.IsInf(r.PriorityJump, 0):
		return ReasonInvalidConstraint, "priority jump is not finite"
	case c.entries[r.ID] != nil:
		return ReasonInvalidConstraint, fmt.Sprintf("request %s is already queued", r.ID)
	case len(c.workers) == 0:
		return ReasonNoEndpoints, "no workers are registered"
	}
	if r.Pinned != "" {
		if _, ok := c.workerIdx[r.Pinned]; !ok {
			return ReasonInvalidConstraint, fmt.Sprintf("pinned worker %s is not registered", r.Pinned)
		}
		if len(r.Allowed) > 0 && !contains(r.Allowed, r.Pinned) {
			return ReasonInvalidConstraint, fmt.Sprintf("pinned worker %s is not in the allowed list", r.Pinned)
		}
		return 0, ""
	}
	if len(r.Allowed) > 0 && !c.anyAllowed(r) {
		return ReasonInvalidConstraint, "none of the allowed workers is registered"
	}
	return 0, ""
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (c *Core) anyAllowed(r *Request) bool {
	if r.Pinned != "" {
		_, ok := c.workerIdx[r.Pinned]
		return ok
	}
	if len(r.Allowed) == 0 {
		return len(c.workers) > 0
	}
	for _, a := range r.Allowed {
		if _, ok := c.workerIdx[a]; ok {
			return true
		}
	}
	return false
}

// usableWorkers is how many registered workers r may run on: one when
// pinned, the distinct registered workers of its allow-list, else all.
func (c *Core) usableWorkers(r *Request) int {
	switch {
	case r.Pinned != "":
		if _, ok := c.workerIdx[r.Pinned]; ok {
			return 1
		}
		return 0
	case len(r.Allowed) == 0:
		return len(c.workers)
	}
	c.stamp++
	n := 0
	for _, a := range r.Allowed {
		if i, ok := c.workerIdx[a]; ok && c.allow[i] != c.stamp {
			c.allow[i] = c.stamp
			n++
		}
	}
	return n
}

func (c *Core) newEntry(r *Request, respond Responder, cls *class, now time.Time) *entry {
	var e *entry
	if n := len(c.freeEnt); n > 0 {
		e = c.freeEnt[n-1]
		c.freeEnt = c.freeEnt[:n-1]
	} else {
		e = &entry{cold: new(entryCold)}
	}
	c.seq++
	cached := c.bestCached(r)
	cost := int64(max(1, r.PromptTokens-cached))
	ingress := r.Ingress
	if ingress.IsZero() {
		ingress = now
	}
	*e = entry{
		req: r, cold: e.cold,
		seq: c.seq, strict: r.StrictPriority,
		score: policyScore(cls.cfg.Policy, r.PriorityJump, ingress.Sub(c.epoch).Seconds(), cost),
		cost:  cost, qi: -1, di: -1,
	}
	*e.cold = entryCold{respond: respond, cls: cls, cached: cached, enqueuedAt: now}
	if !r.Due.IsZero() {
		e.hasDue, e.due = true, r.Due.UnixNano()
	}
	return e
}

// bestCached is Request.BestCachedTokens over the registered workers.
func (c *Core) bestCached(r *Request) int { return bestCachedTokens(r, c) }

func (c *Core) blockSizeOf(worker string) (int, bool) {
	if i, ok := c.workerIdx[worker]; ok {
		return c.workers[i].BlockSize, true
	}
	return 0, false
}

// overLimit checks the class limits, scaled by the number of workers e may
// run on (seed 000: capacity checks respect pinned and allowed workers), as
// if e were added. It returns the name of the first limit e would exceed.
func (c *Core) overLimit(cls *class, e *entry) string {
	n := int64(c.usableWorkers(e.req))
	l := cls.cfg.Limits
	if l.Requests != Unlimited && int64(cls.q.len()+1) > int64(l.Requests)*n {
		return LimitRequests
	}
	if l.ISLTokens != Unlimited && cls.pendingISL+int64(e.req.PromptTokens) > int64(l.ISLTokens)*n {
		return LimitISLTokens
	}
	if l.CachedTokens != Unlimited && cls.pendingCached+int64(e.cold.cached) > int64(l.CachedTokens)*n {
		return LimitCachedTokens
	}
	return ""
}

func (c *Core) push(e *entry) {
	cls := e.cold.cls
	cls.q.push(e)
	cls.blocked = false
	if e.hasDue {
		c.due.push(e)
	}
	c.entries[e.req.ID] = e
	cls.pendingISL += int64(e.req.PromptTokens)
	cls.pendingCached += int64(e.cold.cached)
	c.queued++
	c.tenantQueued(e)
}

// unqueue removes e from every index and releases its queue accounting.
func (c *Core) unqueue(e *entry) {
	cls := e.cold.cls
	cls.blocked = false
	if e.qi >= 0 {
		cls.q.remove(int(e.qi))
	}
	if e.di >= 0 {
		c.due.remove(int(e.di))
	}
	delete(c.entries, e.req.ID)
	cls.pendingISL -= int64(e.req.PromptTokens)
	cls.pendingCached -= int64(e.cold.cached)
	c.queued--
	c.tenantUnqueued(e)
	if len(cls.q) == 0 {
		// An idle class must not bank credit for later (standard DRR).
		cls.deficit = 0
		cls.untenanted()
	}
}

func (c *Core) release(e *entry) {
	cold := e.cold
	*cold = entryCold{}
	*e = entry{cold: cold}
	c.freeEnt = append(c.freeEnt, e)
}

func (c *Core) reject(cls *class, r *Request, respond Responder, reason Reason, limit, detail string) {
	if cls != nil && !r.Probe {
		if cls.counters.Rejected == nil {
			cls.counters.Rejected = make(map[Reason]uint64, len(Reasons))
		}
		cls.counters.Rejected[reason]++
	}
	respond(Grant{}, &RejectError{Reason: reason, Limit: limit, Detail: detail})
}

// rejectEntry completes a queued (already unqueued) entry with a rejection.
func (c *Core) rejectEntry(e *entry, reason Reason, detail string) {
	cls, r, respond := e.cold.cls, e.req, e.cold.respond
	c.release(e)
	c.reject(cls, r, respond, reason, "", detail)
}

// ---------------------------------------------------------------- drain

// drain admits queued requests until nothing is dispatchable.
func (c *Core) drain() {
	if c.queued > 0 {
		c.refreshRemote()
	}
	for c.queued > 0 {
		e, idx := c.popNext()
		if e == nil {
			return
		}
		now := c.clock.Now()
		if e.hasDue && now.UnixNano() >= e.due {
			// Expiry right before booking. The DRR charge is not refunded:
			// the class had its turn.
			c.rejectEntry(e, ReasonDueTimePassed, "due time passed before booking")
			continue
		}
		c.admit(e, idx, now)
	}
}

// Drain re-evaluates the queues. Call it when capacity may have changed
// outside the Core's knowledge (other replicas' load through the LoadView).
func (c *Core) Drain() {
	c.capEpoch++
	c.capAll = c.capEpoch
	c.drain()
}

// popNext picks the next entry by deficit round robin across classes and
// removes it from the queue. Only dispatchable classes take part (see
// candidate); the others keep their deficit but do not grow it. When a whole
// cycle passes without service, the bulk-credit step skips the rounds in
// which nobody could afford their candidate. It returns nil when no class is
// dispatchable.
func (c *Core) popNext() (*entry, int) {
	n := len(c.ring)
	if n == 0 {
		return nil, -1
	}
	c.gen++
	if c.cursor >= n {
		c.cursor, c.turn = 0, false
	}
	// A scan that finds nothing dispatchable must leave the rotation as it
	// was: passing over blocked classes is not a turn.
	cursor, turn := c.cursor, c.turn
	idle := 0
	for {
		cls := c.ring[c.cursor]
		if e, idx := c.candidate(cls); e != nil {
			if !c.turn {
				cls.deficit += cls.cfg.Quantum
				c.turn = true
			}
			if cls.deficit >= e.cost {
				cls.deficit -= e.cost
				c.tenantServed(e)
				c.unqueue(e)
				return e, idx
			}
		}
		c.cursor = (c.cursor + 1) % n
		c.turn = false
		if idle++; idle < n {
			continue
		}
		// A full cycle without service: every dispatchable class got one
		// quantum and still cannot afford its candidate. Skip ahead k-1
		// rounds, where k is the fewest rounds any of them still needs; the
		// next cycle serves that class.
		k := int64(-1)
		for _, x := range c.ring {
			e, _ := c.candidate(x)
			if e == nil {
				continue
			}
			need := (e.cost - x.deficit + x.cfg.Quantum - 1) / x.cfg.Quantum
			if k < 0 || need < k {
				k = need
			}
		}
		if k < 0 {
			c.cursor, c.turn = cursor, turn
			return nil, -1
		}
		if k > 1 {
			for _, x := range c.ring {
				if e, _ := c.candidate(x); e != nil {
					x.deficit += (k - 1) * x.cfg.Quantum
				}
			}
		}
		idle = 0
	}
}

// constraintLookahead bounds how many queued entries candidate examines.
const constraintLookahead = 16

// candidate is the class's next entry to dispatch and its worker, or nil when
// the class must wait. It walks the queue in order from the head: the first
// entry that has a worker right now wins, and an entry blocked with no worker
// constraint stops the walk (the class waits for capacity, in order). An
// entry blocked only because its pinned or allowed workers are full is
// stepped over, up to constraintLookahead entries, so one busy pinned worker
// does not hold up the whole class. Computed once per popNext.
func (c *Core) candidate(cls *class) (*entry, int) {
	if cls.selGen == c.gen {
		return cls.selEntry, cls.selIdx
	}
	cls.selGen, cls.selEntry, cls.selIdx = c.gen, nil, -1
	// A plain LoadView can change under us at any time: no memo then.
	memo := c.load == nil || c.vload != nil
	if memo && cls.blocked && c.stillBlocked(cls) {
		return nil, -1
	}
	cls.blockedOn, cls.blockedAll = cls.blockedOn[:0], false
	if cls.multiTenant() {
		cls.selEntry, cls.selIdx = c.tenantCandidate(cls)
	} else {
		cls.selEntry, cls.selIdx = c.walkQueue(cls, cls.q)
	}
	cls.blocked = cls.selEntry == nil && len(cls.q) > 0
	cls.blockedAt = c.capEpoch
	cls.blockedAll = cls.blockedAll || len(cls.blockedOn) > maxBlockedOn
	return cls.selEntry, cls.selIdx
}

// walkQueue is candidate's walk over one heap of cls's entries (the class
// queue, or one tenant's part of it): the first entry in order that has a
// worker, with the constrained look-ahead. A walk that finds none records
// what it waited on in cls.blockedOn and cls.blockedAll (every walk of one
// candidate adds to them), so the blocked-class memo knows which freed
// capacity can change the answer.
func (c *Core) walkQueue(cls *class, q []*entry) (*entry, int) {
	deps := cls.blockedOn
	// In-order walk of the heap: a frontier of heap positions, smallest first.
	front := append(c.front[:0], 0)
	for steps := 0; steps < constraintLookahead && len(front) > 0 && len(q) > 0; steps++ {
		j := 0
		for k := 1; k < len(front); k++ {
			if q[front[k]].before(q[front[j]]) {
				j = k
			}
		}
		qi := front[j]
		front[j] = front[len(front)-1]
		front = front[:len(front)-1]
		e := q[qi]
		if idx, ok := c.selectWorker(e.req, &cls.cfg); ok {
			c.front, cls.blockedOn = front, deps
			return e, idx
		}
		if e.req.Pinned == "" && len(e.req.Allowed) == 0 {
			cls.blockedAll = true
			break
		}
		deps = c.appendConstraint(deps, e.req)
		for _, ch := range [2]int{2*qi + 1, 2*qi + 2} {
			if ch < len(q) {
				front = append(front, ch)
			}
		}
	}
	c.front, cls.blockedOn = front, deps
	return nil, -1
}

// maxBlockedOn bounds the workers a blocked class remembers; past it, any
// freed capacity re-evaluates the class.
const maxBlockedOn = 64

// appendConstraint appends the registered workers r may run on (r is
// pinned or allow-listed) to deps, up to just past maxBlockedOn.
func (c *Core) appendConstraint(deps []int32, r *Request) []int32 {
	if r.Pinned != "" {
		if i, ok := c.workerIdx[r.Pinned]; ok {
			deps = append(deps, int32(i))
		}
		return deps
	}
	for _, a := range r.Allowed {
		if len(deps) > maxBlockedOn {
			break
		}
		if i, ok := c.workerIdx[a]; ok {
			deps = append(deps, int32(i))
		}
	}
	return deps
}

// stillBlocked reports whether nothing that could unblock cls changed
// since it was found blocked: no capacity anywhere (capEpoch), or, when
// only constrained entries were blocked, none on their workers (capAt)
// and none everywhere (capAll). Selection is deterministic in these, so a
// re-walk would find the class blocked again.
func (c *Core) stillBlocked(cls *class) bool {
	at := cls.blockedAt
	if at == c.capEpoch {
		return true
	}
	if c.scanOnly || cls.blockedAll || c.capAll > at {
		return false
	}
	for _, i := range cls.blockedOn {
		if c.capAt[i] > at {
			return false
		}
	}
	return true
}

// capFreed records that capacity may have been freed on ledger l's worker.
func (c *Core) capFreed(l *workerLedger) {
	c.capEpoch++
	if l.slot >= 0 {
		c.capAt[l.slot] = c.capEpoch
	}
}

// admit is the canonical admission path after selection: book, respond, and
// roll back when the requester is gone. e is released.
func (c *Core) admit(e *entry, idx int, now time.Time) {
	r, cls, respond, enqueuedAt := e.req, e.cold.cls, e.cold.respond, e.cold.enqueuedAt
	w := &c.workers[idx]
	ovl := r.OverlapBlocks(w.ID)
	cached := r.cachedFromOverlap(ovl, w.BlockSize)
	pred := c.ttftPredict(r, idx)
	b := c.book(r.ID, cls.cfg.Name, w.ID, w.BlockSize, r.BlockHashes, r.PromptTokens, cached, r.ExpectedOutputTokens, false, now)
	b.grantedAt, b.predMs = now.UnixNano(), pred
	c.tenantBooked(b, r, now)
	b.attempt = r.Attempt
	c.unacked[grantKey{r.ID, r.Attempt}] = b
	g := Grant{
		RequestID: r.ID, Worker: w.ID, WorkerURL: w.URL, Booking: b.id,
		CachedTokens: cached, OverlapBlocks: ovl, QueueWait: now.Sub(enqueuedAt),
	}
	c.release(e)
	if !respond(g, nil) {
		c.free(b)
		if !r.Probe {
			cls.counters.Cancelled++
		}
		return
	}
	if !r.Probe {
		cls.counters.Admitted++
	}
}

// ---------------------------------------------------------------- cancel, expiry

// Cancel withdraws a queued request: it is counted cancelled and its
// responder gets ErrCancelled. It reports whether the request was queued.
func (c *Core) Cancel(requestID string) bool {
	e := c.entries[requestID]
	if e == nil {
		return false
	}
	c.unqueue(e)
	cls, r, respond := e.cold.cls, e.req, e.cold.respond
	c.release(e)
	if !r.Probe {
		cls.counters.Cancelled++
	}
	respond(Grant{}, fmt.Errorf("request %s: %w", requestID, ErrCancelled))
	// The withdrawn entry may have been a blocked head.
	c.drain()
	return true
}

// CancelAttempt is Cancel for one attempt of the request: a cancel sent for
// an earlier attempt (delivered late, after the request was resubmitted to
// this same Core) must not withdraw the resubmission. An entry cancels an
// attempt only once it will never use that attempt's grant (its reply was
// lost, came too late, or was fenced), so if the attempt was granted and is
// not yet acknowledged, its booking is freed at once: counters unchanged,
// as for Rollback. An acknowledged booking is never freed by a cancel (its
// request runs). It reports whether the attempt was queued.
func (c *Core) CancelAttempt(requestID string, attempt int) bool {
	if e := c.entries[requestID]; e != nil && e.req.Attempt == attempt {
		return c.Cancel(requestID)
	}
	if b := c.unacked[grantKey{requestID, attempt}]; b != nil {
		c.free(b)
		c.drain()
	}
	return false
}

// Tick rejects queued requests whose due time has passed, frees grants not
// acknowledged within AckTimeout and bookings not renewed within
// BookingExpiry, then drains.
func (c *Core) Tick() {
	now := c.clock.Now().UnixNano()
	for len(c.due) > 0 && c.due[0].due <= now {
		e := c.due[0]
		c.unqueue(e)
		c.rejectEntry(e, ReasonDueTimePassed, "due time passed while queued")
	}
	for len(c.expiry) > 0 && c.expiry[0].deadline <= now {
		c.free(c.expiry[0])
	}
	c.drain()
}

// NextWake returns when Tick next has work: the earliest due time or booking
// deadline.
func (c *Core) NextWake() (time.Time, bool) {
	var at int64
	ok := false
	if len(c.due) > 0 {
		at, ok = c.due[0].due, true
	}
	if len(c.expiry) > 0 && (!ok || c.expiry[0].deadline < at) {
		at, ok = c.expiry[0].deadline, true
	}
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}

// ---------------------------------------------------------------- ledger

func (c *Core) ledgerFor(worker string) *workerLedger {
	l := c.ledgers[worker]
	if l == nil {
		l = &workerLedger{slot: -1}
		c.ledgers[worker] = l
	}
	return l
}

func (c *Core) book(reqID, cls, worker string, blockSize int, hashes []uint64, prompt, cached, output int, firstToken bool, now time.Time) *booking {
	var b *booking
	if n := len(c.freeBook); n > 0 {
		b = c.freeBook[n-1]
		c.freeBook = c.freeBook[:n-1]
	} else {
		b = new(booking)
	}
	c.nextBooking++
	*b = booking{
		id: c.nextBooking, requestID: reqID, class: cls, worker: worker,
		ledger: c.ledgerFor(worker), hashes: hashes,
		prompt: prompt, cached: cached, output: output,
		private:  privateBlocks(len(hashes), prompt, output, blockSize),
		deadline: now.Add(c.cfg.AckTimeout).UnixNano(),
	}
	if !firstToken {
		b.prefill = max(0, prompt-cached)
	}
	b.ledger.add(b)
	c.ledgerChanged(b.ledger)
	c.bookings[b.id] = b
	c.expiry.push(b)
	return b
}

func (c *Core) free(b *booking) {
	c.forgetUnacked(b)
	c.capFreed(b.ledger)
	c.tenantFreed(b)
	b.ledger.remove(b)
	c.ledgerChanged(b.ledger)
	c.expiry.remove(b.ei)
	delete(c.bookings, b.id)
	if b.ledger.empty() {
		if _, registered := c.workerIdx[b.worker]; !registered {
			delete(c.ledgers, b.worker)
		}
	}
	*b = booking{}
	c.freeBook = append(c.freeBook, b)
}

// acknowledge makes a booking final and restarts its renewal window.
func (c *Core) acknowledge(b *booking) {
	c.forgetUnacked(b)
	b.acked = true
	b.deadline = c.clock.Now().Add(c.cfg.BookingExpiry).UnixNano()
	c.expiry.fix(b.ei)
}

// forgetUnacked drops b from the unacknowledged grants (adopted bookings
// and acknowledged ones are not there).
func (c *Core) forgetUnacked(b *booking) {
	if b.acked {
		return
	}
	k := grantKey{b.requestID, b.attempt}
	if c.unacked[k] == b {
		delete(c.unacked, k)
	}
}

// Ack makes a grant final (the entry replica took it). Unknown IDs (already
// finished, rolled back or expired) are ignored.
func (c *Core) Ack(id BookingID) {
	if b := c.bookings[id]; b != nil {
		c.acknowledge(b)
	}
}

// FirstToken removes the booking's prefill load (and acknowledges it: marks
// may arrive out of order). Freed prefill capacity drains the queues.
func (c *Core) FirstToken(id BookingID) {
	b := c.bookings[id]
	if b == nil {
		return
	}
	c.acknowledge(b)
	c.calibrate(b, c.clock.Now().UnixNano())
	if b.prefill > 0 {
		c.capFreed(b.ledger)
		b.ledger.prefill -= b.prefill
		b.prefill = 0
	}
	c.ledgerChanged(b.ledger)
	c.drain()
}

// Finish frees a booking (done or aborted) and drains.
func (c *Core) Finish(id BookingID) {
	if b := c.bookings[id]; b != nil {
		c.free(b)
		c.drain()
	}
}

// Rollback frees a booking whose hand-off failed. Counters are unchanged: the
// request was admitted; its booking just ends early.
func (c *Core) Rollback(id BookingID) { c.Finish(id) }

// Renew restarts the renewal window of in-flight bookings (and acknowledges
// them). Unknown IDs are ignored.
func (c *Core) Renew(ids []BookingID) {
	for _, id := range ids {
		if b := c.bookings[id]; b != nil {
			c.acknowledge(b)
		}
	}
}

// Adopt books an in-flight request granted by another owner, so this
// ledger carries its load (ownership moved, design §4 step 7). The booking
// counts as acknowledged; it expires unless renewed. No counter changes: the
// request was counted by the owner that admitted it.
func (c *Core) Adopt(rec BookingRecord) BookingID {
	blockSize := 0
	if i, ok := c.workerIdx[rec.Worker]; ok {
		blockSize = c.workers[i].BlockSize
	}
	b := c.book(rec.RequestID, rec.Class, rec.Worker, blockSize, rec.BlockHashes,
		max(0, rec.PromptTokens), max(0, rec.CachedTokens), max(0, rec.ExpectedOutputTokens), rec.FirstTokenSeen, c.clock.Now())
	c.tenantAdopted(b, rec.Tenant)
	c.acknowledge(b)
	return b.id
}

// Booking returns the record of an in-flight booking.
func (c *Core) Booking(id BookingID) (BookingRecord, bool) {
	b := c.bookings[id]
	if b == nil {
		return BookingRecord{}, false
	}
	return BookingRecord{
		RequestID: b.requestID, Class: b.class, Worker: b.worker, BlockHashes: b.hashes,
		PromptTokens: b.prompt, CachedTokens: b.cached, ExpectedOutputTokens: b.output,
		FirstTokenSeen: b.prefill == 0, Tenant: b.tenantID(),
	}, true
}

// Load returns the local ledger's load on worker.
func (c *Core) Load(worker string) WorkerLoad {
	if l := c.ledgers[worker]; l != nil {
		return l.load()
	}
	return WorkerLoad{}
}

// Queued returns how many requests are queued across all classes.
func (c *Core) Queued() int { return c.queued }

// Bookings returns how many bookings are in flight.
func (c *Core) Bookings() int { return len(c.bookings) }

// ---------------------------------------------------------------- membership

// SetWorkers replaces the registered workers. Invalid registrations are
// skipped (counted in Snapshot.InvalidConfigs). Bookings on departed workers
// stay until they finish or expire. Queued requests that can no longer run
// anywhere (zero workers, pinned worker gone, allow-list all gone) are
// rejected with no_endpoints; the rest are drained against the new set.
func (c *Core) SetWorkers(ws []Worker) {
	c.workers = c.workers[:0]
	clear(c.workerIdx)
	for _, w := range ws {
		if w.Validate() != nil {
			c.invalidConfigs++
			continue
		}
		if i, dup := c.workerIdx[w.ID]; dup {
			c.workers[i] = newWorkerSlot(w, c.workers[i].ledger) // last registration wins
			continue
		}
		c.workerIdx[w.ID] = len(c.workers)
		c.workers = append(c.workers, newWorkerSlot(w, c.ledgerFor(w.ID)))
	}
	for id, l := range c.ledgers {
		l.slot = -1
		if i, ok := c.workerIdx[id]; ok {
			l.slot = int32(i)
		} else if l.empty() {
			delete(c.ledgers, id)
		}
	}
	c.remoteValid = false
	c.ix.built = false
	c.capEpoch++
	c.capAll = c.capEpoch
	c.capAt = slices.Grow(c.capAt[:0], len(c.workers))[:len(c.workers)]
	clear(c.capAt)
	n := len(c.workers)
	if cap(c.ovl) < n {
		c.ovl = make([]int32, n)
		c.allow = make([]uint64, n)
	}
	c.ovl, c.allow = c.ovl[:n], c.allow[:n]
	clear(c.ovl)
	clear(c.allow)
	c.stamp = 0

	var stranded []*entry
	for _, e := range c.entries {
		if !c.anyAllowed(e.req) {
			stranded = append(stranded, e)
		}
	}
	sortBySeq(stranded)
	for _, e := range stranded {
		c.unqueue(e)
		c.rejectEntry(e, ReasonNoEndpoints, "no registered worker may serve the request")
	}
	c.drain()
}

// Workers returns a copy of the registered workers.
func (c *Core) Workers() []Worker {
	out := make([]Worker, len(c.workers))
	for i := range c.workers {
		out[i] = c.workers[i].Worker
	}
	return out
}

func sortBySeq(es []*entry) {
	// insertion sort: stranded sets are small and this keeps rejection order
	// deterministic for the simulator
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].seq < es[j-1].seq; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}

// SetClasses replaces the class configurations. Queued entries of classes
// still present stay queued with the order keys they were given at enqueue;
// classes absent from cfgs are removed as by RemoveClass(name,
// ReasonUnknownClass). Invalid configs are skipped (counted in
// Snapshot.InvalidConfigs); the last of duplicate names wins.
func (c *Core) SetClasses(cfgs []ClassConfig) {
	c.capEpoch++ // thresholds may have changed
	c.capAll = c.capEpoch
	keep := make(map[string]bool, len(cfgs))
	c.ring = c.ring[:0]
	for _, cfg := range cfgs {
		if cfg.Validate() != nil {
			c.invalidConfigs++
			continue
		}
		cls := c.classes[cfg.Name]
		if cls == nil {
			cls = &class{}
			c.classes[cfg.Name] = cls
		}
		cls.cfg = cfg
		if !keep[cfg.Name] {
			keep[cfg.Name] = true
			cls.active = true
			c.ring = append(c.ring, cls)
		}
	}
	var gone []string
	for name, cls := range c.classes {
		if cls.active && !keep[name] {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone) // deterministic rejection order for the simulator
	for _, name := range gone {
		c.removeClass(c.classes[name], ReasonUnknownClass, "class was removed from the configuration")
	}
	c.cursor, c.turn = 0, false
	c.drain()
}

// RemoveClass stops serving a class: its queued entries are rejected with
// reason (ReasonOwnershipLost when ownership moves) in queue order, and later
// arrivals get unknown_class. Its counters are kept.
func (c *Core) RemoveClass(name string, reason Reason) {
	cls := c.classes[name]
	if cls == nil || !cls.active {
		return
	}
	c.removeClass(cls, reason, fmt.Sprintf("class %s is no longer served here", name))
	for i, x := range c.ring {
		if x == cls {
			c.ring = append(c.ring[:i], c.ring[i+1:]...)
			break
		}
	}
	c.cursor, c.turn = 0, false
	c.drain()
}

// RejectQueued rejects the class's queued entries with reason, in queue
// order, and keeps the class configured, in its place in the DRR ring: the
// rotation of the other classes goes on where it was (ownership moved away;
// the class may come back). It reports how many were rejected.
func (c *Core) RejectQueued(name string, reason Reason) int {
	cls := c.classes[name]
	if cls == nil || !cls.active {
		return 0
	}
	n := len(cls.q)
	for len(cls.q) > 0 {
		e := cls.q[0]
		c.unqueue(e)
		c.rejectEntry(e, reason, fmt.Sprintf("class %s is no longer admitted here", name))
	}
	if n > 0 {
		c.drain()
	}
	return n
}

func (c *Core) removeClass(cls *class, reason Reason, detail string) {
	cls.active = false
	for len(cls.q) > 0 {
		e := cls.q[0]
		c.unqueue(e)
		c.rejectEntry(e, reason, detail)
	}
	cls.deficit = 0
}

// Shutdown rejects every queued request with reason, leaving classes
// configured. The Actor calls it when it stops.
func (c *Core) Shutdown(reason Reason) {
	for _, cls := range c.ring {
		for len(cls.q) > 0 {
			e := cls.q[0]
			c.unqueue(e)
			c.rejectEntry(e, reason, "scheduler stopped")
		}
	}
}

// ---------------------------------------------------------------- snapshot

// Snapshot returns an immutable copy of the counters, queue depths and local
// ledger. O(classes + workers): not for every turn.
func (c *Core) Snapshot() *Snapshot {
	c.snapSeq++
	s := &Snapshot{
		Instance: c.instance, Seq: c.snapSeq, At: c.clock.Now(),
		Classes:  make(map[string]ClassSnapshot, len(c.classes)),
		Workers:  make(map[string]WorkerLoad, len(c.ledgers)),
		Bookings: len(c.bookings), UnknownClass: c.unknownClass, InvalidConfigs: c.invalidConfigs,
	}
	for name, cls := range c.classes {
		cs := ClassSnapshot{QueueDepth: len(cls.q), PendingTokens: cls.pendingISL, Counters: cls.counters}
		cs.Counters.Rejected = make(map[Reason]uint64, len(Reasons))
		for _, r := range Reasons {
			cs.Counters.Rejected[r] = cls.counters.Rejected[r]
		}
		s.Classes[name] = cs
	}
	for id, l := range c.ledgers {
		s.Workers[id] = l.load()
	}
	c.sweepTenants(s.At.UnixNano())
	return s
}
