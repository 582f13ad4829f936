package engine

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

func (h *harness) submitTransfer(id string, p []uint32, maxTokens int, tr Transfer) {
	h.t.Helper()
	_, err := h.e.Submit(&Request{ID: id, Prompt: p, MaxTokens: maxTokens, Transfer: &tr,
		OnDelta: func(d Delta) { h.deltas[id] = append(h.deltas[id], d) }})
	require.NoError(h.t, err)
}

func firstTokenAt(t *testing.T, h *harness, id string) time.Time {
	t.Helper()
	for _, d := range h.deltas[id] {
		if d.HasToken && d.Index == 0 {
			return d.Time
		}
	}
	t.Fatalf("request %s got no token", id)
	return time.Time{}
}

func TestATransferredRequestComputesOnlyTheRemainderAfterTheDelay(t *testing.T) {
	h := newHarness(t, smallConfig())
	rt := &recordingTiming{}
	h.e.timing = rt
	start := h.clock.now
	p := prompt(1, 10*16+5)
	h.submitTransfer("d", p, 3, Transfer{Tokens: 10 * 16, Delay: 50 * time.Millisecond})
	h.runIdle()

	last := h.finish("d")
	assert.Equal(t, FinishLength, last.Finish)
	assert.Equal(t, 160, last.TransferredTokens)
	assert.Zero(t, last.CachedTokens)
	prefill := 0
	for _, s := range rt.shapes {
		prefill += s.PrefillTokens
	}
	assert.Equal(t, 5, prefill, "only the tokens after the transferred prefix are computed")
	assert.Equal(t, 60*time.Millisecond, firstTokenAt(t, h, "d").Sub(start), "TTFT = the 50 ms pull + one 10 ms step")
	st := h.e.Stats()
	assert.Equal(t, uint64(1), st.Transfers)
	assert.Equal(t, uint64(160), st.TransferredTokens)
	assert.Zero(t, st.Transferring)
	assert.Zero(t, st.KVBlocksUsed)
}

func TestAPullingRequestDoesNotDelayOtherRequests(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.e.timing = &recordingTiming{}
	start := h.clock.now
	h.submitTransfer("slow", prompt(1, 8*16+1), 2, Transfer{Tokens: 8 * 16, Delay: 500 * time.Millisecond})
	h.submit("fast", prompt(2, 40), 2, 0)
	require.True(t, h.step())
	st := h.e.Stats()
	assert.Equal(t, 1, st.Transferring)
	assert.Equal(t, 1, st.Running, "the pulling request takes no sequence slot")
	assert.Equal(t, 8, st.KVBlocksUsed-3, "the pull's 8 blocks are allocated at admission, next to fast's 3")
	h.runIdle()
	assert.Equal(t, 10*time.Millisecond, firstTokenAt(t, h, "fast").Sub(start), "fast runs in the first step")
	assert.Equal(t, 510*time.Millisecond, firstTokenAt(t, h, "slow").Sub(start))
}

func TestATransferPublishesItsBlocksAsStoredEvents(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.e.timing = &recordingTiming{}
	p := prompt(3, 6*16+2)
	h.submitTransfer("d", p, 1, Transfer{Tokens: len(p), Delay: 20 * time.Millisecond})
	h.runIdle()
	want := kvindex.AppendSequenceHashes(nil, p, 16, kvindex.BaseSeed)
	require.Len(t, want, 6)
	set, _ := h.replay()
	for i, x := range want {
		assert.True(t, set[x], "block %d of the transferred prefix is published", i)
	}
	var first *wire.KVEvent
	for _, b := range h.sink.batches {
		for i := range b.Events {
			if b.Events[i].Kind == wire.KVStored && first == nil {
				first = &b.Events[i]
			}
		}
	}
	require.NotNil(t, first)
	assert.Equal(t, want, first.Hashes, "the pulled blocks land as one stored run")
	assert.Equal(t, 6*16+1, h.finish("d").TransferredTokens, "at most the prompt minus its last token is pulled")
	// The same prompt again is now a local prefix hit.
	h.submit("again", p, 1, 0)
	h.runIdle()
	assert.Equal(t, 6*16, h.finish("again").CachedTokens)
}

