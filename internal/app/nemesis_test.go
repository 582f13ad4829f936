package app

// The nemesis: a randomized fault test of cluster-wide admission.
// In one process, on embedded etcd and NATS, memberlist on loopback, real
// HTTP and the real simulated engine: 5 router replicas, 8 workers, 3
// classes. An open-loop load generator sends to every replica whatever
// state it is in, while the nemesis injects faults at random; after the run
// quiesces a checker asserts the admission invariants (nemesis_check_test.go).
// The fault schedule and the load are derived from the seed, so
//
//	go test ./internal/app/ -run TestNemesis -nemesis.seed N
//
// replays seed N (as exactly as the Go scheduler and the wall clock allow).
// docs/testing.md describes the flags, the faults and the invariants.

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

var (
	nemesisSeed     = flag.Uint64("nemesis.seed", 0, "nemesis: replay this one seed (0: run the -nemesis.seeds set)")
	nemesisSeeds    = flag.String("nemesis.seeds", nemesisCISeeds, "nemesis: the seeds run when -nemesis.seed is 0 (empty: skip)")
	nemesisDuration = flag.Duration("nemesis.duration", 20*time.Second, "nemesis: load and fault time per seed")
	nemesisFaults   = flag.String("nemesis.faults", strings.Join(nemesisCIFaults, ","), "nemesis: fault kinds to inject, comma-separated, or 'all'")
	nemesisRate     = flag.Float64("nemesis.rate", 12, "nemesis: requests per second, open loop over every replica")
	nemesisFaultGap = flag.Duration("nemesis.fault-gap", 2500*time.Millisecond, "nemesis: mean time between two fault injections")
	nemesisProgress = flag.Duration("nemesis.progress", 0, "nemesis: print a progress line this often (0: never)")
	nemesisAck      = flag.Duration("nemesis.ack-timeout", 0, "nemesis: the owners' AckTimeout (0: the booking expiry, 5 s)")
	nemesisLog      = flag.String("nemesis.log", "", "nemesis: replicas' and workers' log level into the test log (empty: no logs)")
)

// nemesisCISeeds are the seeds `go test ./...` (make test) runs with every
// fault kind, 20 s each (about 3 minutes under -race); empty would skip
// TestNemesis there. `make nemesis-ci` runs the same seeds alone.
const nemesisCISeeds = "1,2,3"

// Fault kinds. Restart is injected by the kinds that stop a replica: it
// comes back under the same id (a StatefulSet's pod), on the same address.
const (
	faultCrash         = "crash"          // stop without goodbye: etcd and NATS cut first, then stopped
	faultRestart       = "restart"        // start again under the same id
	faultGraceful      = "graceful_stop"  // context cancelled while load keeps flowing to it
	faultNATSCut       = "nats_cut"       // its NATS connection cut, later restored
	faultEtcdRestart   = "etcd_restart"   // etcd stopped and started at once
	faultSession       = "session_expiry" // its etcd connection cut past the session TTL
	faultEtcdOutage    = "etcd_outage"    // etcd down for three session TTLs
	faultSlowActor     = "slow_actor"     // its admission actor's turns take 20-80 ms
	faultClockSkew     = "clock_skew"     // its admission clock ±500 ms
	faultLifeDrop      = "life_drop"      // half its life marks lost
	faultLifeDuplicate = "life_duplicate" // half its life marks sent twice

	// One-sided faults (nemesis_onesided_test.go): a replica loses one link
	// and keeps the others.
	faultOwnerNATSCut = "owner_nats_cut" // a class owner's NATS cut longer than NoOwnerTimeout
	faultEntryNATSCut = "entry_nats_cut" // an entry's NATS cut longer than the booking expiry, streams in flight
	faultEtcdCutOne   = "etcd_cut_one"   // etcd unreachable from one replica, 0.3-2 session TTLs
	faultGossipCutOne = "gossip_cut_one" // gossip cut from one replica, both ways
)

// nemesisAllFaults is every kind the harness injects; nemesisCIFaults is
// the set the CI seeds inject: every kind, now that the lame duck, the
// regranting session and the lost life mark are handled (docs/testing.md).
var (
	nemesisAllFaults = []string{faultCrash, faultGraceful, faultNATSCut, faultEtcdRestart, faultSession, faultEtcdOutage,
		faultSlowActor, faultClockSkew, faultLifeDrop, faultLifeDuplicate,
		faultOwnerNATSCut, faultEntryNATSCut, faultEtcdCutOne, faultGossipCutOne}
	nemesisCIFaults = nemesisAllFaults
	// nemesisOneSided are scheduled first, once each, when they are among
	// the kinds: a 20 s CI seed injects about eight faults of fifteen kinds,
	// and these must be in every CI run.
	nemesisOneSided = []string{faultOwnerNATSCut, faultEntryNATSCut, faultEtcdCutOne, faultGossipCutOne}
)

// The cluster under test.
const (
	nemesisReplicas = 5
	nemesisWorkers  = 8
	nemesisCap      = 2               // max_num_seqs of every worker: the per-worker cap the routers book against
	nemesisTTL      = 5 * time.Second // an etcd restart (about 1-2 s) stays inside it
	nemesisMaxDown  = 2               // replicas down at once, at most
	// nemesisNoOwner is the admission client's NoOwnerTimeout and
	// nemesisExpiry the owners' booking expiry: owner_nats_cut and
	// entry_nats_cut last longer than them.
	nemesisNoOwner = 10 * time.Second
	nemesisExpiry  = 5 * time.Second
)

