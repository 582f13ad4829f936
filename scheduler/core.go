package scheduler

import (
	"math"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
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
	idHash     uint64 // the worker ID's hash, for the herd band's rendezvous draw
	Worker
	// tierDepth is the request's prefix depth on each lower tier during a
	// selection (tiers.go), zero outside one.
	tierDepth [NumTiers]int32
	// engine is the worker's fresh engine-reported load (remoteload.go).
	engine engineSlot
}

func newWorkerSlot(w Worker, l *workerLedger) workerSlot {
	return workerSlot{
		ledger: l, invB: 1 / float64(w.BlockSize), Worker: w,
		blockSize: int32(min(w.BlockSize, math.MaxInt32)), maxRunning: int32(min(w.MaxRunning, math.MaxInt32)),
		kvBlocks: int32(min(w.KVBlocks, math.MaxInt32)), idHash: hashString(w.ID),
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
	clock clock.Clock
	load  LoadView
	vload VersionedLoadView // load, when it is versioned
	rng   *rand.Rand

	remoteVer   uint64 // LoadVersion the cached remote loads reflect
	remoteValid bool
	eng         engineState // engine-reported loads' expiry (remoteload.go)
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
	// tenantHook learns of tenant bookings that end or are adopted
	// (SetTenantHook); usedAtFree is FinishUsage's reported usage plus one
	// while it frees (0: unknown)
	tenantHook TenantHook
	usedAtFree int

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
	herd     herdState
	freeEnt  []*entry
	freeBook []*booking

	disagg disaggState // disagg.go
}

// NewCore returns an empty Core: no classes, no workers. load may be nil (no
// other replicas); rng may be nil (seeded from the clock). An invalid cfg is
// replaced field by field with defaults; call cfg.Validate first to reject it.
func NewCore(cfg Config, clk clock.Clock, load LoadView, rng *rand.Rand) *Core {
	cfg = sanitize(cfg)
	if clk == nil {
		clk = clock.Real{}
	}
	now := clk.Now()
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
		clock:       clk,
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
	return sanitizeSelector(sanitizeDisagg(cfg))
}

// Config returns the configuration in use.
func (c *Core) Config() Config { return c.cfg }