func TestALocalPrefixHitIsNotPulled(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.e.timing = &recordingTiming{}
	base := prompt(4, 4*16)
	h.submit("a", append(base, 1, 2, 3), 1, 0)
	h.runIdle()
	p := append(append([]uint32{}, base...), prompt(5, 3*16+1)...)
	h.submitTransfer("d", p, 1, Transfer{Tokens: 7 * 16, Delay: time.Millisecond})
	h.runIdle()
	last := h.finish("d")
	assert.Equal(t, 4*16, last.CachedTokens)
	assert.Equal(t, 3*16, last.TransferredTokens)

	// A transfer entirely covered by the cache pulls nothing and waits for nothing.
	start := h.clock.now
	h.submitTransfer("e", p, 1, Transfer{Tokens: 4 * 16, Delay: time.Hour})
	h.runIdle()
	assert.Zero(t, h.finish("e").TransferredTokens)
	assert.Equal(t, 10*time.Millisecond, firstTokenAt(t, h, "e").Sub(start))
}

func TestCancellingAPullingRequestFreesItsBlocks(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.e.timing = &recordingTiming{}
	h.submitTransfer("d", prompt(6, 8*16+1), 4, Transfer{Tokens: 8 * 16, Delay: time.Second})
	next := h.e.Step(h.clock.now)
	assert.Equal(t, h.clock.now.Add(time.Second), next, "an idle engine wakes when the pull lands")
	require.Equal(t, 8, h.e.Stats().KVBlocksUsed)
	assert.ErrorIs(t, h.e.ResetPrefixCache(), ErrBusy)
	require.True(t, h.e.Cancel("d"))
	assert.Equal(t, FinishCancelled, h.finish("d").Finish)
	st := h.e.Stats()
	assert.Zero(t, st.KVBlocksUsed)
	assert.Zero(t, st.Transferring)
	assert.True(t, h.e.Step(h.clock.now).IsZero())
}

func TestAPreemptedTransferredRequestRecomputesFromItsCachedBlocks(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 24
	h := newHarness(t, cfg)
	h.e.timing = &recordingTiming{}
	h.submitTransfer("d", prompt(7, 8*16+1), 100, Transfer{Tokens: 8 * 16, Delay: 5 * time.Millisecond})
	h.submit("o", prompt(8, 8*16), 100, 0)
	h.runIdle()
	for _, id := range []string{"d", "o"} {
		assert.Equal(t, FinishLength, h.finish(id).Finish)
		assert.Len(t, h.deltas[id], 100)
	}
	st := h.e.Stats()
	assert.Positive(t, st.Preemptions, "the pool is small enough to preempt")
	assert.Equal(t, uint64(1), st.Transfers, "a preempted request is recomputed, never pulled again")
	assert.Zero(t, st.KVBlocksUsed)
}

func TestSubmitRejectsABadTransfer(t *testing.T) {
	h := newHarness(t, smallConfig())
	for _, tr := range []Transfer{{Tokens: -1}, {Tokens: 16, Delay: -time.Second}} {
		_, err := h.e.Submit(&Request{ID: "x", Prompt: prompt(1, 40), MaxTokens: 1, Transfer: &tr})
		assert.ErrorIs(t, err, ErrInvalidRequest)
	}
}

func TestTransferTimeFollowsTheModelShapeAndLink(t *testing.T) {
	cfg := DefaultConfig()
	assert.Equal(t, int64(128<<10), cfg.KVBytesPerToken(), "Llama 3.1 8B bf16: 32 × 8 × 128 × 2 × 2")
	assert.Zero(t, cfg.TransferTime(0))
	// 1 ms + 1000 × 131072 B × 8 / 200 Gb/s = 1 ms + 5.24288 ms.
	assert.InDelta(t, 6.24288, float64(cfg.TransferTime(1000))/1e6, 1e-6)
	cfg.KVDTypeBytes, cfg.TransferGbps = 1, 400
	assert.InDelta(t, 1+5.24288/4, float64(cfg.TransferTime(1000))/1e6, 1e-6)

	cfg = DefaultConfig()
	th := cfg.DisaggThreshold()
	require.Positive(t, th)
	saved := func(n int) float64 { return PrefillMillis(n) - PrefillMillis(0) }
	assert.Less(t, float64(cfg.TransferTime(th))/1e6, saved(th))
	assert.GreaterOrEqual(t, float64(cfg.TransferTime(th-cfg.BlockSize))/1e6, saved(th-cfg.BlockSize))
	cfg.TransferSetupMs = 1e4
	assert.Zero(t, cfg.DisaggThreshold(), "a link slower than computing never pays")
}

