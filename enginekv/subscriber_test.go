package enginekv

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func seqTrace(from, to int) string {
	var parts []string
	for i := from; i < to; i++ {
		parts = append(parts, fmt.Sprint(i))
	}
	return strings.Join(parts, " ")
}

// --- with the Python publisher (the engines' wire format, not our code) ------

func TestVLLMBatchesFromThePythonPublisherDecodeToThePlanInEveryEncoding(t *testing.T) {
	for _, tc := range []struct{ layout, hashes string }{{"array", "uint"}, {"array", "bytes"}, {"map", "uint"}, {"map", "bytes"}} {
		t.Run(tc.layout+"/"+tc.hashes, func(t *testing.T) {
			port := testenv.FreePort(t)
			steps := []pyStep{{"op": "wait_subscriber"}}
			for i := range 6 {
				steps = append(steps, batchStep(i, false))
			}
			py := startPython(t, pyPlan{Pub: tcp(port), Flavor: "vllm", Layout: tc.layout, Hashes: tc.hashes, Steps: steps})
			rec, _ := startSubscriber(t, subConfig(tcp(port), ""))
			py.waitDone(t)
			rec.waitBatches(t, 6)
			require.Equal(t, seqTrace(0, 6), rec.trace())
			requireBatchesMatch(t, rec, identity)
			require.Equal(t, 0, rec.snapshot()[0].batch.DPRank)
		})
	}
}

func TestSGLangBatchesWithSignedHashesFromThePythonPublisherDecodeToThePlan(t *testing.T) {
	port := testenv.FreePort(t)
	steps := []pyStep{{"op": "wait_subscriber"}}
	for i := range 6 {
		steps = append(steps, batchStep(i, false))
	}
	py := startPython(t, pyPlan{Pub: tcp(port), Flavor: "sglang", Steps: steps})
	rec, _ := startSubscriber(t, subConfig(tcp(port), ""))
	py.waitDone(t)
	rec.waitBatches(t, 6)
	require.Equal(t, seqTrace(0, 6), rec.trace())
	requireBatchesMatch(t, rec, identity)
}

func TestAGapIsReplayedFromThePythonPublishersRouterInBothReplyForms(t *testing.T) {
	for _, tc := range []struct {
		name, flavor string
		withTopic    bool
	}{{"vllm with topic", "vllm", true}, {"vllm without topic", "vllm", false}, {"sglang", "sglang", false}} {
		t.Run(tc.name, func(t *testing.T) {
			port, rport := twoPorts(t)
			steps := []pyStep{{"op": "wait_subscriber"}}
			for i := range 8 {
				steps = append(steps, batchStep(i, i == 2 || i == 3)) // 2 and 3 never go out live
			}
			steps = append(steps, pyStep{"op": "wait_replays", "count": 1})
			py := startPython(t, pyPlan{Pub: tcp(port), Replay: tcp(rport), Flavor: tc.flavor, Layout: "map",
				ReplyWithTopic: tc.withTopic, Steps: steps})
			rec, reg := startSubscriber(t, subConfig(tcp(port), tcp(rport)))
			py.waitDone(t)
			rec.waitBatches(t, 8)
			require.Equal(t, seqTrace(0, 8), rec.trace(), "no reset, no gap, no duplicate")
			requireBatchesMatch(t, rec, identity)
			require.Equal(t, 1.0, counter(t, reg, NameReplays, "result", "ok"))
		})
	}
}

func TestARestartOfThePythonPublishersSequenceIsAReset(t *testing.T) {
	port := testenv.FreePort(t)
	steps := []pyStep{{"op": "wait_subscriber"}, batchStep(0, false), batchStep(1, false), batchStep(2, false),
		{"op": "restart"}, batchStep(0, false), batchStep(1, false)}
	py := startPython(t, pyPlan{Pub: tcp(port), Flavor: "vllm", Steps: steps})
	rec, reg := startSubscriber(t, subConfig(tcp(port), ""))
	py.waitDone(t)
	rec.waitBatches(t, 5)
	require.Equal(t, "0 1 2 reset:restart 0 1", rec.trace())
	requireBatchesMatch(t, rec, identity)
	require.Equal(t, 1.0, counter(t, reg, NameResets, "reason", "restart"))
}

