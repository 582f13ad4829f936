package engine

import (
	"container/heap"
	"context"
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/tokenizer"
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
	clock     Clock
	timing    TimingModel
	pool      *pool
	watermark int

	seqs      map[string]*seq
	waiting   seqHeap
	running   []*seq // by (priority desc, arrival asc); the tail is preempted first
	nextSeqNo uint64
	cursor    int // rotates the decode start for fairness under a small budget

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
	inBatch    int // 1 + index in Engine.batch, 0 when not scheduled
	heapIdx    int
	outBase    uint64
}

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
}

// New builds an engine. It starts nothing.
func New(cfg Config, clock Clock) (*Engine, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = RealClock{}
	}
	e := &Engine{
		cfg:     cfg,
		clock:   clock,
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

// Submit queues a request. The returned Stream receives its deliveries
// (unless req.OnDelta is set).
func (e *Engine) Submit(req *Request) (*Stream, error) {
	switch {
	case req.ID == "":
		return nil, fmt.Errorf("%w: empty id", ErrInvalidRequest)
	case len(req.Prompt) == 0:
		return nil, fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	case req.MaxTokens <= 0:
		return nil, fmt.Errorf("%w: max_tokens %d must be positive", ErrInvalidRequest, req.MaxTokens)
	}
	total := len(req.Prompt) + req.MaxTokens
	if total > e.cfg.MaxModelLen {
		return nil, fmt.Errorf("%w: %d prompt + %d output tokens exceed max model length %d",
			ErrTooLong, len(req.Prompt), req.MaxTokens, e.cfg.MaxModelLen)
	}
	if e.blocksFor(total)+e.watermark > e.cfg.NumBlocks {
		return nil, fmt.Errorf("%w: %d tokens need more than the %d-block KV pool",
			ErrTooLong, total, e.cfg.NumBlocks)
	}
	seed := req.HashSeed
	if seed == 0 {
		seed = kvindex.BaseSeed
	}
	s := &seq{
		req:     *req,
		tokens:  make([]uint32, len(req.Prompt), total),
		nPrompt: len(req.Prompt),
		seed:    seed,
		state:   stateWaiting,
		outBase: xxh3.HashStringSeed(req.ID, e.cfg.Seed),
	}
	copy(s.tokens, req.Prompt)
	s.req.Prompt = nil // the engine keeps its own copy
	s.hashes = kvindex.AppendSequenceHashes(make([]uint64, 0, total/e.cfg.BlockSize), s.tokens, e.cfg.BlockSize, seed)
	if req.OnDelta == nil {
		s.stream = newStream(req.ID)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.stopped:
		return nil, ErrStopped
	case e.seqs[req.ID] != nil:
		return nil, fmt.Errorf("%w: %q", ErrDuplicateID, req.ID)
	case e.cfg.MaxWaiting > 0 && e.waiting.Len() >= e.cfg.MaxWaiting:
		return nil, fmt.Errorf("%w: %d waiting", ErrQueueFull, e.waiting.Len())
	}
	e.nextSeqNo++
	s.seqNo = e.nextSeqNo
	e.seqs[req.ID] = s
	heap.Push(&e.waiting, s)
	e.st.Submitted++
	e.st.PeakLive = max(e.st.PeakLive, len(e.seqs))
	signal(e.wake)
	signal(e.changed)
	if s.stream == nil {
		return newStream(req.ID), nil // an inert handle: deliveries go to OnDelta
	}
	return s.stream, nil
}

// Cancel ends a request and frees its blocks. It reports whether the request
// was live. The request receives a final delivery with FinishCancelled.
func (e *Engine) Cancel(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.seqs[id]
	if s == nil {
		return false
	}
	e.end(s, Delta{Time: e.clock.Now(), Finish: FinishCancelled})
	e.st.Cancelled++
	signal(e.changed)
	return true
}

// Stop aborts every live request (each gets FinishAborted) and makes Submit
// fail with ErrStopped. Run calls it when its context ends.
func (e *Engine) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	e.stopped = true
	now := e.clock.Now()
	live := make([]*seq, 0, len(e.seqs))
	for _, s := range e.seqs {
		live = append(live, s)
	}
	slices.SortFunc(live, func(a, b *seq) int { return cmpU64(a.seqNo, b.seqNo) })
	for _, s := range live {
		e.end(s, Delta{Time: now, Finish: FinishAborted})
	}
	e.inflight = false
	e.batch = e.batch[:0]
	e.flush()
	signal(e.changed)
}

