package bench

import (
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The deterministic cluster simulator (design §11): the real scheduler Core,
// kvindex.Index and engine.Engine code in one process under virtual time.
// sim.go holds its configuration, sim_run.go the event loop, sim_report.go
// the per-run report and sim_cli.go the `switchyard bench --sim` front end.

// SimPolicy is how a router picks the worker of a request. Values start at 1.
type SimPolicy int

const (
	// SimKVAware is Switchyard's selector: the scheduler Core's cost with
	// prefix overlap from the replica's KV index.
	SimKVAware SimPolicy = iota + 1
	// SimRoundRobin cycles over the workers (per admitting replica).
	SimRoundRobin
	// SimRandom picks a worker uniformly at random.
	SimRandom
	// SimLeastLoaded picks the worker with the fewest active requests as the
	// admitting replica sees them (its own bookings plus gossiped ones).
	SimLeastLoaded
)

var simPolicyNames = [...]string{
	SimKVAware:     "kv-aware",
	SimRoundRobin:  "round-robin",
	SimRandom:      "random",
	SimLeastLoaded: "least-loaded",
}

func (p SimPolicy) String() string {
	if p >= SimKVAware && int(p) < len(simPolicyNames) {
		return simPolicyNames[p]
	}
	return fmt.Sprintf("SimPolicy(%d)", int(p))
}

// ParseSimPolicy accepts the String names and the short forms kv, rr, ll.
func ParseSimPolicy(s string) (SimPolicy, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "kv", "kv-aware":
		return SimKVAware, nil
	case "rr", "round-robin":
		return SimRoundRobin, nil
	case "random":
		return SimRandom, nil
	case "ll", "least-loaded":
		return SimLeastLoaded, nil
	}
	return 0, fmt.Errorf("%w: sim policy %q: want kv, round-robin, random or least-loaded", ErrInvalidConfig, s)
}

// SimAdmission is where a request is admitted. Values start at 1.
type SimAdmission int

const (
	// SimCluster is Switchyard: each class is owned by one replica, whose
	// Core admits every request of the class, whichever replica it entered.
	SimCluster SimAdmission = iota + 1
	// SimPerReplica is what the peer routers do: every replica admits its
	// own share of every class with its own queues.
	SimPerReplica
)

func (a SimAdmission) String() string {
	switch a {
	case SimCluster:
		return "cluster"
	case SimPerReplica:
		return "per-replica"
	}
	return fmt.Sprintf("SimAdmission(%d)", int(a))
}

// ParseSimAdmission accepts "cluster" and "per-replica".
func ParseSimAdmission(s string) (SimAdmission, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "cluster":
		return SimCluster, nil
	case "per-replica", "replica":
		return SimPerReplica, nil
	}
	return 0, fmt.Errorf("%w: sim admission %q: want cluster or per-replica", ErrInvalidConfig, s)
}

// SimClassTemplate configures every admission class of a simulated run (one
// class per distinct trace class, or one in all when SingleClass is set).
type SimClassTemplate struct {
	Policy             scheduler.Policy
	Quantum            int64
	Limits             scheduler.Limits
	BusyPrefillTokens  int
	BusyDecodeFraction float64
}

