package e2e

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const exposition = `# TYPE switchyard_router_admission_admitted_total counter
switchyard_router_admission_admitted_total{class="batch",model="any"} 3
switchyard_router_admission_admitted_total{class="interactive",model="any"} 7
# TYPE process_start_time_seconds gauge
process_start_time_seconds 1.7e9
`

func TestParseMetricsSumsAFamilyOverItsLabelSetsAndReadsTheStartTime(t *testing.T) {
	s, err := ParseMetrics(strings.NewReader(exposition), []string{MetricAdmitted, MetricReceived}, nil)
	require.NoError(t, err)
	assert.Equal(t, 10.0, s.Values[MetricAdmitted])
	assert.Equal(t, 0.0, s.Values[MetricReceived], "an absent family sums to zero")
	assert.Equal(t, 1.7e9, s.Start)

	s, err = ParseMetrics(strings.NewReader(exposition), []string{MetricAdmitted}, map[string]string{"class": "batch"})
	require.NoError(t, err)
	assert.Equal(t, 3.0, s.Values[MetricAdmitted])
}

func TestParseMetricsRejectsMalformedText(t *testing.T) {
	_, err := ParseMetrics(strings.NewReader("switchyard_x{ 1\n"), []string{"switchyard_x"}, nil)
	assert.Error(t, err)
}

func TestResetSumCountsEveryProcessLifetimeOnce(t *testing.T) {
	s := NewResetSum()
	s.Observe("router-1", 100, 5)
	s.Observe("router-1", 100, 9)
	s.Observe("router-2", 100, 4)
	s.Observe("router-1", 200, 2) // router-1 restarted: its 9 stay counted
	s.Observe("router-1", 200, 3)
	assert.Equal(t, 9.0+3+4, s.Total())
	assert.Equal(t, 1, s.Restarts())
	assert.Zero(t, s.Regressions)
}

func TestResetSumCountsACounterGoingDownWithinOneLifetimeAsARegression(t *testing.T) {
	s := NewResetSum()
	s.Observe("router-1", 100, 9)
	s.Observe("router-1", 100, 8)
	assert.Equal(t, 1, s.Regressions)
	assert.Equal(t, 9.0, s.Total(), "the regressed value is not taken")
}

func TestCounterWatchSumsRealEndpointsAcrossARestart(t *testing.T) {
	// Two real /metrics endpoints; the second "restarts" by swapping its
	// registry for a fresh one with a new start time.
	newReg := func(start float64, admitted float64) *prometheus.Registry {
		reg := prometheus.NewRegistry()
		promauto.With(reg).NewCounter(prometheus.CounterOpts{Name: MetricAdmitted}).Add(admitted)
		promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: metricProcessStart}).Set(start)
		return reg
	}
	a := httptest.NewServer(promhttp.HandlerFor(newReg(1, 5), promhttp.HandlerOpts{}))
	defer a.Close()
	var current atomic.Pointer[prometheus.Registry]
	current.Store(newReg(1, 7))
	b := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		promhttp.HandlerFor(current.Load(), promhttp.HandlerOpts{}).ServeHTTP(w, r)
	}))
	defer b.Close()

	w := NewCounterWatch(http.DefaultClient, map[string]string{"a": a.URL, "b": b.URL}, []string{MetricAdmitted}, time.Hour)
	ctx := context.Background()
	w.Poll(ctx)
	assert.Equal(t, 12.0, w.Total(MetricAdmitted))
	current.Store(newReg(2, 1))
	w.Poll(ctx)
	assert.Equal(t, 13.0, w.Total(MetricAdmitted), "the restarted process adds its new count to the old one")
	reg, dec, restarts, errs := w.Health(MetricAdmitted)
	assert.Zero(t, reg)
	assert.Zero(t, dec)
	assert.Equal(t, 1, restarts)
	assert.Zero(t, errs)
}

func FuzzParseMetrics(f *testing.F) {
	f.Add([]byte(exposition))
	f.Add([]byte("x 1\n"))
	f.Add([]byte("# TYPE x counter\nx{a=\"b\"} NaN\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := ParseMetrics(strings.NewReader(string(in)), []string{MetricAdmitted}, nil)
		if err == nil && s.Values == nil {
			t.Fatal("no values map on success")
		}
	})
}

// Concurrent scrapes of one source (the watch's own poll and a test's
// PollSource on a stopping router) are recorded in the order they were
// made: a slow older answer recorded after a newer one would look like a
// counter going backwards.
func TestConcurrentScrapesOfOneSourceNeverLookLikeARegression(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		v := n.Add(1)
		if v%2 == 1 {
			time.Sleep(20 * time.Millisecond) // the older answer is the slower one
		}
		fmt.Fprintf(w, "# TYPE %s counter\n%s %d\n# TYPE %s gauge\n%s 1000\n", MetricReceived, MetricReceived, v, metricProcessStart, metricProcessStart)
	}))
	defer srv.Close()
	w := NewCounterWatch(srv.Client(), map[string]string{"r": srv.URL}, []string{MetricReceived}, time.Hour)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(2)
		go func() { defer wg.Done(); w.PollSource(context.Background(), "r") }()
		go func() { defer wg.Done(); w.PollSource(context.Background(), "r") }()
		wg.Wait()
	}
	reg, _, _, errs := w.Health(MetricReceived)
	require.Zero(t, errs)
	require.Zero(t, reg, "a counter that only grew was seen going backwards")
	require.Equal(t, float64(16), w.Total(MetricReceived))
}
