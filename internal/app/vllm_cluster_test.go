package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// vllmEngine is a simulated engine speaking vLLM's protocol (it registers
// nowhere and publishes its KV events on ZMQ) with an adapter beside it that
// makes it worker id of the cluster.
type vllmEngine struct {
	id         string
	worker     *runningWorker
	adapterURL string // the adapter's HTTP base URL (its /metrics)
	stop       func()
}

func startVLLMEngineWithAdapter(t *testing.T, c *testCluster, id string, format func(*VLLMWorkerConfig)) *vllmEngine {
	t.Helper()
	return startVLLMEngine(t, c, id, func(w *WorkerConfig) {
		if format != nil {
			format(&w.VLLM)
		}
	}, nil)
}

// startVLLMEngine is startVLLMEngineWithAdapter with the engine's and the
// adapter's configurations changed by mutateWorker and mutateAdapter (each
// may be nil).
func startVLLMEngine(t *testing.T, c *testCluster, id string, mutateWorker func(*WorkerConfig), mutateAdapter func(*adapter.Config)) *vllmEngine {
	t.Helper()
	wcfg := vllmWorkerConfig(t)
	wcfg.ID = id
	if mutateWorker != nil {
		mutateWorker(&wcfg)
	}
	w := startWorker(t, wcfg)

	acfg := adapter.DefaultConfig()
	acfg.Engine = adapter.EngineVLLM
	acfg.EngineURL = w.url
	acfg.KVEvents, acfg.KVReplay = wcfg.VLLM.EventsBind, wcfg.VLLM.ReplayBind
	acfg.ID, acfg.Cluster = id, "test"
	acfg.Listen = "127.0.0.1:0"
	acfg.EtcdEndpoints, acfg.NATSURL = c.etcd.Endpoints, c.nats.URL
	acfg.LeaseTTL = 2 * time.Second
	acfg.HealthInterval = 100 * time.Millisecond
	// A replay that times out resets the engine's blocks on the routers (a
	// miss, never a stale hit), which is right but would fail the routing
	// assertions below when a loaded CI machine stalls the engine's ROUTER.
	acfg.KVReplayTimeout = 15 * time.Second
	if mutateAdapter != nil {
		mutateAdapter(&acfg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	ready := make(chan string, 1)
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	go func() { done <- RunAdapterWithLinks(ctx, acfg, Links{}, log, func(u string) { ready <- u }) }()
	var adapterURL string
	select {
	case adapterURL = <-ready:
	case err := <-done:
		cancel()
		t.Fatalf("adapter %s did not start: %v", id, err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("adapter %s did not start within 30s", id)
	}
	e := &vllmEngine{id: id, worker: w, adapterURL: adapterURL, stop: func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("adapter %s: %v", id, err)
		}
	}}
	t.Cleanup(e.stop)
	return e
}

// The whole adapter path in one process: a router replica, two simulated
// engines that speak only vLLM's protocol (ZMQ KV events with opaque
// per-process block hashes, vLLM's HTTP endpoints and metrics), and one
// adapter beside each. A multi-turn conversation's turns 2..n go to the
// worker that holds turn 1's blocks, and what the router predicted cached
// on each turn is exactly what the engine reports it served from cache.
//
// It runs with current vLLM's wire format (map events, unsigned hashes,
// replay replies with a topic) and with SGLang's (tagged-array events,
// signed 64-bit hashes, replay replies without a topic).
func TestAMultiTurnChatStaysOnTheVLLMEngineHoldingItsBlocksAndCachedTokensMatchThePrediction(t *testing.T) {
	formats := map[string]func(*VLLMWorkerConfig){
		"vllm": nil,
		"sglang": func(v *VLLMWorkerConfig) {
			v.Encoding, v.HashForm, v.ReplyWithTopic = "array", "int64", false
		},
	}
	for name, format := range formats {
		t.Run(name, func(t *testing.T) { multiTurnChatThroughAdapters(t, format) })
	}
}

func multiTurnChatThroughAdapters(t *testing.T, format func(*VLLMWorkerConfig)) {
	c := newTestCluster(t, 0)
	engines := []*vllmEngine{startVLLMEngineWithAdapter(t, c, "v1", format), startVLLMEngineWithAdapter(t, c, "v2", format)}
	// Routing-time predictions expire at once, so every overlap the router
	// sees comes from the engines' own events as the adapters rehash them:
	// a wrong hash would show as a cache miss on the next turn.
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.PredictTTL = time.Nanosecond })
	c.waitOwned([]string{"interactive"}, "r1")
	awaitV1AndV2Registered(t, r)

	// The adapters' load reports carry the id of the last KV event each
	// published: the router's index has caught up with an engine once its
	// digest for that worker reaches the id of a report sent after the
	// engine finished a request.
	type mark struct {
		lastID uint64
		at     time.Time
	}
	marks := make(chan mark, 64)
	sub, err := c.nats.Conn(t).Subscribe(wire.NewSubjects("test").LoadAll(), func(m *nats.Msg) {
		if lr, err := wire.DecodeLoadReport(m.Data); err == nil {
			select {
			case marks <- mark{lr.LastEventID, time.Unix(0, lr.TimeUnixNano)}:
			default: // the test reads a fresh one when it needs it
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	byID := map[string]*vllmEngine{}
	for _, e := range engines {
		byID[e.id] = e
	}
	caughtUp := func(worker string, after time.Time) {
		t.Helper()
		// First the adapter has read every batch the engine published by
		// now (a loaded machine can hold them in ZMQ for longer than any
		// fixed delay); a load report sent after that carries their ids.
		e := byID[worker]
		published := scrapedCounter(t, e.worker.url+"/metrics", enginekv.NamePubBatches)
		require.Positive(t, published, "%s published its blocks' events", worker)
		testenv.Eventually(t, 10*time.Second, func() bool {
			return scrapedCounter(t, e.adapterURL+"/metrics", enginekv.NameBatches) >= published
		}, "%s's adapter read the engine's %v batches", worker, published)
		if now := time.Now(); now.After(after) {
			after = now
		}
		var want uint64
		testenv.Eventually(t, 10*time.Second, func() bool {
			for {
				select {
				case m := <-marks:
					if m.at.After(after) {
						want = max(want, m.lastID)
					}
					continue
				default:
				}
				break
			}
			d, ok := r.status.ix.Digest(worker)
			return want > 0 && ok && d.LastID >= want
		}, "the router's index caught up with %s's events", worker)
	}

	cl := r.client()
	ctx := testenv.Context(t)
	system := strings.Repeat("You are a careful assistant who answers questions about railway switchyards. ", 40)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system)}
	var first string
	for turn := 1; turn <= 5; turn++ {
		msgs = append(msgs, openai.UserMessage(fmt.Sprintf("Question %d: how many tracks does yard number %d have?", turn, turn*7)))
		before := counterSum(t, r.reg, metrics.NamePredictedCachedTokens)
		var hr *http.Response
		resp, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model: testModel, Messages: msgs, MaxTokens: openai.Int(8),
		}, option.WithResponseInto(&hr))
		require.NoError(t, err, "turn %d", turn)
		done := time.Now()
		worker := hr.Header.Get("X-Switchyard-Routed-Worker")
		require.NotEmpty(t, worker)
		predicted := counterSum(t, r.reg, metrics.NamePredictedCachedTokens) - before
		served := resp.Usage.PromptTokensDetails.CachedTokens
		if turn == 1 {
			first = worker
			assert.Zero(t, served, "nothing is cached before the first turn")
		} else {
			assert.Equal(t, first, worker, "turn %d follows turn 1's blocks", turn)
			assert.Greater(t, served, int64(512), "turn %d is served mostly from cache", turn)
		}
		assert.Equal(t, float64(served), predicted, "turn %d: the router's predicted cached tokens are the engine's", turn)
		msgs = append(msgs, openai.AssistantMessage(resp.Choices[0].Message.Content))
		caughtUp(worker, done.Add(50*time.Millisecond))
	}
	for _, e := range engines {
		d, ok := r.status.ix.Digest(e.id)
		require.True(t, ok, "%s is in the router's index", e.id)
		if e.id == first {
			assert.Positive(t, d.Blocks, "the conversation's blocks are indexed under its engine")
		} else {
			assert.Zero(t, d.Blocks, "the other engine never served the conversation")
		}
	}
}

// awaitV1AndV2Registered waits until r's /debug/cluster lists the workers
// of both adapters, v1 and v2.
func awaitV1AndV2Registered(t *testing.T, r *runningReplica) {
	t.Helper()
	testenv.Eventually(t, 15*time.Second, func() bool {
		resp, err := http.Get("http://" + r.status.HTTPAddr + "/debug/cluster")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return err == nil && strings.Contains(string(b), `"v1"`) && strings.Contains(string(b), `"v2"`)
	}, "both adapters' workers registered on the router")
}

// scrapedCounter is the sum of counter name's series at a /metrics URL.
func scrapedCounter(t *testing.T, url, name string) float64 {
	t.Helper()
	fams, err := scrape(url)
	require.NoError(t, err)
	sum := 0.0
	if f, ok := fams[name]; ok {
		for _, m := range f.GetMetric() {
			sum += m.GetCounter().GetValue()
		}
	}
	return sum
}
