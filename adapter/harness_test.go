package adapter

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/kvingest"
	"github.com/switchyard/switchyard/wire"
)

const testCluster = "adapter-test"

// fakeEngine is a real HTTP server answering as vLLM does (its /v1/models,
// /health and /metrics wire format); the test changes its answers.
type fakeEngine struct {
	srv     *httptest.Server
	healthy atomic.Bool
	models  atomic.Pointer[string]
	metrics atomic.Pointer[string]
	info    atomic.Pointer[string] // SGLang /get_server_info
	probes  atomic.Int64
}

// testSalt is vllmModels' root: an adapter that discovered its engine
// salts the base model's blocks by it (wire.WorkerInfo.Salt).
const testSalt = "/models/llama-3.1-8b"

const vllmModels = `{"object":"list","data":[
 {"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1733000000,"owned_by":"vllm",
  "root":"/models/llama-3.1-8b","parent":null,"max_model_len":8192,
  "permission":[{"id":"modelperm-1","object":"model_permission","created":1733000000,"allow_create_engine":false}]},
 {"id":"sql-lora","object":"model","created":1733000000,"owned_by":"vllm","root":"/loras/sql",
  "parent":"meta-llama/Llama-3.1-8B-Instruct","max_model_len":null,"permission":[]}]}`

func vllmMetrics(running, waiting int, usage float64) string {
	return fmt.Sprintf(`# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",calculate_kv_scales="False",enable_prefix_caching="True",gpu_memory_utilization="0.9",is_attention_free="False",num_cpu_blocks="None",num_gpu_blocks="2048",num_gpu_blocks_override="None",prefix_caching_hash_algo="sha256",sliding_window="None",swap_space="4",swap_space_bytes="4294967296"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} %d.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 1.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} %d.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} %g
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} %g
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 12345.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 800.0
vllm:prefix_cache_queries_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 400.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 240.0
vllm:prefix_cache_hits_total{engine="1",model_name="meta-llama/Llama-3.1-8B-Instruct"} 120.0
`, running, waiting, usage, usage)
}

func startFakeEngine(t *testing.T) *fakeEngine {
	t.Helper()
	return startFakeEngineWith(t, httptest.NewServer)
}

// startFakeEngineWith is startFakeEngine on the server start makes of the
// engine's handler (httptest.NewServer, or an HTTPS one).
func startFakeEngineWith(t *testing.T, start func(http.Handler) *httptest.Server) *fakeEngine {
	t.Helper()
	e := &fakeEngine{}
	e.healthy.Store(true)
	m, x := vllmModels, vllmMetrics(3, 2, 0.25)
	e.models.Store(&m)
	e.metrics.Store(&x)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		e.probes.Add(1)
		if !e.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		e.probes.Add(1)
		if !e.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(*e.models.Load()))
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		_, _ = w.Write([]byte(*e.metrics.Load()))
	})
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, _ *http.Request) {
		p := e.info.Load()
		if p == nil {
			http.NotFound(w, nil)
			return
		}
		_, _ = w.Write([]byte(*p))
	})
	e.srv = start(mux)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *fakeEngine) setModels(s string)  { e.models.Store(&s) }
func (e *fakeEngine) setMetrics(s string) { e.metrics.Store(&s) }