// nemesisClass is one policy class and the workers its requests may use.
// The classes split the workers, so each worker is booked by one owner and
// its cap is exact (across owners it is as fresh as gossip, design §4).
type nemesisClass struct {
	name    string
	weight  float64
	limit   int // limits.requests: queued requests per allowed worker
	workers []string
}

var nemesisClasses = []nemesisClass{
	{name: "gold", weight: 0.45, limit: 2, workers: []string{"w1", "w2", "w3"}},
	{name: "silver", weight: 0.35, limit: 2, workers: []string{"w4", "w5", "w6"}},
	{name: "bronze", weight: 0.20, limit: 3, workers: []string{"w7", "w8"}},
}

var nemesisPolicy = []byte(`default_class: gold
classes:
  - name: gold
    policy: fcfs
    quantum: 1024
    priority: 1
    limits: {requests: 2}
  - name: silver
    policy: wspt
    quantum: 512
    limits: {requests: 2}
  - name: bronze
    policy: lcfs
    quantum: 1024
    priority: 2
    deadline_ms: 4000
    limits: {requests: 3}
`)

func TestNemesis(t *testing.T) {
	kinds, err := parseFaultKinds(*nemesisFaults)
	if err != nil {
		t.Fatal(err)
	}
	seeds := []uint64{*nemesisSeed}
	if *nemesisSeed == 0 && strings.TrimSpace(*nemesisSeeds) == "" {
		t.Skip("no nemesis seeds (-nemesis.seeds is empty)")
	}
	if *nemesisSeed == 0 {
		seeds = nil
		for _, s := range strings.Split(*nemesisSeeds, ",") {
			n, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil || n == 0 {
				t.Fatalf("-nemesis.seeds: %q is not a positive integer", s)
			}
			seeds = append(seeds, n)
		}
	}
	for _, seed := range seeds {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			res := runNemesis(t, seed, kinds, *nemesisDuration)
			t.Log("\n" + res.table())
			if *nemesisProgress > 0 {
				fmt.Fprintln(os.Stderr, res.table())
			}
			for _, name := range res.invariantNames() {
				for _, v := range res.violations[name] {
					t.Errorf("seed %d: invariant %s violated: %s", seed, name, v)
				}
			}
		})
	}
}

func parseFaultKinds(s string) ([]string, error) {
	if s == "all" {
		return nemesisAllFaults, nil
	}
	var out []string
	for _, k := range strings.Split(s, ",") {
		k = strings.TrimSpace(k)
		if k == "" {
			continue
		}
		if !slices.Contains(nemesisAllFaults, k) {
			return nil, fmt.Errorf("-nemesis.faults: unknown kind %q (kinds: %s)", k, strings.Join(nemesisAllFaults, ", "))
		}
		out = append(out, k)
	}
	return out, nil
}

// faultEvent is one scheduled injection.
type faultEvent struct {
	at    time.Duration // after the load started
	kind  string
	slot  int           // the replica, for per-replica kinds
	class int           // owner_nats_cut: the class whose owner (then) is cut
	dur   time.Duration // how long it lasts
	skew  time.Duration // clock_skew
}

// nemesisSchedule derives the faults from the seed: exponential gaps, a
// uniform kind, a replica that has no fault now (and at most nemesisMaxDown
// replicas down at once), one etcd fault at a time. It is a pure function of
// its arguments, and a longer duration extends a shorter one's schedule.
func nemesisSchedule(seed uint64, kinds []string, duration, meanGap time.Duration) []faultEvent {
	if len(kinds) == 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(seed, 0x6e656d65736973))
	var busy [nemesisReplicas]time.Duration // a replica's current fault ends then
	var down [nemesisReplicas]bool
	var etcdBusy, ownerBusy time.Duration
	var out []faultEvent
	var pending []string // one-sided kinds not scheduled yet
	for _, k := range nemesisOneSided {
		if slices.Contains(kinds, k) {
			pending = append(pending, k)
		}
	}
	at := time.Second
	for {
		at += time.Duration(rng.ExpFloat64() * float64(meanGap))
		if at >= duration {
			return out
		}
		ev := faultEvent{at: at, kind: kinds[rng.IntN(len(kinds))], slot: rng.IntN(nemesisReplicas)}
		if len(pending) > 0 {
			ev.kind = pending[rng.IntN(len(pending))]
		}
		ev.class = rng.IntN(len(nemesisClasses))
		u := rng.Float64()
		switch ev.kind {
		case faultOwnerNATSCut:
			ev.dur = nemesisNoOwner + time.Second + time.Duration(u*float64(2*time.Second))
		case faultEntryNATSCut:
			ev.dur = nemesisExpiry + time.Second + time.Duration(u*float64(2*time.Second))
		case faultEtcdCutOne:
			ev.dur = nemesisTTL*3/10 + time.Duration(u*float64(nemesisTTL*17/10))
		case faultGossipCutOne:
			ev.dur = 2*time.Second + time.Duration(u*float64(6*time.Second))
		case faultCrash, faultGraceful:
			ev.dur = 200*time.Millisecond + time.Duration(u*float64(nemesisTTL+time.Second)) // often back before its lease expired
		case faultNATSCut:
			ev.dur = 500*time.Millisecond + time.Duration(u*float64(3*time.Second))
		case faultSession:
			ev.dur = nemesisTTL*3/2 + time.Duration(u*float64(nemesisTTL))
		case faultEtcdRestart:
			ev.dur = 0
		case faultEtcdOutage:
			ev.dur = 3 * nemesisTTL
		default: // slow_actor, clock_skew, life marks
			ev.dur = time.Second + time.Duration(u*float64(3*time.Second))
		}
		if ev.kind == faultClockSkew {
			ev.skew = 500 * time.Millisecond
			if rng.IntN(2) == 0 {
				ev.skew = -ev.skew
			}
		}
		switch ev.kind {
		case faultEtcdRestart, faultEtcdOutage:
			if at < etcdBusy {
				continue
			}
			etcdBusy = at + ev.dur + 2*time.Second // etcd needs a moment to start
		case faultOwnerNATSCut: // its replica is known only then: one at a time
			if at < ownerBusy {
				continue
			}
			ownerBusy = at + ev.dur + 3*time.Second
		default:
			nDown := 0
			for i := range busy {
				if busy[i] > at && down[i] {
					nDown++
				}
			}
			stops := ev.kind == faultCrash || ev.kind == faultGraceful
			if busy[ev.slot] > at || (stops && nDown >= nemesisMaxDown) {
				continue
			}
			busy[ev.slot] = at + ev.dur + 3*time.Second // a restarted replica needs a moment to start
			down[ev.slot] = stops
		}
		out = append(out, ev)
		if i := slices.Index(pending, ev.kind); i >= 0 {
			pending = slices.Delete(pending, i, i+1)
		}
	}
}

