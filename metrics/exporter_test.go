package metrics

import (
	"context"
	"errors"
	"flag"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// exporterHarness is one registry with the admission metrics and an exporter.
type exporterHarness struct {
	reg *prometheus.Registry
	adm *Admission
	exp *Exporter
}

func newHarness(t testing.TB, mutate ...func(*ExporterConfig)) *exporterHarness {
	t.Helper()
	cfg := DefaultExporterConfig()
	for _, m := range mutate {
		m(&cfg)
	}
	return newHarnessWithClock(t, cfg, nil)
}

func newHarnessWithClock(t testing.TB, cfg ExporterConfig, clk clock.Clock) *exporterHarness {
	t.Helper()
	reg := prometheus.NewRegistry()
	adm := NewAdmission(reg)
	exp, err := NewExporter(cfg, adm, reg, clk)
	require.NoError(t, err)
	return &exporterHarness{reg: reg, adm: adm, exp: exp}
}

func (h *exporterHarness) received(class string) float64 {
	return testutil.ToFloat64(h.adm.Received.WithLabelValues("w", class))
}

func (h *exporterHarness) rejected(class, reason string) float64 {
	return testutil.ToFloat64(h.adm.Rejected.WithLabelValues("w", class, reason))
}

func (h *exporterHarness) snapshotResults(result string) float64 {
	mfs, err := h.reg.Gather()
	if err != nil {
		panic(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != NameExporterSnapshots {
			continue
		}
		for _, m := range mf.GetMetric() {
			if m.GetLabel()[0].GetValue() == result {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}

// snap builds a snapshot of model "m", worker type "w" with one class whose
// received count is received and whose due_time_passed count is deadline.
func snap(instance, seq uint64, class string, received, deadline uint64) AdmissionSnapshot {
	return AdmissionSnapshot{Instance: instance, Seq: seq, WorkerType: "w", Classes: map[string]AdmissionCounts{
		class: {Received: received, Rejected: map[string]uint64{ReasonDueTimePassed: deadline}},
	}}
}

func TestDuplicateSnapshotIsCountedOnce(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 1, "a", 10, 2))
	h.exp.Observe(snap(1, 1, "a", 10, 2))

	require.Equal(t, 10.0, h.received("a"))
	require.Equal(t, 2.0, h.rejected("a", ReasonDueTimePassed))
	require.Equal(t, 1.0, h.snapshotResults("duplicate"))
}

func TestStaleSnapshotAfterANewerOneAddsNothing(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 5, "a", 50, 5))
	h.exp.Observe(snap(1, 3, "a", 30, 3))

	require.Equal(t, 50.0, h.received("a"))
	require.Equal(t, 5.0, h.rejected("a", ReasonDueTimePassed))
	require.Equal(t, 1.0, h.snapshotResults("stale"))
	require.Equal(t, 1.0, h.snapshotResults("applied"))
}

func TestSnapshotsExportOnlyTheDeltaAboveTheHighWaterMark(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 1, "a", 10, 0))
	h.exp.Observe(snap(1, 2, "a", 14, 1))
	h.exp.Observe(snap(1, 3, "a", 15, 1))

	require.Equal(t, 15.0, h.received("a"))
	require.Equal(t, 1.0, h.rejected("a", ReasonDueTimePassed))
}

func TestReplacementSchedulerAddsOntoTheSameSeries(t *testing.T) {
	// The class moves to another scheduler instance (ownership move, reload):
	// its counters restart from zero, the exported total keeps growing.
	h := newHarness(t)
	h.exp.Observe(snap(1, 9, "a", 100, 4))
	h.exp.Retire(1)
	h.exp.Observe(snap(2, 1, "a", 3, 1))

	require.Equal(t, 103.0, h.received("a"))
	require.Equal(t, 5.0, h.rejected("a", ReasonDueTimePassed))
}

func TestTwoLiveInstancesOfOneClassAreSummed(t *testing.T) {
	// During a handoff the old and the new owner both report the class.
	h := newHarness(t)
	h.exp.Observe(snap(1, 1, "a", 7, 0))
	h.exp.Observe(snap(2, 1, "a", 4, 0))
	h.exp.Observe(snap(1, 2, "a", 8, 0))

	require.Equal(t, 12.0, h.received("a"))
}

func TestClassMissingFromNewerSnapshotsKeepsItsLastCounts(t *testing.T) {
	// Class b moved away after seq 2; its final counts arrive late, behind a
	// newer snapshot that no longer lists it. They must still be exported.
	h := newHarness(t)
	s3 := snap(1, 3, "a", 30, 0)
	h.exp.Observe(s3)
	s2 := snap(1, 2, "a", 20, 0)
	s2.Classes["b"] = AdmissionCounts{Received: 6}
	h.exp.Observe(s2)

	require.Equal(t, 30.0, h.received("a"))
	require.Equal(t, 6.0, h.received("b"))
}

func TestLateSnapshotOfARetiredInstanceIsIgnored(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 2, "a", 20, 1))
	h.exp.Retire(1)
	h.exp.Observe(snap(1, 1, "a", 10, 0))
	h.exp.Observe(snap(1, 2, "a", 20, 1))

	require.Equal(t, 20.0, h.received("a"))
	require.Equal(t, 2.0, h.snapshotResults("ignored"))
	require.Equal(t, 0.0, testutil.ToFloat64(h.exp.instancesGauge), "retired marks must be released")
}

