package engine

import (
	"crypto/rand"
	"encoding/binary"
	"sync"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

// EventSink receives KV event batches, one per step that changed the cache,
// in id order. It is called with the engine's lock held: it must not block
// and must not call the Engine. It may keep the batch.
type EventSink interface {
	PublishKVEvents(b *wire.KVEventBatch)
}

// TokenEventSink is an EventSink that also wants the token ids of every
// stored block, as a vLLM-protocol publisher must send them (the native
// stream does not: its hashes already name the content). When Config.Events
// implements it, the engine calls PublishKVEventsWithTokens instead of
// PublishKVEvents; the native path keeps no tokens.
type TokenEventSink interface {
	EventSink
	// PublishKVEventsWithTokens is PublishKVEvents with tokens[i] the token
	// ids of b.Events[i]'s blocks in order (len(Hashes)·BlockSize of them)
	// for a stored event, nil for the others. Same rules: called under the
	// engine's lock, must not block, may keep both.
	PublishKVEventsWithTokens(b *wire.KVEventBatch, tokens [][]uint32)
}

// Engine is one simulated inference engine. See the package doc for the
// concurrency rules.
type Engine struct {
	mu        sync.Mutex
	cfg       Config
	clock     clock.Clock
	timing    TimingModel
	pool      *pool
	host      *hostTier // nil without a host tier
	watermark int

	seqs      map[string]*seq
	waiting   seqHeap
	running   []*seq // by (priority desc, arrival asc); the tail is preempted first
	nextSeqNo uint64
	cursor    int // rotates the decode start for fairness under a small budget

	pulls  []*seq // transfers in flight (transfer.go)
	landed int    // waiting requests holding the blocks of a landed transfer

	batch    []batchEntry
	batchEnd time.Time
	inflight bool
	scratch  []*seq

	instance     uint64
	lastEventID  uint64
	pending      []wire.KVEvent
	pendingFirst uint64
	tokenSink    TokenEventSink // Config.Events when it wants tokens, else nil
	pendingToks  [][]uint32     // parallel to pending, only with tokenSink

	st      Stats
	stopped bool

	wake    chan struct{} // size 1: Submit wakes an idle Run
	changed chan struct{} // size 1: running/waiting changed (load reports)
}

type seqState uint8

const (
	stateWaiting seqState = iota + 1
	stateRunning
	statePulling // its transfer's KV is arriving (transfer.go)
	stateDone
)

type seq struct {
	req        Request
	stream     *Stream
	tokens     []uint32 // prompt then generated tokens
	hashes     []uint64 // sequence hashes of tokens' full blocks, filled lazily
	seed       uint64
	nPrompt    int
	nOut       int
	computed   int     // tokens whose KV is computed
	blocks     []int32 // KV blocks, block i holds tokens [i·B, (i+1)·B)
	nCommitted int     // leading blocks already findable in the cache
	state      seqState
	seqNo      uint64
	started    bool
	cached     int
	hostCached int // of cached, loaded back from the host tier
	diskCached int // of cached, loaded back from the disk tier
	inBatch    int // 1 + index in Engine.batch, 0 when not scheduled
	heapIdx    int
	outBase    uint64

	pull        pullState
	pullTokens  int       // the prompt prefix computed once the pull lands
	pullReady   time.Time // when it lands
	transferred int       // prompt tokens that arrived by transfer
}

type pullState uint8

const (
	noPull      pullState = iota
	pullPending           // Request.Transfer set, not yet admitted
	pulling
	pullDone
)

type batchEntry struct {
	s      *seq
	n      int
	decode bool
}

// Stats is a snapshot of the engine's state and cumulative counters.
type Stats struct {
	Instance uint64
	Running  int
	Waiting  int
	// PeakLive is the most requests the engine held at once (waiting and
	// running: submitted and not yet ended) since it started, and
	// PeakRunning the largest running set. A router that books a worker
	// up to its cap never pushes PeakLive past it; the randomized fault
	// test (internal/app nemesis) checks exactly that.
	PeakLive      int
	PeakRunning   int
	KVBlocksUsed  int
	KVBlocksTotal int
	KVUsage       float64
	// CachedBlocks counts blocks findable by prefix (in use or free).
	CachedBlocks int
	LastEventID  uint64

	Submitted     uint64
	Finished      uint64
	Cancelled     uint64
	Preemptions   uint64
	Steps         uint64
	PromptTokens  uint64 // prompt tokens of first-scheduled requests
	CachedTokens  uint64 // of those, served from the prefix cache
	PrefillTokens uint64 // tokens computed by prefill chunks (incl. recompute)
	DecodeTokens  uint64
	OutputTokens  uint64
	BusyTime      time.Duration // sum of step durations
	EventsEmitted uint64
	BlocksEvicted uint64
	PrefixHitRate float64 // CachedTokens / PromptTokens
	// HostCachedTokens are the cached tokens loaded back from the host
	// tier (part of CachedTokens), in HostLoads blocks.
	HostCachedTokens uint64
	HostLoads        uint64
	// DiskCachedTokens are the cached tokens loaded back from the disk
	// tier (part of CachedTokens), in DiskLoads blocks.
	DiskCachedTokens uint64
	DiskLoads        uint64
	// Transfers counts landed KV transfers (Request.Transfer), which
	// brought TransferredTokens prompt tokens; Transferring are in flight
	// now (those requests are neither running nor waiting).
	Transfers         uint64
	TransferredTokens uint64
	Transferring      int
}

// New builds an engine. It starts nothing. Submit stamps arrivals with clk's
// Now and Run waits on it (nil: wall time); a simulator passes a virtual
// clock and never calls Run.
func New(cfg Config, clk clock.Clock) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Real{}
	}
	e := &Engine{
		cfg:     cfg,
		clock:   clk,
		timing:  cfg.Timing,
		seqs:    make(map[string]*seq),
		wake:    make(chan struct{}, 1),
		changed: make(chan struct{}, 1),
	}
	if e.timing == nil {
		e.timing = Polynomial{Speedup: cfg.Speedup}
	}
	e.instance = cfg.Instance
	for e.instance == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		e.instance = binary.LittleEndian.Uint64(b[:])
	}
	if ts, ok := cfg.Events.(TokenEventSink); ok {
		e.tokenSink = ts
	}
	e.watermark = int(cfg.WatermarkFraction * float64(cfg.NumBlocks))
	e.pool = newPool(cfg.NumBlocks, e.evicted)
	e.host = newTiers(&cfg, e.instance)
	return e, nil
}

// Config returns the engine's configuration.
func (e *Engine) Config() Config { return e.cfg }

// Instance is this engine start's random id, carried by its events and dumps.
func (e *Engine) Instance() uint64 { return e.instance }

// Changed is signalled when the number of running or waiting requests
// changes; a load reporter selects on it.
func (e *Engine) Changed() <-chan struct{} { return e.changed }

func (e *Engine) blocksFor(tokens int) int {
	return (tokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // already signalled
	}
}