// loadRequest is one request of the open-loop load.
type loadRequest struct {
	at        time.Duration
	slot      int
	class     int
	words     int
	maxTokens int
	// abandonAfter, if set, is when the client gives up on the request
	// (outcomeAbandoned): entry_nats_cut's long streams end so.
	abandonAfter time.Duration
}

// nemesisLoad yields the load's requests in order; like the schedule it is
// a pure function of the seed, prefix-stable in the duration.
type nemesisLoad struct {
	rng  *rand.Rand
	rate float64
	at   time.Duration
	n    int
}

func newNemesisLoad(seed uint64, rate float64) *nemesisLoad {
	return &nemesisLoad{rng: rand.New(rand.NewPCG(seed, 0x6c6f6164)), rate: rate}
}

func (l *nemesisLoad) next() loadRequest {
	l.at += time.Duration(l.rng.ExpFloat64() / l.rate * float64(time.Second))
	r := loadRequest{at: l.at, slot: l.rng.IntN(nemesisReplicas), words: 20 + l.rng.IntN(180), maxTokens: 8 + l.rng.IntN(120)}
	u := l.rng.Float64()
	for i, c := range nemesisClasses {
		if u < c.weight || i == len(nemesisClasses)-1 {
			r.class = i
			break
		}
		u -= c.weight
	}
	l.n++
	return r
}

var nemesisWords = strings.Fields("admission owner replica worker class queue grant booking lease epoch gossip ledger " +
	"token prefix cache stream fault nemesis seed router switchyard kv block hash session etcd nats")

func (r loadRequest) prompt(seed uint64, i int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nemesis %d request %d:", seed, i)
	for k := range r.words {
		b.WriteByte(' ')
		b.WriteString(nemesisWords[(i*7+k*13+k*k)%len(nemesisWords)])
	}
	return b.String()
}

// Outcomes as the client sees them.
const (
	outcomeOK      = "ok"      // 200 with choices
	outcomeTyped   = "typed"   // an OpenAI error body with a code
	outcomeCut     = "cut"     // sent, then the connection failed (allowed only if its replica went down)
	outcomeRefused = "refused" // never sent: the connection was refused (allowed only while its replica is down)
	outcomeHung    = "hung"    // no answer within the client's timeout
	outcomeBad     = "bad"     // an answer that is neither success nor a typed error
	// outcomeAbandoned: the harness gave up on the request on purpose
	// (loadRequest.abandonAfter) while it ran; counted like a cut one.
	outcomeAbandoned = "abandoned"
)

type requestRecord struct {
	slot          int
	class         int
	start, end    time.Time
	outcome, code string
	status        int
	detail        string
	wroteRequest  bool
	routedWorker  string
}

// nemesisSlot is one replica id across its incarnations.
type nemesisSlot struct {
	id       string
	idx      int
	httpAddr string
	clock    *skewClock

	op   sync.Mutex // serializes stop and start
	mu   sync.Mutex
	cur  *nemesisReplica
	all  []*nemesisReplica
	down []downInterval
	// cut is when one of its links was cut (NATS or etcd, by any kind):
	// such a replica is not "live and connected".
	cut []downInterval

	keyring *gossipKeyring
	// natsCuts and etcdCuts count the faults cutting its links now.
	natsCuts, etcdCuts atomic.Int32
}

type downInterval struct{ from, to time.Time } // to zero: still down

// nemesisReplica is one incarnation of a slot.
type nemesisReplica struct {
	status            *ReplicaStatus
	reg               *prometheus.Registry
	cancel            context.CancelFunc
	done              chan struct{}
	err               error
	stopping          atomic.Bool
	stoppedAt         atomic.Int64 // unix nanos once Run returned
	etcdProxy, natsPx *faultProxy
	// httpPx listens on the slot's HTTP address and forwards to the
	// incarnation's own listener, so that a crash can cut the API at once
	// like a killed process: without it the incarnation's lame duck would
	// go on serving for its drain delay, admitting locally in degraded
	// mode (its NATS is cut) over other owners' worker caps.
	httpPx *faultProxy
	// stopBound is how long a stop of this incarnation may take: see
	// replicaStopBound.
	stopBound time.Duration
}

// replicaStopBound is the longest RunReplica's shutdown may take by design
// with cfg (ReplicaConfig.StopBound), plus 5 s of slack for a machine
// starved under -race. A stop that hangs overruns it.
func replicaStopBound(cfg ReplicaConfig) time.Duration {
	const slack = 5 * time.Second
	return cfg.StopBound() + slack
}

func (inc *nemesisReplica) closeProxies() {
	inc.httpPx.close()
	inc.etcdProxy.close()
	inc.natsPx.close()
}

