package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// virtualClock is a clock the harness moves by hand. Tests call Step
// themselves and never Run, so nothing waits on it: its timers and tickers
// (the embedded wall clock's) are never used.
type virtualClock struct {
	clock.Real
	now time.Time
}

func (c *virtualClock) Now() time.Time                       { return c.now }
func (c *virtualClock) After(time.Duration) <-chan time.Time { return nil }

// recordingSink keeps every published batch.
type recordingSink struct{ batches []*wire.KVEventBatch }

func (r *recordingSink) PublishKVEvents(b *wire.KVEventBatch) { r.batches = append(r.batches, b) }

// recordingTiming records every step shape and charges a fixed time.
type recordingTiming struct{ shapes []StepShape }

func (r *recordingTiming) StepTime(s StepShape) time.Duration {
	r.shapes = append(r.shapes, s)
	return 10 * time.Millisecond
}

// harness drives one engine in virtual time.
type harness struct {
	t      *testing.T
	e      *Engine
	clock  *virtualClock
	sink   *recordingSink
	deltas map[string][]Delta
	order  []string // request ids in order of their first token
}

func smallConfig() Config {
	cfg := DefaultConfig()
	cfg.WorkerID = "w1"
	cfg.NumBlocks = 64
	cfg.MaxNumBatchedTokens = 256
	cfg.MaxNumSeqs = 16
	cfg.WatermarkFraction = 0
	cfg.Seed = 7
	cfg.Instance = 42
	return cfg
}

func newHarness(t *testing.T, cfg Config) *harness {
	t.Helper()
	h := &harness{t: t, clock: &virtualClock{now: time.Unix(1000, 0)}, sink: &recordingSink{}, deltas: map[string][]Delta{}}
	cfg.Events = h.sink
	e, err := New(cfg, h.clock)
	require.NoError(t, err)
	h.e = e
	return h
}

func (h *harness) submit(id string, prompt []uint32, maxTokens, priority int) {
	h.t.Helper()
	_, err := h.e.Submit(&Request{ID: id, Prompt: prompt, MaxTokens: maxTokens, Priority: priority,
		OnDelta: func(d Delta) {
			if d.HasToken && d.Index == 0 {
				h.order = append(h.order, id)
			}
			h.deltas[id] = append(h.deltas[id], d)
		}})
	require.NoError(h.t, err)
}

// step runs one engine step at the current virtual time and advances the
// clock to the end of the scheduled batch. It reports whether work remains.
func (h *harness) step() bool {
	next := h.e.Step(h.clock.now)
	if next.IsZero() {
		return false
	}
	h.clock.now = next
	return true
}

// runIdle steps until the engine is idle (bounded, so a livelock fails).
func (h *harness) runIdle() {
	h.t.Helper()
	for i := 0; h.step(); i++ {
		require.Less(h.t, i, 1_000_000, "engine never became idle")
	}
}

func (h *harness) finish(id string) Delta {
	h.t.Helper()
	ds := h.deltas[id]
	require.NotEmpty(h.t, ds, "request %s got no delivery", id)
	last := ds[len(ds)-1]
	require.NotZero(h.t, last.Finish, "request %s did not finish", id)
	return last
}

// replay applies every recorded event to a block set, checking ids on the
// way, and returns the set and the last id.
func (h *harness) replay() (map[uint64]bool, uint64) {
	h.t.Helper()
	set := map[uint64]bool{}
	var last uint64
	for _, b := range h.sink.batches {
		require.Equal(h.t, last+1, b.FirstID, "event ids must continue without gaps")
		require.Equal(h.t, uint64(42), b.Instance)
		require.Equal(h.t, "w1", b.Worker)
		for _, ev := range b.Events {
			switch ev.Kind {
			case wire.KVStored:
				for _, x := range ev.Hashes {
					set[x] = true
				}
			case wire.KVRemoved:
				for _, x := range ev.Hashes {
					require.True(h.t, set[x], "removed a block that was never stored")
					delete(set, x)
				}
			case wire.KVCleared:
				clear(set)
			}
		}
		last = b.LastID()
	}
	return set, last
}

// prompt returns n distinct-looking tokens starting at base.
func prompt(base uint32, n int) []uint32 {
	p := make([]uint32, n)
	for i := range p {
		p[i] = 1000 + base*7919 + uint32(i)
	}
	return p
}

// expectedToken is the k-th synthetic output token of request id under seed.
func expectedToken(seed uint64, id string, k int) uint32 {
	return outputToken(xxh3.HashStringSeed(id, seed), k)
}
