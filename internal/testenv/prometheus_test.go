package testenv

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
)

func TestPrometheusScrapesATargetAndAnswersInstantQueries(t *testing.T) {
	reg := prometheus.NewRegistry()
	probes := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_testenv_probes_total",
		Help: "Probe counter served to the test Prometheus.",
	}, []string{"side"})
	probes.WithLabelValues("left").Add(40)
	probes.WithLabelValues("right").Add(2)
	target := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(target.Close) // registered first, so it closes after Prometheus stopped

	p := StartPrometheus(t, []string{target.URL}, 100*time.Millisecond)
	ctx := Context(t)

	// Before the first scrape the vector is empty: ErrNoSamples, then 42.
	Eventually(t, 30*time.Second, func() bool {
		v, err := p.Query(ctx, "switchyard_testenv_probes_total")
		return err == nil && v == 42
	}, "the summed counter never reached 42")

	v, err := p.Query(ctx, `switchyard_testenv_probes_total{side="right"}`)
	require.NoError(t, err)
	require.Equal(t, 2.0, v)

	v, err = p.Query(ctx, "1 + 2")
	require.NoError(t, err)
	require.Equal(t, 3.0, v, "scalar results are returned as is")

	_, err = p.Query(ctx, "switchyard_testenv_no_such_metric")
	require.ErrorIs(t, err, ErrNoSamples)

	_, err = p.Query(ctx, "sum(")
	require.ErrorContains(t, err, "bad_data")

	_, err = p.Query(ctx, "switchyard_testenv_probes_total[1m]")
	require.ErrorContains(t, err, "matrix")
}
