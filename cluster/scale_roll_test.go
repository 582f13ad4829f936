package cluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

// The rolling-restart benchmark (issue 30, docs/benchmarks.md §10 "etcd:
// ownership churn and watch fan-out as replicas roll"): N replicas, each
// with its own etcd client, Session, Replicas registry and Ownership over K
// classes, against one real embedded etcd. Every replica is restarted in
// turn the way a router stops (lame duck: re-register not ready, its classes
// hand off; then ownership stops, the lease is revoked) and a new
// incarnation under the same id starts and registers ready. Two paces:
//
//   - settled: the next replica stops only once the cluster agrees again
//     (the new incarnation settled and took its classes back), as a rollout
//     with minReadySeconds ≥ the settle period would;
//   - ready: the next replica stops as soon as the new incarnation is
//     registered ready (a rollout that only waits for /readyz).
//
// Measured per roll: ownership moves per class (acquisitions), moves during
// a step whose restarted replica is not the class's placement owner
// ("unrelated"), the longest time a class had no owner key (from a
// separate observer watch), watch events delivered to the replicas' watches
// (counted in their clients), etcd requests the replicas sent, the server's
// own counters (events sent, puts, txns, leases) and the process CPU, split
// between the etcd server and the replicas by pprof labels when
// SWITCHYARD_ROLL_CPUPROFILE names a directory (go tool pprof -tags).

// rollCounts are one replica id's etcd traffic, over all its incarnations.
type rollCounts struct {
	events  atomic.Int64 // watch events delivered to its watches
	watches atomic.Int64 // watches opened
	gets    atomic.Int64
	puts    atomic.Int64
	txns    atomic.Int64
	dels    atomic.Int64
	grants  atomic.Int64
	renews  atomic.Int64
	revokes atomic.Int64
}

func (c *rollCounts) requests() int64 {
	return c.gets.Load() + c.puts.Load() + c.txns.Load() + c.dels.Load() + c.grants.Load() + c.revokes.Load() + c.watches.Load()
}

// countingWatcher counts the events every watch of one client delivers.
type countingWatcher struct {
	clientv3.Watcher
	c *rollCounts
}

func (w countingWatcher) Watch(ctx context.Context, key string, opts ...clientv3.OpOption) clientv3.WatchChan {
	w.c.watches.Add(1)
	in := w.Watcher.Watch(ctx, key, opts...)
	out := make(chan clientv3.WatchResponse)
	go func() {
		defer close(out)
		for wr := range in {
			w.c.events.Add(int64(len(wr.Events)))
			select {
			case out <- wr:
			case <-ctx.Done():
				for range in { // drain until the client closes the inner channel
				}
				return
			}
		}
	}()
	return out
}