func (s *nemesisSlot) current() *nemesisReplica {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur
}

// wasDown reports whether the slot was down (or going down) at some time in
// [from, to], with slack for a stop that began just after.
func (s *nemesisSlot) wasDown(from, to time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, d := range s.down {
		end := d.to
		if end.IsZero() {
			end = time.Now()
		}
		if !d.from.After(to) && !end.Before(from) {
			return true
		}
	}
	return false
}

// nemesisRun is one seed's cluster, load, nemesis and checker.
type nemesisRun struct {
	t        *testing.T
	seed     uint64
	kinds    []string
	duration time.Duration
	log      *zap.Logger

	etcd *nemesisEtcd
	// etcdFront is the one way to etcd: every worker and every replica's
	// own proxy connect through it, so an etcd stop cuts every client
	// first (an embedded etcd with live clients takes seconds to close).
	etcdFront *faultProxy
	etcdOp    sync.Mutex // one etcd fault at a time
	natsURL   string
	lifePfx   string
	workers   []*runningWorker
	slots     []*nemesisSlot
	allSlots  []*nemesisSlot // slots, kept after teardown for the checker
	start     time.Time

	mu         sync.Mutex
	records    []*requestRecord
	faults     map[string]int
	violations map[string][]string
	checked    map[string]int
	queuePeak  map[string]int // class -> most entries queued at one replica
	queueSum   map[string]int // class -> most entries queued over all replicas in one sample
	// capPeak is each worker's peak as the monitor last saw it;
	// capDegraded the peaks past the cap it saw in a degraded window.
	capPeak     [nemesisWorkers]float64
	capDegraded []string
	slowest     time.Duration // the longest a request waited for its answer
	longestStop time.Duration // the longest a replica's stop took
	closing     atomic.Bool   // teardown began: nothing starts again
	// degraded counts the replicas cut from NATS now; degradedUntil is when
	// the last one's degraded bookings are surely gossiped (unix nanos).
	degraded      atomic.Int64
	degradedUntil atomic.Int64
	sent          atomic.Int64
	done          atomic.Int64
	faultsRun     atomic.Int64

	keysFile string        // the tenants (writeNemesisKeys)
	oneSided oneSidedState // the one-sided invariants' state (monitor goroutine only)
	// etcdDown counts the etcd faults in progress (etcd_restart,
	// etcd_outage: every replica cut); etcdCuts their intervals.
	etcdDown atomic.Int32
	etcdCuts []downInterval // guarded by mu
	// disturbing counts the faults in progress that move classes or
	// bookings (quietAfter); disturbedUntil is quietAfter past the last one's
	// heal (unix nanos).
	disturbing     atomic.Int32
	disturbedUntil atomic.Int64

	faultsWG sync.WaitGroup // injected faults, until healed
	extra    sync.WaitGroup // requests the faults send, until answered
	bg       sync.WaitGroup // exit watchers, until their incarnation ends
}

func (r *nemesisRun) violate(invariant, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.violations[invariant] = append(r.violations[invariant], fmt.Sprintf(format, args...))
}

func (r *nemesisRun) check(invariant string, n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.checked[invariant] += n
}

func (r *nemesisRun) countFault(kind string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[kind]++
	r.faultsRun.Add(1)
}

func (r *nemesisRun) elapsed() time.Duration {
	return time.Since(r.start).Truncate(100 * time.Millisecond)
}

