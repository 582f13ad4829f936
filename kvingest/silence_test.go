package kvingest

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
)

// feed observes, every 10 s for d, a worker serving blocksPerTick and
// storing storedPerTick blocks in batchesPerTick batches.
func feed(s *Silence, t0 time.Time, d time.Duration, smp *SilenceSample, servedPerTick, storedPerTick, batchesPerTick uint64) time.Time {
	at := t0
	for ; at.Sub(t0) <= d; at = at.Add(10 * time.Second) {
		smp.ServedBlocks += servedPerTick
		smp.Events.Stored += storedPerTick
		smp.Events.Batches += batchesPerTick
		s.Observe(at, []SilenceSample{*smp})
	}
	return at
}

func TestAWorkerServingPromptsWithNoBatchesIsSilentAndCounted(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := NewSilence(time.Minute, 64, reg)
	t0 := time.Unix(1_700_000_000, 0)
	smp := &SilenceSample{Worker: "w1"}
	feed(s, t0, 2*time.Minute, smp, 20, 0, 0)
	st := s.State("w1")
	require.True(t, st.Silent)
	require.Contains(t, st.Why, "no KV event batch arrived")
	require.Equal(t, []string{"w1"}, s.Silent())
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, metrics.NameRouterKVSilentWorkers, nil))
}

func TestBatchesThatStoreNothingAreSilentAndSayWhy(t *testing.T) {
	s := NewSilence(time.Minute, 64, nil)
	smp := &SilenceSample{Worker: "w1", Events: kvindex.EventCounts{Resets: 3, LastReset: "unknown_parent"}}
	at := feed(s, time.Unix(1_700_000_000, 0), 2*time.Minute, smp, 20, 0, 5)
	smp.Events.Resets++
	s.Observe(at, []SilenceSample{*smp})
	st := s.State("w1")
	require.True(t, st.Silent)
	require.Contains(t, st.Why, "stored no block")
	require.Contains(t, st.Why, "unknown_parent")
}

func TestAWorkerWhoseBlocksReachTheIndexIsNotSilent(t *testing.T) {
	s := NewSilence(time.Minute, 64, nil)
	feed(s, time.Unix(1_700_000_000, 0), 2*time.Minute, &SilenceSample{Worker: "w1"}, 20, 1, 1)
	require.False(t, s.State("w1").Silent)
	require.Empty(t, s.Silent())
}

func TestAnIdleWorkerIsNotSilent(t *testing.T) {
	s := NewSilence(time.Minute, 64, nil)
	feed(s, time.Unix(1_700_000_000, 0), 5*time.Minute, &SilenceSample{Worker: "w1"}, 1, 0, 0)
	require.False(t, s.State("w1").Silent, "6 blocks a minute are below the threshold")
}

func TestASilentWorkerRecoversWhenABlockIsStoredAndIsForgottenWhenGone(t *testing.T) {
	s := NewSilence(time.Minute, 64, nil)
	smp := &SilenceSample{Worker: "w1"}
	at := feed(s, time.Unix(1_700_000_000, 0), 2*time.Minute, smp, 20, 0, 0)
	require.True(t, s.State("w1").Silent)
	smp.Events.Stored++
	s.Observe(at, []SilenceSample{*smp})
	require.False(t, s.State("w1").Silent)

	feed(s, at.Add(10*time.Second), 2*time.Minute, smp, 20, 0, 0)
	require.True(t, s.State("w1").Silent)
	s.Observe(at.Add(5*time.Minute), nil)
	require.Empty(t, s.Silent(), "a worker no longer sampled is forgotten")
}

func TestASampledPublisherIsJudgedOnItsRateTimesTheBlocks(t *testing.T) {
	// 20 blocks every 10 s is 120 a minute: silent for a publisher of every
	// block when none arrives, but a publisher sampling one block in 32
	// would store none of them 2% of the time ((31/32)^120) while healthy.
	s := NewSilence(time.Minute, 64, nil)
	smp := &SilenceSample{Worker: "w1", Events: kvindex.EventCounts{Sample: 32}}
	feed(s, time.Unix(1_700_000_000, 0), 2*time.Minute, smp, 20, 0, 5)
	require.False(t, s.State("w1").Silent, "120 blocks a minute are below 64 x 32")

	// At 64 x 32 blocks a window with nothing stored it is silent.
	feed(s, time.Unix(1_700_000_200, 0), 2*time.Minute, smp, 500, 0, 5)
	require.True(t, s.State("w1").Silent)
}
