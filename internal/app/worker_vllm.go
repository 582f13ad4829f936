package app

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// Worker protocols: what the simulated worker speaks to the rest of the
// cluster.
const (
	// ProtocolNative registers in etcd and publishes Switchyard's KV events
	// and load reports on NATS.
	ProtocolNative = "native"
	// ProtocolVLLM speaks what a vLLM server does: KV events on a ZeroMQ PUB
	// socket (with a replay ROUTER), vLLM-named metrics on /metrics, /health
	// and vLLM's /v1/models. It registers nowhere: an adapter beside it does.
	ProtocolVLLM = "vllm"
)

// VLLMWorkerConfig configures the vLLM protocol of a worker.
type VLLMWorkerConfig struct {
	// EventsBind is where the KV event PUB socket binds (vLLM's
	// --kv-events-config endpoint; tcp://*:port binds every interface).
	EventsBind string
	// ReplayBind is where the replay ROUTER binds; empty serves no replay
	// (vLLM's default).
	ReplayBind string
	// Encoding is the payload layout: array (tagged arrays, vLLM before its
	// events became maps, SGLang), map (map events, current vLLM) or
	// map-envelope.
	Encoding string
	// HashForm is how block hashes are written: uint (vLLM with integer
	// block hashes), int64 (SGLang) or bytes (vLLM's digests).
	HashForm string
	// Topic is the first frame of every message.
	Topic string
	// ReplyWithTopic makes replay replies carry the topic (current vLLM).
	ReplyWithTopic bool
	// BufferSteps is how many recent batches the replay serves.
	BufferSteps int
	// HashSeed seeds the engine-side block hashes. Zero picks a random seed
	// per process, as vLLM does without PYTHONHASHSEED: the hashes are
	// opaque and differ across restarts.
	HashSeed uint64
	// DPRank is the data-parallel rank this engine plays (`up -dp-size`
	// runs one engine per rank, no flag): stamped in every batch as vLLM's
	// data_parallel_rank, and the engine label of its metrics.
	DPRank int
}

func defaultVLLMWorkerConfig() VLLMWorkerConfig {
	return VLLMWorkerConfig{
		EventsBind:     "tcp://127.0.0.1:5557",
		Encoding:       enginekv.LayoutMap.String(),
		HashForm:       enginekv.HashUint.String(),
		ReplyWithTopic: true,
		BufferSteps:    10000,
	}
}

func (c *VLLMWorkerConfig) registerFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.EventsBind, prefix+"kv-events-bind", c.EventsBind, "vllm protocol: bind address of the KV event PUB socket")
	fs.StringVar(&c.ReplayBind, prefix+"kv-replay-bind", c.ReplayBind, "vllm protocol: bind address of the KV event replay ROUTER (empty: no replay)")
	fs.StringVar(&c.Encoding, prefix+"kv-event-encoding", c.Encoding, "vllm protocol: event encoding, array, map or map-envelope")
	fs.StringVar(&c.HashForm, prefix+"kv-hash-form", c.HashForm, "vllm protocol: block hash form, uint, int64 or bytes")
	fs.StringVar(&c.Topic, prefix+"kv-events-topic", c.Topic, "vllm protocol: topic of the KV event messages")
	fs.BoolVar(&c.ReplyWithTopic, prefix+"kv-replay-topic", c.ReplyWithTopic, "vllm protocol: replay replies carry the topic (current vLLM; false: older vLLM and SGLang)")
	fs.IntVar(&c.BufferSteps, prefix+"kv-buffer-steps", c.BufferSteps, "vllm protocol: batches kept for replay")
	fs.Uint64Var(&c.HashSeed, prefix+"kv-hash-seed", c.HashSeed, "vllm protocol: seed of the engine-side block hashes (0: random per process)")
}

// publisherConfig turns the flags into the publisher's config.
func (c *VLLMWorkerConfig) publisherConfig() (enginekv.PublisherConfig, error) {
	pc := enginekv.DefaultPublisherConfig()
	layout, err := enginekv.ParseLayout(c.Encoding)
	if err != nil {
		return pc, err
	}
	hashes, err := enginekv.ParseHashForm(c.HashForm)
	if err != nil {
		return pc, err
	}
	pc.Endpoint, pc.ReplayEndpoint, pc.Topic = c.EventsBind, c.ReplayBind, c.Topic
	pc.Encoding = enginekv.Encoding{Layout: layout, Hashes: hashes}
	pc.ReplyWithTopic, pc.BufferSteps, pc.DPRank = c.ReplyWithTopic, c.BufferSteps, c.DPRank
	return pc, pc.Validate()
}