// loadReports subscribes to the worker's load reports until the test ends.
// A report that does not decode fails the test; one that finds the channel
// full (64 unread) is dropped, so the adapter is never held up.
func loadReports(t *testing.T, n *testenv.NATS, worker string) <-chan *wire.LoadReport {
	t.Helper()
	nc := n.Conn(t)
	reports := make(chan *wire.LoadReport, 64)
	sub, err := nc.Subscribe(wire.NewSubjects(testCluster).Load(worker), func(m *nats.Msg) {
		r, err := wire.DecodeLoadReport(m.Data)
		if assert.NoError(t, err) {
			select {
			case reports <- r:
			default:
			}
		}
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return reports
}

// routerIndex is a router's KV index fed by a real kvingest.Subscriber from
// NATS, as internal/app/replica.go wires it.
type routerIndex struct {
	ix  *kvindex.Index
	reg *prometheus.Registry
}

func startRouterIndex(t *testing.T, n *testenv.NATS, worker string, capacity int) *routerIndex {
	t.Helper()
	return startRouterIndexTB(t, n, worker, capacity)
}

func startRouterIndexTB(t testing.TB, n *testenv.NATS, worker string, capacity int) *routerIndex {
	t.Helper()
	return startSampledRouterIndex(t, n, worker, capacity, 1)
}

// startSampledRouterIndex is startRouterIndex with -index.sample sample.
func startSampledRouterIndex(t testing.TB, n *testenv.NATS, worker string, capacity, sample int) *routerIndex {
	t.Helper()
	reg := prometheus.NewRegistry()
	icfg := kvindex.DefaultConfig()
	icfg.Sample = sample
	ix, err := kvindex.New(icfg, clock.Real{}, zap.NewNop(), reg)
	require.NoError(t, err)
	require.NoError(t, ix.SetCapacity(worker, capacity))
	cfg := kvingest.DefaultConfig()
	cfg.Cluster = testCluster
	cfg.DumpRetry, cfg.DumpRetryMax = 20*time.Millisecond, 200*time.Millisecond
	cfg.DumpTimeout = 2 * time.Second
	sub, err := kvingest.NewSubscriber(cfg, n.Conn(t), ix, zap.NewNop(), reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = sub.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return &routerIndex{ix: ix, reg: reg}
}

// holdsExactly waits until the index holds exactly want for worker (and
// waits for no dump), then checks it.
func (r *routerIndex) holdsExactly(t *testing.T, worker string, want []uint64, msg string) {
	t.Helper()
	wantSet := map[uint64]bool{}
	for _, h := range want {
		wantSet[h] = true
	}
	var got []uint64
	// Generous: it ends as soon as the index is right, and a shared CI
	// machine under the race detector can take seconds to deliver.
	deadline := time.Now().Add(15 * time.Second)
	for {
		got = r.ix.WorkerHashes(worker, got[:0])
		ok := len(got) == len(wantSet) && !r.ix.NeedsDump(worker)
		for _, h := range got {
			ok = ok && wantSet[h]
		}
		if ok || time.Now().After(deadline) {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if len(want) == 0 {
		require.Emptyf(t, got, "%s: router index for %s", msg, worker)
		return
	}
	require.ElementsMatchf(t, want, got, "%s: router index for %s", msg, worker)
	require.Falsef(t, r.ix.NeedsDump(worker), "%s: router still waits for a dump of %s", msg, worker)
}

// startMirror runs a mirror for worker publishing on a fresh connection.
func startMirror(t testing.TB, n *testenv.NATS, worker string, shape Shape, reg prometheus.Registerer) *Mirror {
	t.Helper()
	return startSampledMirror(t, n, worker, shape, reg, 0)
}

// startSampledMirror is startMirror with MirrorConfig.Sample sample.
func startSampledMirror(t testing.TB, n *testenv.NATS, worker string, shape Shape, reg prometheus.Registerer, sample int) *Mirror {
	t.Helper()
	cfg := DefaultMirrorConfig()
	cfg.Worker, cfg.Cluster, cfg.Sample = worker, testCluster, sample
	cfg.HeartbeatInterval = 20 * time.Millisecond
	m, err := NewMirror(cfg, n.Conn(t), zap.NewNop(), reg)
	require.NoError(t, err)
	require.NoError(t, m.Configure(shape))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = m.Run(ctx) })
	t.Cleanup(func() { cancel(); wg.Wait() })
	return m
}

// prompt is a token sequence cut into engine blocks with made-up engine
// hashes, the way an engine reports a stored prompt.
type prompt struct {
	tokens  []uint32
	engine  []uint64 // one engine hash per full block
	bs      int
	lora    string
	loraID  int
	medium  string
	groupID int
}

var engineHashSeq atomic.Uint64

func newPrompt(seed uint32, blocks, bs int) prompt {
	p := prompt{bs: bs}
	for i := 0; i < blocks*bs; i++ {
		p.tokens = append(p.tokens, seed*7919+uint32(i)*31+1)
	}
	for i := 0; i < blocks; i++ {
		p.engine = append(p.engine, engineHashSeq.Add(1)*0x9E3779B97F4A7C15)
	}
	return p
}

// extend returns a prompt that shares p's blocks and adds more.
func (p prompt) extend(seed uint32, blocks int) prompt {
	q := newPrompt(seed, blocks, p.bs)
	q.tokens = append(append([]uint32(nil), p.tokens...), q.tokens...)
	q.engine = append(append([]uint64(nil), p.engine...), q.engine...)
	q.lora, q.loraID = p.lora, p.loraID
	return q
}

// stored is the BlockStored event of blocks [from, to) of p.
func (p prompt) stored(from, to int) enginekv.Event {
	e := enginekv.Event{Kind: enginekv.BlockStored, BlockHashes: append([]uint64(nil), p.engine[from:to]...),
		TokenIDs: append([]uint32(nil), p.tokens[from*p.bs:to*p.bs]...), BlockSize: p.bs,
		LoRAID: p.loraID, LoRAName: p.lora, Medium: p.medium, GroupIdx: p.groupID}
	if from > 0 {
		e.ParentHash, e.HasParent = p.engine[from-1], true
	}
	return e
}

func (p prompt) removed(from, to int) enginekv.Event {
	return enginekv.Event{Kind: enginekv.BlockRemoved, BlockHashes: append([]uint64(nil), p.engine[from:to]...)}
}

// want is what a router computes for p's blocks [0, to).
func (p prompt) want(model string, to int) []uint64 {
	name := model
	if p.lora != "" {
		name = p.lora
	}
	return kvindex.SequenceHashes(p.tokens[:to*p.bs], p.bs, kvindex.ModelSeed(name))
}

// feeder hands batches to a handler with increasing sequence numbers, as
// the enginekv subscriber does.
type feeder struct {
	h   enginekv.Handler
	seq uint64
}

func (f *feeder) batch(evs ...enginekv.Event) {
	f.h.Batch(enginekv.Batch{Topic: "kv", Seq: f.seq, TS: float64(time.Now().UnixNano()) / 1e9, Events: evs})
	f.seq++
}