// end removes s from wherever it is, frees its blocks and delivers d.
func (e *Engine) end(s *seq, d Delta) {
	switch s.state {
	case stateWaiting:
		heap.Remove(&e.waiting, s.heapIdx)
	case stateRunning:
		e.removeRunning(s)
		e.pool.releaseAll(s.blocks)
		s.blocks = s.blocks[:0]
	}
	s.state = stateDone
	s.inBatch = 0
	delete(e.seqs, s.req.ID)
	d.PromptTokens, d.CachedTokens = s.nPrompt, s.cached
	e.deliver(s, d)
}

func (e *Engine) deliver(s *seq, d Delta) {
	if s.req.OnDelta != nil {
		s.req.OnDelta(d)
		return
	}
	s.stream.push(d)
}

// Step drives the engine at time now. If the batch in flight ends after
// now, Step does nothing and returns its end. Otherwise it completes that
// batch (tokens are delivered stamped with its end time), schedules the next
// batch starting at now, publishes the step's KV events, and returns when
// that batch ends; the zero time means the engine is idle until Submit.
func (e *Engine) Step(now time.Time) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return time.Time{}
	}
	if e.inflight {
		if now.Before(e.batchEnd) {
			return e.batchEnd
		}
		e.complete(e.batchEnd)
		e.inflight = false
	}
	running, waiting := len(e.running), e.waiting.Len()
	e.schedule(now)
	e.flush()
	if running != len(e.running) || waiting != e.waiting.Len() {
		signal(e.changed)
	}
	if !e.inflight {
		return time.Time{}
	}
	return e.batchEnd
}