// validateProtocol checks the protocol fields of a worker config.
func (c *WorkerConfig) validateProtocol() error {
	switch c.Protocol {
	case ProtocolNative:
		if c.Engine.HostBlocks > 0 {
			// The native stream has no tier streams of its own to dump from:
			// a host tier needs the vllm protocol and an adapter -kv-tiers cpu.
			return errors.New("worker config: -host-blocks needs the vllm protocol")
		}
		return nil
	case ProtocolVLLM:
	default:
		return fmt.Errorf("worker config: Protocol %q must be %s or %s", c.Protocol, ProtocolNative, ProtocolVLLM)
	}
	switch {
	case len(c.EtcdEndpoints) > 0:
		return errors.New("worker config: EtcdEndpoints must be empty with the vllm protocol (an adapter registers the worker)")
	case c.NATSURL != "":
		return errors.New("worker config: NATSURL must be empty with the vllm protocol (an adapter publishes for the worker)")
	}
	if _, err := c.VLLM.publisherConfig(); err != nil {
		return fmt.Errorf("worker config: VLLM: %w", err)
	}
	return nil
}

// vllmEventSink turns the engine's batches into vLLM events: the engine's
// Switchyard sequence hashes become engine-local hashes (a bijection keyed
// by a per-process seed, so they are as opaque as vLLM's and a removal
// names the same hash its store did), and each stored event carries its
// blocks' token ids. It runs under the engine lock; Publish only queues.
type vllmEventSink struct {
	pub       *enginekv.Publisher
	seed      uint64
	blockSize int
}

func newVLLMEventSink(pub *enginekv.Publisher, seed uint64, blockSize int) *vllmEventSink {
	for seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms
		seed = binary.LittleEndian.Uint64(b[:])
	}
	return &vllmEventSink{pub: pub, seed: seed, blockSize: blockSize}
}

// engineHash is a bijection of the 64-bit hashes (splitmix64's finalizer,
// each step invertible) keyed by the seed.
func (s *vllmEventSink) engineHash(h uint64) uint64 {
	z := h ^ s.seed
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

func (s *vllmEventSink) PublishKVEvents(b *wire.KVEventBatch) { s.PublishKVEventsWithTokens(b, nil) }

func (s *vllmEventSink) PublishKVEventsWithTokens(b *wire.KVEventBatch, tokens [][]uint32) {
	out := enginekv.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: make([]enginekv.Event, 0, len(b.Events))}
	medium := "GPU"
	switch _, t := kvindex.SplitTier(b.Worker); t {
	case kvindex.TierCPU:
		// The engine's host tier (engine/host.go): vLLM's offloading
		// connector reports it as medium CPU, without tokens or parents.
		medium = "CPU"
	case kvindex.TierDisk:
		// The disk tier below it (engine/disk.go): medium DISK.
		medium = "DISK"
	}
	for i, ev := range b.Events {
		hs := make([]uint64, len(ev.Hashes))
		for j, h := range ev.Hashes {
			hs[j] = s.engineHash(h)
		}
		switch ev.Kind {
		case wire.KVStored:
			e := enginekv.Event{Kind: enginekv.BlockStored, BlockHashes: hs, BlockSize: s.blockSize, Medium: medium}
			if i < len(tokens) {
				e.TokenIDs = tokens[i]
			}
			if ev.HasParent {
				e.ParentHash, e.HasParent = s.engineHash(ev.Parent), true
			}
			out.Events = append(out.Events, e)
		case wire.KVRemoved:
			out.Events = append(out.Events, enginekv.Event{Kind: enginekv.BlockRemoved, BlockHashes: hs, Medium: medium})
		case wire.KVCleared:
			out.Events = append(out.Events, enginekv.Event{Kind: enginekv.AllBlocksCleared})
		}
	}
	s.pub.Publish(out)
}

// vllmRoutes serves vLLM's /health, /v1/models and /metrics in front of
// the worker's own routes.
func vllmRoutes(cfg WorkerConfig, next http.Handler, gatherer prometheus.Gatherer) http.Handler {
	m := vllmModels{cfg: cfg, started: time.Now()}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) { rw.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /v1/models", m.serve)
	mux.Handle("GET /metrics", promhttp.HandlerFor(gatherer, promhttp.HandlerOpts{}))
	mux.Handle("/", next)
	return mux
}

