package kvingest

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/metrics"
)

type subscriberMetrics struct {
	decodeBatch, decodeChunk prometheus.Counter
	filtered                 prometheus.Counter
	sampleMismatch           prometheus.Counter
	dumps                    *prometheus.CounterVec
	lag                      prometheus.Histogram
}

func newSubscriberMetrics(reg prometheus.Registerer) *subscriberMetrics {
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	f := promauto.With(reg)
	dec := f.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.NameIndexDecodeErrors,
		Help: "KV messages that could not be decoded, by kind.",
	}, []string{metrics.LabelKind})
	return &subscriberMetrics{
		decodeBatch: dec.WithLabelValues("batch"),
		decodeChunk: dec.WithLabelValues("dump_chunk"),
		filtered: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_index_filtered_total",
			Help: "KV batches dropped by the subscriber's message filter (tests and fault injection).",
		}),
		sampleMismatch: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameIndexSampleMismatch,
			Help: "KV batches whose publisher sampled block hashes more coarsely than this replica's index (-kv-sample above -index.sample).",
		}),
		dumps: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameIndexDumps,
			Help: "KV dumps fetched from workers, by result.",
		}, []string{metrics.LabelResult}),
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    metrics.NameIndexEventLag,
			Help:    "Time from an engine publishing a KV event batch to the index applying it.",
			Buckets: metrics.BucketsLag,
		}),
	}
}

// newSilenceMetrics exports how many workers s holds silent.
func newSilenceMetrics(reg prometheus.Registerer, s *Silence) {
	if reg == nil {
		return
	}
	promauto.With(reg).NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.NameRouterKVSilentWorkers,
		Help: "Workers registered as publishing KV events whose computed prompt blocks reached the index as no stored block over the silence window.",
	}, func() float64 { return float64(len(s.Silent())) })
}
