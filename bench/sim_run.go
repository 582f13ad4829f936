package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// simEpoch is virtual time zero. Any fixed instant works; a non-zero one
// keeps time.Time.IsZero meaning "unset" in the components.
var simEpoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// simClock is the virtual clock every simulated component reads. The event
// loop is its only writer. It satisfies clock.Clock, kvindex.Clock and
// engine.Clock; the simulator never runs the components' waiting loops
// (Actor, Subscriber, Engine.Run), so its timers never fire.
type simClock struct{ now int64 } // ns since simEpoch

func (c *simClock) Now() time.Time                       { return simEpoch.Add(time.Duration(c.now)) }
func (c *simClock) After(time.Duration) <-chan time.Time { return nil }
func (c *simClock) NewTimer(time.Duration) clock.Timer   { return inertTimer{} }
func (c *simClock) NewTicker(time.Duration) clock.Ticker { return inertTicker{} }

// inertTimer never fires (see simClock).
type inertTimer struct{}

func (inertTimer) C() <-chan time.Time { return nil }
func (inertTimer) Reset(time.Duration) {}
func (inertTimer) Stop() bool          { return false }

// inertTicker never ticks (see simClock).
type inertTicker struct{}

func (inertTicker) C() <-chan time.Time { return nil }
func (inertTicker) Stop()               {}

// ---------------------------------------------------------------- events

type simEventKind uint8

const (
	evArrival simEventKind = iota + 1 // a: request
	evStep                            // a: worker
	evKV                              // a: worker, batch
	evDump                            // a: worker, dump
	evLoad                            // a: origin replica, b: worker, load
	evPredict                         // a: origin replica, b: worker, hashes, exp
	evWake                            // a: replica
	evSession                         // a: replica, b: worker, exp: session id, hashes[0]: routing time (sim_sessions.go)
	evRound                           // the gossip round's end: dirty loads go out (SimConfig.GossipRound)
	evLoads                           // loads: one gossip round's loads, every origin's
)

type simEvent struct {
	at     int64
	seq    uint64
	kind   simEventKind
	a, b   int
	exp    int64
	load   scheduler.WorkerLoad
	batch  *wire.KVEventBatch
	dump   *kvindex.Dump
	hashes []uint64
	loads  []simLoadUpdate
}

// simLoadUpdate is one replica's booked load on one worker, gossiped.
type simLoadUpdate struct {
	origin, worker int
	load           scheduler.WorkerLoad
}

// eventHeap orders events by (time, insertion): equal times run in the
// order they were scheduled, which makes the run deterministic.
type eventHeap []simEvent

func (h eventHeap) less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}

