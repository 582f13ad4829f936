package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

var (
	classLabels  = []string{LabelModel, LabelWorkerType, LabelClass}
	reasonLabels = []string{LabelModel, LabelWorkerType, LabelClass, LabelReason}
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
	// Received counts first attempts that reached the admission actor.
	// Retries (attempt > 0) and advisory probes are not received.
	Received *prometheus.CounterVec
	// Rejected counts rejections by reason (RejectReasons).
	Rejected  *prometheus.CounterVec
	Admitted  *prometheus.CounterVec
	Retried   *prometheus.CounterVec
	Cancelled *prometheus.CounterVec

	QueueDepth         *prometheus.GaugeVec
	QueuePendingTokens *prometheus.GaugeVec
	// QueueWait is the time from enqueue to grant.
	QueueWait *prometheus.HistogramVec
	// Decision is the actor's own time for one admission decision (project
	// load, select, book), excluding time spent waiting in the queue.
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
			Help: "Admission attempts received by the class owner's actor (first attempts only; retries and probes excluded).",
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
			Help:    "Actor time for one admission decision (projection, selection, booking), excluding queue wait.",
			Buckets: BucketsDecision,
		}, classLabels),
		DegradedAdmissions: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameDegradedAdmissions,
			Help: "Admissions made by a local fallback scheduler while NATS was unreachable.",
		}, []string{LabelClass}),
	}
}

// InitClass creates every series of one (model, worker type, class) at zero,
// so that ratios and absent() alerts work before the first event and the
// reserved predicted_miss series exists.
func (a *Admission) InitClass(model, workerType, class string) {
	a.Received.WithLabelValues(model, workerType, class)
	a.Admitted.WithLabelValues(model, workerType, class)
	a.Retried.WithLabelValues(model, workerType, class)
	a.Cancelled.WithLabelValues(model, workerType, class)
	for _, r := range rejectReasons {
		a.Rejected.WithLabelValues(model, workerType, class, r)
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

	// DegradedMode is 1 while this replica admits remote classes locally
	// because NATS is unreachable.
	DegradedMode prometheus.Gauge
	// HTTPResponses counts responses by route (Route) and status code.
	HTTPResponses *prometheus.CounterVec
}

// NewRouter registers the router metrics on reg.
func NewRouter(reg prometheus.Registerer) *Router {
	f := promauto.With(reg)
	worker := []string{LabelWorker}
	return &Router{
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
		DegradedMode: f.NewGauge(prometheus.GaugeOpts{
			Name: NameDegradedMode, Help: "1 while remote classes are admitted locally because NATS is unreachable.",
		}),
		HTTPResponses: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameHTTPResponses, Help: "HTTP responses by route and status code.",
		}, []string{LabelRoute, LabelCode}),
	}
}

// Index holds the KV index metrics of one replica.
type Index struct {
	Blocks           prometheus.Gauge
	Bytes            prometheus.Gauge
	PredictedEntries prometheus.Gauge
	EventsApplied    prometheus.Counter
	// DecodeErrors counts malformed event batches and dump chunks, by kind
	// ("event", "dump").
	DecodeErrors *prometheus.CounterVec
	Gaps         prometheus.Counter
	// Dumps counts dump repairs by result ("ok", "error").
	Dumps *prometheus.CounterVec
	// EventLag is the time from the engine stamping an event batch to this
	// replica applying it.
	EventLag prometheus.Histogram
}

// NewIndex registers the KV index metrics on reg.
func NewIndex(reg prometheus.Registerer) *Index {
	f := promauto.With(reg)
	return &Index{
		Blocks:           f.NewGauge(prometheus.GaugeOpts{Name: NameIndexBlocks, Help: "Exact (engine-reported) block entries in the index."}),
		Bytes:            f.NewGauge(prometheus.GaugeOpts{Name: NameIndexBytes, Help: "Estimated memory held by the index."}),
		PredictedEntries: f.NewGauge(prometheus.GaugeOpts{Name: NameIndexPredictedEntries, Help: "Predicted (TTL) prefix entries held beside the exact ones."}),
		EventsApplied:    f.NewCounter(prometheus.CounterOpts{Name: NameIndexEventsApplied, Help: "KV events applied to the index."}),
		DecodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameIndexDecodeErrors, Help: "Malformed KV event batches or dump chunks, by kind.",
		}, []string{LabelKind}),
		Gaps: f.NewCounter(prometheus.CounterOpts{Name: NameIndexGaps, Help: "Event id gaps detected (each resets a worker and triggers a dump)."}),
		Dumps: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameIndexDumps, Help: "Dump repairs, by result.",
		}, []string{LabelResult}),
		EventLag: f.NewHistogram(prometheus.HistogramOpts{
			Name: NameIndexEventLag, Help: "Time from the engine stamping a KV event batch to this replica applying it.", Buckets: BucketsLag,
		}),
	}
}

