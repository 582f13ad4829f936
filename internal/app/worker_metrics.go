package app

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/engine"
)

// workerMetrics are the worker process's own counters. Every series carries
// a constant worker label (added by the wrapping registerer), so several
// workers can share one registry in `switchyard up`.
type workerMetrics struct {
	requests        *prometheus.CounterVec // endpoint, outcome
	publishErrors   *prometheus.CounterVec // stream: kv, kv_dump, load
	malformed       *prometheus.CounterVec // kind
	kvBatches       prometheus.Counter
	loadReports     prometheus.Counter
	dumps           prometheus.Counter
	reregistrations prometheus.Counter
	kvTransfers     *prometheus.CounterVec // role, outcome (worker_pd.go)
}

func newWorkerMetrics(reg prometheus.Registerer) *workerMetrics {
	f := promauto.With(reg)
	return &workerMetrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_worker_http_requests_total",
			Help: "OpenAI API requests by endpoint and outcome."}, []string{"endpoint", "outcome"}),
		publishErrors: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_worker_publish_errors_total",
			Help: "NATS publishes that failed, by stream."}, []string{"stream"}),
		malformed: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_worker_malformed_messages_total",
			Help: "NATS messages rejected as malformed, by kind."}, []string{"kind"}),
		kvBatches: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_worker_kv_event_batches_total",
			Help: "KV event batches published."}),
		loadReports: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_worker_load_reports_total",
			Help: "Load reports published."}),
		dumps: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_worker_kv_dumps_total",
			Help: "KV dump requests answered."}),
		reregistrations: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_worker_reregistrations_total",
			Help: "Times the workerRegistration lease was lost and registered again."}),
		kvTransfers: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_worker_kv_transfers_total",
			Help: "Disaggregated prefill/decode KV hand-offs by the worker's role and outcome (held, no_params, served, pulled, malformed, unreachable, missing, timeout, wrong_role)."},
			[]string{"role", "outcome"}),
	}
}

// engineCollector exports the engine's state. It is a custom collector
// rather than a set of GaugeFuncs so that one scrape reads one consistent
// Stats snapshot (one lock acquisition) instead of one per series.
type engineCollector struct{ eng *engine.Engine }

var (
	engDescRunning      = prometheus.NewDesc("switchyard_engine_running_requests", "Requests in the running set.", nil, nil)
	engDescWaiting      = prometheus.NewDesc("switchyard_engine_waiting_requests", "Requests in the waiting queue.", nil, nil)
	engDescPeakLive     = prometheus.NewDesc("switchyard_engine_peak_live_requests", "Most requests held at once (waiting and running) since the engine started.", nil, nil)
	engDescPeakRunning  = prometheus.NewDesc("switchyard_engine_peak_running_requests", "Largest running set since the engine started.", nil, nil)
	engDescKVUsage      = prometheus.NewDesc("switchyard_engine_kv_usage_ratio", "KV blocks in use over total.", nil, nil)
	engDescKVUsed       = prometheus.NewDesc("switchyard_engine_kv_blocks_used", "KV blocks in use.", nil, nil)
	engDescKVTotal      = prometheus.NewDesc("switchyard_engine_kv_blocks_total", "KV blocks in the pool.", nil, nil)
	engDescCached       = prometheus.NewDesc("switchyard_engine_cached_blocks", "Blocks findable by prefix.", nil, nil)
	engDescHitRate      = prometheus.NewDesc("switchyard_engine_prefix_cache_hit_ratio", "Cached prompt tokens over prompt tokens, cumulative.", nil, nil)
	engDescPreemptions  = prometheus.NewDesc("switchyard_engine_preemptions_total", "Running requests preempted by recompute.", nil, nil)
	engDescPromptTokens = prometheus.NewDesc("switchyard_engine_prompt_tokens_total", "Prompt tokens of scheduled requests.", nil, nil)
	engDescCachedTokens = prometheus.NewDesc("switchyard_engine_cached_prompt_tokens_total", "Prompt tokens served from the prefix cache.", nil, nil)
	engDescOutputTokens = prometheus.NewDesc("switchyard_engine_output_tokens_total", "Generated tokens.", nil, nil)
	engDescSteps        = prometheus.NewDesc("switchyard_engine_steps_total", "Engine steps run.", nil, nil)
	engDescBusy         = prometheus.NewDesc("switchyard_engine_busy_seconds_total", "Simulated time spent in steps.", nil, nil)
	engDescEvents       = prometheus.NewDesc("switchyard_engine_kv_events_total", "KV events emitted.", nil, nil)
	engDescEvicted      = prometheus.NewDesc("switchyard_engine_evicted_blocks_total", "Cached blocks evicted.", nil, nil)
	engDescFinished     = prometheus.NewDesc("switchyard_engine_finished_requests_total", "Requests finished by length.", nil, nil)
	engDescCancelled    = prometheus.NewDesc("switchyard_engine_cancelled_requests_total", "Requests cancelled.", nil, nil)
)

func (c *engineCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{engDescRunning, engDescWaiting, engDescPeakLive, engDescPeakRunning, engDescKVUsage, engDescKVUsed, engDescKVTotal, engDescCached,
		engDescHitRate, engDescPreemptions, engDescPromptTokens, engDescCachedTokens, engDescOutputTokens, engDescSteps, engDescBusy,
		engDescEvents, engDescEvicted, engDescFinished, engDescCancelled} {
		ch <- d
	}
}

func (c *engineCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.eng.Stats()
	g := func(d *prometheus.Desc, v float64) { ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v) }
	k := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	g(engDescRunning, float64(s.Running))
	g(engDescWaiting, float64(s.Waiting))
	g(engDescPeakLive, float64(s.PeakLive))
	g(engDescPeakRunning, float64(s.PeakRunning))
	g(engDescKVUsage, s.KVUsage)
	g(engDescKVUsed, float64(s.KVBlocksUsed))
	g(engDescKVTotal, float64(s.KVBlocksTotal))
	g(engDescCached, float64(s.CachedBlocks))
	g(engDescHitRate, s.PrefixHitRate)
	k(engDescPreemptions, float64(s.Preemptions))
	k(engDescPromptTokens, float64(s.PromptTokens))
	k(engDescCachedTokens, float64(s.CachedTokens))
	k(engDescOutputTokens, float64(s.OutputTokens))
	k(engDescSteps, float64(s.Steps))
	k(engDescBusy, s.BusyTime.Seconds())
	k(engDescEvents, float64(s.EventsEmitted))
	k(engDescEvicted, float64(s.BlocksEvicted))
	k(engDescFinished, float64(s.Finished))
	k(engDescCancelled, float64(s.Cancelled))
}
