package kvindex

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// sampledOf returns the hashes of hs kept at rate n and their positions.
func sampledOf(hs []uint64, n int) (kept []uint64, pos []int) {
	for i, h := range hs {
		if Sampled(h, n) {
			kept = append(kept, h)
			pos = append(pos, i)
		}
	}
	return kept, pos
}

func TestSampledKeepsAboutOneHashInN(t *testing.T) {
	hs := chain(7, 100_000)
	for _, n := range []int{1, 2, 4, 16, 256} {
		kept, _ := sampledOf(hs, n)
		want := float64(len(hs)) / float64(n)
		require.InDelta(t, want, float64(len(kept)), want*0.1, "n=%d", n)
	}
	for _, h := range hs[:1000] {
		require.True(t, Sampled(h, 1))
		require.True(t, Sampled(h, 0))
	}
	// Hashes whose low bits are all zero (an engine's own layout) are
	// still sampled at the rate: the rule mixes first.
	low := 0
	for i := range uint64(64_000) {
		if Sampled(i<<20, 16) {
			low++
		}
	}
	require.InDelta(t, 4000, low, 400)
}

func TestSampledIndexStoresAndRemovesOnlySampledHashes(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.Sample = 4 })
	h := chain(1, 400)
	kept, _ := sampledOf(h, 4)
	require.Greater(t, len(kept), 50)
	require.Less(t, len(kept), len(h))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 1, stored(nil, h...)))
	require.Equal(t, len(kept), ix.Blocks("a"))
	require.Equal(t, sortedHashes(kept), sortedHashes(ix.WorkerHashes("a", nil)))
	// The raw blocks still count: the dead-event-path check compares them
	// with the blocks the worker computed.
	require.Equal(t, uint64(len(h)), ix.EventCounts("a").Stored)

	// Removing every unsampled hash is a no-op.
	var unsampled []uint64
	for _, x := range h {
		if !Sampled(x, 4) {
			unsampled = append(unsampled, x)
			require.False(t, ix.Held("a", x))
		}
	}
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 2, removed(unsampled...)))
	require.Equal(t, len(kept), ix.Blocks("a"))
	for _, x := range kept {
		require.True(t, ix.Held("a", x))
	}
	// Removing a sampled one is not.
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 3, removed(kept[0])))
	require.Equal(t, len(kept)-1, ix.Blocks("a"))
	require.Empty(t, ix.Lookup(h, nil), "the first sampled position is gone")
}

func TestSampledLookupReportsTheDepthOfTheLastMatchedSampledPosition(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.Sample = 8 })
	h := chain(3, 300)
	_, pos := sampledOf(h, 8)
	require.Greater(t, len(pos), 5)
	// a holds the whole chain, b up to just before the fourth sampled
	// position, c a prefix that ends before the first one.
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 1, stored(nil, h...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "b", 1, 1, stored(nil, h[:pos[3]]...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "c", 1, 1, stored(nil, h[:pos[0]]...)))
	got := sortedMatches(ix.Lookup(h, nil))
	require.Equal(t, []Match{
		{Worker: "a", Blocks: pos[len(pos)-1] + 1},
		{Worker: "b", Blocks: pos[2] + 1},
	}, got)
	// A prompt that is a prefix of the chain ending before any sampled
	// position matches nothing: the resolution cost.
	require.Empty(t, ix.Lookup(h[:pos[0]], nil))
}

func TestSampledStoreWhoseParentIsNotSampledIsNoGap(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.Sample = 4 })
	h := chain(5, 200)
	// Split after an unsampled block, so the second event's parent was
	// never indexed.
	cut := 0
	for i := 10; i < len(h); i++ {
		if !Sampled(h[i-1], 4) {
			cut = i
			break
		}
	}
	require.Positive(t, cut)
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 1, stored(nil, h[:cut]...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 2, stored(ptr(h[cut-1]), h[cut:]...)))
	require.Zero(t, ix.EventCounts("a").Resets)
	// A sampled parent the worker does not hold is still a gap.
	other := chain(6, 200)
	kept, _ := sampledOf(other, 4)
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 1, 3, stored(ptr(kept[0]), chain(8, 4)...)))
}