type countingKV struct {
	clientv3.KV
	c *rollCounts
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.c.gets.Add(1)
	return k.KV.Get(ctx, key, opts...)
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.c.puts.Add(1)
	return k.KV.Put(ctx, key, val, opts...)
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.c.dels.Add(1)
	return k.KV.Delete(ctx, key, opts...)
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn {
	k.c.txns.Add(1)
	return k.KV.Txn(ctx)
}

type countingLease struct {
	clientv3.Lease
	c *rollCounts
}

func (l countingLease) Grant(ctx context.Context, ttl int64) (*clientv3.LeaseGrantResponse, error) {
	l.c.grants.Add(1)
	return l.Lease.Grant(ctx, ttl)
}

func (l countingLease) KeepAliveOnce(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseKeepAliveResponse, error) {
	l.c.renews.Add(1)
	return l.Lease.KeepAliveOnce(ctx, id)
}

func (l countingLease) Revoke(ctx context.Context, id clientv3.LeaseID) (*clientv3.LeaseRevokeResponse, error) {
	l.c.revokes.Add(1)
	return l.Lease.Revoke(ctx, id)
}

// rollMove is one acquisition, in callback order across replicas.
type rollMove struct {
	class, replica string
	step           int
}

// rollCluster is the etcd member, the observer and the replicas of one run.
type rollCluster struct {
	tb      testing.TB
	etcd    *testenv.Etcd
	admin   *clientv3.Client
	classes []string
	ttl     time.Duration
	settle  time.Duration
	labels  context.Context // pprof labels of the replicas' goroutines

	mu     sync.Mutex
	step   int // the roll step callbacks are attributed to; -1 before the roll
	moves  []rollMove
	counts map[string]*rollCounts
}

// rollNode is one incarnation of a replica.
type rollNode struct {
	id      string
	client  *clientv3.Client
	sess    *Session
	reps    *Replicas
	own     *Ownership
	stopOwn context.CancelFunc
	stopAll context.CancelFunc
	ownDone chan error
	allDone sync.WaitGroup

	mu   sync.Mutex
	held map[string]bool
}

func (rc *rollCluster) countsOf(id string) *rollCounts {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	c := rc.counts[id]
	if c == nil {
		c = &rollCounts{}
		rc.counts[id] = c
	}
	return c
}

// start runs a new incarnation of replica id and returns once it is
// registered ready with its registries listed, as a router's readiness.
func (rc *rollCluster) start(id string) *rollNode {
	tb := rc.tb
	n := &rollNode{id: id, held: map[string]bool{}, ownDone: make(chan error, 1)}
	cnt := rc.countsOf(id)
	pprof.Do(rc.labels, pprof.Labels("part", "replicas"), func(ctx context.Context) {
		client, err := clientv3.New(clientv3.Config{Endpoints: rc.etcd.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		require.NoError(tb, err)
		client.Watcher = countingWatcher{Watcher: client.Watcher, c: cnt}
		client.KV = countingKV{KV: client.KV, c: cnt}
		client.Lease = countingLease{Lease: client.Lease, c: cnt}
		n.client = client
		log := zap.NewNop()
		reg := prometheus.NewRegistry()
		n.sess, err = NewSession(client, SessionConfig{Cluster: testCluster, TTL: rc.ttl}, Deps{Logger: log, Registerer: reg})
		require.NoError(tb, err)
		deps := Deps{Logger: log, Registerer: reg}
		n.reps, err = NewReplicas(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond}, deps)
		require.NoError(tb, err)
		n.own, err = NewOwnership(client, n.sess, n.reps, OwnershipConfig{
			Cluster: testCluster, ReplicaID: id, SettlePeriod: rc.settle,
			RetryInterval: 100 * time.Millisecond, OpTimeout: 2 * time.Second,
		}, Callbacks{
			OnAcquire: func(class string, _ int64) error {
				n.mu.Lock()
				n.held[class] = true
				n.mu.Unlock()
				rc.mu.Lock()
				rc.moves = append(rc.moves, rollMove{class: class, replica: id, step: rc.step})
				rc.mu.Unlock()
				return nil
			},
			OnRelease: func(class string, _ ReleaseReason) {
				n.mu.Lock()
				delete(n.held, class)
				n.mu.Unlock()
			},
		}, yamlClassNames, deps)
		require.NoError(tb, err)
		allCtx, stopAll := context.WithCancel(ctx)
		ownCtx, stopOwn := context.WithCancel(allCtx)
		n.stopAll, n.stopOwn = stopAll, stopOwn
		n.allDone.Add(3)
		go func() { defer n.allDone.Done(); _ = n.sess.Run(allCtx) }()
		go func() { defer n.allDone.Done(); _ = n.reps.Run(allCtx) }()
		go func() { defer n.allDone.Done(); n.ownDone <- n.own.Run(ownCtx) }()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := n.sess.WaitLease(ctx)
	require.NoError(tb, err)
	require.NoError(tb, n.reps.WaitSynced(ctx))
	require.NoError(tb, n.sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: id, HTTPAddr: "127.0.0.1:1", Ready: true}))
	return n
}

func (n *rollNode) owned() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.held)
}

// stop is a router's stop: lame duck (registered not ready until its
// classes have been handed off), then ownership stops, the rest stops and
// the lease is revoked.
func (n *rollNode) stop(tb testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	require.NoError(tb, n.sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: n.id, HTTPAddr: "127.0.0.1:1", Ready: false}))
	testenv.Eventually(tb, 30*time.Second, func() bool { return n.owned() == 0 }, "%s did not hand off its classes", n.id)
	n.stopOwn()
	if err := <-n.ownDone; err != nil && !errors.Is(err, context.Canceled) {
		tb.Errorf("%s: ownership stopped with %v", n.id, err)
	}
	n.stopAll()
	n.allDone.Wait()
	require.NoError(tb, n.sess.Revoke(ctx))
	_ = n.client.Close()
}

func (n *rollNode) kill() {
	n.stopAll()
	n.allDone.Wait()
	_ = n.client.Close()
}