func TestASubscriberJoiningThePythonPublisherMidStreamReplaysFromZero(t *testing.T) {
	port, rport := twoPorts(t)
	// Batches 0..4 go out before anyone subscribes (a PUB drops them).
	var steps []pyStep
	for i := range 5 {
		steps = append(steps, batchStep(i, false))
	}
	steps = append(steps, pyStep{"op": "wait_subscriber"}, batchStep(5, false), pyStep{"op": "wait_replays", "count": 1},
		batchStep(6, false))
	py := startPython(t, pyPlan{Pub: tcp(port), Replay: tcp(rport), Flavor: "vllm", Layout: "array", ReplyWithTopic: true, Steps: steps})
	rec, _ := startSubscriber(t, subConfig(tcp(port), tcp(rport)))
	py.waitDone(t)
	rec.waitBatches(t, 7)
	require.Equal(t, seqTrace(0, 7), rec.trace())
	requireBatchesMatch(t, rec, identity)
}

func TestCorruptFramesFromThePythonPublisherAreCountedAndSurvived(t *testing.T) {
	port := testenv.FreePort(t)
	steps := []pyStep{{"op": "wait_subscriber"}, batchStep(0, false),
		{"op": "garbage", "frames_hex": []string{"00"}},                                       // one frame
		{"op": "garbage", "frames_hex": []string{"", "0000000000000001", "90", "ff"}},         // four frames
		{"op": "garbage", "frames_hex": []string{"", "000001", "9300"}},                       // a 3-byte seq
		{"op": "garbage", "frames_hex": []string{"", "0000000000000001", "68656c6c6f"}},       // seq 1, not msgpack
		{"op": "garbage", "frames_hex": []string{"", "0000000000000002", "93cb00dd7fffffff"}}, // seq 2, absurd length
		{"op": "restart"}, // pypub's own counter is at 1: seqs 1 and 2 were the garbage above
	}
	// Continue the real stream at 3 (after a restart pypub counts from 0,
	// so three throwaway batches are never sent).
	steps = append(steps, batchStep(0, true), batchStep(1, true), batchStep(2, true), batchStep(3, false), batchStep(4, false))
	py := startPython(t, pyPlan{Pub: tcp(port), Flavor: "vllm", Steps: steps})
	rec, reg := startSubscriber(t, subConfig(tcp(port), ""))
	py.waitDone(t)
	rec.waitBatches(t, 3)
	require.Equal(t, "0 reset:gap reset:gap 3 4", rec.trace(), "the two undecodable batches are lost, counted as gaps")
	requireBatchesMatch(t, rec, identity)
	require.Equal(t, 2.0, counter(t, reg, NameFrames, "result", "bad_frame_count"), "the one- and four-frame messages")
	require.Equal(t, 1.0, counter(t, reg, NameFrames, "result", "bad_seq"))
	require.Equal(t, 2.0, counter(t, reg, NameFrames, "result", "bad_payload"))
}

// --- the same scenarios with our Go Publisher ----------------------------------

func TestGoPublisherBatchesDecodeToTheScenarioInEveryEncoding(t *testing.T) {
	for _, enc := range allEncodings {
		t.Run(fmt.Sprintf("%v/%v", enc.Layout, enc.Hashes), func(t *testing.T) {
			p, _ := startPublisher(t, pubConfig(enc.Layout, enc.Hashes, false))
			rec, _ := startSubscriber(t, subConfig(p.Endpoint(), ""))
			waitSubscribed(t, p)
			for i := range 6 {
				publishScenario(p, i)
			}
			rec.waitBatches(t, 6)
			require.Equal(t, seqTrace(0, 6), rec.trace())
			requireBatchesMatch(t, rec, identity)
		})
	}
}