func TestConfigValidateNamesABadTransferField(t *testing.T) {
	for name, mut := range map[string]func(*Config){
		"model shape":     func(c *Config) { c.KVHeads = 0 },
		"TransferGbps":    func(c *Config) { c.TransferGbps = 0 },
		"TransferSetupMs": func(c *Config) { c.TransferSetupMs = -1 },
	} {
		cfg := DefaultConfig()
		mut(&cfg)
		err := cfg.Validate()
		require.Error(t, err, name)
		assert.Contains(t, err.Error(), name)
	}
}

func TestAModeledTransferTakesTheTransferTimeOfThePulledTokens(t *testing.T) {
	h := newHarness(t, smallConfig())
	h.e.timing = &recordingTiming{}
	start := h.clock.now
	h.submitTransfer("d", prompt(9, 20*16+1), 1, Transfer{Tokens: 20 * 16, Delay: time.Hour, Modeled: true})
	h.runIdle()
	want := h.e.Config().TransferTime(20*16) + 10*time.Millisecond
	assert.Equal(t, want, firstTokenAt(t, h, "d").Sub(start))
}

func TestALandedTransferNeverDeadlocksAHigherPriorityHead(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 20
	h := newHarness(t, cfg)
	h.e.timing = &recordingTiming{}
	h.submitTransfer("d", prompt(1, 10*16+1), 2, Transfer{Tokens: 10 * 16, Delay: 10 * time.Millisecond})
	h.e.Step(h.clock.now)
	require.Equal(t, 10, h.e.Stats().KVBlocksUsed, "the pull holds 10 of the 20 blocks")
	// A higher-priority request needing 16 blocks arrives while it pulls:
	// once the transfer lands, the landed request holds blocks behind a
	// head that cannot get them, and nothing runs to free any.
	h.submit("hi", prompt(2, 15*16), 2, 5)
	h.runIdle()
	assert.Equal(t, FinishLength, h.finish("hi").Finish)
	assert.Equal(t, FinishLength, h.finish("d").Finish)
	assert.True(t, firstTokenAt(t, h, "hi").Before(firstTokenAt(t, h, "d")), "the head keeps its place")
	st := h.e.Stats()
	assert.Equal(t, uint64(1), st.Preemptions, "the landed request gave its blocks back")
	assert.Zero(t, st.KVBlocksUsed)
}

func TestRunWakesForALandingTransferAndForASubmitWhileItWaits(t *testing.T) {
	cfg := smallConfig()
	step := &switchableTiming{}
	step.d.Store(int64(10 * time.Microsecond))
	cfg.Timing = step
	e, err := New(cfg, clock.Real{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); assert.NoError(t, e.Run(ctx)) }()
	defer func() { cancel(); wg.Wait() }()

	collect := func(s *Stream) []Delta {
		var got []Delta
		for {
			select {
			case <-s.Notify():
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: no end within 10 s", s.ID())
			}
			got = s.Take(got)
			if n := len(got); n > 0 && got[n-1].Finish != 0 {
				return got
			}
		}
	}
	// The engine is idle but for a pull that lands in an hour; an
	// ordinary request submitted meanwhile must not wait for it.
	slow, err := e.Submit(&Request{ID: "slow", Prompt: prompt(1, 5*16+1), MaxTokens: 2, Transfer: &Transfer{Tokens: 5 * 16, Delay: time.Hour}})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return e.Stats().Transferring == 1 }, 10*time.Second, time.Millisecond)
	fast, err := e.Submit(&Request{ID: "fast", Prompt: prompt(2, 40), MaxTokens: 3})
	require.NoError(t, err)
	assert.Equal(t, FinishLength, collect(fast)[2].Finish)

	short, err := e.Submit(&Request{ID: "short", Prompt: prompt(3, 5*16+1), MaxTokens: 2, Transfer: &Transfer{Tokens: 5 * 16, Delay: 20 * time.Millisecond}})
	require.NoError(t, err)
	got := collect(short)
	assert.Equal(t, FinishLength, got[len(got)-1].Finish, "Run wakes when the pull lands")
	assert.Equal(t, 5*16, got[len(got)-1].TransferredTokens)
	require.True(t, e.Cancel("slow"))
	assert.Equal(t, FinishCancelled, collect(slow)[0].Finish)
}
