package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	// Admission series carry no model label: a class queue holds the
	// requests of every model, and the scheduler counts per class, so a
	// model label could only ever hold a constant (docs/metrics.md, "One
	// model label").
	classLabels  = []string{LabelWorkerType, LabelClass}
	reasonLabels = []string{LabelWorkerType, LabelClass, LabelReason}
	streamLabels = []string{LabelModel, LabelClass}
)

// Admission holds the per-class admission metrics of the class owner's
// scheduler.
//
// The five counters are written only by the Exporter, from the scheduler's
// cumulative snapshots: writing them directly as well would count requests
// twice. Queue depth and pending tokens are gauges the app sets from the same
// snapshots; queue wait and decision time are observed per request.
type Admission struct {
	// Received counts requests that entered admission, once each, on the
	// entry replica they arrived at (admission.Client.Counts), whatever
	// happened to their attempts at owners. Retries (attempt > 0) and
	// advisory probes are not received.
	Received *prometheus.CounterVec
	// Rejected counts rejections by reason (RejectReasons).
	Rejected  *prometheus.CounterVec
	Admitted  *prometheus.CounterVec
	Retried   *prometheus.CounterVec
	Cancelled *prometheus.CounterVec

	QueueDepth         *prometheus.GaugeVec
	QueuePendingTokens *prometheus.GaugeVec
	// QueueWait is the time from enqueue to grant, as the owner reports it
	// in the grant; observed by the entry replica.
	QueueWait *prometheus.HistogramVec
	// Decision is the rest of an admission's time as the entry replica
	// measures it: the owner's decision (project load, select, book) and,
	// for a remote owner, the NATS round trip; queue wait excluded.
	Decision *prometheus.HistogramVec
	// DegradedAdmissions counts admissions made by a local fallback scheduler
	// while NATS was unreachable (design §4.10); labelled by class only.
	DegradedAdmissions *prometheus.CounterVec
}

// NewAdmission registers the admission metrics on reg.
func NewAdmission(reg prometheus.Registerer) *Admission {
	f := promauto.With(reg)
	return &Admission{
		Received: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionReceived,
			Help: "Requests that entered admission, counted once by the entry replica they arrived at (retries and probes excluded).",
		}, classLabels),
		Rejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionRejected,
			Help: "Admission attempts rejected, by reason. Every reason is initialised to zero.",
		}, reasonLabels),
		Admitted: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionAdmitted,
			Help: "Admission attempts granted a worker.",
		}, classLabels),
		Retried: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionRetried,
			Help: "Retried admission attempts (resubmissions after ownership moves or worker failures).",
		}, classLabels),
		Cancelled: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameAdmissionCancelled,
			Help: "Queued admission attempts cancelled because the client went away.",
		}, classLabels),
		QueueDepth: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameQueueDepth,
			Help: "Requests waiting in the class queue.",
		}, classLabels),
		QueuePendingTokens: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameQueuePendingTokens,
			Help: "Prompt tokens of the requests waiting in the class queue.",
		}, classLabels),
		QueueWait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameQueueWait,
			Help:    "Time from enqueue to grant.",
			Buckets: BucketsQueueWait,
		}, classLabels),
		Decision: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    NameDecision,
			Help:    "Admission time excluding queue wait, as the entry replica measures it: the owner's decision plus, for a remote owner, the NATS round trip.",
			Buckets: BucketsDecision,
		}, classLabels),
		DegradedAdmissions: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameDegradedAdmissions,
			Help: "Admissions made by a local fallback scheduler while NATS was unreachable.",
		}, []string{LabelClass}),
	}
}

// InitClass creates every counter series of one (worker type, class)
// at zero, so that ratios, rates and absent() alerts work before the first
// event and the reserved predicted_miss series exists. The degraded
// admissions series is created too: degraded mode is rare, and a counter
// that first appears at 1 loses that first increase to rate().
func (a *Admission) InitClass(workerType, class string) {
	a.DegradedAdmissions.WithLabelValues(class)
	a.Received.WithLabelValues(workerType, class)
	a.Admitted.WithLabelValues(workerType, class)
	a.Retried.WithLabelValues(workerType, class)
	a.Cancelled.WithLabelValues(workerType, class)
	for _, r := range rejectReasons {
		a.Rejected.WithLabelValues(workerType, class, r)
	}
}