func TestAGapIsReplayedFromTheGoPublishersRouterInBothReplyForms(t *testing.T) {
	for _, withTopic := range []bool{true, false} {
		t.Run(fmt.Sprintf("topic=%v", withTopic), func(t *testing.T) {
			cfg := pubConfig(LayoutMap, HashBytes, true)
			cfg.ReplyWithTopic = withTopic
			cfg.Topic = "kv"
			p, err := NewPublisher(cfg, nil, nil)
			require.NoError(t, err)
			p.skipLive = func(seq uint64) bool { return seq == 2 || seq == 3 }
			p, _ = runPublisher(t, p)
			sc := subConfig(p.Endpoint(), p.ReplayEndpoint())
			sc.Topic = "kv"
			rec, reg := startSubscriber(t, sc)
			waitSubscribed(t, p)
			for i := range 8 {
				publishScenario(p, i)
			}
			rec.waitBatches(t, 8)
			require.Equal(t, seqTrace(0, 8), rec.trace())
			requireBatchesMatch(t, rec, identity)
			require.Equal(t, "kv", rec.snapshot()[2].batch.Topic, "a replayed batch has the live stream's topic")
			require.Equal(t, 1.0, counter(t, reg, NameReplays, "result", "ok"))
		})
	}
}

func TestARestartedGoPublisherIsAResetAndTheSubscriberReconnects(t *testing.T) {
	port := testenv.FreePort(t)
	cfg := pubConfig(LayoutArray, HashUint, false)
	cfg.Endpoint = tcp(port)
	p, stop := startPublisher(t, cfg)
	rec, _ := startSubscriber(t, subConfig(p.Endpoint(), ""))
	waitSubscribed(t, p)
	for i := range 3 {
		publishScenario(p, i)
	}
	rec.waitBatches(t, 3)
	stop()
	p2, _ := startPublisher(t, cfg)
	waitSubscribed(t, p2)
	publishScenario(p2, 0)
	publishScenario(p2, 1)
	rec.waitBatches(t, 5)
	require.Equal(t, "0 1 2 reset:restart 0 1", rec.trace())
	requireBatchesMatch(t, rec, identity)
}

func TestASubscriberJoiningTheGoPublisherMidStreamReplaysFromZero(t *testing.T) {
	p, _ := startPublisher(t, pubConfig(LayoutArray, HashInt64, true))
	for i := range 5 {
		publishScenario(p, i) // nobody subscribed yet: dropped live, kept for replay
	}
	waitSent(t, p, 5)
	rec, _ := startSubscriber(t, subConfig(p.Endpoint(), p.ReplayEndpoint()))
	waitSubscribed(t, p)
	publishScenario(p, 5)
	rec.waitBatches(t, 6)
	require.Equal(t, seqTrace(0, 6), rec.trace())
	requireBatchesMatch(t, rec, identity)
}

func TestAMidStreamJoinWithoutReplayIsAResetBeforeTheFirstBatch(t *testing.T) {
	p, _ := startPublisher(t, pubConfig(LayoutArray, HashUint, false))
	for i := range 3 {
		publishScenario(p, i)
	}
	waitSent(t, p, 3)
	rec, _ := startSubscriber(t, subConfig(p.Endpoint(), ""))
	waitSubscribed(t, p)
	publishScenario(p, 3)
	rec.waitBatches(t, 1)
	require.Equal(t, "reset:joined_mid_stream 3", rec.trace())
	requireBatchesMatch(t, rec, identity)
}

func TestAGapWithoutReplayIsAReset(t *testing.T) {
	cfg := pubConfig(LayoutArray, HashUint, false)
	p, err := NewPublisher(cfg, nil, nil)
	require.NoError(t, err)
	p.skipLive = func(seq uint64) bool { return seq == 1 }
	p, _ = runPublisher(t, p)
	rec, _ := startSubscriber(t, subConfig(p.Endpoint(), ""))
	waitSubscribed(t, p)
	for i := range 3 {
		publishScenario(p, i)
	}
	rec.waitBatches(t, 2)
	require.Equal(t, "0 reset:gap 2", rec.trace())
}