// agreed reports whether etcd and every replica's view give each class to
// its placement winner among ids. The replicas' own views are checked
// first, so that polling adds no etcd traffic until they agree.
func (rc *rollCluster) agreed(nodes []*rollNode, ids []string) bool {
	want := map[string]int{}
	for _, c := range rc.classes {
		want[Place(c, ids)]++
	}
	for _, n := range nodes {
		view := n.own.Owners()
		for _, c := range rc.classes {
			if view[c].Replica != Place(c, ids) {
				return false
			}
		}
		if n.owned() != want[n.id] {
			return false
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys := wire.NewKeys(testCluster)
	resp, err := rc.admin.Get(ctx, keys.Classes(), clientv3.WithPrefix())
	if err != nil || len(resp.Kvs) != len(rc.classes) {
		return false
	}
	for _, kv := range resp.Kvs {
		class, err := keys.ClassFromOwnerKey(string(kv.Key))
		if err != nil || string(kv.Value) != Place(class, ids) {
			return false
		}
		for _, n := range nodes {
			if v, _ := n.own.Owner(class); v.Epoch != kv.CreateRevision {
				return false
			}
		}
	}
	return true
}

func (rc *rollCluster) waitAgreed(nodes []*rollNode, ids []string, what string) {
	testenv.Eventually(rc.tb, 60*time.Second, func() bool { return rc.agreed(nodes, ids) }, "no agreement %s", what)
}

// gapObserver watches the owner keys and records how long each class had
// no key.
type gapObserver struct {
	mu     sync.Mutex
	since  map[string]time.Time
	maxGap time.Duration
	sumGap time.Duration
	gaps   int
	open   int
	rev    int64 // newest event revision seen
}

func (g *gapObserver) run(ctx context.Context, client *clientv3.Client, rev int64) {
	keys := wire.NewKeys(testCluster)
	for wr := range client.Watch(ctx, keys.Classes(), clientv3.WithPrefix(), clientv3.WithRev(rev+1)) {
		now := time.Now()
		g.mu.Lock()
		for _, ev := range wr.Events {
			g.rev = max(g.rev, ev.Kv.ModRevision)
			class, err := keys.ClassFromOwnerKey(string(ev.Kv.Key))
			if err != nil {
				continue
			}
			if ev.Type == clientv3.EventTypeDelete {
				g.since[class] = now
				continue
			}
			if s, ok := g.since[class]; ok {
				d := now.Sub(s)
				g.maxGap = max(g.maxGap, d)
				g.sumGap += d
				g.gaps++
				delete(g.since, class)
			}
		}
		g.open = len(g.since)
		g.mu.Unlock()
	}
}

// etcdServerCounters reads the embedded server's own counters from the
// default registry (etcd registers them there; one server per benchmark).
func etcdServerCounters(tb testing.TB) map[string]float64 {
	mfs, err := prometheus.DefaultGatherer.Gather()
	require.NoError(tb, err)
	out := map[string]float64{}
	for _, mf := range mfs {
		name := mf.GetName()
		switch name {
		case "etcd_debugging_mvcc_events_total", "etcd_mvcc_put_total", "etcd_mvcc_txn_total",
			"etcd_mvcc_delete_total", "etcd_mvcc_range_total",
			"etcd_debugging_lease_granted_total", "etcd_debugging_lease_revoked_total", "etcd_debugging_lease_renewed_total":
			for _, m := range mf.GetMetric() {
				out[name] += m.GetCounter().GetValue()
			}
		case "grpc_server_started_total":
			for _, m := range mf.GetMetric() {
				out["grpc_started:"+grpcMethod(m)] += m.GetCounter().GetValue()
				out["grpc_started"] += m.GetCounter().GetValue()
			}
		}
	}
	return out
}

func grpcMethod(m *dto.Metric) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == "grpc_method" {
			return l.GetValue()
		}
	}
	return ""
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rollResult is what one rolling restart measured.
type rollResult struct {
	steps         int
	movesPerClass float64 // mean acquisitions per class over the roll
	maxMoves      int     // most acquisitions of one class
	over2         int     // classes that moved more than twice
	unrelated     int     // moves in a step whose replica is not the class's placement owner (settled pace only)
	maxGap        time.Duration
	meanGap       time.Duration
	gaps          int
	events        int64 // watch events delivered to all replicas
	requests      int64 // etcd requests the replicas sent (renewals apart)
	renewals      int64
	server        map[string]float64 // server counter deltas
	cpu, wall     time.Duration
	stepConverge  time.Duration // longest step to agreement (settled pace)
}

func runRoll(tb testing.TB, replicas, classes int, pace string, settle time.Duration, profileDir string) rollResult {
	labels := context.Background()
	var e *testenv.Etcd
	pprof.Do(labels, pprof.Labels("part", "etcd"), func(context.Context) { e = testenv.StartEtcd(tb) })
	rc := &rollCluster{
		tb: tb, etcd: e, admin: e.Client(tb), classes: classNames(classes), ttl: 5 * time.Second, settle: settle,
		labels: labels, step: -1, counts: map[string]*rollCounts{},
	}
	ok, err := SeedConfig(testenv.Context(tb), rc.admin, testCluster, policyYAML(rc.classes...), false)
	require.NoError(tb, err)
	require.True(tb, ok)

	ids := make([]string, replicas)
	nodes := make([]*rollNode, replicas)
	for i := range ids {
		ids[i] = fmt.Sprintf("router-%02d", i)
		nodes[i] = rc.start(ids[i])
	}
	tb.Cleanup(func() {
		for _, n := range nodes {
			n.kill()
		}
	})
	rc.waitAgreed(nodes, ids, "before the roll")

	// Baselines, then the observer from the current revision.
	head, err := rc.admin.Get(testenv.Context(tb), "nonexistent-key")
	require.NoError(tb, err)
	obs := &gapObserver{since: map[string]time.Time{}}
	octx, ocancel := context.WithCancel(context.Background())
	odone := make(chan struct{})
	go func() { defer close(odone); obs.run(octx, rc.admin, head.Header.Revision) }()
	defer func() { ocancel(); <-odone }()
	before := map[string][3]int64{}
	for _, id := range ids {
		c := rc.countsOf(id)
		before[id] = [3]int64{c.events.Load(), c.requests(), c.renews.Load()}
	}
	srvBefore := etcdServerCounters(tb)
	var prof *os.File
	if profileDir != "" {
		prof, err = os.Create(filepath.Join(profileDir, fmt.Sprintf("roll-r%d-c%d-%s.pprof", replicas, classes, pace)))
		require.NoError(tb, err)
		require.NoError(tb, pprof.StartCPUProfile(prof))
	}
	cpu0, t0 := processCPU(), time.Now()

	res := rollResult{steps: replicas, server: map[string]float64{}}
	for s, id := range ids {
		rc.mu.Lock()
		rc.step = s
		rc.mu.Unlock()
		stepStart := time.Now()
		nodes[s].stop(tb)
		nodes[s] = rc.start(id)
		if pace == "settled" {
			rc.waitAgreed(nodes, ids, fmt.Sprintf("after restarting %s", id))
			res.stepConverge = max(res.stepConverge, time.Since(stepStart))
		}
	}
	rc.mu.Lock()
	rc.step = replicas // the tail of a ready-paced roll
	rc.mu.Unlock()
	rc.waitAgreed(nodes, ids, "after the roll")

	res.cpu, res.wall = processCPU()-cpu0, time.Since(t0)
	if prof != nil {
		pprof.StopCPUProfile()
		require.NoError(tb, prof.Close())
	}
	srvAfter := etcdServerCounters(tb)
	for k, v := range srvAfter {
		res.server[k] = v - srvBefore[k]
	}
	for _, id := range ids {
		c := rc.countsOf(id)
		b := before[id]
		res.events += c.events.Load() - b[0]
		res.requests += c.requests() - b[1]
		res.renewals += c.renews.Load() - b[2]
	}
	rc.mu.Lock()
	moves := slices.Clone(rc.moves)
	rc.mu.Unlock()
	perClass := map[string]int{}
	for _, m := range moves {
		if m.step < 0 {
			continue
		}
		perClass[m.class]++
		if pace == "settled" && m.step < replicas && Place(m.class, ids) != ids[m.step] {
			res.unrelated++
		}
	}
	total := 0
	for _, c := range rc.classes {
		total += perClass[c]
		res.maxMoves = max(res.maxMoves, perClass[c])
		if perClass[c] > 2 {
			res.over2++
		}
	}
	res.movesPerClass = float64(total) / float64(classes)
	// The observer may trail the agreement's read: wait for the newest
	// owner key's revision before reading it.
	owners, err := rc.admin.Get(testenv.Context(tb), wire.NewKeys(testCluster).Classes(), clientv3.WithPrefix())
	require.NoError(tb, err)
	var newest int64
	for _, kv := range owners.Kvs {
		newest = max(newest, kv.ModRevision)
	}
	testenv.Eventually(tb, 30*time.Second, func() bool {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return obs.rev >= newest
	}, "the observer did not see revision %d", newest)
	obs.mu.Lock()
	res.maxGap, res.gaps = obs.maxGap, obs.gaps
	if obs.gaps > 0 {
		res.meanGap = obs.sumGap / time.Duration(obs.gaps)
	}
	require.Zero(tb, obs.open, "classes left without an owner key")
	obs.mu.Unlock()
	return res
}

// BenchmarkScaleEtcdRoll rolls N replicas over K classes once per
// iteration (run it with -benchtime 1x). Settle period 1 s instead of the
// default 5 s, so a 32-replica roll takes about a minute.
func BenchmarkScaleEtcdRoll(b *testing.B) {
	profileDir := os.Getenv("SWITCHYARD_ROLL_CPUPROFILE")
	for _, replicas := range []int{8, 16, 32} {
		for _, classes := range []int{8, 64} {
			for _, pace := range []string{"settled", "ready"} {
				b.Run(fmt.Sprintf("replicas=%d/classes=%d/pace=%s", replicas, classes, pace), func(b *testing.B) {
					var agg []rollResult
					for i := 0; i < b.N; i++ {
						agg = append(agg, runRoll(b, replicas, classes, pace, time.Second, profileDir))
					}
					r := agg[len(agg)-1]
					steps := float64(r.steps)
					b.ReportMetric(r.movesPerClass, "moves/class")
					b.ReportMetric(float64(r.maxMoves), "max-moves/class")
					b.ReportMetric(float64(r.over2), "classes-over-2-moves")
					b.ReportMetric(float64(r.unrelated), "unrelated-moves")
					b.ReportMetric(float64(r.maxGap.Microseconds())/1000, "max-gap-ms")
					b.ReportMetric(float64(r.meanGap.Microseconds())/1000, "mean-gap-ms")
					b.ReportMetric(float64(r.events), "watch-events/roll")
					b.ReportMetric(float64(r.events)/steps, "watch-events/step")
					b.ReportMetric(float64(r.events)/steps/float64(replicas), "watch-events/replica/step")
					b.ReportMetric(r.server["etcd_debugging_mvcc_events_total"], "server-events/roll")
					b.ReportMetric(float64(r.requests)/steps, "etcd-req/step")
					b.ReportMetric(r.server["etcd_mvcc_txn_total"]/steps, "srv-txn/step")
					b.ReportMetric(r.server["etcd_mvcc_put_total"]/steps, "srv-put/step")
					b.ReportMetric(r.server["etcd_debugging_lease_granted_total"]/steps, "lease-grant/step")
					b.ReportMetric(float64(r.renewals)/r.wall.Seconds(), "renewals/s")
					b.ReportMetric(r.cpu.Seconds()/r.wall.Seconds()*100, "cpu-%")
					b.ReportMetric(r.wall.Seconds(), "roll-s")
					b.ReportMetric(float64(r.stepConverge.Milliseconds()), "max-step-ms")
					b.Logf("server counter deltas over the roll: %v", r.server)
				})
			}
		}
	}
}

// TestRollingRestartMovesEachClassOnlyForItsOwner guards the property the
// benchmark measures at scale: during a rolling restart a class moves away
// from its owner and back when that owner restarts (at most twice), never
// when another replica restarts, and every class has an owner at the end.
func TestRollingRestartMovesEachClassOnlyForItsOwner(t *testing.T) {
	for _, pace := range []string{"settled", "ready"} {
		t.Run(pace, func(t *testing.T) {
			r := runRoll(t, 5, 16, pace, 300*time.Millisecond, "")
			t.Logf("moves per class %.2f (max %d), unrelated %d, longest gap %v, watch events %d",
				r.movesPerClass, r.maxMoves, r.unrelated, r.maxGap, r.events)
			require.LessOrEqual(t, r.maxMoves, 2, "a class moved more than away and back")
			require.Zero(t, r.unrelated, "a class moved while another replica restarted")
			require.Positive(t, r.gaps, "the owners' restarts moved their classes")
		})
	}
}
