package bench

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

func TestSimTTFTSelectorCalibratesToWorkersFasterAndSlowerThanItsModel(t *testing.T) {
	syn := DefaultSyntheticConfig()
	syn.Requests, syn.Rate, syn.Turns, syn.PrefixTokens, syn.InputTokens, syn.OutputTokens = 400, 20, 2, 1024, 2048, 16
	reqs, err := GenerateSynthetic(syn)
	require.NoError(t, err)

	cfg := simTestConfig()
	cfg.Workers = 4
	cfg.Scheduler.Selector = scheduler.SelectorTTFT
	// Workers 0 and 2 run at half the model's speed, 1 and 3 at twice it.
	cfg.EngineSpeedups = []float64{0.5, 2}
	rep := runSim(t, cfg, reqs)
	fastest := 0
	for i, w := range rep.Workers {
		if i%2 == 1 {
			fastest = max(fastest, w.Requests)
		}
	}
	for i, w := range rep.Workers {
		t.Logf("%s: %d requests, calibrated scale %.3f", w.ID, w.Requests, w.TTFTScale)
		require.Positive(t, w.Requests, "worker %s served nothing: no marks to calibrate on", w.ID)
		if i%2 == 0 {
			// A slow worker soon gets few requests, and its first marks
			// (a start prior holds them near scale 1 while they cannot
			// tell a slower engine from a fixed overhead) never make it
			// look faster than the model, nor busier than a fast one.
			require.Greater(t, w.TTFTScale, 1.0, "worker %s is twice as slow as the model", w.ID)
			require.Less(t, w.Requests, fastest/4, "worker %s is slow: the fast workers take the load", w.ID)
		} else {
			require.Less(t, w.TTFTScale, 0.75, "worker %s is twice as fast as the model", w.ID)
		}
	}
	require.Equal(t, "ttft", rep.Config.Selector)
	require.Equal(t, []float64{0.5, 2}, rep.Config.EngineSpeedups)
}

func TestSimBlocksSelectorLeavesTheScaleAtOne(t *testing.T) {
	cfg := simTestConfig()
	cfg.Scheduler.Selector = scheduler.SelectorBlocks
	cfg.EngineSpeedups = []float64{0.5}
	rep := runSim(t, cfg, twoGroupTrace())
	for _, w := range rep.Workers {
		require.Equal(t, 1.0, w.TTFTScale, w.ID)
	}
	require.Equal(t, "blocks", rep.Config.Selector)
}