// Cluster holds this replica's view of membership and class ownership.
type Cluster struct {
	ClassesOwned prometheus.Gauge
	// ClassOwned is 1 for each class this replica owns and 0 for each class
	// it knows but does not own. Summed over replicas it is the number of
	// owners per class: 0 means nobody admits the class, 2 means split brain.
	ClassOwned *prometheus.GaugeVec
	Handoffs   prometheus.Counter
	// OwnershipAcquired and OwnershipLost count claims and losses; reason is
	// a small fixed set chosen by the cluster package (e.g. "released",
	// "session_lost", "keepalive_stale").
	OwnershipAcquired prometheus.Counter
	OwnershipLost     *prometheus.CounterVec
	SessionHealthy    prometheus.Gauge
	Replicas          prometheus.Gauge
	Workers           prometheus.Gauge
	// DecodeErrors counts malformed registry or ownership records, by kind
	// ("replica", "worker", "owner", "config").
	DecodeErrors *prometheus.CounterVec
}

// NewCluster registers the cluster metrics on reg.
func NewCluster(reg prometheus.Registerer) *Cluster {
	f := promauto.With(reg)
	return &Cluster{
		ClassesOwned: f.NewGauge(prometheus.GaugeOpts{Name: NameClusterClassesOwned, Help: "Policy classes this replica owns."}),
		ClassOwned: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: NameClusterClassOwned, Help: "1 if this replica owns the class, 0 if it knows the class but does not own it.",
		}, []string{LabelClass}),
		Handoffs:          f.NewCounter(prometheus.CounterOpts{Name: NameClusterHandoffs, Help: "Graceful class handoffs from this replica."}),
		OwnershipAcquired: f.NewCounter(prometheus.CounterOpts{Name: NameClusterOwnershipAcquired, Help: "Class ownership claims won."}),
		OwnershipLost: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameClusterOwnershipLost, Help: "Class ownerships lost or given up, by reason.",
		}, []string{LabelReason}),
		SessionHealthy: f.NewGauge(prometheus.GaugeOpts{Name: NameClusterSessionHealthy, Help: "1 while the etcd session's keep-alive is current."}),
		Replicas:       f.NewGauge(prometheus.GaugeOpts{Name: NameClusterReplicas, Help: "Router replicas registered in etcd."}),
		Workers:        f.NewGauge(prometheus.GaugeOpts{Name: NameClusterWorkers, Help: "Workers registered in etcd."}),
		DecodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameClusterDecodeErrors, Help: "Malformed etcd records, by kind.",
		}, []string{LabelKind}),
	}
}

// Gossip holds the memberlist health of one replica.
type Gossip struct {
	Members prometheus.Gauge
	// HealthScore is memberlist's awareness score: 0 is healthy, higher
	// means this node has been missing probes and slows its own timers.
	HealthScore    prometheus.Gauge
	PropagationLag prometheus.Histogram
	// MessagesDropped counts messages dropped by a full hand-off, by kind
	// ("load", "prediction", "digest").
	MessagesDropped *prometheus.CounterVec
	DecodeErrors    prometheus.Counter
	StateBytes      prometheus.Gauge
	BroadcastBytes  prometheus.Counter
}

// NewGossip registers the gossip metrics on reg.
func NewGossip(reg prometheus.Registerer) *Gossip {
	f := promauto.With(reg)
	return &Gossip{
		Members:     f.NewGauge(prometheus.GaugeOpts{Name: NameGossipMembers, Help: "Live memberlist members, this node included."}),
		HealthScore: f.NewGauge(prometheus.GaugeOpts{Name: NameGossipHealthScore, Help: "memberlist awareness score (0 = healthy)."}),
		PropagationLag: f.NewHistogram(prometheus.HistogramOpts{
			Name: NameGossipPropagationLag, Help: "Time from the origin stamping gossip state to this replica receiving it.", Buckets: BucketsLag,
		}),
		MessagesDropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameGossipMessagesDropped, Help: "Gossip messages dropped without being applied, by reason.",
		}, []string{LabelReason}),
		DecodeErrors:   f.NewCounter(prometheus.CounterOpts{Name: NameGossipDecodeErrors, Help: "Malformed gossip messages."}),
		StateBytes:     f.NewGauge(prometheus.GaugeOpts{Name: NameGossipStateBytes, Help: "Size of this replica's encoded local gossip state."}),
		BroadcastBytes: f.NewCounter(prometheus.CounterOpts{Name: NameGossipBroadcastBytes, Help: "Bytes of gossip broadcasts queued by this replica."}),
	}
}