func TestAReplayThatCannotConnectTimesOutAndResets(t *testing.T) {
	cfg := pubConfig(LayoutArray, HashUint, false)
	p, err := NewPublisher(cfg, nil, nil)
	require.NoError(t, err)
	p.skipLive = func(seq uint64) bool { return seq == 1 }
	p, _ = runPublisher(t, p)
	sc := subConfig(p.Endpoint(), tcp(testenv.FreePort(t))) // nothing listens there
	sc.ReplayTimeout = 300 * time.Millisecond
	rec, reg := startSubscriber(t, sc)
	waitSubscribed(t, p)
	publishScenario(p, 0)
	rec.waitBatches(t, 1)
	publishScenario(p, 1)
	publishScenario(p, 2)
	publishScenario(p, 3)
	rec.waitBatches(t, 3)
	require.Equal(t, "0 reset:replay_failed 2 3", rec.trace())
	require.Equal(t, 1.0, counter(t, reg, NameReplays, "result", "failed"))
}

func TestCorruptFramesFromTheGoPublisherAreCountedAndSurvived(t *testing.T) {
	p, _ := startPublisher(t, pubConfig(LayoutArray, HashUint, false))
	rec, reg := startSubscriber(t, subConfig(p.Endpoint(), ""))
	waitSubscribed(t, p)
	publishScenario(p, 0)
	p.injectRaw([]byte{0})
	p.injectRaw([]byte{}, seqBytes(1), []byte{0x90}, []byte{0xff})
	p.injectRaw([]byte{}, []byte{1, 2, 3}, []byte{0x90})
	publishScenario(p, 1)
	rec.waitBatches(t, 2)
	require.Equal(t, "0 1", rec.trace())
	require.Equal(t, 2.0, counter(t, reg, NameFrames, "result", "bad_frame_count"))
	require.Equal(t, 1.0, counter(t, reg, NameFrames, "result", "bad_seq"))
}

func TestABindingSubscriberReceivesFromADialingPublisher(t *testing.T) {
	port := testenv.FreePort(t)
	sc := subConfig(tcp(port), "")
	sc.Bind = true
	rec, _ := startSubscriber(t, sc)
	cfg := pubConfig(LayoutMap, HashUint, false)
	cfg.Endpoint, cfg.Dial = tcp(port), true
	p, _ := startPublisher(t, cfg)
	waitSubscribed(t, p)
	for i := range 3 {
		publishScenario(p, i)
	}
	rec.waitBatches(t, 3)
	require.Equal(t, seqTrace(0, 3), rec.trace())
}

// runPublisher runs an already built Publisher until the test ends.
func runPublisher(t *testing.T, p *Publisher) (*Publisher, func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	select {
	case <-p.Ready():
	case err := <-done:
		t.Fatalf("publisher: %v", err)
	}
	stopped := false
	stop := func() {
		if !stopped {
			stopped = true
			cancel()
			require.NoError(t, <-done)
		}
	}
	t.Cleanup(stop)
	return p, stop
}

// waitSent waits until the publisher has sent n batches (to nobody, before
// any subscriber exists).
func waitSent(t *testing.T, p *Publisher, n int) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(p.m.batches) >= float64(n) }, "%d batches sent", n)
}

// twoPorts returns two distinct free ports (FreePort may hand out the same
// one twice, since it closes what it probed).
func twoPorts(t *testing.T) (int, int) {
	t.Helper()
	a := testenv.FreePort(t)
	for {
		if b := testenv.FreePort(t); b != a {
			return a, b
		}
	}
}