// vllmModels answers /v1/models like vLLM's OpenAI server: root, parent
// and max_model_len, which an adapter reads to register the worker.
type vllmModels struct {
	cfg     WorkerConfig
	started time.Time
}

func (m vllmModels) serve(rw http.ResponseWriter, _ *http.Request) {
	created := m.started.Unix()
	writeWorkerJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{{
		"id": m.cfg.Model, "object": "model", "created": created, "owned_by": "vllm",
		"root": m.cfg.Model, "parent": nil, "max_model_len": m.cfg.Engine.MaxModelLen,
		"permission": []map[string]any{{
			"id": "modelperm-" + m.cfg.ID, "object": "model_permission", "created": created,
			"allow_create_engine": false, "allow_sampling": true, "allow_logprobs": true,
			"allow_search_indices": false, "allow_view": true, "allow_fine_tuning": false,
			"organization": "*", "group": nil, "is_blocking": false,
		}},
	}}})
}

// vllmCollector exports the engine's state under vLLM's metric names and
// labels (engine index and model name), from one Stats snapshot per scrape.
type vllmCollector struct {
	eng    *engine.Engine
	cfg    engine.Config
	labels []string // engine, model_name
	info   *prometheus.Desc
}

var vllmLabelNames = []string{"engine", "model_name"}

var (
	vllmDescRunning = prometheus.NewDesc("vllm:num_requests_running", "Number of requests in model execution batches.", vllmLabelNames, nil)
	vllmDescWaiting = prometheus.NewDesc("vllm:num_requests_waiting", "Number of requests waiting to be processed.", vllmLabelNames, nil)
	vllmDescKVUsage = prometheus.NewDesc("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", vllmLabelNames, nil)
	vllmDescPreempt = prometheus.NewDesc("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", vllmLabelNames, nil)
	vllmDescPrompt  = prometheus.NewDesc("vllm:prompt_tokens_total", "Number of prefill tokens processed.", vllmLabelNames, nil)
	vllmDescGen     = prometheus.NewDesc("vllm:generation_tokens_total", "Number of generation tokens processed.", vllmLabelNames, nil)
	vllmDescQueries = prometheus.NewDesc("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", vllmLabelNames, nil)
	vllmDescHits    = prometheus.NewDesc("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", vllmLabelNames, nil)
)

func newVLLMCollector(eng *engine.Engine, cfg engine.Config, model string, rank int) *vllmCollector {
	// vLLM's cache_config_info carries every CacheConfig field as a string
	// label (Python's str() of the value) plus the engine index; these are
	// the fields of vLLM's CacheConfig that mean something here, with
	// vLLM's defaults for the rest.
	info := prometheus.Labels{
		"block_size": strconv.Itoa(cfg.BlockSize), "num_gpu_blocks": strconv.Itoa(cfg.NumBlocks),
		"num_cpu_blocks": "None", "num_gpu_blocks_override": "None", "gpu_memory_utilization": "0.9",
		"swap_space": "4", "cache_dtype": "auto", "is_attention_free": "False", "sliding_window": "None",
		"enable_prefix_caching": "True", "prefix_caching_hash_algo": "sha256", "cpu_offload_gb": "0",
		"calculate_kv_scales": "False", "engine": strconv.Itoa(rank),
	}
	return &vllmCollector{eng: eng, cfg: cfg, labels: []string{strconv.Itoa(rank), model},
		info: prometheus.NewDesc("vllm:cache_config_info", "Information of the LLMEngine CacheConfig", nil, info)}
}

func (c *vllmCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{vllmDescRunning, vllmDescWaiting, vllmDescKVUsage, vllmDescPreempt,
		vllmDescPrompt, vllmDescGen, vllmDescQueries, vllmDescHits, c.info} {
		ch <- d
	}
}

func (c *vllmCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.eng.Stats()
	g := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, c.labels...)
	}
	k := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, c.labels...)
	}
	g(vllmDescRunning, float64(s.Running))
	g(vllmDescWaiting, float64(s.Waiting))
	g(vllmDescKVUsage, s.KVUsage)
	k(vllmDescPreempt, float64(s.Preemptions))
	k(vllmDescPrompt, float64(s.PrefillTokens))
	k(vllmDescGen, float64(s.OutputTokens))
	k(vllmDescQueries, float64(s.PromptTokens))
	k(vllmDescHits, float64(s.CachedTokens))
	ch <- prometheus.MustNewConstMetric(c.info, prometheus.GaugeValue, 1)
}
