package kvindex

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/wire"
)

func TestATiersStreamNameSplitsBackIntoItsWorkerAndTier(t *testing.T) {
	for _, w := range []string{"w", "vllm-0", "engine-dp3", "a--cpu-b"} {
		for tier := TierGPU; tier < NumTiers; tier++ {
			name := TierStream(w, tier)
			gotW, gotT := SplitTier(name)
			assert.Equal(t, w, gotW, name)
			assert.Equal(t, tier, gotT, name)
		}
	}
	w, tier := SplitTier("--cpu")
	assert.Equal(t, "--cpu", w, "a bare suffix is a name, not a tier of nothing")
	assert.Equal(t, TierGPU, tier)
	assert.Equal(t, "cpu", TierCPU.String())
}

func TestALowerTiersBlocksAreIndexedApartFromTheWorkersGPUBlocks(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	hs := chain(1, 8)
	for _, b := range []*wire.KVEventBatch{
		batch("w", 1, 1, stored(nil, hs[:2]...)),
		batch(TierStream("w", TierCPU), 2, 1, stored(nil, hs[:6]...)),
	} {
		o, err := ix.ApplyBatch(b)
		require.NoError(t, err)
		require.Equal(t, OutcomeApplied, o)
	}
	got := map[string]int{}
	for _, m := range ix.Lookup(hs, nil) {
		got[m.Worker] = m.Blocks
	}
	assert.Equal(t, map[string]int{"w": 2, "w--cpu": 6}, got)
}
