package scheduler

import (
	"maps"
	"math"
	"sync/atomic"
	"time"
)

// RemoteLoads is a VersionedLoadView that its owner feeds with complete
// snapshots of the other replicas' load (one per gossip round). Store bumps
// the version only when some worker's load changed, so between changes the
// Core keeps its cached remote loads and its blocked-class memo, and a
// selection over many workers makes no interface calls. Safe for concurrent
// use: Store from one goroutine, reads from the actor.
type RemoteLoads struct {
	cur atomic.Pointer[remoteLoadsSnap]
	// MaxEngineAge, in ns, bounds an engine report's age (EngineMaxAge;
	// 0: DefaultEngineMaxAge).
	MaxEngineAge atomic.Int64
}

type remoteLoadsSnap struct {
	version uint64
	loads   map[string]WorkerLoad // zero loads are left out
	engine  map[string]EngineLoad
}

// Store installs loads (copied; workers missing from it carry no remote
// load) and reports whether anything changed.
func (v *RemoteLoads) Store(loads map[string]WorkerLoad) bool {
	next := make(map[string]WorkerLoad, len(loads))
	for w, l := range loads {
		if l != (WorkerLoad{}) {
			next[w] = l
		}
	}
	old := v.cur.Load()
	var ver uint64
	var engine map[string]EngineLoad
	if old != nil {
		if maps.Equal(old.loads, next) {
			return false
		}
		ver, engine = old.version, old.engine
	}
	v.cur.Store(&remoteLoadsSnap{version: ver + 1, loads: next, engine: engine})
	return true
}

// RemoteLoad is worker's load booked by other replicas, as last stored.
func (v *RemoteLoads) RemoteLoad(worker string) WorkerLoad {
	if s := v.cur.Load(); s != nil {
		return s.loads[worker]
	}
	return WorkerLoad{}
}

// LoadVersion changes with every Store that changed a load.
func (v *RemoteLoads) LoadVersion() uint64 {
	if s := v.cur.Load(); s != nil {
		return s.version
	}
	return 0
}

// EngineLoad is what a worker's engine last reported about itself (its
// adapter's load report): requests running and waiting in the engine and
// the share of its KV pool in use. It counts work no router booked: other
// routers' or direct traffic, and requests running past their prediction.
type EngineLoad struct {
	Running int
	Waiting int
	KVUsage float64   // used blocks / pool, 0..1
	At      time.Time // when the report arrived (the router's clock)
}

// EngineLoadView is a LoadView that also carries the engines' own reports.
// The Core reads them when the view's version changes and whenever a report
// it uses grows older than EngineMaxAge, after which it is ignored.
type EngineLoadView interface {
	EngineLoad(worker string) (EngineLoad, bool)
	// EngineMaxAge is how old a report may be and still count.
	EngineMaxAge() time.Duration
}

// DefaultEngineMaxAge bounds a report's age when RemoteLoads.MaxEngineAge
// is unset: adapters report once per engine scrape (1 s by default), so
// two seconds is one late report, and a worker whose reports stop is not
// held busy by its last one for longer.
const DefaultEngineMaxAge = 2 * time.Second

// StoreEngine installs the engines' reports (copied; workers missing from
// it have none) and reports whether anything changed.
func (v *RemoteLoads) StoreEngine(loads map[string]EngineLoad) bool {
	next := maps.Clone(loads)
	old := v.cur.Load()
	var ver uint64
	var remote map[string]WorkerLoad
	if old != nil {
		if maps.EqualFunc(old.engine, next, func(a, b EngineLoad) bool {
			return a.Running == b.Running && a.Waiting == b.Waiting && a.KVUsage == b.KVUsage && a.At.Equal(b.At)
		}) {
			return false
		}
		ver, remote = old.version, old.loads
	}
	v.cur.Store(&remoteLoadsSnap{version: ver + 1, loads: remote, engine: next})
	return true
}