// Run steps the engine in real time until ctx ends, then calls Stop.
func (e *Engine) Run(ctx context.Context) error {
	defer e.Stop()
	for {
		next := e.Step(e.clock.Now())
		var timer <-chan time.Time
		var wake <-chan struct{}
		if next.IsZero() {
			wake = e.wake // idle: only a Submit can create work
		} else {
			d := next.Sub(e.clock.Now())
			if d <= 0 {
				if ctx.Err() != nil {
					return nil
				}
				continue
			}
			timer = e.clock.After(d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer:
		case <-wake:
		}
	}
}

func (s *seq) decoding() bool { return s.nOut > 0 && s.computed == len(s.tokens)-1 }

func (e *Engine) schedule(now time.Time) {
	e.batch = e.batch[:0]
	budget := e.cfg.MaxNumBatchedTokens

	// 1. Decodes of running requests, one token each, starting at a rotating
	// position so that a budget smaller than the running set serves everyone
	// in turn.
	cands := e.scratch[:0]
	if n := len(e.running); n > 0 {
		start := e.cursor % n
		for i := 0; i < n; i++ {
			if s := e.running[(start+i)%n]; s.decoding() {
				cands = append(cands, s)
			}
		}
		served := 0
		for _, s := range cands {
			if budget == 0 {
				break
			}
			if s.state != stateRunning || s.inBatch != 0 {
				continue // preempted by an earlier candidate
			}
			served++
			if e.reserve(s, 1, &budget) {
				e.add(s, 1, true)
				budget--
			}
		}
		e.cursor = start + served
	}

	// 2. Chunks of running prefills (including recomputes), oldest first.
	cands = append(cands[:0], e.running...)
	for _, s := range cands {
		if budget == 0 {
			break
		}
		if s.state != stateRunning || s.inBatch != 0 || s.decoding() {
			continue
		}
		n := min(len(s.tokens)-s.computed, budget)
		if e.reserve(s, n, &budget) {
			e.add(s, n, false)
			budget -= n
		}
	}
	clear(cands)
	e.scratch = cands[:0]

	// 3. Admit waiting requests while budget, sequence slots and free blocks
	// (above the watermark) allow. A head that does not fit blocks the queue:
	// that is the engine's backpressure; admission never preempts.
	for budget > 0 && len(e.running) < e.cfg.MaxNumSeqs && e.waiting.Len() > 0 {
		s := e.waiting[0]
		bs := e.cfg.BlockSize
		maxHit := (len(s.tokens) - 1) / bs // always compute at least one token
		hits, hitFree := 0, 0
		for hits < maxHit && hits < len(s.hashes) {
			id, ok := e.pool.lookup(s.hashes[hits])
			if !ok {
				break
			}
			if e.pool.blocks[id].ref == 0 {
				hitFree++
			}
			hits++
		}
		cached := hits * bs
		n := min(len(s.tokens)-cached, budget)
		need := e.blocksFor(cached+n) - hits
		if e.pool.nFree-hitFree < need+e.watermark {
			break
		}
		heap.Pop(&e.waiting)
		for i := 0; i < hits; i++ {
			id, _ := e.pool.lookup(s.hashes[i])
			e.pool.touch(id)
			s.blocks = append(s.blocks, id)
		}
		for i := 0; i < need; i++ {
			s.blocks = append(s.blocks, e.pool.allocate())
		}
		s.computed, s.nCommitted = cached, hits
		if !s.started {
			s.started = true
			s.cached = cached
			e.st.PromptTokens += uint64(s.nPrompt)
			e.st.CachedTokens += uint64(cached)
		}
		s.state = stateRunning
		e.insertRunning(s)
		e.st.PeakRunning = max(e.st.PeakRunning, len(e.running))
		e.add(s, n, false)
		budget -= n
	}

	var shape StepShape
	for _, be := range e.batch {
		switch {
		case be.n == 0:
		case be.decode:
			shape.DecodeTokens++
		default:
			shape.PrefillTokens += be.n
		}
	}
	if shape.DecodeTokens == 0 && shape.PrefillTokens == 0 {
		e.batch = e.batch[:0]
		return
	}
	shape.KVUsage = float64(e.pool.used()) / float64(e.cfg.NumBlocks)
	d := e.timing.StepTime(shape)
	if d <= 0 {
		d = 1
	}
	e.inflight = true
	e.batchEnd = now.Add(d)
	e.st.Steps++
	e.st.BusyTime += d
	e.st.PrefillTokens += uint64(shape.PrefillTokens)
	e.st.DecodeTokens += uint64(shape.DecodeTokens)
}

func (e *Engine) add(s *seq, n int, decode bool) {
	e.batch = append(e.batch, batchEntry{s: s, n: n, decode: decode})
	s.inBatch = len(e.batch)
}

// reserve makes sure s has blocks for n more tokens, preempting the newest
// lowest-priority running requests as needed. It reports false when s itself
// had to be preempted.
func (e *Engine) reserve(s *seq, n int, budget *int) bool {
	need := e.blocksFor(s.computed+n) - len(s.blocks)
	for e.pool.nFree < need {
		victim := e.running[len(e.running)-1]
		e.preempt(victim, budget)
		if victim == s {
			return false
		}
	}
	for i := 0; i < need; i++ {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
	return true
}

// preempt moves a running request back to the waiting queue, releasing its
// blocks (cached full blocks stay findable, so its recompute may hit them).
// Its generated tokens are kept: the recompute prefills prompt and output.
func (e *Engine) preempt(v *seq, budget *int) {
	if v.inBatch != 0 {
		be := &e.batch[v.inBatch-1]
		*budget += be.n
		be.n = 0
		v.inBatch = 0
	}
	e.removeRunning(v)
	e.pool.releaseAll(v.blocks)
	v.blocks = v.blocks[:0]
	v.computed, v.nCommitted = 0, 0
	v.state = stateWaiting
	heap.Push(&e.waiting, v)
	e.st.Preemptions++
}

func (e *Engine) complete(end time.Time) {
	for i, be := range e.batch {
		s := be.s
		// Skip entries refunded by a preemption and requests cancelled or
		// preempted (and possibly re-admitted under a newer entry) meanwhile.
		if be.n == 0 || s.state != stateRunning || s.inBatch != i+1 {
			continue
		}
		s.inBatch = 0
		s.computed += be.n
		e.commitBlocks(s)
		if s.computed < len(s.tokens) {
			continue // mid-prefill chunk: no token yet
		}
		tok := outputToken(s.outBase, s.nOut)
		s.tokens = append(s.tokens, tok)
		s.nOut++
		e.st.OutputTokens++
		d := Delta{Time: end, Token: tok, HasToken: true, Index: s.nOut - 1,
			PromptTokens: s.nPrompt, CachedTokens: s.cached}
		if s.nOut >= s.req.MaxTokens {
			e.st.Finished++
			d.Finish = FinishLength
			e.end(s, d)
			continue
		}
		e.deliver(s, d)
	}
	e.batch = e.batch[:0]
}

// commitBlocks makes s's newly computed full blocks findable and records
// them as stored events: one event per contiguous run, parented on the block
// before it.
func (e *Engine) commitBlocks(s *seq) {
	bs := e.cfg.BlockSize
	full := s.computed / bs
	for len(s.hashes) < full {
		i := len(s.hashes)
		h := kvindex.BlockHash(s.tokens[i*bs:(i+1)*bs], s.seed)
		if i > 0 {
			h = kvindex.ChainHash(s.hashes[i-1], h, s.seed)
		}
		s.hashes = append(s.hashes, h)
	}
	runStart := -1
	for i := s.nCommitted; i < full; i++ {
		if e.pool.commit(s.blocks[i], s.hashes[i]) {
			if runStart < 0 {
				runStart = i
			}
			continue
		}
		if runStart >= 0 {
			e.stored(s, runStart, i)
			runStart = -1
		}
	}
	if runStart >= 0 {
		e.stored(s, runStart, full)
	}
	s.nCommitted = full
}

func (e *Engine) stored(s *seq, from, to int) {
	ev := wire.KVEvent{Kind: wire.KVStored, Hashes: slices.Clone(s.hashes[from:to])}
	if from > 0 {
		ev.Parent, ev.HasParent = s.hashes[from-1], true
	}
	e.emit(ev)
	if e.tokenSink != nil {
		bs := e.cfg.BlockSize
		e.pendingToks[len(e.pendingToks)-1] = slices.Clone(s.tokens[from*bs : to*bs])
	}
}

func (e *Engine) evicted(h uint64) {
	e.st.BlocksEvicted++
	if n := len(e.pending); n > 0 && e.pending[n-1].Kind == wire.KVRemoved {
		e.pending[n-1].Hashes = append(e.pending[n-1].Hashes, h)
		return
	}
	e.emit(wire.KVEvent{Kind: wire.KVRemoved, Hashes: []uint64{h}})
}

func (e *Engine) emit(ev wire.KVEvent) {
	e.lastEventID++
	if len(e.pending) == 0 {
		e.pendingFirst = e.lastEventID
	}
	e.pending = append(e.pending, ev)
	if e.tokenSink != nil {
		e.pendingToks = append(e.pendingToks, nil)
	}
	e.st.EventsEmitted++
}

func (e *Engine) flush() {
	if len(e.pending) == 0 {
		return
	}
	b := &wire.KVEventBatch{Worker: e.cfg.WorkerID, Instance: e.instance, FirstID: e.pendingFirst, Events: e.pending}
	e.pending = nil // the sink may keep the batch
	if e.tokenSink != nil {
		toks := e.pendingToks
		e.pendingToks = nil
		e.tokenSink.PublishKVEventsWithTokens(b, toks)
		return
	}
	if e.cfg.Events != nil {
		e.cfg.Events.PublishKVEvents(b)
	}
}

// ResetPrefixCache forgets every cached block and emits a cleared event. It
// fails with ErrBusy while requests run (their blocks could not be
// described consistently afterwards).
func (e *Engine) ResetPrefixCache() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.running) > 0 || e.inflight {
		return ErrBusy
	}
	e.pool.clear()
	e.emit(wire.KVEvent{Kind: wire.KVCleared})
	e.flush()
	return nil
}