func runNemesis(t *testing.T, seed uint64, kinds []string, duration time.Duration) *nemesisRun {
	leakBaseline := nemesisLeakBaseline()
	r := &nemesisRun{t: t, seed: seed, kinds: kinds, duration: duration, faults: map[string]int{}, violations: map[string][]string{},
		checked: map[string]int{}, queuePeak: map[string]int{}, queueSum: map[string]int{}, log: zap.NewNop()}
	if *nemesisLog != "" {
		lvl, err := zap.ParseAtomicLevel(*nemesisLog)
		if err != nil {
			t.Fatalf("-nemesis.log: %v", err)
		}
		r.log = zaptest.NewLogger(t, zaptest.Level(lvl))
	}
	schedule := nemesisSchedule(seed, kinds, duration, *nemesisFaultGap)
	t.Logf("seed %d: %v of load at %.1f req/s, %d faults scheduled from %v", seed, duration, *nemesisRate, len(schedule), kinds)

	r.etcd = newNemesisEtcd(filepath.Join(t.TempDir(), "etcd"), testenv.FreePort(t), testenv.FreePort(t))
	if err := r.etcd.start(); err != nil {
		t.Fatal(err)
	}
	var err error
	r.etcdFront, err = startFaultProxy(strings.TrimPrefix(r.etcd.endpoint(), "http://"), "", seed)
	if err != nil {
		r.etcd.stop()
		t.Fatal(err)
	}
	ns, err := startNemesisNATS()
	if err != nil {
		r.etcdFront.close()
		r.etcd.stop()
		t.Fatal(err)
	}
	r.natsURL = ns.ClientURL()
	r.lifePfx = wire.NewSubjects("nemesis").Life("")
	teardown := func() {
		r.closing.Store(true)
		var stops sync.WaitGroup // at once, as a rollout's end would: each waits its drain delay
		for _, s := range r.slots {
			stops.Add(1)
			go func() { defer stops.Done(); r.stopSlot(s, false) }()
		}
		stops.Wait()
		r.bg.Wait()
		for _, w := range r.workers {
			_ = w.stop()
		}
		ns.Shutdown()
		ns.WaitForShutdown()
		r.etcdFront.close()
		r.etcd.stop()
	}
	defer func() { // a t.Fatal on the way still tears everything down
		if r.slots != nil {
			teardown()
		}
	}()

	for i := 1; i <= nemesisWorkers; i++ {
		cfg := testWorkerConfig()
		cfg.ID, cfg.Cluster = fmt.Sprintf("w%d", i), "nemesis"
		cfg.EtcdEndpoints, cfg.NATSURL = []string{"http://" + r.etcdFront.addr()}, r.natsURL
		cfg.Engine.MaxNumSeqs = nemesisCap
		cfg.Engine.Speedup = 1
		cfg.GracePeriod = 5 * time.Second
		r.workers = append(r.workers, startWorker(t, cfg))
	}
	r.keysFile = writeNemesisKeys(t)
	gossipKey := []byte("nemesis-gossip16") // AES-128
	for i := range nemesisReplicas {
		kr, err := newGossipKeyring(t.TempDir(), gossipKey, seed, i)
		if err != nil {
			t.Fatal(err)
		}
		r.slots = append(r.slots, &nemesisSlot{id: fmt.Sprintf("n%d", i+1), idx: i,
			httpAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)), clock: &skewClock{}, keyring: kr})
	}
	r.allSlots = r.slots
	for _, s := range r.slots {
		if err := r.startSlot(s); err != nil {
			t.Fatalf("start replica %s: %v", s.id, err)
		}
	}
	r.waitServing(60 * time.Second)

	// Run: load, nemesis, monitors, progress.
	r.start = time.Now()
	runCtx, stopMonitors := context.WithCancel(context.Background())
	var monitors sync.WaitGroup
	monitors.Add(2)
	go func() { defer monitors.Done(); r.monitor(runCtx) }()
	go func() { defer monitors.Done(); r.progress(runCtx) }()
	transport := &http.Transport{MaxIdleConnsPerHost: 64, IdleConnTimeout: 5 * time.Second}
	var load sync.WaitGroup
	load.Add(2)
	go func() { defer load.Done(); r.sendLoad(transport) }()
	go func() { defer load.Done(); r.inject(schedule) }()
	load.Wait()
	r.faultsWG.Wait() // every fault healed, every restart done
	r.extra.Wait()    // entry_nats_cut's long streams answered
	t.Logf("%v: every request answered, every fault healed", r.elapsed())
	r.quiesce()
	t.Logf("%v: quiesced", r.elapsed())
	stopMonitors()
	monitors.Wait()
	transport.CloseIdleConnections()

	teardown()
	r.slots = nil
	t.Logf("%v: torn down", r.elapsed())
	r.checkAfterTeardown()
	r.checkLeaks(leakBaseline)
	return r
}

// waitServing waits until every class has an owner among the replicas and
// every replica sees every worker.
func (r *nemesisRun) waitServing(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		ok := true
		for _, s := range r.slots {
			cur := s.current()
			if cur == nil {
				ok = false
				break
			}
			owners := cur.status.Owners()
			for _, c := range nemesisClasses {
				if owners[c.name].Replica == "" {
					ok = false
				}
			}
			if n, err := cur.status.SchedulableWorkers(context.Background()); err != nil || n != nemesisWorkers {
				ok = false
			}
		}
		if ok {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.t.Fatalf("the cluster did not serve within %v", timeout)
}

// startSlot starts a new incarnation of s behind fresh proxies, retrying
// while its address is still held by the previous one.
func (r *nemesisRun) startSlot(s *nemesisSlot) error {
	s.op.Lock()
	defer s.op.Unlock()
	if r.closing.Load() {
		return nil
	}
	var last error
	for range 20 {
		err := r.startIncarnation(s)
		if err == nil {
			return nil
		}
		last = err
		time.Sleep(100 * time.Millisecond)
	}
	return last
}

func (r *nemesisRun) startIncarnation(s *nemesisSlot) error {
	ep, err := startFaultProxy(r.etcdFront.addr(), "", r.seed)
	if err != nil {
		return err
	}
	np, err := startFaultProxy(strings.TrimPrefix(r.natsURL, "nats://"), r.lifePfx, r.seed+uint64(s.idx))
	if err != nil {
		ep.close()
		return err
	}
	backend := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(r.t))
	hp, err := startFaultProxyAt(s.httpAddr, backend, "", r.seed)
	if err != nil { // the previous incarnation's proxy still holds the address
		ep.close()
		np.close()
		return err
	}
	cfg := DefaultReplicaConfig()
	cfg.ID, cfg.Cluster = s.id, "nemesis"
	cfg.HTTPAddr = backend
	cfg.EtcdEndpoints = []string{"http://" + ep.addr()}
	cfg.NATSURL = "nats://" + np.addr()
	cfg.PolicyYAML = nemesisPolicy
	cfg.Session.TTL = nemesisTTL
	cfg.Ownership.SettlePeriod = 200 * time.Millisecond
	cfg.Gossip.BindAddr, cfg.Gossip.BindPort = "127.0.0.1", 0
	// An unacknowledged grant is held for the renewal window too (the
	// scheduler's default AckTimeout is its default BookingExpiry): a grant
	// whose entry crashed before taking it ends then, which
	// ledger_matches_streams allows (ledgerLeakPersist).
	cfg.Scheduler.BookingExpiry, cfg.Scheduler.AckTimeout = nemesisExpiry, nemesisExpiry
	if *nemesisAck > 0 {
		cfg.Scheduler.AckTimeout = *nemesisAck
	}
	cfg.Admission.RenewInterval = time.Second
	cfg.Admission.NoOwnerTimeout = nemesisNoOwner
	cfg.Tenants.KeysFile = r.keysFile
	cfg.Gossip.KeyringFile, cfg.Gossip.KeyringCheckInterval = s.keyring.path, 100*time.Millisecond
	cfg.Frontend.ShutdownGrace = 5 * time.Second
	cfg.Clock = s.clock
	for _, o := range r.slots {
		if o != s {
			if cur := o.current(); cur != nil {
				cfg.Gossip.Join = append(cfg.Gossip.Join, cur.status.GossipAddr)
			}
		}
	}
	inc := &nemesisReplica{reg: prometheus.NewRegistry(), done: make(chan struct{}), etcdProxy: ep, natsPx: np, httpPx: hp,
		stopBound: replicaStopBound(cfg)}
	ctx, cancel := context.WithCancel(context.Background())
	inc.cancel = cancel
	ready := make(chan *ReplicaStatus, 1)
	go func() {
		defer close(inc.done)
		defer func() { inc.stoppedAt.Store(time.Now().UnixNano()) }()
		inc.err = RunReplica(ctx, cfg, r.log.With(zap.String("nemesis_slot", s.id)), inc.reg, func(st *ReplicaStatus) { ready <- st })
	}()
	select {
	case inc.status = <-ready:
	case <-inc.done:
		cancel()
		inc.closeProxies()
		return fmt.Errorf("replica %s exited while starting: %w", s.id, inc.err)
	case <-time.After(30 * time.Second):
		cancel()
		<-inc.done
		inc.closeProxies()
		return fmt.Errorf("replica %s did not start within 30s", s.id)
	}
	s.mu.Lock()
	s.cur = inc
	s.all = append(s.all, inc)
	if n := len(s.down); n > 0 && s.down[n-1].to.IsZero() {
		s.down[n-1].to = time.Now()
	}
	s.mu.Unlock()
	r.check("replica_stays_up", 1)
	r.bg.Add(1)
	go func() { // a replica must never exit by itself, whatever fails under it
		defer r.bg.Done()
		<-inc.done
		if inc.stopping.Load() {
			return
		}
		r.violate("replica_stays_up", "%s exited by itself at %v: %v", s.id, r.elapsed(), inc.err)
		s.mu.Lock()
		if s.cur == inc {
			s.cur = nil
			// Its exit began before it returned: the frontend's grace
			// and the hand-off; requests it cut meanwhile count against
			// this violation, not as outcomes of a live replica.
			s.down = append(s.down, downInterval{from: time.Now().Add(-15 * time.Second)})
		}
		s.mu.Unlock()
		inc.closeProxies()
		time.Sleep(500 * time.Millisecond)
		if err := r.startSlot(s); err != nil {
			r.violate("replica_stays_up", "%s could not restart after exiting: %v", s.id, err)
		}
	}()
	return nil
}