// SimConfig configures one simulated run.
type SimConfig struct {
	// Label names the run in reports.
	Label string
	// Seed drives every random choice (selector ties, the random policy):
	// equal configs and traces give byte-identical reports.
	Seed uint64
	// Replicas and Workers size the simulated cluster.
	Replicas int
	Workers  int
	Policy   SimPolicy
	// Admission places admission (class owners or per-replica queues).
	Admission SimAdmission
	// Gossip shares booked loads, routing predictions and session records
	// between replicas after GossipDelay. Off, each replica sees only its own bookings and
	// predictions (KV events still reach every replica: every replica
	// subscribes to every worker's events).
	Gossip      bool
	GossipDelay time.Duration
	// GossipRound > 0 coalesces load changes into one update per round
	// (the live gossip's Interval): the loads that changed go out at the
	// round's end, read then, and reach every replica GossipDelay later as
	// one update. 0 gossips each change on its own, GossipDelay after the
	// event that made it.
	GossipRound time.Duration
	// EventDelay is how long a KV event batch takes from an engine to every
	// replica's index (NATS).
	EventDelay time.Duration
	// PredictTTL is the lifetime of a routing decision's predicted prefix.
	PredictTTL time.Duration
	// IndexSample is every replica's index sampling rate
	// (kvindex.Config.Sample; 0 or 1: every block).
	IndexSample int
	// TimeScale divides trace arrival offsets (the live runner's --speedup).
	TimeScale float64
	// ArrivalSpread is the trace option --arrival-spread the requests were
	// read with (SpreadArrivals), carried into the report.
	ArrivalSpread time.Duration
	// MaxRequests stops after this many trace requests (0: all).
	MaxRequests int
	// Vocab bounds synthesized prompt tokens (as the live runner sends them).
	Vocab Vocab
	// MaxRunning is the router-side cap of concurrent requests per worker
	// (scheduler.Worker.MaxRunning); 0 uses the engine's MaxNumSeqs, as a
	// live replica does. A small cap makes the routers, not the engines,
	// hold the queue, so admission order matters.
	MaxRunning int
	// SingleClass admits every request in one class (DefaultClass), keeping
	// each request's priority and deadline; reports still group by the
	// trace's class.
	SingleClass bool
	// SplitClasses > 0 spreads requests without a class over that many
	// classes (by trace index), so that several replicas own classes and
	// book load: a trace without classes otherwise has one owner.
	SplitClasses int
	// IgnoreDeadlines hands no due time to the scheduler (plain FCFS, no
	// expiry); deadline misses are still measured at the first token.
	IgnoreDeadlines bool
	// DueMargin is subtracted from a deadline to form the due time handed
	// to the scheduler: admission must leave room for the prefill, or an
	// admitted request still misses its first-token deadline. It stands in
	// for the deadline-miss predictor the design reserves (predicted_miss).
	DueMargin time.Duration
	// DefaultClass names requests without a class.
	DefaultClass string
	Class        SimClassTemplate
	Scheduler    scheduler.Config
	// Engine is every worker's engine configuration (WorkerID, Instance,
	// Seed and Events are set per worker).
	Engine engine.Config
	// EngineSpeedups, when set, overrides Engine.Speedup per worker: worker
	// i runs at EngineSpeedups[i mod len], a heterogeneous fleet (the
	// routers are not told; the ttft selector calibrates to it).
	EngineSpeedups []float64
	// Sessions turns session affinity on (sim_sessions.go): a turn prefers
	// its session's previous worker, as the entry replica's session table
	// (gossiped after GossipDelay) knows it, while that worker's cost is
	// within SessionMargin of the best. SessionTTL is a table entry's life.
	Sessions      bool
	SessionMargin float64
	SessionTTL    time.Duration
	// Fleet makes the run disaggregated (sim_pd.go): Fleet.Prefill prefill
	// and Fleet.Decode decode workers (their sum is Workers); the zero
	// value is an aggregated fleet. Decider on leaves the choice to the
	// Core's decider (a short uncached prefill runs aggregated on a decode
	// or prefill worker the selector picks); off sets its threshold to 1:
	// every request runs as a pair.
	Fleet   SimFleet
	Decider bool
	// SLO is the goodput objective the report counts requests against.
	SLO SimSLO
	// KVTap, when set, also receives every KV event batch an engine
	// publishes, when it publishes it (the scale report derives event
	// rates and batch shapes from them). It may keep the batch and must
	// not modify it.
	KVTap func(*wire.KVEventBatch)
	// MeasureIngest accounts the thread CPU time every replica's index
	// spends applying KV event batches (SimReport.Ingest). The caller
	// locks its goroutine to its OS thread for the run.
	MeasureIngest bool
}

// DefaultSimConfig returns one replica in front of eight workers with the
// KV-aware policy, 5 ms gossip and event delays and a KV pool of one
// Mooncake "worker's worth" (1,700 blocks of 512 tokens, as 16-token blocks).
func DefaultSimConfig() SimConfig {
	sc := scheduler.DefaultConfig()
	// The simulator defaults to the TTFT selector (docs/benchmarks.md §7);
	// live routers keep block counts until the TTFT model's calibration
	// separates fixed hand-off overhead from engine time (see there).
	sc.Selector = scheduler.SelectorTTFT
	// Lifecycle marks are never lost in the simulator: bookings must not
	// expire under long generations.
	sc.BookingExpiry = 1000 * time.Hour
	ec := engine.DefaultConfig()
	ec.NumBlocks = 1700 * 512 / ec.BlockSize
	ec.MaxModelLen = 1 << 18 // the longest Mooncake prompt is ~126k tokens
	return SimConfig{
		Label:         "sim",
		Seed:          1,
		Replicas:      1,
		Workers:       8,
		Policy:        SimKVAware,
		Admission:     SimCluster,
		Gossip:        true,
		GossipDelay:   5 * time.Millisecond,
		EventDelay:    5 * time.Millisecond,
		PredictTTL:    5 * time.Second,
		TimeScale:     1,
		SessionMargin: 0.5,
		SessionTTL:    10 * time.Minute,
		Vocab:         DefaultVocab(),
		DefaultClass:  "default",
		Class: SimClassTemplate{
			Policy:  scheduler.PolicyFCFS,
			Quantum: 2048,
			Limits:  scheduler.Limits{Requests: scheduler.Unlimited, ISLTokens: scheduler.Unlimited, CachedTokens: scheduler.Unlimited},
		},
		Scheduler: sc,
		Engine:    ec,
		SLO:       DefaultSimSLO(),
	}
}