// Dump is the engine's cached block set as of event AsOfID: applying it and
// then the events after AsOfID reproduces the engine's cache.
type Dump struct {
	Worker   string
	Instance uint64
	AsOfID   uint64
	Hashes   []uint64 // sorted ascending
}

// Dump returns the current cached block set.
func (e *Engine) Dump() Dump {
	e.mu.Lock()
	defer e.mu.Unlock()
	hs := make([]uint64, 0, len(e.pool.cached))
	for h := range e.pool.cached {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	return Dump{Worker: e.cfg.WorkerID, Instance: e.instance, AsOfID: e.lastEventID, Hashes: hs}
}

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.st
	s.Instance = e.instance
	s.Running = len(e.running)
	s.Waiting = e.waiting.Len()
	s.KVBlocksUsed = e.pool.used()
	s.KVBlocksTotal = e.cfg.NumBlocks
	s.KVUsage = float64(s.KVBlocksUsed) / float64(s.KVBlocksTotal)
	s.CachedBlocks = len(e.pool.cached)
	s.LastEventID = e.lastEventID
	if s.PromptTokens > 0 {
		s.PrefixHitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	return s
}

func (e *Engine) insertRunning(s *seq) {
	i, _ := slices.BinarySearchFunc(e.running, s, cmpSeq)
	e.running = slices.Insert(e.running, i, s)
}

func (e *Engine) removeRunning(s *seq) {
	if i := slices.Index(e.running, s); i >= 0 {
		e.running = slices.Delete(e.running, i, i+1)
	}
}

// cmpSeq orders by priority descending, then arrival ascending.
func cmpSeq(a, b *seq) int {
	if a.req.Priority != b.req.Priority {
		if a.req.Priority > b.req.Priority {
			return -1
		}
		return 1
	}
	return cmpU64(a.seqNo, b.seqNo)
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// seqHeap is the waiting queue: priority descending, then arrival (a
// preempted request keeps its arrival, so it resumes ahead of later ones).
type seqHeap []*seq

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return cmpSeq(h[i], h[j]) < 0 }
func (h seqHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *seqHeap) Push(x any) {
	s := x.(*seq)
	s.heapIdx = len(*h)
	*h = append(*h, s)
}
func (h *seqHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.heapIdx = -1
	return s
}

// outputToken is the k-th synthetic token of a request: a splitmix64 of the
// request's base hash and k, mapped into the default tokenizer's id range.
func outputToken(base uint64, k int) uint32 {
	z := base + uint64(k+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return tokenizer.FirstID + uint32(z%uint64(tokenizer.VocabSize-tokenizer.FirstID))
}

func signal(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default: // already signalled
	}
}