func TestRetiredMemoryForgetsTheOldestIdsFirst(t *testing.T) {
	h := newHarness(t, func(c *ExporterConfig) { c.RetiredMemory = 2 })
	for id := uint64(1); id <= 3; id++ {
		h.exp.Observe(snap(id, 1, "a", 1, 0))
		h.exp.Retire(id)
	}
	require.Len(t, h.exp.retired, 2, "memory stays bounded by RetiredMemory")

	// Ids 2 and 3 are remembered; id 1 has been forgotten, so a (pathological)
	// snapshot of it arriving now would count again: the documented limit.
	h.exp.Observe(snap(3, 1, "a", 1, 0))
	h.exp.Observe(snap(2, 1, "a", 1, 0))
	require.Equal(t, 3.0, h.received("a"))
	h.exp.Observe(snap(1, 1, "a", 1, 0))
	require.Equal(t, 4.0, h.received("a"))
}

func TestRetiringTwiceKeepsOneTombstone(t *testing.T) {
	h := newHarness(t, func(c *ExporterConfig) { c.RetiredMemory = 2 })
	h.exp.Retire(1)
	h.exp.Retire(1)
	h.exp.Retire(2)
	h.exp.Observe(snap(1, 1, "a", 5, 0))

	require.Equal(t, 0.0, h.received("a"), "id 1 must still be remembered")
}

func TestCounterThatGoesDownInANewerSnapshotIsCountedAsARegression(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 1, "a", 10, 0))
	h.exp.Observe(snap(1, 2, "a", 7, 0))
	h.exp.Observe(snap(1, 3, "a", 12, 0))

	require.Equal(t, 12.0, h.received("a"), "the total never decreases and never double counts")
	require.Equal(t, 1.0, testutil.ToFloat64(h.exp.regressions))
}

func TestUnknownRejectReasonsAreSummedIntoOther(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(AdmissionSnapshot{Instance: 1, Seq: 1, WorkerType: "w", Classes: map[string]AdmissionCounts{
		"a": {Rejected: map[string]uint64{"brand_new_reason": 2, "another": 3}},
	}})
	h.exp.Observe(AdmissionSnapshot{Instance: 1, Seq: 2, WorkerType: "w", Classes: map[string]AdmissionCounts{
		"a": {Rejected: map[string]uint64{"brand_new_reason": 2, "another": 4}},
	}})

	require.Equal(t, 6.0, h.rejected("a", ReasonOther))
}

func TestEveryReasonSeriesExistsAtZeroOnceAClassIsSeen(t *testing.T) {
	h := newHarness(t)
	h.exp.Observe(snap(1, 1, "a", 1, 0))

	for _, r := range RejectReasons() {
		require.Equal(t, 0.0, h.rejected("a", r), "reason %s", r)
	}
	require.Equal(t, len(RejectReasons()), testutil.CollectAndCount(h.adm.Rejected, NameAdmissionRejected))
}

// manualClock hands out one ticker whose ticks the test sends by hand. The
// Exporter only makes tickers; the rest of the clock is the wall clock's.
type manualClock struct {
	clock.Real
	ticks chan time.Time
}

func (c manualClock) NewTicker(time.Duration) clock.Ticker { return manualTicker(c) }

type manualTicker manualClock

func (m manualTicker) C() <-chan time.Time { return m.ticks }
func (manualTicker) Stop()                 {}

func TestRunPullsEverySourceOnEachTickAndStopsWithItsContext(t *testing.T) {
	clock := manualClock{ticks: make(chan time.Time)}
	h := newHarnessWithClock(t, DefaultExporterConfig(), clock)
	var seq uint64
	pulled := make(chan struct{})
	h.exp.AddSource(func() []AdmissionSnapshot {
		seq++
		defer func() { pulled <- struct{}{} }()
		return []AdmissionSnapshot{snap(1, seq, "a", 10*seq, 0)}
	})
	h.exp.AddSource(func() []AdmissionSnapshot { return []AdmissionSnapshot{snap(2, 1, "b", 1, 0)} })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- h.exp.Run(ctx) }()

	for range 3 {
		clock.ticks <- time.Time{}
		<-pulled
	}
	cancel()
	require.NoError(t, <-done)
	require.Equal(t, 30.0, h.received("a"))
	require.Equal(t, 1.0, h.received("b"))
}

func TestExporterConfigValidationNamesTheBadField(t *testing.T) {
	require.NoError(t, DefaultExporterConfig().Validate())

	c := DefaultExporterConfig()
	c.Interval = 0
	err := c.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "Interval")

	c = DefaultExporterConfig()
	c.RetiredMemory = 0
	err = c.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "RetiredMemory")

	_, err = NewExporter(c, NewAdmission(prometheus.NewRegistry()), prometheus.NewRegistry(), nil)
	require.True(t, errors.Is(err, ErrInvalidConfig), "NewExporter validates its config")
	_, err = NewExporter(DefaultExporterConfig(), nil, prometheus.NewRegistry(), nil)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestExporterFlagsOverrideDefaults(t *testing.T) {
	c := DefaultExporterConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	c.RegisterFlags(fs, "metrics.")
	require.NoError(t, fs.Parse([]string{"-metrics.refresh-interval=2s", "-metrics.retired-memory=7"}))

	require.Equal(t, 2*time.Second, c.Interval)
	require.Equal(t, 7, c.RetiredMemory)
}