// maxSimNodes bounds replicas and workers: every replica's index interns
// a worker's three streams (engine, host and disk tiers) to 16-bit ids, so
// 3 × 20,000 stays below kvindex's 65,534.
const maxSimNodes = 20_000

// Validate names the first bad field.
func (c SimConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: sim %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case c.Replicas < 1 || c.Replicas > maxSimNodes:
		return bad("replicas %d outside [1, %d]", c.Replicas, maxSimNodes)
	case c.Workers < 1 || c.Workers > maxSimNodes:
		return bad("workers %d outside [1, %d]", c.Workers, maxSimNodes)
	case c.IndexSample < 0 || c.IndexSample > kvindex.MaxSample:
		return bad("index sample %d outside [0, %d]", c.IndexSample, kvindex.MaxSample)
	case c.Policy < SimKVAware || c.Policy > SimLeastLoaded:
		return bad("policy %d is not one of kv-aware, round-robin, random, least-loaded", int(c.Policy))
	case c.Admission != SimCluster && c.Admission != SimPerReplica:
		return bad("admission %d is not cluster or per-replica", int(c.Admission))
	case c.GossipDelay < 0:
		return bad("gossip_delay %v must not be negative", c.GossipDelay)
	case c.GossipRound < 0:
		return bad("gossip_round %v must not be negative", c.GossipRound)
	case c.EventDelay < 0:
		return bad("event_delay %v must not be negative", c.EventDelay)
	case !(c.SessionMargin >= 0) || math.IsInf(c.SessionMargin, 0):
		return bad("session_margin %v must be a finite number >= 0", c.SessionMargin)
	case c.Sessions && c.SessionTTL <= 0:
		return bad("session_ttl %v must be positive with sessions", c.SessionTTL)
	case c.PredictTTL <= 0:
		return bad("predict_ttl %v must be positive", c.PredictTTL)
	case !(c.TimeScale > 0) || math.IsInf(c.TimeScale, 0):
		return bad("time_scale %v must be positive and finite", c.TimeScale)
	case c.MaxRequests < 0:
		return bad("max_requests %d must not be negative", c.MaxRequests)
	case c.DueMargin < 0:
		return bad("due_margin %v must not be negative", c.DueMargin)
	case c.SplitClasses < 0:
		return bad("split_classes %d must not be negative", c.SplitClasses)
	case c.MaxRunning < 0:
		return bad("max_running %d must not be negative", c.MaxRunning)
	case c.DefaultClass == "":
		return bad("default_class is empty")
	case c.Fleet.Prefill < 0 || c.Fleet.Decode < 0 || (c.Fleet.Prefill+c.Fleet.Decode > 0 &&
		(c.Fleet.Prefill == 0 || c.Fleet.Decode == 0 || c.Fleet.Prefill+c.Fleet.Decode != c.Workers)):
		return bad("fleet %s must have both roles and %d workers in all", c.Fleet, c.Workers)
	case c.SLO.TTFT <= 0 || c.SLO.ITL <= 0:
		return bad("slo ttft %v and itl %v must be positive", c.SLO.TTFT, c.SLO.ITL)
	}
	for i, sp := range c.EngineSpeedups {
		if !(sp > 0) || sp > 1e9 {
			return bad("engine_speedups[%d] %v must be positive", i, sp)
		}
	}
	if err := c.Vocab.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	cls := c.classConfig(c.DefaultClass)
	if err := cls.Validate(); err != nil {
		return bad("class template: %v", err)
	}
	if err := c.Scheduler.Validate(); err != nil {
		return bad("scheduler: %v", err)
	}
	ec := c.Engine
	if err := ec.Validate(); err != nil {
		return bad("engine: %v", err)
	}
	return nil
}

// classConfig is the scheduler class config of one class name.
func (c SimConfig) classConfig(name string) scheduler.ClassConfig {
	return scheduler.ClassConfig{
		Name: name, Quantum: c.Class.Quantum, Policy: c.Class.Policy, Limits: c.Class.Limits,
		BusyPrefillTokens: c.Class.BusyPrefillTokens, BusyDecodeFraction: c.Class.BusyDecodeFraction,
	}
}

// maxRunning is the effective router-side cap per worker.
func (c SimConfig) maxRunning() int {
	if c.MaxRunning > 0 {
		return c.MaxRunning
	}
	return c.Engine.MaxNumSeqs
}