func TestSampledDumpAndPredictionsKeepOnlySampledHashes(t *testing.T) {
	ix, _, clk := newTestIndex(t, func(c *Config) { c.Sample = 4 })
	h := chain(9, 200)
	kept, pos := sampledOf(h, 4)
	// A dump replaces the worker's entries with its sampled hashes.
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 1, 5, stored(nil, chain(10, 3)...)))
	require.Equal(t, OutcomeApplied, ix.ApplyDump(&Dump{Worker: "a", Instance: 1, AsOfID: 5, Hashes: h}))
	require.Equal(t, sortedHashes(kept), sortedHashes(ix.WorkerHashes("a", nil)))
	require.Equal(t, []Match{{Worker: "a", Blocks: pos[len(pos)-1] + 1}}, ix.Lookup(h, nil))

	// Predictions store the sampled hashes only and answer at the same
	// resolution as exact entries.
	require.NoError(t, ix.Predict("b", h[:pos[5]+1], time.Minute))
	require.Equal(t, 6, ix.PredictedEntries())
	got := sortedMatches(ix.Lookup(h, nil))
	require.Equal(t, []Match{{Worker: "a", Blocks: pos[len(pos)-1] + 1}, {Worker: "b", Blocks: pos[5] + 1}}, got)
	clk.Advance(2 * time.Minute)
	require.Equal(t, []Match{{Worker: "a", Blocks: pos[len(pos)-1] + 1}}, ix.Lookup(h, nil))
}

func TestSampleOneIndexesEveryBlock(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	require.Equal(t, 1, ix.Sample())
	h := chain(11, 50)
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 1, stored(nil, h...)))
	require.Equal(t, 50, ix.Blocks("a"))
	for d := 1; d <= len(h); d++ {
		require.Equal(t, []Match{{Worker: "a", Blocks: d}}, ix.Lookup(h[:d], nil))
	}
}

func TestSampleOutOfRangeIsRefused(t *testing.T) {
	for _, n := range []int{0, -1, MaxSample + 1} {
		cfg := DefaultConfig()
		cfg.Sample = n
		require.ErrorContains(t, cfg.Validate(), "Sample", fmt.Sprint(n))
	}
	cfg := DefaultConfig()
	cfg.Sample = MaxSample
	require.NoError(t, cfg.Validate())
}

func TestHeldDepthAgreesWithLookupsExactDepth(t *testing.T) {
	for _, n := range []int{1, 4, 16} {
		ix, _, _ := newTestIndex(t, func(c *Config) { c.Sample = n })
		h := chain(21, 300)
		_, pos := sampledOf(h, n)
		cut := pos[len(pos)/2]
		require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 1, 1, stored(nil, h[:cut]...)))
		want := 0
		if ms := ix.Lookup(h, nil); len(ms) == 1 {
			want = ms[0].Blocks
		}
		require.Positive(t, want, "n=%d", n)
		require.Equal(t, want, ix.HeldDepth("a", h), "n=%d", n)
		if n == 1 {
			require.Equal(t, cut, want)
		}
		require.Zero(t, ix.HeldDepth("nobody", h))
	}
}

// FuzzSampledLookupAgreesWithAModel drives one chain through stores and
// removals of four workers at a fuzzed sampling rate and compares every
// lookup and HeldDepth with a model that applies Sampled itself.
func FuzzSampledLookupAgreesWithAModel(f *testing.F) {
	f.Add(uint8(3), []byte{0x08, 0x41, 0xfa, 0x13, 0x77})
	f.Add(uint8(0), []byte{0xff, 0x00, 0x84})
	f.Add(uint8(15), []byte{0x10, 0x20, 0x35, 0x8c, 0xf2, 0x03})
	f.Fuzz(func(t *testing.T, rate uint8, ops []byte) {
		n := 1 + int(rate%16)
		ix, _, _ := newTestIndex(t, func(c *Config) { c.Sample = n })
		h := chain(uint64(rate)+1, 64)
		model := make([]map[uint64]bool, 4)
		next := make([]uint64, 4)
		for w := range model {
			model[w], next[w] = map[uint64]bool{}, 1
		}
		name := func(w int) string { return fmt.Sprint("w", w) }
		for _, op := range ops {
			w, k := int(op&3), int(op>>3)*2
			ev := stored(nil, h[:k]...)
			if op&4 != 0 {
				ev = removed(h[k:]...)
			}
			require.Equal(t, OutcomeApplied, mustApply(t, ix, name(w), 1, next[w], ev))
			next[w]++
			for _, x := range ev.Hashes {
				if Sampled(x, n) {
					model[w][x] = ev.Kind == stored(nil).Kind
				}
			}
			want := map[string]int{}
			for m := range model {
				d := 0
				for i, x := range h {
					if !Sampled(x, n) {
						continue
					}
					if !model[m][x] {
						break
					}
					d = i + 1
				}
				require.Equal(t, d, ix.HeldDepth(name(m), h))
				if d > 0 {
					want[name(m)] = d
				}
			}
			got := map[string]int{}
			for _, m := range ix.Lookup(h, nil) {
				got[m.Worker] = m.Blocks
			}
			require.Equal(t, want, got)
		}
	})
}
