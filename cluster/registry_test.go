package cluster

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

// runInBackground runs fn until the test ends and fails the test if it
// returns an error.
func runInBackground(t *testing.T, fn func(context.Context) error) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := fn(ctx); err != nil {
			t.Errorf("run: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); wg.Wait() })
}

func testWorker(id string) wire.WorkerInfo {
	return wire.WorkerInfo{ID: id, URL: "http://127.0.0.1:9", Model: "m", BlockSize: 16, KVBlocks: 100, MaxNumSeqs: 8, MaxBatchedTokens: 512}
}

func TestReplicaRegistryReflectsRegistrationsReadinessAndDeletes(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	deps := Deps{Logger: zaptest.NewLogger(t), Registerer: prometheus.NewRegistry()}
	reps, err := NewReplicas(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond}, deps)
	require.NoError(t, err)
	sess, err := NewSession(client, SessionConfig{Cluster: testCluster, TTL: 5 * time.Second}, Deps{})
	require.NoError(t, err)
	runInBackground(t, reps.Run)
	runInBackground(t, func(ctx context.Context) error {
		if err := sess.Run(ctx); err != nil {
			return err
		}
		return nil
	})
	_, err = sess.WaitLease(ctx)
	require.NoError(t, err)
	require.NoError(t, reps.WaitSynced(ctx))

	require.NoError(t, sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: "r1", HTTPAddr: "h:1"}))
	testenv.Eventually(t, 5*time.Second, func() bool {
		r, ok := reps.Snapshot().Items["r1"]
		return ok && !r.Info.Ready && r.ReadySince.IsZero() && r.Lease == sess.Lease()
	}, "the registry shows r1, not ready, bound to the session lease")

	snap := reps.Snapshot()
	require.NoError(t, sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: "r1", HTTPAddr: "h:1", Ready: true}))
	select {
	case <-snap.Changed():
	case <-time.After(5 * time.Second):
		t.Fatal("the snapshot's Changed channel was not closed by the update")
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		r := reps.Snapshot().Items["r1"]
		return r.Info.Ready && !r.ReadySince.IsZero()
	}, "readiness and its start time are recorded")
	since := reps.Snapshot().Items["r1"].ReadySince

	require.NoError(t, sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: "r1", HTTPAddr: "h:2", Ready: true}))
	testenv.Eventually(t, 5*time.Second, func() bool { return reps.Snapshot().Items["r1"].Info.HTTPAddr == "h:2" }, "update seen")
	require.Equal(t, since, reps.Snapshot().Items["r1"].ReadySince, "staying ready keeps the settle clock running")

	_, err = client.Delete(ctx, wire.NewKeys(testCluster).Replica("r1"))
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool { return len(reps.Snapshot().Items) == 0 }, "delete seen")
	require.Equal(t, float64(0), testutil.ToFloat64(reps.c.size))
}

// runWorkerRegistry starts a worker registry on client for the test's life.
func runWorkerRegistry(t *testing.T, client *clientv3.Client) *Workers {
	t.Helper()
	workers, err := NewWorkers(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond}, Deps{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runInBackground(t, workers.Run)
	return workers
}

func TestWorkerRegistryDropsAWorkerWhoseLeaseExpired(t *testing.T) {
	e := testenv.StartEtcd(t)
	ctx := testenv.Context(t)
	workers := runWorkerRegistry(t, e.Client(t))

	// The worker has its own client and session, and dies without revoking.
	wc, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	sess, err := NewSession(wc, SessionConfig{Cluster: testCluster, TTL: time.Second}, Deps{})
	require.NoError(t, err)
	sctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- sess.Run(sctx) }()
	_, err = sess.WaitLease(ctx)
	require.NoError(t, err)
	require.NoError(t, sess.RegisterWorker(ctx, testWorker("w1")))
	testenv.Eventually(t, 5*time.Second, func() bool {
		w, ok := workers.Snapshot().Items["w1"]
		return ok && w.Info.BlockSize == 16
	}, "w1 registered")
	require.Equal(t, float64(1), testutil.ToFloat64(workers.c.size))

	_ = wc.Close()
	stop()
	<-done //nolint:errcheck // waiting for Run to return; its error is not what this test checks
	diedAt := time.Now()
	testenv.Eventually(t, 5*time.Second, func() bool { return len(workers.Snapshot().Items) == 0 },
		"the dead worker's record outlived its lease")
	t.Logf("worker record gone %v after its process died (ttl 1s)", time.Since(diedAt))
}