// EngineLoad is worker's last stored engine report.
func (v *RemoteLoads) EngineLoad(worker string) (EngineLoad, bool) {
	if s := v.cur.Load(); s != nil {
		l, ok := s.engine[worker]
		return l, ok
	}
	return EngineLoad{}, false
}

// EngineMaxAge is MaxEngineAge, or DefaultEngineMaxAge when unset.
func (v *RemoteLoads) EngineMaxAge() time.Duration {
	if a := v.MaxEngineAge.Load(); a > 0 {
		return time.Duration(a)
	}
	return DefaultEngineMaxAge
}

// engineSlot is a worker's engine-reported load in the ledger's terms,
// while its report is fresh; the zero value when it has none, it is stale,
// or it reports nothing at all.
//
// The selector prices a worker by the larger of what the routers booked
// and what its engine reports (costLoad), term by term: a report never
// lowers the booked load (the engine may not have seen the latest grants
// yet), but it raises it by the work no router booked. Eligibility
// (MaxRunning, the classes' busy thresholds) stays on the booked load: a
// report cannot make a request wait, only steer it.
type engineSlot struct {
	on      bool
	active  int // running + waiting: the ledger's ActiveRequests
	prefill int // waiting requests × tokens per waiting request
	blocks  int // KV usage × the worker's pool
}

// engineState is the Core's side of the engine reports.
type engineState struct {
	// next is the soonest a used report goes stale (unix ns; 0: none in
	// use): refreshRemote re-reads every worker's report then, so a stale
	// report stops counting without waiting for a new version.
	next int64
	// tokens is the mean uncached prompt of the requests this Core booked
	// (smoothed): what one waiting request in an engine's queue stands for.
	tokens float64
}

// defaultWaitingTokens stands for a waiting request before this Core has
// booked any.
const defaultWaitingTokens = 1024

// noteBooked folds a booked request's uncached prompt tokens into the mean.
func (e *engineState) noteBooked(tokens int) {
	if e.tokens == 0 {
		e.tokens = float64(max(1, tokens))
		return
	}
	e.tokens += (float64(max(1, tokens)) - e.tokens) / loadSmoothing
}

// engineFor is worker s's engine slot from report l at now, and when it
// goes stale (0 when it is off).
func (c *Core) engineFor(s *workerSlot, l EngineLoad, ok bool, now, maxAge int64) (engineSlot, int64) {
	if !ok || l.At.IsZero() {
		return engineSlot{}, 0
	}
	exp := l.At.UnixNano() + maxAge
	if exp <= now {
		return engineSlot{}, 0
	}
	tokens := c.eng.tokens
	if tokens <= 0 {
		tokens = defaultWaitingTokens
	}
	run, wait := max(0, l.Running), max(0, l.Waiting)
	e := engineSlot{active: run + wait, prefill: int(min(float64(wait)*tokens, math.MaxInt32))}
	if u := l.KVUsage; s.kvBlocks > 0 && u > 0 && !math.IsNaN(u) {
		e.blocks = int(min(u, 1) * float64(s.kvBlocks))
	}
	if e == (engineSlot{}) {
		return e, 0 // an idle engine adds nothing to any booking
	}
	e.on = true
	return e, exp
}

// costLoad is the load the selector prices s at: projectLoad, raised term
// by term to the engine's fresh report (engineSlot).
func (s *workerSlot) costLoad() WorkerLoad {
	l := s.projectLoad()
	if e := &s.engine; e.on {
		l.ActiveRequests = max(l.ActiveRequests, e.active)
		l.PrefillTokens = max(l.PrefillTokens, e.prefill)
		l.DecodeBlocks = max(l.DecodeBlocks, e.blocks)
	}
	return l
}

// engineRaises reports whether s's engine report raises its decode blocks
// above the booked ones: its KV then holds blocks of requests this ledger
// does not know, which may be the prompt's own cached prefix.
func (s *workerSlot) engineRaises() bool {
	return s.engine.on && s.engine.blocks > s.projectLoad().DecodeBlocks
}
