package engine

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

func TestRepeatedPromptIsServedFromPrefixCacheAndSkipsPrefill(t *testing.T) {
	h := newHarness(t, smallConfig())
	p := prompt(1, 160) // ten full blocks
	h.submit("a", p, 2, 0)
	h.runIdle()
	first := h.e.Stats()
	require.Equal(t, uint64(160), first.PrefillTokens, "a cold prompt is prefilled in full")

	h.submit("b", p, 2, 0)
	h.runIdle()
	second := h.e.Stats()

	// The last block is recomputed so that at least one prompt token runs.
	assert.Equal(t, 144, h.finish("b").CachedTokens)
	assert.Equal(t, 0, h.finish("a").CachedTokens)
	assert.Equal(t, uint64(16), second.PrefillTokens-first.PrefillTokens, "only the uncached tail is prefilled")
	assert.InDelta(t, 144.0/320.0, second.PrefixHitRate, 1e-9)
}

func TestSharedPrefixHitsOnlyItsCommonBlocks(t *testing.T) {
	h := newHarness(t, smallConfig())
	common := prompt(1, 64)
	h.submit("a", append(slices.Clone(common), prompt(2, 40)...), 1, 0)
	h.runIdle()
	h.submit("b", append(slices.Clone(common), prompt(3, 40)...), 1, 0)
	h.runIdle()
	assert.Equal(t, 64, h.finish("b").CachedTokens)
}

func TestStoredEventsCarryTheRouterSequenceHashesWithParents(t *testing.T) {
	h := newHarness(t, smallConfig())
	p := prompt(1, 100)
	h.submit("a", p, 1, 0)
	h.runIdle()
	want := kvindex.SequenceHashes(p, 16, kvindex.BaseSeed)
	var got []uint64
	for _, b := range h.sink.batches {
		for _, ev := range b.Events {
			require.Equal(t, wire.KVStored, ev.Kind)
			if len(got) == 0 {
				assert.False(t, ev.HasParent, "the first block starts the chain")
			} else {
				assert.True(t, ev.HasParent)
				assert.Equal(t, got[len(got)-1], ev.Parent)
			}
			got = append(got, ev.Hashes...)
		}
	}
	assert.Equal(t, want, got)
}

func TestChunkedPrefillNeverExceedsTheTokenBudget(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumBatchedTokens = 64
	timing := &recordingTiming{}
	cfg.Timing = timing
	h := newHarness(t, cfg)
	h.submit("long", prompt(1, 300), 3, 0)
	h.runIdle()
	require.NotEmpty(t, timing.shapes)
	for i, s := range timing.shapes {
		assert.LessOrEqual(t, s.PrefillTokens+s.DecodeTokens, 64, "step %d", i)
	}
	// 300 tokens at 64 per step: four full chunks and one of 44, then decodes.
	prefills := []int{}
	for _, s := range timing.shapes {
		prefills = append(prefills, s.PrefillTokens)
	}
	assert.Equal(t, []int{64, 64, 64, 64, 44, 0, 0}, prefills)
	assert.Equal(t, 0, h.deltas["long"][0].Index)
	assert.Len(t, h.deltas["long"], 3)
}

func TestDecodesAreScheduledBeforePrefillChunks(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumBatchedTokens = 32
	timing := &recordingTiming{}
	cfg.Timing = timing
	h := newHarness(t, cfg)
	h.submit("d1", prompt(1, 10), 50, 0)
	h.submit("d2", prompt(2, 10), 50, 0)
	h.step() // both prefill in one step
	h.step() // both decode
	h.submit("p", prompt(3, 200), 1, 0)
	h.step()
	last := timing.shapes[len(timing.shapes)-1]
	assert.Equal(t, StepShape{PrefillTokens: 30, DecodeTokens: 2, KVUsage: last.KVUsage}, last,
		"two decodes take their token first, the new prompt gets the rest of the budget")
}

func TestWaitingQueueIsOrderedByPriorityThenArrival(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumSeqs = 1
	h := newHarness(t, cfg)
	h.submit("low1", prompt(1, 20), 1, 0)
	h.submit("high", prompt(2, 20), 1, 5)
	h.submit("low2", prompt(3, 20), 1, 0)
	h.submit("mid", prompt(4, 20), 1, 1)
	h.runIdle()
	assert.Equal(t, []string{"high", "mid", "low1", "low2"}, h.order)
}

func TestEvictionEmitsRemovedLeavesFirst(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 8
	h := newHarness(t, cfg)
	a := prompt(1, 64) // four full blocks
	h.submit("a", a, 1, 0)
	h.runIdle()
	ha := kvindex.SequenceHashes(a, 16, kvindex.BaseSeed)
	require.Equal(t, 4, h.e.Stats().CachedBlocks, "a's blocks stay cached after it finishes")

	h.submit("b", prompt(2, 112), 1, 0) // seven blocks: four free plus three evicted
	h.runIdle()
	var removed []uint64
	for _, b := range h.sink.batches {
		for _, ev := range b.Events {
			if ev.Kind == wire.KVRemoved {
				removed = append(removed, ev.Hashes...)
			}
		}
	}
	assert.Equal(t, []uint64{ha[3], ha[2], ha[1]}, removed, "the chain is evicted from its leaf")
	assert.Contains(t, h.e.Dump().Hashes, ha[0], "the root, evicted last, is still cached")
}