// stopSlot stops s's current incarnation: crash cuts its etcd and NATS
// first, so it says no goodbye (its keys stay until its lease expires, its
// queued requests get no answer); otherwise it stops gracefully while the
// load keeps coming. A graceful stop must finish within its bound.
func (r *nemesisRun) stopSlot(s *nemesisSlot, crash bool) (stopped bool) {
	s.op.Lock()
	defer s.op.Unlock()
	s.mu.Lock()
	inc := s.cur
	if inc == nil {
		s.mu.Unlock()
		return false
	}
	s.cur = nil
	s.down = append(s.down, downInterval{from: time.Now()})
	s.mu.Unlock()
	inc.stopping.Store(true)
	if crash { // the API goes first: a killed process answers nothing more
		inc.httpPx.Cut()
		inc.etcdProxy.Cut()
		inc.natsPx.Cut()
	}
	inc.cancel()
	began := time.Now()
	defer func() {
		r.mu.Lock()
		r.longestStop = max(r.longestStop, time.Since(began))
		r.mu.Unlock()
	}()
	select {
	case <-inc.done:
	case <-time.After(inc.stopBound):
		r.violate("graceful_stop_finishes", "%s still running %v after its stop (crash=%v) at %v", s.id, inc.stopBound, crash, r.elapsed())
		inc.etcdProxy.Cut()
		inc.natsPx.Cut()
		<-inc.done
	}
	r.check("graceful_stop_finishes", 1)
	if inc.err != nil {
		r.violate("replica_stays_up", "%s returned %v from its stop (crash=%v)", s.id, inc.err, crash)
	}
	inc.closeProxies()
	return true
}

// inject runs the schedule: each fault at its time, on its own goroutine.
func (r *nemesisRun) inject(schedule []faultEvent) {
	for _, ev := range schedule {
		if d := time.Until(r.start.Add(ev.at)); d > 0 {
			time.Sleep(d)
		}
		r.faultsWG.Add(1)
		go func() {
			defer r.faultsWG.Done()
			r.apply(ev)
		}()
	}
}

