package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

func TestSelectorPrefersTheWorkerWithTheLongerCachedPrefix(t *testing.T) {
	h := newHarness(t, workers(4, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w1", Blocks: 10}, {Worker: "w3", Blocks: 30}}
	h.enqueue(r)
	g := h.granted("r")
	require.Equal(t, "w3", g.Worker)
	require.Equal(t, 30, g.OverlapBlocks)
	require.Equal(t, 480, g.CachedTokens)
}

func TestSelectorWeighsBookedLoadAgainstCacheOverlap(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	// w0 caches 2 of 40 blocks but carries a heavy prefill load elsewhere.
	h.remote["w0"] = WorkerLoad{ActiveRequests: 4, PrefillTokens: 8000, DecodeBlocks: 600}
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 2}}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestSelectorBreaksExactTiesAtRandom(t *testing.T) {
	seen := map[string]bool{}
	for seed := range uint64(40) {
		c := NewCore(DefaultConfig(), clock.NewFake(t0), nil, rand.New(rand.NewPCG(seed, 1)))
		c.SetWorkers(workers(3, 0))
		idx, ok := c.selectWorker(req("r", "c", 100), &ClassConfig{})
		require.True(t, ok)
		seen[c.workers[idx].ID] = true
	}
	require.Len(t, seen, 3, "identical idle workers must all be chosen sometimes")
}

func TestSelectorWithTemperatureSometimesPicksACostlierWorker(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Temperature = 1
	picks := map[string]int{}
	for seed := range uint64(400) {
		c := NewCore(cfg, clock.NewFake(t0), nil, rand.New(rand.NewPCG(seed, 9)))
		c.SetWorkers(workers(2, 0))
		r := req("r", "c", 320)
		r.BlockHashes = seqHashes(1, 20)
		r.Overlaps = []Overlap{{Worker: "w0", Blocks: 20}}
		idx, ok := c.selectWorker(r, &ClassConfig{})
		require.True(t, ok)
		picks[c.workers[idx].ID]++
	}
	require.Greater(t, picks["w0"], picks["w1"], "the cheaper worker is more likely")
	require.Positive(t, picks["w1"], "the costlier worker still has probability e^-1/(1+e^-1)")
}

func TestSelectorIsSideEffectFree(t *testing.T) {
	h := newHarness(t, workers(3, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "c", 100))
	before := h.core.Snapshot()
	r := req("probe", "c", 500)
	r.Allowed = []string{"w1", "w2"}
	r.Overlaps = []Overlap{{Worker: "w1", Blocks: 3}}
	r.BlockHashes = seqHashes(4, 10)
	for range 3 {
		_, ok := h.core.selectWorker(r, &h.core.classes["c"].cfg)
		require.True(t, ok)
	}
	after := h.core.Snapshot()
	require.Equal(t, before.Workers, after.Workers)
	require.Equal(t, before.Bookings, after.Bookings)
	require.Equal(t, before.Classes, after.Classes)
	require.Equal(t, make([]int32, 3), h.core.ovl, "scratch overlaps are reset")
}

func TestBusyPrefillThresholdMakesRequestsWaitForAnIdleWorker(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.BusyPrefillTokens = 1000
	h := newHarness(t, workers(1, 0), c)
	h.enqueue(req("big", "c", 5000)) // an idle worker is never busy
	g := h.granted("big")
	h.enqueue(req("small", "c", 10))
	h.pending("small")

	h.core.FirstToken(g.Booking) // prefill done: the worker is no longer busy
	h.granted("small")
}

func TestBusyDecodeFractionFiltersFullWorkers(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.BusyDecodeFraction = 0.5
	ws := workers(2, 0)
	ws[0].KVBlocks, ws[1].KVBlocks = 100, 100
	h := newHarness(t, ws, c)
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1, DecodeBlocks: 45}
	h.remote["w1"] = WorkerLoad{ActiveRequests: 1, DecodeBlocks: 45}
	r := req("r", "c", 160) // 10 blocks: 55% on either worker
	r.BlockHashes = seqHashes(1, 10)
	h.enqueue(r)
	h.pending("r")

	h.remote["w1"] = WorkerLoad{ActiveRequests: 1, DecodeBlocks: 30}
	h.core.Drain()
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestMaxRunningCountsOtherReplicasBookings(t *testing.T) {
	h := newHarness(t, workers(1, 2), classCfg("c", PolicyFCFS))
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1}
	h.enqueue(req("a", "c", 10))
	h.granted("a")
	h.enqueue(req("b", "c", 10))
	h.pending("b")
}

func TestActiveDepthFindsTheHeldPrefix(t *testing.T) {
	l := &workerLedger{}
	hs := seqHashes(1, 9)
	l.add(&booking{hashes: hs[:5]})
	require.Equal(t, 5, l.activeDepth(hs))
	require.Equal(t, 0, l.activeDepth(seqHashes(2, 9)))
	require.Equal(t, 3, l.activeDepth(hs[:3]))
	require.Equal(t, 0, l.activeDepth(nil))
}