func TestPreemptionUnderATooSmallPoolLosesNoRequestAndNoToken(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 16 // each request needs 7 blocks at its end: only two fit
	cfg.MaxNumSeqs = 8
	h := newHarness(t, cfg)
	const n = 12
	for i := range n {
		h.submit(fmt.Sprint("r", i), prompt(uint32(i), 40), 60, i%3)
	}
	h.runIdle()
	st := h.e.Stats()
	require.Positive(t, st.Preemptions, "the load must force preemptions for this test to mean anything")
	for i := range n {
		id := fmt.Sprint("r", i)
		ds := h.deltas[id]
		require.Len(t, ds, 60, "%s: one delivery per token", id)
		base := ds[0]
		for k, d := range ds {
			assert.True(t, d.HasToken)
			assert.Equal(t, k, d.Index, "%s: tokens in order, none lost or repeated", id)
			assert.Equal(t, expectedToken(7, id, k), d.Token)
			assert.False(t, d.Time.Before(base.Time))
			base = d
		}
		assert.Equal(t, FinishLength, ds[59].Finish)
	}
	assert.Equal(t, uint64(n), st.Finished)
	assert.Zero(t, st.KVBlocksUsed, "every block is released at the end")
	assert.Zero(t, st.Running+st.Waiting)
}

func TestAdmissionWaitsForBlocksInsteadOfPreempting(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 10
	h := newHarness(t, cfg)
	h.submit("a", prompt(1, 96), 20, 0) // 6 blocks for the prompt
	h.step()
	h.submit("b", prompt(2, 96), 20, 0) // would need 6 more: only 4 free
	h.step()
	st := h.e.Stats()
	assert.Equal(t, 1, st.Running)
	assert.Equal(t, 1, st.Waiting, "b waits for blocks")
	assert.Zero(t, st.Preemptions)
	h.runIdle()
	assert.Equal(t, FinishLength, h.finish("b").Finish)
	assert.Zero(t, h.e.Stats().Preemptions, "admission never preempts running requests")
}