func (r *nemesisRun) apply(ev faultEvent) {
	s := r.slots[ev.slot]
	if ev.kind != faultCrash && ev.kind != faultGraceful { // counted below: they may find the slot down
		r.countFault(ev.kind)
	}
	where := s.id
	if ev.kind == faultOwnerNATSCut || ev.kind == faultEntryNATSCut {
		where = "a replica chosen then" // applyOneSided names it
	}
	r.t.Logf("%v: %s on %s for %v (scheduled at %v)", r.elapsed(), ev.kind, where, ev.dur.Truncate(time.Millisecond), ev.at.Truncate(time.Millisecond))
	defer func() { r.t.Logf("%v: %s on %s healed", r.elapsed(), ev.kind, where) }()
	if disturbs(ev.kind) {
		r.disturbing.Add(1)
		defer r.settle()
	}
	switch ev.kind {
	case faultOwnerNATSCut, faultEntryNATSCut, faultEtcdCutOne, faultGossipCutOne:
		r.applyOneSided(ev)
	case faultCrash, faultGraceful:
		// A stop scheduled while the slot is already down (an earlier stop's
		// restart still pending, or the slot restarting itself) has nothing
		// to stop; it must not start a second incarnation beside the one the
		// earlier event will start, so it ends here.
		if !r.stopSlot(s, ev.kind == faultCrash) {
			r.countFault(ev.kind + "_while_down")
			return
		}
		r.countFault(ev.kind)
		time.Sleep(ev.dur)
		r.countFault(faultRestart)
		if err := r.startSlot(s); err != nil {
			r.violate("replica_stays_up", "%s did not restart: %v", s.id, err)
		}
	case faultNATSCut, faultSession:
		cur := s.current()
		if cur == nil {
			return
		}
		if ev.kind == faultSession {
			r.cutEtcd(s, cur, ev.dur)
		} else {
			r.cutNATS(s, cur, ev.dur)
		}
	case faultEtcdRestart, faultEtcdOutage:
		r.etcdOp.Lock()
		defer r.etcdOp.Unlock()
		began := time.Now()
		r.etcdDown.Add(1)
		r.etcdFront.Cut()
		r.etcd.stop()
		time.Sleep(ev.dur)
		if err := r.etcd.start(); err != nil {
			r.violate("harness", "etcd did not come back: %v", err)
		}
		r.etcdFront.Restore()
		r.etcdDown.Add(-1)
		r.mu.Lock()
		r.etcdCuts = append(r.etcdCuts, downInterval{from: began, to: time.Now()})
		r.mu.Unlock()
		r.t.Logf("%v: %s: etcd down for %v", r.elapsed(), ev.kind, time.Since(began).Truncate(time.Millisecond))
	case faultSlowActor:
		cur := s.current()
		if cur == nil {
			return
		}
		rng := rand.New(rand.NewPCG(r.seed, uint64(ev.at)))
		until := time.Now().Add(ev.dur)
		for time.Now().Before(until) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			pause := time.Duration(20+rng.IntN(60)) * time.Millisecond
			_ = cur.status.actor.Do(ctx, func(*scheduler.Core) { time.Sleep(pause) })
			cancel()
			time.Sleep(5 * time.Millisecond)
		}
	case faultClockSkew:
		s.clock.set(ev.skew)
		time.Sleep(ev.dur)
		s.clock.set(0)
	case faultLifeDrop, faultLifeDuplicate:
		cur := s.current()
		if cur == nil {
			return
		}
		mode := marksDrop
		if ev.kind == faultLifeDuplicate {
			mode = marksDuplicate
		}
		cur.natsPx.setMarks(mode, 0.5)
		time.Sleep(ev.dur)
		cur.natsPx.setMarks(marksPass, 0)
	}
}

// degradedGossip is how long after NATS is back a replica's degraded
// bookings may still be unknown to the owners: reconnect, leave degraded
// mode, a few gossip rounds.
const degradedGossip = 3 * time.Second

func (r *nemesisRun) leaveDegraded() {
	r.noteDegraded()
	r.degraded.Add(-1)
}

// noteDegraded extends the degraded window to degradedGossip from now: a
// replica was seen admitting in degraded mode (its own report, sampled with
// the queues) or has just left the NATS cut that made it.
func (r *nemesisRun) noteDegraded() {
	until := time.Now().Add(degradedGossip).UnixNano()
	for {
		cur := r.degradedUntil.Load()
		if cur >= until || r.degradedUntil.CompareAndSwap(cur, until) {
			return
		}
	}
}

// inDegradedWindow reports whether some replica is, or just was, admitting
// in degraded mode: design §4.10 gives each its own queues and ledger, so
// a worker's cap holds across them only as fresh as gossip.
func (r *nemesisRun) inDegradedWindow() bool {
	return r.degraded.Load() > 0 || time.Now().UnixNano() < r.degradedUntil.Load()
}

// sendLoad sends the open-loop load for the run's duration: each request
// at its time, to its replica whatever that replica's state, and waits for
// every answer.
func (r *nemesisRun) sendLoad(transport *http.Transport) {
	load := newNemesisLoad(r.seed, *nemesisRate)
	client := &http.Client{Transport: transport, Timeout: 90 * time.Second}
	var wg sync.WaitGroup
	for i := 0; ; i++ {
		req := load.next()
		if req.at >= r.duration {
			break
		}
		if d := time.Until(r.start.Add(req.at)); d > 0 {
			time.Sleep(d)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			rec := r.send(client, req, i)
			r.mu.Lock()
			r.records = append(r.records, rec)
			r.mu.Unlock()
			r.done.Add(1)
		}()
	}
	wg.Wait()
}

