package kvindex

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/metrics"
)

// nameIndexDropped counts what the index discarded to stay bounded.
const nameIndexDropped = "switchyard_index_dropped_total"

type indexMetrics struct {
	stored, removed, cleared prometheus.Counter
	gaps                     map[ResetReason]prometheus.Counter
	bufferDrops              prometheus.Counter
	predDrops                prometheus.Counter
	dumpTruncated            prometheus.Counter
}

func newIndexMetrics(reg prometheus.Registerer, ix *Index) *indexMetrics {
	if reg == nil {
		reg = prometheus.NewRegistry() // counted but not exported
	}
	f := promauto.With(reg)
	applied := f.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.NameIndexEventsApplied,
		Help: "KV block events applied to the index, by kind (stored and removed count blocks, cleared counts events).",
	}, []string{metrics.LabelKind})
	gaps := f.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.NameIndexGaps,
		Help: "Workers reset because their event stream could not be continued, by reason.",
	}, []string{metrics.LabelReason})
	dropped := f.NewCounterVec(prometheus.CounterOpts{
		Name: nameIndexDropped,
		Help: "Things the index discarded to stay bounded, by kind.",
	}, []string{metrics.LabelKind})
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.NameIndexBlocks,
		Help: "Exact (block, worker) entries in the index.",
	}, func() float64 { return float64(ix.TotalBlocks()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.NameIndexBytes,
		Help: "Estimated bytes held by the exact index.",
	}, func() float64 { return float64(ix.Memory()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{
		Name: metrics.NameIndexPredictedEntries,
		Help: "Predicted (block, worker) entries not yet swept.",
	}, func() float64 { return float64(ix.PredictedEntries()) })
	m := &indexMetrics{
		stored:        applied.WithLabelValues("stored"),
		removed:       applied.WithLabelValues("removed"),
		cleared:       applied.WithLabelValues("cleared"),
		gaps:          make(map[ResetReason]prometheus.Counter, len(resetReasons)),
		bufferDrops:   dropped.WithLabelValues("buffered_batches"),
		predDrops:     dropped.WithLabelValues("predicted_entries"),
		dumpTruncated: dropped.WithLabelValues("dump_blocks_over_capacity"),
	}
	for _, r := range resetReasons {
		m.gaps[r] = gaps.WithLabelValues(r.String())
	}
	return m
}

func (m *indexMetrics) count(stored, removed, cleared int) {
	if stored > 0 {
		m.stored.Add(float64(stored))
	}
	if removed > 0 {
		m.removed.Add(float64(removed))
	}
	if cleared > 0 {
		m.cleared.Add(float64(cleared))
	}
}