func TestRegistryCountsBadRecordsAndKeepsServingGoodOnes(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	keys := wire.NewKeys(testCluster)
	// One bad record exists before the first list, the rest arrive by watch.
	_, err := client.Put(ctx, keys.Worker("garbage"), "{not json")
	require.NoError(t, err)
	workers, err := NewWorkers(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond}, Deps{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runInBackground(t, workers.Run)
	require.NoError(t, workers.WaitSynced(ctx))

	good, err := wire.EncodeWorkerInfo(ptr(testWorker("w1")))
	require.NoError(t, err)
	mismatched, err := wire.EncodeWorkerInfo(ptr(testWorker("other")))
	require.NoError(t, err)
	zeroBlocks := testWorker("w3")
	zeroBlocks.BlockSize = 0
	invalid, err := wire.EncodeWorkerInfo(&zeroBlocks)
	require.NoError(t, err)
	for k, v := range map[string][]byte{
		keys.Worker("w1"):               good,
		keys.Worker("w2"):               mismatched, // id differs from the key
		keys.Worker("w3"):               invalid,
		keys.Workers() + "nested/deep":  good, // not a direct child
		keys.Worker("w1") + "-shadowed": []byte(`{"version":99}`),
	} {
		_, err := client.Put(ctx, k, string(v))
		require.NoError(t, err)
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(workers.c.decodeErrs) == 5 },
		"five bad records counted (got %v)", lazyFloat(func() float64 { return testutil.ToFloat64(workers.c.decodeErrs) }))
	// The puts run in map order, so the good record may be the last event.
	testenv.Eventually(t, 5*time.Second, func() bool { return slices.Equal(sortedKeys(workers.Snapshot().Items), []string{"w1"}) },
		"only the good record is served (got %v)", lazyKeys(func() []string { return sortedKeys(workers.Snapshot().Items) }))

	// A good record that turns bad is dropped, not kept stale.
	_, err = client.Put(ctx, keys.Worker("w1"), "null")
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool { return len(workers.Snapshot().Items) == 0 }, "w1 dropped")
	require.Equal(t, float64(6), testutil.ToFloat64(workers.c.decodeErrs))
}

func TestRegistryRelistsWhenItsWatchRevisionWasCompacted(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	keys := wire.NewKeys(testCluster)
	workers, err := NewWorkers(client, RegistryConfig{Cluster: testCluster, RetryInterval: 50 * time.Millisecond}, Deps{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)

	// Right after the first list, and before its watch starts, a worker is
	// added and history is compacted past the list's revision: the watch
	// must fail and the registry must find w1 by listing again.
	first := true
	list := workers.c.w.onList
	workers.c.w.onList = func(rev int64, kvs []*mvccpb.KeyValue) {
		list(rev, kvs)
		if !first {
			return
		}
		first = false
		b, err := wire.EncodeWorkerInfo(ptr(testWorker("w1")))
		require.NoError(t, err)
		_, err = client.Put(ctx, keys.Worker("w1"), string(b))
		require.NoError(t, err)
		resp, err := client.Put(ctx, keys.Prefix()+"unrelated", "x")
		require.NoError(t, err)
		_, err = client.Compact(ctx, resp.Header.Revision)
		require.NoError(t, err)
	}
	runInBackground(t, workers.Run)
	testenv.Eventually(t, 5*time.Second, func() bool { _, ok := workers.Snapshot().Items["w1"]; return ok },
		"w1, written into compacted history, was never seen")
	require.Equal(t, float64(1), testutil.ToFloat64(workers.c.w.relists))
}

func ptr[T any](v T) *T { return &v }

type lazyFloat func() float64

func (f lazyFloat) String() string { return prometheusFloat(f()) }

// lazyKeys formats a key list only when a failure message needs it.
type lazyKeys func() []string

func (f lazyKeys) String() string { return fmt.Sprint(f()) }

func prometheusFloat(v float64) string { return strconvFloat(v) }

func strconvFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

func TestWorkerRegistryTellsWhichWorkersPublishKVEvents(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	workers := runWorkerRegistry(t, client)
	sess, err := NewSession(client, SessionConfig{Cluster: testCluster, TTL: 2 * time.Second}, Deps{})
	require.NoError(t, err)
	runInBackground(t, sess.Run)
	_, err = sess.WaitLease(ctx)
	require.NoError(t, err)

	loud, quiet := testWorker("loud"), testWorker("quiet")
	loud.PublishesEvents = true
	require.NoError(t, sess.RegisterWorker(ctx, loud))
	require.NoError(t, sess.RegisterWorker(ctx, quiet))
	testenv.Eventually(t, 5*time.Second, func() bool { return len(workers.Snapshot().Items) == 2 }, "both registered")
	require.True(t, workers.PublishesEvents("loud"))
	require.False(t, workers.PublishesEvents("quiet"))
	require.True(t, workers.PublishesEvents("unknown"), "an unregistered worker gets the default (publishing) treatment")
}