func (r *nemesisRun) send(client *http.Client, req loadRequest, i int) *requestRecord {
	s := r.slots[req.slot]
	class := nemesisClasses[req.class]
	rec := &requestRecord{slot: req.slot, class: req.class, start: time.Now()}
	defer func() { rec.end = time.Now() }()
	body, _ := json.Marshal(map[string]any{"model": testModel, "prompt": req.prompt(r.seed, i), "max_tokens": req.maxTokens})
	hreq, err := http.NewRequest(http.MethodPost, "http://"+s.httpAddr+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		rec.outcome, rec.detail = outcomeBad, err.Error()
		return rec
	}
	hreq.Header.Set("Content-Type", "application/json")
	hreq.Header.Set("Authorization", "Bearer "+nemesisKey(class.name))
	hreq.Header.Set("X-Switchyard-Class", class.name)
	hreq.Header.Set("X-Switchyard-Allowed-Workers", strings.Join(class.workers, ","))
	var wrote atomic.Bool
	ctx := context.Background()
	if req.abandonAfter > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.abandonAfter)
		defer cancel()
	}
	hreq = hreq.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		WroteRequest: func(httptrace.WroteRequestInfo) { wrote.Store(true) },
	}))
	r.sent.Add(1)
	resp, err := client.Do(hreq)
	rec.wroteRequest = wrote.Load()
	if err != nil {
		switch {
		case ctx.Err() != nil && rec.wroteRequest:
			rec.outcome = outcomeAbandoned
		case strings.Contains(err.Error(), "Client.Timeout"):
			rec.outcome = outcomeHung
		case !rec.wroteRequest:
			rec.outcome = outcomeRefused
		default:
			rec.outcome = outcomeCut
		}
		rec.detail = err.Error()
		return rec
	}
	defer resp.Body.Close()
	rec.status = resp.StatusCode
	rec.routedWorker = resp.Header.Get("X-Switchyard-Routed-Worker")
	b, err := io.ReadAll(resp.Body)
	if err != nil && ctx.Err() != nil {
		rec.outcome, rec.detail = outcomeAbandoned, err.Error()
		return rec
	}
	if err != nil {
		rec.outcome, rec.detail = outcomeCut, err.Error()
		return rec
	}
	if resp.StatusCode == http.StatusOK {
		var ok struct {
			Choices []json.RawMessage `json:"choices"`
		}
		if json.Unmarshal(b, &ok) == nil && len(ok.Choices) > 0 {
			rec.outcome = outcomeOK
		} else {
			rec.outcome, rec.detail = outcomeBad, "200 without choices: "+truncate(string(b), 200)
		}
		return rec
	}
	var apiErr struct {
		Error struct {
			Code string `json:"code"`
			Type string `json:"type"`
		} `json:"error"`
	}
	if json.Unmarshal(b, &apiErr) == nil && apiErr.Error.Code != "" {
		rec.outcome, rec.code = outcomeTyped, apiErr.Error.Code
		return rec
	}
	rec.outcome, rec.detail = outcomeBad, fmt.Sprintf("%d without a typed error: %s", resp.StatusCode, truncate(string(b), 200))
	return rec
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// progress prints a line every -nemesis.progress.
func (r *nemesisRun) progress(ctx context.Context) {
	if *nemesisProgress <= 0 {
		<-ctx.Done()
		return
	}
	tick := time.NewTicker(*nemesisProgress)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			r.mu.Lock()
			nv := 0
			for _, v := range r.violations {
				nv += len(v)
			}
			r.mu.Unlock()
			fmt.Fprintf(os.Stderr, "nemesis seed=%d elapsed=%v requests=%d answered=%d faults=%d violations=%d\n",
				r.seed, r.elapsed(), r.sent.Load(), r.done.Load(), r.faultsRun.Load(), nv)
		}
	}
}

// table is the run's report: faults injected by kind and invariants
// checked by name.
func (r *nemesisRun) table() string {
	var b strings.Builder
	r.mu.Lock()
	defer r.mu.Unlock()
	outcomes := map[string]int{}
	codes := map[string]int{}
	for _, rec := range r.records {
		outcomes[rec.outcome]++
		if rec.code != "" {
			codes[rec.code]++
		}
	}
	fmt.Fprintf(&b, "nemesis seed %d: %d requests %s, typed errors %s, slowest answer %v\n", r.seed, len(r.records), fmtCounts(outcomes), fmtCounts(codes), r.slowest.Truncate(time.Millisecond))
	fmt.Fprintf(&b, "%-24s %8s\n", "fault", "injected")
	kinds := make([]string, 0, len(r.faults))
	for k := range r.faults {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	total := 0
	for _, k := range kinds {
		fmt.Fprintf(&b, "%-24s %8d\n", k, r.faults[k])
		if !strings.HasSuffix(k, "_while_down") { // scheduled, but nothing was stopped
			total += r.faults[k]
		}
	}
	fmt.Fprintf(&b, "%-24s %8d\n", "total", total)
	if r.longestStop > 0 {
		fmt.Fprintf(&b, "longest replica stop %v\n", r.longestStop.Truncate(time.Millisecond))
	}
	fmt.Fprintf(&b, "%-24s %8s %10s\n", "invariant", "checked", "violations")
	names := map[string]bool{}
	for k := range r.checked {
		names[k] = true
	}
	for k := range r.violations {
		names[k] = true
	}
	sorted := make([]string, 0, len(names))
	for k := range names {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		fmt.Fprintf(&b, "%-24s %8d %10d\n", k, r.checked[k], len(r.violations[k]))
	}
	qs := make([]string, 0, len(nemesisClasses))
	for _, c := range nemesisClasses {
		qs = append(qs, fmt.Sprintf("%s %d/%d (sum %d)", c.name, r.queuePeak[c.name], c.limit*len(c.workers), r.queueSum[c.name]))
	}
	fmt.Fprintf(&b, "queue peak/limit by class: %s\n", strings.Join(qs, ", "))
	peaks := make([]string, 0, len(r.workers))
	for i, w := range r.workers {
		peaks = append(peaks, fmt.Sprintf("w%d %v", i+1, metricValue(w.reg, "switchyard_engine_peak_live_requests")))
	}
	fmt.Fprintf(&b, "worker peak live requests (cap %d): %s\n", nemesisCap, strings.Join(peaks, ", "))
	fmt.Fprintf(&b, "over the cap while a replica was degraded (design §4.10, allowed): %d %v", len(r.capDegraded), r.capDegraded)
	return b.String()
}

func (r *nemesisRun) invariantNames() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]string, 0, len(r.violations))
	for k := range r.violations {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func fmtCounts(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, 0, len(keys))
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s=%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