func TestEventIDsStartAtOneAndStrictlyIncrease(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 24
	h := newHarness(t, cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 40 {
		h.submit(fmt.Sprint("r", i), prompt(uint32(rng.IntN(5)), 20+rng.IntN(100)), 1+rng.IntN(30), 0)
		h.step()
	}
	h.runIdle()
	require.NotEmpty(t, h.sink.batches)
	assert.Equal(t, uint64(1), h.sink.batches[0].FirstID)
	var last uint64
	for _, b := range h.sink.batches {
		require.NotEmpty(t, b.Events)
		assert.Greater(t, b.FirstID, last)
		assert.Equal(t, last+1, b.FirstID, "no gaps")
		last = b.LastID()
	}
	assert.Equal(t, last, h.e.Stats().LastEventID)
}

func TestDumpEqualsTheBlockSetTheEventsDescribe(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 40
	h := newHarness(t, cfg)
	rng := rand.New(rand.NewPCG(3, 4))
	check := func(when string) {
		set, last := h.replay()
		d := h.e.Dump()
		assert.Equal(t, last, d.AsOfID, when)
		got := map[uint64]bool{}
		for _, x := range d.Hashes {
			got[x] = true
		}
		assert.Equal(t, set, got, when)
	}
	for i := range 60 {
		shared := prompt(uint32(rng.IntN(4)), 16*(1+rng.IntN(4)))
		h.submit(fmt.Sprint("r", i), append(shared, prompt(uint32(100+i), rng.IntN(50)+1)...), 1+rng.IntN(40), 0)
		if rng.IntN(7) == 0 {
			h.e.Cancel(fmt.Sprint("r", rng.IntN(i+1)))
		}
		for range rng.IntN(4) {
			h.step()
		}
		check(fmt.Sprintf("after request %d", i))
	}
	h.runIdle()
	check("at the end")
	require.NoError(t, h.e.ResetPrefixCache())
	check("after reset")
	assert.Empty(t, h.e.Dump().Hashes)
}

func TestResetPrefixCacheRefusesWhileRequestsRun(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.submit("a", prompt(1, 40), 5, 0)
	h.step()
	assert.ErrorIs(t, h.e.ResetPrefixCache(), ErrBusy)
}

func TestCancelFreesBlocksAndEndsTheStream(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.submit("a", prompt(1, 40), 100, 0)
	h.step()
	h.step()
	require.Positive(t, h.e.Stats().KVBlocksUsed)
	require.True(t, h.e.Cancel("a"))
	assert.False(t, h.e.Cancel("a"), "a second cancel finds nothing")
	assert.Equal(t, FinishCancelled, h.finish("a").Finish)
	assert.Zero(t, h.e.Stats().KVBlocksUsed)
	h.runIdle()
	assert.Equal(t, FinishCancelled, h.finish("a").Finish, "no token arrives after the cancel")
}

func TestCancelOfAWaitingRequestRemovesItFromTheQueue(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumSeqs = 1
	h := newHarness(t, cfg)
	h.submit("a", prompt(1, 40), 3, 0)
	h.submit("b", prompt(2, 40), 3, 0)
	h.step()
	require.True(t, h.e.Cancel("b"))
	assert.Equal(t, 0, h.e.Stats().Waiting)
	h.runIdle()
	assert.Equal(t, []string{"a"}, h.order)
}

func TestOutputTokensAreDeterministicForASeed(t *testing.T) {
	run := func(seed uint64) []uint32 {
		cfg := smallConfig()
		cfg.Seed = seed
		h := newHarness(t, cfg)
		h.submit("same-id", prompt(1, 30), 20, 0)
		h.runIdle()
		var toks []uint32
		for _, d := range h.deltas["same-id"] {
			toks = append(toks, d.Token)
		}
		return toks
	}
	assert.Equal(t, run(1), run(1))
	assert.NotEqual(t, run(1), run(2))
}

func TestSubmitRejectsBadRequestsWithTypedErrors(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxModelLen = 500
	cfg.MaxWaiting = 1
	h := newHarness(t, cfg)
	cases := []struct {
		req  Request
		want error
	}{
		{Request{ID: "", Prompt: prompt(1, 3), MaxTokens: 1}, ErrInvalidRequest},
		{Request{ID: "x", MaxTokens: 1}, ErrInvalidRequest},
		{Request{ID: "x", Prompt: prompt(1, 3)}, ErrInvalidRequest},
		{Request{ID: "x", Prompt: prompt(1, 450), MaxTokens: 100}, ErrTooLong},
		{Request{ID: "x", Prompt: prompt(1, 400), MaxTokens: 99 + 16*64}, ErrTooLong},
	}
	for _, c := range cases {
		_, err := h.e.Submit(&c.req)
		assert.ErrorIs(t, err, c.want, "%+v", c.req.ID)
	}
	_, err := h.e.Submit(&Request{ID: "ok", Prompt: prompt(1, 3), MaxTokens: 1})
	require.NoError(t, err)
	_, err = h.e.Submit(&Request{ID: "ok", Prompt: prompt(1, 3), MaxTokens: 1})
	assert.ErrorIs(t, err, ErrDuplicateID)
	_, err = h.e.Submit(&Request{ID: "ok2", Prompt: prompt(1, 3), MaxTokens: 1})
	assert.ErrorIs(t, err, ErrQueueFull)
}

func TestStopAbortsLiveRequestsAndRejectsNewOnes(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.submit("a", prompt(1, 40), 10, 0)
	h.step()
	h.e.Stop()
	assert.Equal(t, FinishAborted, h.finish("a").Finish)
	_, err := h.e.Submit(&Request{ID: "b", Prompt: prompt(1, 3), MaxTokens: 1})
	assert.True(t, errors.Is(err, ErrStopped))
	assert.Zero(t, h.e.Stats().KVBlocksUsed)
}

func TestConfigValidateNamesTheBadField(t *testing.T) {
	for field, mutate := range map[string]func(*Config){
		"BlockSize":           func(c *Config) { c.BlockSize = 0 },
		"NumBlocks":           func(c *Config) { c.NumBlocks = -1 },
		"MaxNumBatchedTokens": func(c *Config) { c.MaxNumBatchedTokens = 0 },
		"MaxNumSeqs":          func(c *Config) { c.MaxNumSeqs = 0 },
		"MaxModelLen":         func(c *Config) { c.MaxModelLen = 1 },
		"MaxWaiting":          func(c *Config) { c.MaxWaiting = -1 },
		"WatermarkFraction":   func(c *Config) { c.WatermarkFraction = 1 },
		"Speedup":             func(c *Config) { c.Speedup = 0 },
	} {
		cfg := DefaultConfig()
		mutate(&cfg)
		err := cfg.Validate()
		require.Error(t, err, field)
		assert.Contains(t, err.Error(), field)
	}
	def := DefaultConfig()
	assert.NoError(t, def.Validate())
}

func TestPeakLiveAndPeakRunningRecordTheMostRequestsHeldAtOnce(t *testing.T) {
	cfg := smallConfig()
	cfg.MaxNumSeqs = 2 // the third request waits: live 3, running 2
	h := newHarness(t, cfg)
	h.submit("a", prompt(1, 20), 4, 0)
	h.submit("b", prompt(2, 20), 4, 0)
	h.submit("c", prompt(3, 20), 4, 0)
	h.runIdle()
	h.submit("d", prompt(4, 20), 4, 0) // alone: the peaks stay
	h.runIdle()
	st := h.e.Stats()
	assert.Equal(t, 3, st.PeakLive, "three requests were submitted before any ended")
	assert.Equal(t, 2, st.PeakRunning, "the running set never exceeds MaxNumSeqs")
	assert.Zero(t, st.Running+st.Waiting)
}
