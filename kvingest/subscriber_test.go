package kvingest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

const testCluster = "kvtest"

type replica struct {
	ix  *kvindex.Index
	reg *prometheus.Registry
	sub *Subscriber
}

// startReplica runs an index fed by its own NATS connection until the test
// ends, and checks that Run returns cleanly.
func startReplica(t *testing.T, n *testenv.NATS, opts ...SubscriberOption) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	ix, err := kvindex.New(kvindex.DefaultConfig(), nil, zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Cluster = testCluster
	cfg.DumpRetry = 10 * time.Millisecond
	cfg.DumpRetryMax = 50 * time.Millisecond
	cfg.DumpTimeout = 2 * time.Second
	nc := n.Conn(t)
	sub, err := NewSubscriber(cfg, nc, ix, zaptest.NewLogger(t), reg, opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done, "Run returns nil when its context ends")
	})
	return &replica{ix: ix, reg: reg, sub: sub}
}

// dropEvery returns a filter that loses every k-th KV batch.
func dropEvery(k int64) (SubscriberOption, *atomic.Int64) {
	var seen, dropped atomic.Int64
	return WithMessageFilter(func(*nats.Msg) bool {
		if seen.Add(1)%k == 0 {
			dropped.Add(1)
			return false
		}
		return true
	}), &dropped
}

// waitSubscribed publishes heartbeats until every replica knows the worker,
// so that the test's first real batch is not published before a replica
// subscribed.
func waitSubscribed(t *testing.T, w *fakeWorker, rs ...*replica) {
	testenv.Eventually(t, 5*time.Second, func() bool {
		w.heartbeat()
		for _, r := range rs {
			if _, ok := r.ix.Digest(w.name); !ok {
				return false
			}
		}
		return true
	}, "replicas never saw the worker's heartbeat")
}

func converge(t *testing.T, w *fakeWorker, what string, rs ...*replica) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, r := range rs {
			if !w.matches(r.ix) {
				w.heartbeat() // reveals a lost trailing batch
				return false
			}
		}
		return true
	}, "replicas did not converge on the worker's true block set %s", what)
}

func TestTwoReplicasConvergeOnTheWorkersTrueBlocksDespiteLostBatchesAndARestart(t *testing.T) {
	n := testenv.StartNATS(t)
	w := newFakeWorker(t, n.Conn(t), testCluster, "w1", 1)
	w.serveDumps()
	exact := startReplica(t, n)
	lossyOpt, dropped := dropEvery(5)
	lossy := startReplica(t, n, lossyOpt)
	waitSubscribed(t, w, exact, lossy)

	for i := 0; i < 400; i++ {
		w.step()
	}
	converge(t, w, "after lost batches", exact, lossy)
	require.Positive(t, dropped.Load(), "the lossy replica lost batches")
	require.Positive(t, testenv.MetricValue(t, lossy.reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "gap"})+
		testenv.MetricValue(t, lossy.reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "unknown_parent"}),
		"the lossy replica detected its losses")
	require.Positive(t, testenv.MetricValue(t, lossy.reg, "switchyard_index_dumps_total", map[string]string{"result": "applied"}))
	require.Zero(t, testenv.MetricValue(t, exact.reg, "switchyard_index_dumps_total", nil), "a replica that lost nothing never needs a dump")
	require.Positive(t, testenv.MetricValue(t, exact.reg, "switchyard_index_event_lag_seconds", nil), "lag is measured from publish times")
	blocks, _, _ := w.truth()
	require.NotEmpty(t, blocks, "the comparison is not vacuous")

	w.restart()
	for i := 0; i < 200; i++ {
		w.step()
	}
	converge(t, w, "after the engine restarted", exact, lossy)
	require.Equal(t, 1.0, testenv.MetricValue(t, exact.reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "instance"}),
		"the restart is detected from the instance change")
}

func TestADumpWithoutResponderIsRetriedUntilTheWorkerAnswers(t *testing.T) {
	n := testenv.StartNATS(t)
	w := newFakeWorker(t, n.Conn(t), testCluster, "w2", 2)
	// Published before the replica exists: it meets the worker mid-stream
	// and needs a dump that nobody answers yet.
	for i := 0; i < 20; i++ {
		w.step()
	}
	require.NoError(t, w.nc.Flush(), "the server has routed the batches before the replica subscribes")
	r := startReplica(t, n)
	testenv.Eventually(t, 5*time.Second, func() bool {
		w.heartbeat()
		return testenv.MetricValue(t, r.reg, "switchyard_index_dumps_total", map[string]string{"result": "no_responders"}) > 0
	}, "no dump attempt failed for lack of responders")
	require.True(t, r.ix.NeedsDump("w2"))

	w.serveDumps()
	converge(t, w, "once the worker answers dumps", r)
}

func TestMalformedBatchesAreCountedAndDropped(t *testing.T) {
	n := testenv.StartNATS(t)
	r := startReplica(t, n)
	pub := n.Conn(t)
	subj := wire.NewSubjects(testCluster)
	w := newFakeWorker(t, pub, testCluster, "w3", 3)
	waitSubscribed(t, w, r)

	require.NoError(t, pub.Publish(subj.KV("w3"), []byte("not a batch")))
	other := wire.AppendKVEventBatch(nil, batch("w4", 1, 1, stored(nil, 1)))
	require.NoError(t, pub.Publish(subj.KV("w3"), other), "a batch on another worker's subject")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testenv.MetricValue(t, r.reg, "switchyard_index_decode_errors_total", map[string]string{"kind": "batch"}) == 2
	}, "decode errors not counted")
	_, ok := r.ix.Digest("w4")
	require.False(t, ok, "a batch whose worker disagrees with its subject is not applied")
	w.step()
	converge(t, w, "after the garbage", r)
}

func TestTheSubscriberSweepsExpiredPredictions(t *testing.T) {
	n := testenv.StartNATS(t)
	clk := newFakeClock()
	ix, err := kvindex.New(kvindex.DefaultConfig(), clk, nil, prometheus.NewRegistry())
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Cluster = testCluster
	sub, err := NewSubscriber(cfg, n.Conn(t), ix, nil, prometheus.NewRegistry(), WithClock(clk))
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-done) }()

	require.NoError(t, ix.Predict("a", chain(1, 4), 5*time.Second))
	require.Equal(t, 4, ix.PredictedEntries())
	testenv.Eventually(t, 5*time.Second, func() bool {
		clk.Advance(cfg.SweepInterval)
		return ix.PredictedEntries() == 0
	}, "expired predictions were never swept")
}

func TestFetchDumpRejectsChunksOutOfOrder(t *testing.T) {
	n := testenv.StartNATS(t)
	nc := n.Conn(t)
	subj := wire.NewSubjects(testCluster)
	s, err := nc.Subscribe(subj.KVDump("w5"), func(m *nats.Msg) {
		for _, seq := range []uint32{0, 2} {
			_ = nc.Publish(m.Reply, wire.AppendKVDumpChunk(nil, &wire.KVDumpChunk{Worker: "w5", Seq: seq, Final: seq == 2}))
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush(), "the responder is registered before the request")
	defer func() { _ = s.Unsubscribe() }()
	ix, err := kvindex.New(kvindex.DefaultConfig(), nil, nil, nil)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.Cluster = testCluster
	sub, err := NewSubscriber(cfg, n.Conn(t), ix, nil, nil)
	require.NoError(t, err)
	_, err = sub.FetchDump(testenv.Context(t), "w5")
	require.ErrorIs(t, err, ErrDumpFailed)
	require.ErrorIs(t, err, wire.ErrMalformed)
}