func (h *eventHeap) push(e simEvent) {
	*h = append(*h, e)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *eventHeap) pop() simEvent {
	s := *h
	top := s[0]
	last := len(s) - 1
	s[0] = s[last]
	s[last] = simEvent{}
	s = s[:last]
	i := 0
	for {
		l := 2*i + 1
		if l >= len(s) {
			break
		}
		m := l
		if r := l + 1; r < len(s) && s.less(r, l) {
			m = r
		}
		if !s.less(m, i) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// ---------------------------------------------------------------- state

// simRequest is one trace request's life in the simulation.
type simRequest struct {
	tr      *TraceRequest
	arrival int64
	entry   int // replica the client sent it to
	admit   int // replica whose Core admits it
	hashes  []uint64
	worker  int // -1 until granted
	booking scheduler.BookingID
	due     int64 // 0: no deadline
	firstAt int64
	lastAt  int64
	itl     []time.Duration
	res     Result
	done    bool
	host    int         // prompt tokens loaded back from the host tier (sim_tiers.go)
	disk    int         // prompt tokens loaded back from the disk tier (sim_tiers.go)
	dec     simDecision // the grant's routing figures until the engine reports (sim_quality.go)
	// sessionPrev is the worker the entry replica's session table named
	// ("": none, or affinity off; sim_sessions.go).
	sessionPrev string
	pair        *simPair // a disaggregated request's prefill leg (sim_pd.go)
}

type simReplica struct {
	id     string
	index  *kvindex.Index
	core   *scheduler.Core
	wakeAt int64 // pending evWake time, -1 when none
	rr     int
	rng    *rand.Rand
	sweep  int64 // last SweepPredictions
	peakQ  int
	admits uint64
}

type simWorker struct {
	id      string
	eng     *engine.Engine
	stepAt  int64 // pending evStep time, -1 when none
	busy    bool  // a batch is in flight (Step returned a non-zero time)
	active  int   // granted and not finished, cluster-wide
	peak    int
	reqs    int
	resyncs int
}

// simMark is a lifecycle mark an engine delivered during Step, applied to
// the admitting Core once Step has returned (Core calls may submit to the
// same engine, whose lock Step holds).
type simMark struct {
	req       int
	first     bool // first token; else finished
	prefilled bool // a pair's prefill leg ended (sim_pd.go); failed: not by length
	failed    bool
}

// simOutcome is a Core decision, settled after the Core call returned
// (a Responder must not call back into the Core).
type simOutcome struct {
	req   int
	grant scheduler.Grant
	err   error
}

// simulation is one run. It is single-goroutine: the event loop owns every
// component and calls them synchronously.
type simulation struct {
	tierResyncs int // host tier streams the index asked to resync (never expected)
	cfg         SimConfig
	log         *zap.Logger
	clock       *simClock
	events      eventHeap
	seq         uint64
	nEvents     uint64
	reqs        []simRequest
	replicas    []simReplica
	workers     []simWorker
	widx        map[string]int
	owner       map[string]int // class → owning replica (cluster admission)

	gossip    [][]scheduler.WorkerLoad // [origin replica][worker], as last gossiped
	gossipSum []scheduler.WorkerLoad   // [worker]: the sum over origins of gossip
	gossipVer uint64
	roundAt   int64 // pending evRound time, -1 when none

	marks    []simMark
	outcomes []simOutcome
	dirty    []int64 // replica<<32 | worker whose local load changed
	dirtyAt  []uint64
	dirtyGen uint64
	spare    []int64

	tokens   []uint32
	matches  []kvindex.Match
	peakQ    int
	quality  SimQuality
	sessions *simSessions
	pd       simPD
	ingest   simIngest
}

// simLoadView is one replica's view of the other replicas' gossiped loads.
type simLoadView struct {
	s    *simulation
	self int
}

// RemoteLoad implements scheduler.LoadView: every origin's gossiped load
// but self's, from the running sum (a Core re-reads every worker after each
// gossip update: a loop over the origins here made that O(replicas ×
// workers) per update).
func (v simLoadView) RemoteLoad(worker string) scheduler.WorkerLoad {
	w, ok := v.s.widx[worker]
	if !ok {
		return scheduler.WorkerLoad{}
	}
	return subLoad(v.s.gossipSum[w], v.s.gossip[v.self][w])
}

// subLoad is the element-wise difference a − b.
func subLoad(a, b scheduler.WorkerLoad) scheduler.WorkerLoad {
	return scheduler.WorkerLoad{
		ActiveRequests: a.ActiveRequests - b.ActiveRequests,
		PrefillTokens:  a.PrefillTokens - b.PrefillTokens,
		DecodeBlocks:   a.DecodeBlocks - b.DecodeBlocks,
	}
}

// LoadVersion implements scheduler.VersionedLoadView: the Cores re-read
// remote loads only after a gossip update.
func (v simLoadView) LoadVersion() uint64 { return v.s.gossipVer }

// kvSink hands an engine's event batches to the event loop.
type kvSink struct {
	s *simulation
	w int
}

func (k kvSink) PublishKVEvents(b *wire.KVEventBatch) {
	if k.s.cfg.KVTap != nil {
		k.s.cfg.KVTap(b)
	}
	k.s.schedule(simEvent{at: k.s.clock.now + int64(k.s.cfg.EventDelay), kind: evKV, a: k.w, batch: b})
}

// ErrSimIncomplete is returned when a run ends with requests that never
// finished (a simulator bug, reported rather than hidden).
var ErrSimIncomplete = errors.New("bench: simulation ended with unfinished requests")

// RunSim simulates the trace requests reqs (in arrival order) under cfg and
// returns the run's report, with every request's Result in
// SimReport.Results. The same cfg and reqs always give the same report.
// It runs on the caller's goroutine and starts none; a cancelled ctx stops
// it with ctx.Err().
func RunSim(ctx context.Context, cfg SimConfig, reqs []TraceRequest, log *zap.Logger) (*SimReport, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	if cfg.MaxRequests > 0 && len(reqs) > cfg.MaxRequests {
		reqs = reqs[:cfg.MaxRequests]
	}
	s, err := newSimulation(cfg, reqs, log.Named("sim"))
	if err != nil {
		return nil, err
	}
	if err := s.run(ctx); err != nil {
		return nil, err
	}
	return s.report(), nil
}

func newSimulation(cfg SimConfig, reqs []TraceRequest, log *zap.Logger) (*simulation, error) {
	s := &simulation{
		cfg: cfg, log: log, clock: &simClock{}, roundAt: -1,
		widx: make(map[string]int, cfg.Workers), owner: map[string]int{},
		reqs: make([]simRequest, len(reqs)), quality: newSimQuality(), sessions: newSimSessions(cfg),
	}
	schedWorkers := make([]scheduler.Worker, cfg.Workers)
	s.workers = make([]simWorker, cfg.Workers)
	for i := range s.workers {
		id := "worker-" + strconv.Itoa(i)
		ec := cfg.Engine
		ec.WorkerID, ec.Instance, ec.Seed = id, uint64(i)+1, cfg.Seed
		if n := len(cfg.EngineSpeedups); n > 0 {
			ec.Speedup = cfg.EngineSpeedups[i%n]
		}
		ec.Events = kvSink{s: s, w: i}
		eng, err := engine.New(ec, s.clock)
		if err != nil {
			return nil, fmt.Errorf("sim engine %s: %w", id, err)
		}
		s.workers[i] = simWorker{id: id, eng: eng, stepAt: -1}
		s.widx[id] = i
		schedWorkers[i] = scheduler.Worker{ID: id, URL: "sim://" + id, BlockSize: ec.BlockSize, KVBlocks: ec.NumBlocks, MaxRunning: cfg.maxRunning(),
			Role: cfg.roleOf(i)}
	}

	// Classes, in first-seen order so configuration order is deterministic.
	var classes []string
	seen := map[string]bool{}
	for i := range reqs {
		c := s.admitClass(&reqs[i])
		if !seen[c] {
			seen[c] = true
			classes = append(classes, c)
		}
	}
	s.replicas = make([]simReplica, cfg.Replicas)
	ids := make([]string, cfg.Replicas)
	for r := range ids {
		ids[r] = "replica-" + strconv.Itoa(r)
	}
	for _, c := range classes {
		s.owner[c] = placeClass(c, ids)
	}
	if cfg.Gossip {
		s.gossip = make([][]scheduler.WorkerLoad, cfg.Replicas)
		for r := range s.gossip {
			s.gossip[r] = make([]scheduler.WorkerLoad, cfg.Workers)
		}
		s.gossipSum = make([]scheduler.WorkerLoad, cfg.Workers)
	}
	for r := range s.replicas {
		icfg := kvindex.DefaultConfig()
		// Host and disk tiers are one more stream each. No more ids than
		// streams: binding a worker copies the id → name table (MaxWorkers
		// wide), which at 10,000 workers made room for tiers nobody
		// configured cost 3× the copying per replica.
		streams := 1
		if cfg.Engine.HostBlocks > 0 {
			streams++
		}
		if cfg.Engine.DiskBlocks > 0 {
			streams++
		}
		icfg.MaxWorkers = max(icfg.MaxWorkers, streams*cfg.Workers)
		// Predictions live PredictTTL; room for every prompt block routed
		// in that window keeps them from being dropped.
		icfg.MaxPredictedEntries = 1 << 24
		icfg.Sample = max(1, cfg.IndexSample)
		ix, err := kvindex.New(icfg, s.clock, log, nil)
		if err != nil {
			return nil, fmt.Errorf("sim index: %w", err)
		}
		for _, w := range s.workers {
			if err := ix.SetCapacity(w.id, cfg.Engine.NumBlocks); err != nil {
				return nil, fmt.Errorf("sim index capacity: %w", err)
			}
			if st := w.eng.HostTierStream(); st != "" {
				if err := ix.SetCapacity(st, cfg.Engine.HostBlocks); err != nil {
					return nil, fmt.Errorf("sim index capacity: %w", err)
				}
			}
			if st := w.eng.DiskTierStream(); st != "" {
				if err := ix.SetCapacity(st, cfg.Engine.DiskBlocks); err != nil {
					return nil, fmt.Errorf("sim index capacity: %w", err)
				}
			}
		}
		var view scheduler.LoadView
		if cfg.Gossip {
			view = simLoadView{s: s, self: r}
		}
		seed := cfg.Seed*0x9e3779b97f4a7c15 + uint64(r)
		sc := cfg.Scheduler
		// The routers are configured with the engines' step budget (the
		// TTFT selector's chunking); their speed they calibrate themselves.
		sc.TTFT.StepTokens = cfg.Engine.MaxNumBatchedTokens
		// and with their gossip period: a remote booking made while a
		// decision's booking was on its way to the others shows up within
		// two gossip delays of it.
		sc.TTFT.HerdWindow = 2 * float64(cfg.GossipDelay) / float64(time.Millisecond)
		// and with their index's sampling, as a live replica's wiring does.
		if n := cfg.IndexSample; n > 1 {
			sc.IndexKeeps = func(h uint64) bool { return kvindex.Sampled(h, n) }
		}
		// and with the engines' KV transfer model (the decider's).
		sc.Disagg = disaggModel(cfg.Engine, sc.Disagg)
		if cfg.Fleet.Disaggregated() && !cfg.Decider {
			sc.Disagg.MinTokens = 1 // every request a pair
		}
		core := scheduler.NewCore(sc, s.clock, view, rand.New(rand.NewPCG(seed, 0x636f7265)))
		core.SetWorkers(schedWorkers)
		var ccfg []scheduler.ClassConfig
		for _, c := range classes {
			if cfg.Admission == SimPerReplica || s.owner[c] == r {
				ccfg = append(ccfg, cfg.classConfig(c))
			}
		}
		core.SetClasses(ccfg)
		s.replicas[r] = simReplica{
			id: ids[r], index: ix, core: core, wakeAt: -1,
			rng: rand.New(rand.NewPCG(seed, 0x706f6c)),
		}
	}
	s.dirtyAt = make([]uint64, cfg.Replicas*cfg.Workers)
	s.dirtyGen = 1

	for i := range reqs {
		tr := &reqs[i]
		at := int64(float64(tr.Arrival) / cfg.TimeScale)
		s.reqs[i] = simRequest{tr: tr, arrival: at, worker: -1, entry: i % cfg.Replicas}
		s.schedule(simEvent{at: at, kind: evArrival, a: i})
	}
	return s, nil
}

// placeClass is rendezvous hashing of a class over the replicas (as the
// cluster package places class ownership).
func placeClass(class string, replicas []string) int {
	best, bestScore := 0, uint64(0)
	for i, r := range replicas {
		sc := xxh3.HashString(class + "\x00" + r)
		if i == 0 || sc > bestScore {
			best, bestScore = i, sc
		}
	}
	return best
}

func (s *simulation) admitClass(tr *TraceRequest) string {
	switch {
	case s.cfg.SingleClass:
		return s.cfg.DefaultClass
	case tr.Class == "" && s.cfg.SplitClasses > 0:
		return "class-" + strconv.Itoa(tr.Index%s.cfg.SplitClasses)
	case tr.Class == "":
		return s.cfg.DefaultClass
	}
	return tr.Class
}

func (s *simulation) schedule(e simEvent) {
	s.seq++
	e.seq = s.seq
	s.events.push(e)
}

// run is the event loop.
func (s *simulation) run(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	for len(s.events) > 0 {
		s.nEvents++
		if s.nEvents&0xfff == 0 {
			if err := ctx.Err(); err != nil {
				return err
			}
		}
		e := s.events.pop()
		s.clock.now = e.at
		switch e.kind {
		case evArrival:
			s.arrive(e.a)
		case evStep:
			s.step(e)
		case evKV:
			s.deliverKV(e)
		case evDump:
			s.applyDump(e)
		case evLoad:
			s.applyLoad(e)
		case evPredict:
			s.applyPredict(e)
		case evSession:
			s.applySession(e)
		case evRound:
			s.endRound()
		case evLoads:
			s.applyLoads(e.loads)
		case evWake:
			rep := &s.replicas[e.a]
			if rep.wakeAt != e.at {
				continue // superseded by an earlier wake
			}
			rep.wakeAt = -1
			if at, ok := rep.core.NextWake(); !ok || at.After(s.clock.Now()) {
				// Nothing due (the booking behind it finished): only re-arm.
				s.afterCore(e.a)
				continue
			}
			rep.core.Tick()
			s.afterCore(e.a)
		}
		s.publishDirty()
	}
	for i := range s.reqs {
		if !s.reqs[i].done {
			return fmt.Errorf("%w: request %d (worker %d)", ErrSimIncomplete, i, s.reqs[i].worker)
		}
	}
	return nil
}

// ---------------------------------------------------------------- arrival

func (s *simulation) arrive(i int) {
	q := &s.reqs[i]
	tr := q.tr
	s.tokens = tr.AppendTokens(s.tokens[:0], s.cfg.Vocab)
	q.hashes = kvindex.SequenceHashes(s.tokens, s.cfg.Engine.BlockSize, kvindex.BaseSeed)
	class := s.admitClass(tr)
	if s.cfg.Admission == SimCluster {
		q.admit = s.owner[class]
	} else {
		q.admit = q.entry
	}
	now := s.clock.Now()
	r := &scheduler.Request{
		ID:                   "r" + strconv.Itoa(i),
		Class:                class,
		StrictPriority:       int32(tr.Priority),
		Ingress:              now,
		PromptTokens:         tr.InputLength,
		BlockHashes:          q.hashes,
		ExpectedOutputTokens: tr.OutputLength,
	}
	if tr.Deadline > 0 {
		q.due = s.clock.now + int64(tr.Deadline)
		if !s.cfg.IgnoreDeadlines {
			r.Due = now.Add(tr.Deadline - s.cfg.DueMargin)
		}
	}
	entry := &s.replicas[q.entry]
	if s.clock.now-entry.sweep >= int64(s.cfg.PredictTTL) {
		// Expired predictions are ignored by lookups anyway; sweeping once
		// per lifetime bounds memory to two lifetimes' worth.
		entry.sweep = s.clock.now
		entry.index.SweepPredictions()
	}
	switch s.cfg.Policy {
	case SimKVAware:
		s.matches = entry.index.Lookup(q.hashes, s.matches[:0])
		if len(s.matches) > 0 {
			r.Overlaps = make([]scheduler.Overlap, len(s.matches))
			for j, m := range s.matches {
				r.Overlaps[j] = tierOverlap(m)
			}
		}
	default:
		r.Pinned = s.workers[s.pick(q.admit)].id
	}
	r.Session = s.sessionAffinity(q)
	q.res = Result{
		Index: tr.Index, Session: tr.Session, Class: tr.Class, Priority: tr.Priority, Deadline: tr.Deadline,
		Target: entry.id, Scheduled: time.Duration(q.arrival), Sent: time.Duration(q.arrival),
		InputTokens: tr.InputLength, MaxTokens: tr.OutputLength,
	}
	rep := &s.replicas[q.admit]
	rep.core.Enqueue(r, func(g scheduler.Grant, err error) bool {
		s.outcomes = append(s.outcomes, simOutcome{req: i, grant: g, err: err})
		return true
	})
	s.afterCore(q.admit)
}

// pick is the baseline policies' choice, as the admitting replica sees the
// cluster.
func (s *simulation) pick(r int) int {
	rep := &s.replicas[r]
	n := len(s.workers)
	switch s.cfg.Policy {
	case SimRoundRobin:
		w := rep.rr % n
		rep.rr++
		return w
	case SimRandom:
		return rep.rng.IntN(n)
	}
	// least-loaded: fewest active requests, ties at random
	pick, best, ties := 0, -1, 0
	view := simLoadView{s: s, self: r}
	for w := range s.workers {
		a := rep.core.Load(s.workers[w].id).ActiveRequests
		if s.gossip != nil {
			a += view.RemoteLoad(s.workers[w].id).ActiveRequests
		}
		switch {
		case best < 0 || a < best:
			pick, best, ties = w, a, 1
		case a == best:
			ties++
			if rep.rng.IntN(ties) == 0 {
				pick = w
			}
		}
	}
	return pick
}

// afterCore settles what a call into replica r's Core decided, then
// re-arms its wake-up for due times.
func (s *simulation) afterCore(r int) {
	// settle may call into a Core again (Ack, Finish), which can decide
	// more: the loop picks those up too.
	for i := 0; i < len(s.outcomes); i++ {
		s.settle(s.outcomes[i])
	}
	clear(s.outcomes)
	s.outcomes = s.outcomes[:0]
	queued := 0
	for i := range s.replicas {
		queued += s.replicas[i].core.Queued()
	}
	s.peakQ = max(s.peakQ, queued)
	rep := &s.replicas[r]
	rep.peakQ = max(rep.peakQ, rep.core.Queued())
	if at, ok := rep.core.NextWake(); ok {
		ns := at.Sub(simEpoch).Nanoseconds()
		if ns < s.clock.now {
			ns = s.clock.now
		}
		if rep.wakeAt < 0 || ns < rep.wakeAt {
			rep.wakeAt = ns
			s.schedule(simEvent{at: ns, kind: evWake, a: r})
		}
	}
}

// settle applies one admission decision: a grant is acknowledged, predicted
// and submitted to its engine; a rejection completes the request.
func (s *simulation) settle(out simOutcome) {
	q := &s.reqs[out.req]
	if out.err != nil {
		s.reject(q, out.err)
		return
	}
	g := out.grant
	w, ok := s.widx[g.Worker]
	if !ok {
		s.reject(q, fmt.Errorf("grant names unknown worker %q", g.Worker))
		return
	}
	rep := &s.replicas[q.admit]
	rep.core.Ack(g.Booking)
	rep.admits++
	s.decided(q, g)
	if g.Disaggregated() {
		s.settlePair(out.req, q, g, w, rep)
		return
	}
	if s.cfg.Fleet.Disaggregated() {
		s.pd.bypassed++
		if g.Decision == scheduler.DecisionPrefillBusy {
			s.pd.overflowed++
		}
	}
	q.worker, q.booking = w, g.Booking
	q.res.Worker = g.Worker
	s.sessionGranted(q, w)
	s.markDirty(q.admit, w)
	wk := &s.workers[w]
	wk.active++
	wk.peak = max(wk.peak, wk.active)
	wk.reqs++
	s.predict(q, g.Worker, w)
	s.tokens = q.tr.AppendTokens(s.tokens[:0], s.cfg.Vocab)
	idx := out.req
	_, err := wk.eng.Submit(&engine.Request{
		ID: "r" + strconv.Itoa(idx), Prompt: s.tokens, MaxTokens: q.tr.OutputLength,
		Priority: q.tr.Priority, OnDelta: func(d engine.Delta) { s.delta(idx, d) },
	})
	if err != nil {
		// The engine refused (too long for its model length or pool): the
		// booking ends at once, like a worker's 400 before the first byte.
		wk.active--
		rep.core.Finish(g.Booking)
		s.markDirty(q.admit, w)
		q.res.Outcome, q.res.HTTPStatus, q.res.ErrorCode, q.res.Error = OutcomeHTTPError, 400, "engine_rejected", err.Error()
		s.finishRequest(q)
		return
	}
	if !wk.busy {
		s.ensureStep(w, s.clock.now)
	}
}

// predict records the routing decision's predicted prefix on worker w.
func (s *simulation) predict(q *simRequest, worker string, w int) {
	if s.cfg.Policy == SimKVAware && len(q.hashes) > 0 {
		entry := &s.replicas[q.entry]
		exp := s.clock.Now().Add(s.cfg.PredictTTL)
		_ = entry.index.PredictUntil(worker, q.hashes, exp)
		if s.cfg.Gossip && len(s.replicas) > 1 {
			s.schedule(simEvent{at: s.clock.now + int64(s.cfg.GossipDelay), kind: evPredict, a: q.entry, b: w, hashes: q.hashes, exp: exp.UnixNano()})
		}
	}
}

func (s *simulation) reject(q *simRequest, err error) {
	q.res.Outcome = OutcomeHTTPError
	q.res.Error = err.Error()
	switch scheduler.ReasonOf(err) {
	case scheduler.ReasonDueTimePassed:
		q.res.HTTPStatus, q.res.ErrorCode = 429, "deadline_exceeded"
	case scheduler.ReasonQueueFull:
		q.res.HTTPStatus, q.res.ErrorCode = 429, "queue_full"
	case scheduler.ReasonNoEndpoints:
		q.res.HTTPStatus, q.res.ErrorCode = 503, "no_endpoints"
	default:
		q.res.HTTPStatus, q.res.ErrorCode = 400, scheduler.ReasonOf(err).String()
	}
	s.finishRequest(q)
}

func (s *simulation) finishRequest(q *simRequest) {
	q.done = true
	q.res.DeadlineMissed = q.due > 0 && (q.res.ErrorCode == "deadline_exceeded" ||
		(q.res.Outcome == OutcomeOK && q.firstAt > q.due))
	q.hashes = nil // the ledger and index keep their own references as long as needed
}

// ---------------------------------------------------------------- engines

func (s *simulation) ensureStep(w int, at int64) {
	wk := &s.workers[w]
	if wk.stepAt >= 0 && wk.stepAt <= at {
		return
	}
	wk.stepAt = at
	s.schedule(simEvent{at: at, kind: evStep, a: w})
}

func (s *simulation) step(e simEvent) {
	wk := &s.workers[e.a]
	if wk.stepAt != e.at {
		return // superseded
	}
	wk.stepAt = -1
	next := wk.eng.Step(s.clock.Now())
	wk.busy = !next.IsZero()
	if wk.busy {
		s.ensureStep(e.a, max(next.Sub(simEpoch).Nanoseconds(), s.clock.now))
	}
	// Apply the marks delivered during Step, in delivery order.
	for i := 0; i < len(s.marks); i++ {
		m := s.marks[i]
		if m.prefilled {
			s.prefilled(m)
			continue
		}
		q := &s.reqs[m.req]
		rep := &s.replicas[q.admit]
		if m.first {
			rep.core.FirstToken(q.booking)
		} else {
			s.workers[q.worker].active--
			rep.core.Finish(q.booking)
		}
		s.markDirty(q.admit, q.worker)
		s.afterCore(q.admit)
	}
	s.marks = s.marks[:0]
}

// delta records one engine delivery. It runs inside Engine.Step with the
// engine's lock held: it only records, and leaves Core calls to step.
func (s *simulation) delta(i int, d engine.Delta) {
	q := &s.reqs[i]
	at := d.Time.Sub(simEpoch).Nanoseconds()
	if d.HasToken {
		q.res.Chunks++
		q.res.CompletionTokens++
		if q.res.Chunks == 1 {
			q.firstAt = at
			q.res.TTFT = time.Duration(at - q.arrival)
			q.itl = make([]time.Duration, 0, max(0, q.tr.OutputLength-1))
			s.marks = append(s.marks, simMark{req: i, first: true})
		} else {
			q.itl = append(q.itl, time.Duration(at-q.lastAt))
		}
		q.lastAt = at
	}
	if d.Finish == 0 {
		return
	}
	cached := d.CachedTokens
	if q.pair != nil { // the prompt was the prefill engine's
		cached = q.pair.cached
	}
	q.res.PromptTokens, q.res.CachedTokens = d.PromptTokens, cached
	q.host, q.disk = d.HostCachedTokens, d.DiskCachedTokens
	s.realised(q, cached)
	q.res.E2E = time.Duration(at - q.arrival)
	q.res.ITL = q.itl
	if d.Finish == engine.FinishLength {
		q.res.Outcome = OutcomeOK
	} else {
		q.res.Outcome, q.res.ErrorCode = OutcomeStreamError, d.Finish.String()
	}
	s.marks = append(s.marks, simMark{req: i})
	s.finishRequest(q)
}

// ---------------------------------------------------------------- KV events

func (s *simulation) deliverKV(e simEvent) {
	if s.cfg.MeasureIngest {
		s.ingest.count(e.batch)
		t0 := threadCPU()
		defer func() { s.ingest.cpu += threadCPU() - t0 }()
	}
	for r := range s.replicas {
		o, err := s.replicas[r].index.ApplyBatch(e.batch)
		if err != nil {
			s.log.Warn("kv batch rejected", zap.String("replica", s.replicas[r].id), zap.Error(err))
			continue
		}
		if o == kvindex.OutcomeResync {
			if e.batch.Worker != s.workers[e.a].id {
				// A tier's stream (host or disk) has no dump: its batches arrive in
				// order and complete, so a resync is a simulator bug.
				s.log.Warn("host tier stream resync", zap.String("stream", e.batch.Worker))
				s.tierResyncs++
				continue
			}
			s.requestDump(r, e.a)
		}
	}
}

// requestDump answers an index's resync with the engine's dump as of now,
// arriving one event delay later: batches emitted before now arrive first
// and are buffered (the replay skips them), later ones continue the stream.
func (s *simulation) requestDump(r, w int) {
	wk := &s.workers[w]
	wk.resyncs++
	d := wk.eng.Dump()
	s.schedule(simEvent{at: s.clock.now + int64(s.cfg.EventDelay), kind: evDump, a: r, b: w,
		dump: &kvindex.Dump{Worker: d.Worker, Instance: d.Instance, AsOfID: d.AsOfID, Hashes: d.Hashes}})
}

func (s *simulation) applyDump(e simEvent) {
	if s.replicas[e.a].index.ApplyDump(e.dump) == kvindex.OutcomeResync {
		s.requestDump(e.a, e.b)
	}
}

// ---------------------------------------------------------------- gossip

// markDirty notes that replica r's booked load on worker w changed; the
// event loop gossips it once per event (publishDirty).
func (s *simulation) markDirty(r, w int) {
	if s.gossip == nil || len(s.replicas) == 1 {
		return
	}
	k := r*len(s.workers) + w
	if s.dirtyAt[k] == s.dirtyGen {
		return
	}
	s.dirtyAt[k] = s.dirtyGen
	s.dirty = append(s.dirty, int64(r)<<32|int64(w))
}

// publishDirty gossips every changed (replica, worker) load. With no gossip
// delay an update applies at once and may admit more (and so dirty more):
// it loops until nothing changed.
func (s *simulation) publishDirty() {
	if s.cfg.GossipRound > 0 {
		if len(s.dirty) > 0 && s.roundAt < 0 {
			r := int64(s.cfg.GossipRound)
			s.roundAt = (s.clock.now/r + 1) * r
			s.schedule(simEvent{at: s.roundAt, kind: evRound})
		}
		return
	}
	for len(s.dirty) > 0 {
		batch := s.dirty
		s.dirty = s.spare[:0]
		s.dirtyGen++
		for _, k := range batch {
			r, w := int(k>>32), int(k&0xffffffff)
			load := s.replicas[r].core.Load(s.workers[w].id)
			e := simEvent{at: s.clock.now + int64(s.cfg.GossipDelay), kind: evLoad, a: r, b: w, load: load}
			if s.cfg.GossipDelay == 0 {
				s.applyLoad(e)
				continue
			}
			s.schedule(e)
		}
		s.spare = batch[:0]
	}
}

// applyLoad installs a gossiped load and tells every other replica, as a
// live replica drains its actor after each gossip round: replicas with a
// backlog re-evaluate their queues (capacity elsewhere may have been
// freed), the others note when their view changed (the herd count).
func (s *simulation) applyLoad(e simEvent) {
	s.setLoad(e.a, e.b, e.load)
	s.gossipVer++
	for r := range s.replicas {
		if r == e.a {
			continue
		}
		s.replicas[r].core.Drain()
		s.afterCore(r)
	}
}

func (s *simulation) applyPredict(e simEvent) {
	exp := time.Unix(0, e.exp)
	for r := range s.replicas {
		if r != e.a {
			_ = s.replicas[r].index.PredictUntil(s.workers[e.b].id, e.hashes, exp)
		}
	}
}

// setLoad installs origin's gossiped load on worker w.
func (s *simulation) setLoad(origin, w int, l scheduler.WorkerLoad) {
	s.gossipSum[w] = subLoad(s.gossipSum[w], s.gossip[origin][w]).Add(l)
	s.gossip[origin][w] = l
}

// endRound is the end of a gossip round (SimConfig.GossipRound): the loads
// that changed in it, read now, go out as one update that every replica
// receives GossipDelay later, as a live replica coalesces its changes into
// one broadcast per gossip interval.
func (s *simulation) endRound() {
	s.roundAt = -1
	if len(s.dirty) == 0 {
		return
	}
	loads := make([]simLoadUpdate, len(s.dirty))
	for i, k := range s.dirty {
		r, w := int(k>>32), int(k&0xffffffff)
		loads[i] = simLoadUpdate{origin: r, worker: w, load: s.replicas[r].core.Load(s.workers[w].id)}
	}
	s.dirty = s.dirty[:0]
	s.dirtyGen++
	s.schedule(simEvent{at: s.clock.now + int64(s.cfg.GossipDelay), kind: evLoads, loads: loads})
}

// applyLoads installs one round's loads, then lets every replica that
// received another origin's load re-evaluate its queues once (applyLoad).
func (s *simulation) applyLoads(loads []simLoadUpdate) {
	origins := -1 // the one origin of every load, or -2 for several
	for _, u := range loads {
		s.setLoad(u.origin, u.worker, u.load)
		switch {
		case origins == -1:
			origins = u.origin
		case origins != u.origin:
			origins = -2
		}
	}
	s.gossipVer++
	for r := range s.replicas {
		if r == origins {
			continue
		}
		s.replicas[r].core.Drain()
		s.afterCore(r)
	}
}