// twoBatchesThenStop runs a publisher with a replay endpoint on fixed ports
// (a restarted one binds them again with cfg), has a subscriber take its
// seq 0 and 1, and stops it.
func twoBatchesThenStop(t *testing.T) (PublisherConfig, *recorder, *prometheus.Registry) {
	t.Helper()
	port, rport := twoPorts(t)
	cfg := pubConfig(LayoutArray, HashUint, true)
	cfg.Endpoint, cfg.ReplayEndpoint = tcp(port), tcp(rport)
	p, stop := startPublisher(t, cfg)
	rec, reg := startSubscriber(t, subConfig(p.Endpoint(), p.ReplayEndpoint()))
	waitSubscribed(t, p)
	publishScenario(p, 0)
	publishScenario(p, 1)
	rec.waitBatches(t, 2)
	stop()
	return cfg, rec, reg
}

func TestARestartedEngineThatAlreadyPassedOurSequenceIsStillAReset(t *testing.T) {
	cfg, rec, _ := twoBatchesThenStop(t)
	// The new engine gets past seq 1 before the subscriber is back: seq 5
	// is the first it sees, which alone looks like a gap after 1.
	// Its batches differ from the old engine's by their timestamps, as a
	// real engine's do (a byte-identical batch at that seq could not be
	// told apart).
	p2, _ := startPublisher(t, cfg)
	for i := range 5 {
		publishScenarioAt(p2, i, 1000+float64(i))
	}
	waitSubscribed(t, p2)
	publishScenarioAt(p2, 5, 1005)
	rec.waitBatches(t, 8)
	require.Equal(t, "0 1 reset:restart 0 1 2 3 4 5", rec.trace())
	requireBatchesMatch(t, rec, identity)
}

// A restarted engine publishes nothing until it gets work, and under
// KV-aware routing a worker whose blocks the routers no longer see may get
// none for a long time: the subscriber asks the replay endpoint as soon as
// it is back, and the lost cache is a reset before any new batch.
func TestARestartedEngineThatPublishesNothingIsAResetAsSoonAsTheSubscriberIsBack(t *testing.T) {
	cfg, rec, reg := twoBatchesThenStop(t)
	p2, _ := startPublisher(t, cfg)
	waitSubscribed(t, p2)
	testenv.Eventually(t, 10*time.Second, func() bool { return rec.trace() == "0 1 reset:restart" },
		"a reset before the restarted engine publishes")
	publishScenario(p2, 0)
	rec.waitBatches(t, 3)
	require.Equal(t, "0 1 reset:restart 0", rec.trace())
	requireBatchesMatch(t, rec, identity)
	require.Equal(t, 1.0, counter(t, reg, NameResets, "reason", "restart"))
}

// The same engine behind a broken connection answers the reconnect's replay
// with the batch we took last: no reset, and what it published meanwhile
// arrives by that replay.
func TestAReconnectToTheSameEngineIsNoResetAndReplaysWhatWasMissed(t *testing.T) {
	p, _ := startPublisher(t, pubConfig(LayoutArray, HashUint, true))
	proxy := testenv.StartProxy(t, strings.TrimPrefix(p.Endpoint(), "tcp://"))
	rec, reg := startSubscriber(t, subConfig("tcp://"+proxy.Addr(), p.ReplayEndpoint()))
	waitSubscribed(t, p)
	publishScenario(p, 0)
	publishScenario(p, 1)
	rec.waitBatches(t, 2)
	proxy.Cut()
	testenv.Eventually(t, 10*time.Second, func() bool { return !p.subscribed() }, "the publisher losing its subscriber")
	publishScenario(p, 2) // nobody subscribed: kept for replay only
	waitSent(t, p, 3)
	proxy.Restore()
	rec.waitBatches(t, 3)
	require.Equal(t, "0 1 2", rec.trace())
	requireBatchesMatch(t, rec, identity)
	require.Equal(t, 1.0, counter(t, reg, NameReplays, "result", "ok"))
	require.Zero(t, counter(t, reg, NameResets, "reason", "restart"))
}
