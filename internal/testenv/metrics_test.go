package testenv

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/stretchr/testify/require"
)

func TestMetricValueReadsTheSeriesWhoseLabelsIncludeTheWantedOnes(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "c_total"}, []string{"result", "class"})
	c.WithLabelValues("ok", "gold").Add(3)
	c.WithLabelValues("bad", "gold").Add(1)
	promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: "g"}).Set(2.5)
	h := promauto.With(reg).NewHistogram(prometheus.HistogramOpts{Name: "h"})
	h.Observe(1)
	h.Observe(2)

	require.Equal(t, 3.0, MetricValue(t, reg, "c_total", map[string]string{"result": "ok"}))
	require.Equal(t, 1.0, MetricValue(t, reg, "c_total", map[string]string{"result": "bad", "class": "gold"}))
	require.Equal(t, 0.0, MetricValue(t, reg, "c_total", map[string]string{"result": "ok", "class": "silver"}))
	require.Equal(t, 2.5, MetricValue(t, reg, "g", nil))
	require.Equal(t, 2.0, MetricValue(t, reg, "h", nil), "a histogram reads as its sample count")
	require.Equal(t, 0.0, MetricValue(t, reg, "absent", nil))
}