// Router holds the request-level metrics of the entry replica (the one that
// streams the response) and its view of worker load.
type Router struct {
	TTFT *prometheus.HistogramVec
	ITL  *prometheus.HistogramVec
	E2E  *prometheus.HistogramVec

	PromptTokens    *prometheus.CounterVec
	GeneratedTokens *prometheus.CounterVec
	// CachedTokens counts prompt tokens the engine reported as served from
	// its prefix cache (usage.prompt_tokens_details.cached_tokens).
	CachedTokens *prometheus.CounterVec
	// PredictedCachedTokens counts prompt tokens the router predicted were
	// cached on the granted worker. The predicted KV hit rate is
	// rate(PredictedCachedTokens) / rate(PromptTokens): counters aggregate
	// across replicas and windows, a ratio gauge would not.
	PredictedCachedTokens *prometheus.CounterVec

	// Projected load per worker as this replica's selector sees it (own
	// ledger plus gossiped remote bookings). Workers are registered engines,
	// a bounded set; the app deletes a worker's series when it deregisters.
	WorkerActiveRequests *prometheus.GaugeVec
	WorkerPrefillTokens  *prometheus.GaugeVec
	WorkerDecodeBlocks   *prometheus.GaugeVec
	// The same projected load summed per worker role (RoleBoth,
	// RolePrefill, RoleDecode; every role exported, 0 when it has no
	// worker), and the registered workers per role: a disaggregated
	// fleet's prefill and decode pools side by side.
	RoleActiveRequests *prometheus.GaugeVec
	RolePrefillTokens  *prometheus.GaugeVec
	RoleDecodeBlocks   *prometheus.GaugeVec
	RoleWorkers        *prometheus.GaugeVec
	// The engine's own load per worker, from its last load report: what
	// the engine says it runs and queues, its KV cache use (0..1) and its
	// prefix-cache hit rate (0..1). A worker without a report has none.
	WorkerEngineRunning       *prometheus.GaugeVec
	WorkerEngineWaiting       *prometheus.GaugeVec
	WorkerEngineKVUsage       *prometheus.GaugeVec
	WorkerEnginePrefixHitRate *prometheus.GaugeVec

	// DegradedMode is 1 while this replica admits remote classes locally
	// because NATS is unreachable.
	DegradedMode prometheus.Gauge
	// HTTPResponses counts responses by route (Route) and status code.
	HTTPResponses *prometheus.CounterVec
	// Routing is the routing-quality counters (routing.go).
	Routing *Routing
}

// NewRouter registers the router metrics on reg.
func NewRouter(reg prometheus.Registerer) *Router {
	f := promauto.With(reg)
	worker := []string{LabelWorker}
	role := []string{LabelRole}
	r := &Router{
		TTFT: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: NameTTFT, Help: "Time from request arrival to the first streamed token.", Buckets: BucketsTTFT,
		}, streamLabels),
		ITL: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: NameITL, Help: "Time between consecutive streamed tokens.", Buckets: BucketsITL,
		}, streamLabels),
		E2E: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: NameE2E, Help: "Time from request arrival to the end of the response.", Buckets: BucketsE2E,
		}, streamLabels),
		PromptTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NamePromptTokens, Help: "Prompt tokens of completed requests.",
		}, streamLabels),
		GeneratedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameGeneratedTokens, Help: "Generated tokens of completed requests.",
		}, streamLabels),
		CachedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameCachedTokens, Help: "Prompt tokens the engine served from its prefix cache.",
		}, streamLabels),
		PredictedCachedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NamePredictedCachedTokens, Help: "Prompt tokens the router predicted cached on the granted worker.",
		}, streamLabels),
		WorkerActiveRequests: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerActiveRequests, Help: "Requests booked on the worker, cluster-wide, as this replica projects it.",
		}, worker),
		WorkerPrefillTokens: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerPrefillTokens, Help: "Prefill tokens booked on the worker and not yet past first token.",
		}, worker),
		WorkerDecodeBlocks: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerDecodeBlocks, Help: "Unique KV blocks booked on the worker.",
		}, worker),
		RoleActiveRequests: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRoleActiveRequests, Help: "Requests booked on the role's workers, cluster-wide, as this replica projects it.",
		}, role),
		RolePrefillTokens: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRolePrefillTokens, Help: "Prefill tokens booked on the role's workers and not yet past first token.",
		}, role),
		RoleDecodeBlocks: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRoleDecodeBlocks, Help: "Unique KV blocks booked on the role's workers, summed over them.",
		}, role),
		RoleWorkers: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameRoleWorkers, Help: "Registered workers of the role.",
		}, role),
		WorkerEngineRunning: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerEngineRunning, Help: "Requests the worker's engine last reported running.",
		}, worker),
		WorkerEngineWaiting: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerEngineWaiting, Help: "Requests the worker's engine last reported waiting in its own queue.",
		}, worker),
		WorkerEngineKVUsage: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerEngineKVUsage, Help: "Fraction of its KV cache the worker's engine last reported in use.",
		}, worker),
		WorkerEnginePrefixHitRate: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameWorkerEnginePrefixHitRate, Help: "Prefix-cache hit rate the worker's engine last reported.",
		}, worker),
		DegradedMode: f.NewGauge(prometheus.GaugeOpts{
			Name: NameDegradedMode, Help: "1 while remote classes are admitted locally because NATS is unreachable.",
		}),
		HTTPResponses: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameHTTPResponses, Help: "HTTP responses by route and status code.",
		}, []string{LabelRoute, LabelCode}),
		Routing: NewRouting(reg),
	}
	for _, ro := range Roles() {
		r.RoleActiveRequests.WithLabelValues(ro)
		r.RolePrefillTokens.WithLabelValues(ro)
		r.RoleDecodeBlocks.WithLabelValues(ro)
		r.RoleWorkers.WithLabelValues(ro)
	}
	return r
}

// RoleLoad is one role's projected load (Router.SetRoleLoads).
type RoleLoad struct {
	Workers, ActiveRequests, PrefillTokens, DecodeBlocks int
}

// SetRoleLoads sets the per-role gauges; a role absent from loads reads 0.
func (r *Router) SetRoleLoads(loads map[string]RoleLoad) {
	for _, ro := range Roles() {
		l := loads[ro]
		r.RoleActiveRequests.WithLabelValues(ro).Set(float64(l.ActiveRequests))
		r.RolePrefillTokens.WithLabelValues(ro).Set(float64(l.PrefillTokens))
		r.RoleDecodeBlocks.WithLabelValues(ro).Set(float64(l.DecodeBlocks))
		r.RoleWorkers.WithLabelValues(ro).Set(float64(l.Workers))
	}
}
