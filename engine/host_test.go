package engine

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// streams splits the recorded batches by stream, checking each stream's
// ids continue, and replays each into a block set.
func (h *harness) streams() map[string]map[uint64]bool {
	h.t.Helper()
	sets := map[string]map[uint64]bool{}
	last := map[string]uint64{}
	for _, b := range h.sink.batches {
		require.Equal(h.t, last[b.Worker]+1, b.FirstID, "%s: ids continue without gaps", b.Worker)
		last[b.Worker] = b.LastID()
		set := sets[b.Worker]
		if set == nil {
			set = map[uint64]bool{}
			sets[b.Worker] = set
		}
		for _, ev := range b.Events {
			switch ev.Kind {
			case wire.KVStored:
				require.True(h.t, !ev.HasParent || b.Worker == "w1", "the host tier's stores are chain starts")
				for _, x := range ev.Hashes {
					set[x] = true
				}
			case wire.KVRemoved:
				for _, x := range ev.Hashes {
					require.True(h.t, set[x], "%s removed a block it never stored", b.Worker)
					delete(set, x)
				}
			case wire.KVCleared:
				clear(set)
			}
		}
	}
	return sets
}

func TestGPUEvictedBlocksGoToTheBoundedHostTierAndLoadBackAtACost(t *testing.T) {
	cfg := smallConfig() // 64 GPU blocks of 16 tokens
	cfg.HostBlocks = 64
	cfg.HostLoadMsPerToken = 0.01
	h := newHarness(t, cfg)
	timing := &recordingTiming{}
	h.e.timing = timing
	a := prompt(1, 20*16+3)
	h.submit("a", a, 2, 0)
	h.runIdle()
	var aHashes []uint64
	for x := range h.streams()["w1"] {
		aHashes = append(aHashes, x)
	}
	require.Len(t, aHashes, 20)
	// Other prompts of 20 blocks push a's blocks out of the GPU.
	for i, id := range []string{"b", "c", "d", "e", "f"} {
		h.submit(id, prompt(uint32(10+i), 20*16), 2, 0)
		h.runIdle()
	}
	cpu := kvindex.TierStream("w1", kvindex.TierCPU)
	require.Equal(t, cpu, h.e.HostTierStream())
	sets := h.streams()
	for _, x := range aHashes {
		assert.False(t, sets["w1"][x], "a's blocks left the GPU")
	}
	assert.LessOrEqual(t, len(sets[cpu]), cfg.HostBlocks, "the host tier is bounded")
	held := 0
	for _, x := range aHashes {
		if sets[cpu][x] {
			held++
		}
	}
	require.Equal(t, 20, held, "a's blocks were copied down")

	before := len(timing.shapes)
	h.submit("a2", a, 2, 0)
	h.runIdle()
	d := h.finish("a2")
	assert.Equal(t, 20*16, d.CachedTokens, "a's prefix is cached again")
	assert.Equal(t, 20*16, d.HostCachedTokens, "loaded back from the host tier")
	assert.Equal(t, 3, timing.shapes[before].PrefillTokens, "only the tail is prefilled")
	st := h.e.Stats()
	assert.Equal(t, uint64(20*16), st.HostCachedTokens)
	sets = h.streams()
	for _, x := range aHashes {
		assert.True(t, sets["w1"][x], "loaded blocks are GPU blocks again")
	}
}

func TestTheHostTiersLoadTimeIsAddedToTheAdmittingStep(t *testing.T) {
	cfg := smallConfig()
	cfg.HostBlocks = 512
	cfg.HostLoadMsPerToken = 0.5 // 8 ms a block: far above the fixed 10 ms step
	h := newHarness(t, cfg)
	h.e.timing = &recordingTiming{}
	a := prompt(1, 10*16+1)
	h.submit("a", a, 1, 0)
	h.runIdle()
	for i := range 8 {
		h.submit(string(rune('b'+i)), prompt(uint32(10+i), 15*16), 1, 0)
		h.runIdle()
	}
	start := h.clock.now
	h.submit("a2", a, 1, 0)
	require.True(t, h.step())
	d := h.clock.now.Sub(start)
	h.runIdle()
	assert.Equal(t, 10*16, h.finish("a2").HostCachedTokens)
	assert.InDelta(t, float64(10+80), d.Seconds()*1000, 0.01, "a fixed 10 ms step plus 160 tokens at 0.5 ms")
}

func TestAFullHostTierEvictsItsLeastRecentlyUsedBlocks(t *testing.T) {
	cfg := smallConfig()
	cfg.HostBlocks = 8
	h := newHarness(t, cfg)
	for i := range 6 {
		h.submit(string(rune('a'+i)), prompt(uint32(i), 20*16), 1, 0)
		h.runIdle()
	}
	sets := h.streams() // checks every removal names a stored block
	assert.Len(t, sets[kvindex.TierStream("w1", kvindex.TierCPU)], 8)
	assert.Greater(t, h.e.Stats().BlocksEvicted, uint64(8))
}
