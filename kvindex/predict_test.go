package kvindex

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestLookupTakesTheLargerOfExactAndPredictedDepth(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 6)
	mustApply(t, ix, "a", 1, 1, stored(nil, h[:2]...))
	mustApply(t, ix, "b", 1, 1, stored(nil, h[:5]...))
	require.NoError(t, ix.Predict("a", h[:4], 5*time.Second))
	require.NoError(t, ix.Predict("b", h[:3], 5*time.Second))
	require.NoError(t, ix.Predict("c", h[:1], 5*time.Second))
	require.Equal(t, []Match{{"a", 4}, {"b", 5}, {"c", 1}}, sortedMatches(ix.Lookup(h, nil)))
}

func TestExpiredPredictionsVanishFromLookupsBeforeAnySweep(t *testing.T) {
	ix, _, clk := newTestIndex(t)
	h := chain(1, 3)
	require.NoError(t, ix.Predict("a", h, 5*time.Second))
	clk.Advance(4 * time.Second)
	require.Equal(t, []Match{{"a", 3}}, ix.Lookup(h, nil))
	clk.Advance(time.Second)
	require.Empty(t, ix.Lookup(h, nil), "a prediction is gone at its expiry")
	require.Equal(t, 3, ix.PredictedEntries(), "until swept, expired entries still take memory")
}

func TestSweepRemovesOnlyExpiredPredictions(t *testing.T) {
	ix, reg, clk := newTestIndex(t)
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Second))
	require.NoError(t, ix.Predict("b", chain(2, 2), time.Minute))
	clk.Advance(2 * time.Second)
	require.Equal(t, 3, ix.SweepPredictions())
	require.Equal(t, 2, ix.PredictedEntries())
	require.Equal(t, 2.0, testenv.MetricValue(t, reg, "switchyard_index_predicted_entries", nil))
	require.Equal(t, []Match{{"b", 2}}, ix.Lookup(chain(2, 2), nil))
}

func TestRepeatedPredictionsExtendTheExpiryWithoutDuplicating(t *testing.T) {
	ix, _, clk := newTestIndex(t)
	h := chain(1, 2)
	require.NoError(t, ix.Predict("a", h, 2*time.Second))
	clk.Advance(time.Second)
	require.NoError(t, ix.Predict("a", h, 2*time.Second))
	require.NoError(t, ix.PredictUntil("a", h, clk.Now().Add(time.Millisecond)), "an earlier expiry never shortens one")
	require.Equal(t, 2, ix.PredictedEntries())
	clk.Advance(1500 * time.Millisecond)
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(h, nil))
}

func TestPredictionsBeyondTheLimitAreDroppedAndCounted(t *testing.T) {
	ix, reg, _ := newTestIndex(t, func(c *Config) { c.MaxPredictedEntries = 2 })
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Second))
	require.Equal(t, 2, ix.PredictedEntries())
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_dropped_total", map[string]string{"kind": "predicted_entries"}))
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(chain(1, 3), nil))
}

func TestRemovingAWorkerDropsItsPredictions(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Minute))
	require.NoError(t, ix.Predict("b", chain(1, 1), time.Minute))
	ix.RemoveWorker("a")
	require.Equal(t, []Match{{"b", 1}}, ix.Lookup(chain(1, 3), nil), "a removed worker's predictions vanish at once")
	ix.ClearStale()
	require.Equal(t, 1, ix.PredictedEntries(), "and the next ClearStale reclaims them")
}
