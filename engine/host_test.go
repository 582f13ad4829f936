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

// GPU 64 blocks, a host tier of 20 and a disk tier of 64: a's 20 blocks
// leave the GPU for the host tier, then the next prompts' blocks push them
// on down to disk. a again loads them from disk, at the disk's price.
func TestBlocksEvictedFromTheHostTierGoToTheDiskTierAndLoadBackAtTheDisksCost(t *testing.T) {
	cfg := smallConfig()
	cfg.HostBlocks, cfg.HostLoadMsPerToken = 20, 0.01
	cfg.DiskBlocks, cfg.DiskLoadMsPerToken = 256, 0.5
	h := newHarness(t, cfg)
	h.e.timing = &recordingTiming{}
	a := prompt(1, 20*16+3)
	h.submit("a", a, 2, 0)
	h.runIdle()
	var aHashes []uint64
	for x := range h.streams()["w1"] {
		aHashes = append(aHashes, x)
	}
	require.Len(t, aHashes, 20)
	cpu, disk := kvindex.TierStream("w1", kvindex.TierCPU), kvindex.TierStream("w1", kvindex.TierDisk)
	require.Equal(t, disk, h.e.DiskTierStream())

	where := func() (gpu, host, onDisk int) {
		sets := h.streams()
		assert.LessOrEqual(t, len(sets[cpu]), cfg.HostBlocks, "the host tier is bounded")
		assert.LessOrEqual(t, len(sets[disk]), cfg.DiskBlocks, "the disk tier is bounded")
		for _, x := range aHashes {
			switch {
			case sets["w1"][x]:
				gpu++
			case sets[cpu][x]:
				host++
			case sets[disk][x]:
				onDisk++
			}
		}
		return gpu, host, onDisk
	}
	h.submit("b", prompt(10, 20*16), 2, 0)
	h.runIdle()
	h.submit("c", prompt(11, 20*16), 2, 0)
	h.runIdle()
	h.submit("d", prompt(12, 20*16), 2, 0)
	h.runIdle()
	_, host, onDisk := where()
	require.Positive(t, host, "GPU → host first")
	require.Zero(t, onDisk)
	for i := range 4 {
		h.submit(string(rune('e'+i)), prompt(uint32(20+i), 20*16), 2, 0)
		h.runIdle()
	}
	gpu, host, onDisk := where()
	require.Equal(t, [3]int{0, 0, 20}, [3]int{gpu, host, onDisk}, "host → disk: a's blocks were written down")

	start := h.clock.now
	h.submit("a2", a, 2, 0)
	require.True(t, h.step())
	took := h.clock.now.Sub(start)
	h.runIdle()
	d := h.finish("a2")
	assert.Equal(t, 20*16, d.CachedTokens)
	assert.Equal(t, 20*16, d.DiskCachedTokens, "loaded back from disk")
	assert.Zero(t, d.HostCachedTokens)
	assert.InDelta(t, 10+20*16*0.5, took.Seconds()*1000, 0.01, "a fixed 10 ms step plus 320 tokens at the disk's 0.5 ms")
	st := h.e.Stats()
	assert.Equal(t, uint64(20*16), st.DiskCachedTokens)
	assert.Equal(t, uint64(20), st.DiskLoads)
}

// A prefix split across the tiers loads each block at its own tier's
// price: host blocks at HostLoadMsPerToken, disk blocks at
// DiskLoadMsPerToken, in the one step that admits the request.
func TestAPrefixSplitAcrossHostAndDiskIsPricedPerTier(t *testing.T) {
	cfg := smallConfig()
	cfg.HostBlocks, cfg.HostLoadMsPerToken = 30, 0.1
	cfg.DiskBlocks, cfg.DiskLoadMsPerToken = 256, 0.5
	h := newHarness(t, cfg)
	h.e.timing = &recordingTiming{}
	a := prompt(1, 40*16+1)
	h.submit("a", a, 1, 0)
	h.runIdle()
	// 70 blocks of other prompts: a's 40 blocks leave the GPU, the first
	// ones evicted (its prefix) reach disk, later ones stay on the host.
	h.submit("b", prompt(10, 40*16), 1, 0)
	h.runIdle()
	h.submit("c", prompt(11, 30*16), 1, 0)
	h.runIdle()
	start := h.clock.now
	h.submit("a2", a, 1, 0)
	require.True(t, h.step())
	took := h.clock.now.Sub(start)
	h.runIdle()
	d := h.finish("a2")
	require.Positive(t, d.HostCachedTokens, "part of a on the host")
	require.Positive(t, d.DiskCachedTokens, "part of a on disk")
	want := 10 + float64(d.HostCachedTokens)*0.1 + float64(d.DiskCachedTokens)*0.5
	assert.InDelta(t, want, took.Seconds()*1000, 0.01)
	assert.LessOrEqual(t, d.HostCachedTokens+d.DiskCachedTokens, d.CachedTokens)
}

// ResetPrefixCache clears every tier, each on its own stream.
func TestResetPrefixCacheClearsTheDiskTierToo(t *testing.T) {
	cfg := smallConfig()
	cfg.HostBlocks, cfg.DiskBlocks = 8, 64
	h := newHarness(t, cfg)
	for i := range 6 {
		h.submit(string(rune('a'+i)), prompt(uint32(i), 20*16), 1, 0)
		h.runIdle()
	}
	disk := kvindex.TierStream("w1", kvindex.TierDisk)
	require.NotEmpty(t, h.streams()[disk])
	require.NoError(t, h.e.ResetPrefixCache())
	assert.Empty(t, h.streams()[disk])
}

func TestADiskTierNeedsAHostTier(t *testing.T) {
	cfg := smallConfig()
	cfg.DiskBlocks = 8
	err := cfg.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "DiskBlocks")
}
