package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// tierCosts returns the ttft cost of r on each worker of h, by id, as the
// selector computes it in a selection.
func tierCosts(t *testing.T, h *harness, r *Request) map[string]float64 {
	t.Helper()
	c := h.core
	c.refreshRemote()
	c.ensureIndex()
	c.ttft.begin()
	c.touched = c.touched[:0]
	r.eachOverlap(func(w string, blocks int) {
		i := c.workerIdx[w]
		c.ovl[i] = max(c.ovl[i], int32(blocks))
		c.touched = append(c.touched, i)
	})
	c.noteTiers(r)
	defer c.resetOverlaps()
	out := map[string]float64{}
	cfg := classCfg("c", PolicyFCFS)
	for i := range c.workers {
		s := &c.workers[i]
		cost, ok := c.ttftCost(r, &cfg, s, int(c.ovl[i]), r.privateBlocks(int(s.blockSize)))
		require.True(t, ok)
		out[s.ID] = cost
	}
	return out
}

func TestAHostMemoryHitCostsItsLoadTimeBetweenAGPUHitAndAMiss(t *testing.T) {
	// No herd band: its draws would blur the exact difference below.
	h := ttftHarness(t, workers(3, 0), func(cfg *Config) { cfg.TTFT.Herd = 0 }, classCfg("c", PolicyFCFS))
	for _, w := range []string{"w0", "w1", "w2"} {
		h.remote[w] = WorkerLoad{ActiveRequests: 2, PrefillTokens: 1000, DecodeBlocks: 200}
	}
	r := req("r", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 240}, {Worker: "w1", Blocks: 240, Tier: TierCPU}}
	costs := tierCosts(t, h, r)
	assert.Less(t, costs["w0"], costs["w1"], "a GPU hit is free to reuse")
	assert.Less(t, costs["w1"], costs["w2"], "a host-memory hit loads faster than the prefill it saves")
	// The difference to the GPU hit is the load time, 3,840 tokens of
	// 128 KiB at 20 GB/s, plus the decode steps' cost of the 240 GPU
	// blocks the loaded copy takes (a GPU hit shares the blocks it reuses).
	m := DefaultTTFTModel()
	load := 3840 * m.Tiers.msPerToken(TierCPU)
	assert.InDelta(t, 25.17, load, 0.01)
	assert.GreaterOrEqual(t, costs["w1"]-costs["w0"], load)
	assert.Less(t, costs["w1"]-costs["w0"], load+10)

	h.enqueue(r)
	assert.Equal(t, "w0", h.granted("r").Worker)
	r2 := req("r2", "c", 4096)
	r2.BlockHashes = r.BlockHashes
	r2.Overlaps = []Overlap{{Worker: "w1", Blocks: 240, Tier: TierCPU}}
	h.enqueue(r2)
	assert.Equal(t, "w1", h.granted("r2").Worker, "the host hit wins over recomputing")
	assert.Zero(t, r2.OverlapBlocks("w1"), "a lower tier's blocks are not GPU blocks")
}

func TestADiskHitSlowerToLoadThanToRecomputeLosesUnlessWeightedAsAPeerWould(t *testing.T) {
	// At 2 GB/s a token's 128 KiB takes 0.066 ms to load, four times the
	// model's 0.015 ms to prefill it: loading from disk is the worse deal,
	// which a constant weight (Dynamo's 0.25) cannot see.
	r := func() *Request {
		x := req("r", "c", 2048)
		x.BlockHashes = seqHashes(1, 128)
		x.Overlaps = []Overlap{{Worker: "w1", Blocks: 128, Tier: TierDisk}}
		return x
	}
	for _, c := range []struct {
		weight float64
		want   string
	}{{0, "w0"}, {0.25, "w1"}} {
		h := ttftHarness(t, workers(2, 0), func(cfg *Config) { cfg.TTFT.Tiers.Weights[TierDisk] = c.weight }, classCfg("c", PolicyFCFS))
		for _, w := range []string{"w0", "w1"} {
			h.remote[w] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 100, DecodeBlocks: 50}
		}
		costs := tierCosts(t, h, r())
		if c.weight == 0 {
			assert.Greater(t, costs["w1"], costs["w0"], "timing model")
		} else {
			assert.Less(t, costs["w1"], costs["w0"], "constant weight")
		}
		h.enqueue(r())
		assert.Equal(t, c.want, h.granted("r").Worker, "disk weight %v", c.weight)
	}
}

func TestTierCostsValidateAndZeroMeansTheDefault(t *testing.T) {
	var zero TierCosts
	require.NoError(t, zero.Validate())
	d := DefaultTierCosts()
	assert.Equal(t, d.msPerToken(TierDisk), zero.msPerToken(TierDisk))
	assert.InDelta(t, 10.0, d.msPerToken(TierDisk)/d.msPerToken(TierCPU), 1e-9, "disk is ten times slower than host memory")
	bad := d
	bad.Weights[TierCPU] = 1.5
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
	bad = d
	bad.HostGBps = -1
	require.ErrorIs(t, bad.Validate(), ErrInvalidConfig)
}

func TestTheBlocksSelectorPricesAHostMemoryHitAsAPartialHit(t *testing.T) {
	h := ttftHarness(t, workers(3, 0), func(c *Config) { c.Selector = SelectorBlocks }, classCfg("c", PolicyFCFS))
	c := h.core
	r := req("r", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 240}, {Worker: "w1", Blocks: 240, Tier: TierCPU}, {Worker: "w2", Blocks: 240, Tier: TierDisk}}
	c.touched = c.touched[:0]
	r.eachOverlap(func(w string, blocks int) {
		i := c.workerIdx[w]
		c.ovl[i] = int32(blocks)
		c.touched = append(c.touched, i)
	})
	c.noteTiers(r)
	cfg := classCfg("c", PolicyFCFS)
	cost := map[string]float64{}
	for i := range c.workers {
		s := &c.workers[i]
		x, ok := c.workerCost(r, &cfg, s, int(c.ovl[i]), r.privateBlocks(16))
		require.True(t, ok)
		cost[s.ID] = x
	}
	c.resetOverlaps()
	miss := float64(4096/16 + 256 + r.privateBlocks(16))
	assert.Less(t, cost["w0"], cost["w1"], "a GPU hit is free")
	assert.Less(t, cost["w1"], miss-100, "a host hit is most of a hit")
	// 3,840 tokens load in 25.2 ms; the model prefills a token in about
	// 0.0166 ms at this size, so the load is worth ~1,515 tokens: the
	// credit is the other ~2,325, 145 blocks.
	m := DefaultTTFTModel()
	per := (m.prefillTime(4096, 0, 0) - m.Prefill[2]) / 4096
	want := (3840 - 3840*m.Tiers.msPerToken(TierCPU)/per) / 16
	assert.InDelta(t, miss-want, cost["w1"], 1e-6)
	assert.InDelta(t, miss, cost["w2"], 1e-9, "a disk hit slower to load than to recompute is a miss, never worse")

	c.cfg.TTFT.Tiers.Weights[TierDisk] = 0.25
	c.noteTiers(r)
	x, ok := c.workerCost(r, &cfg, &c.workers[2], 0, r.privateBlocks(16))
	c.touched = append(c.touched, 2)
	c.resetOverlaps()
	require.True(t, ok)
	assert.InDelta(t, miss-960.0/16, x, 1e-9, "weighted as a peer would: a quarter of a hit")

	h.enqueue(func() *Request { x := *r; x.ID = "r1"; x.Overlaps = r.Overlaps[1:]; return &x }())
	assert.Equal(t, "w1", h.granted("r1").Worker, "the host hit wins over a miss")
}

func TestTheBookedPredictionCountsALowerTierPrefixAsItsLoadTime(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), func(c *Config) { c.TTFT.CalibrationWindow = 0 }, classCfg("c", PolicyFCFS))
	m := DefaultTTFTModel()
	r := req("a", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 64}, {Worker: "w0", Blocks: 240, Tier: TierCPU}}
	h.enqueue(r)
	g := h.granted("a")
	// 1,024 tokens on GPU, 2,816 more loaded from host memory, 256 prefilled.
	want := m.prefillTime(256, 0, 0) + 2816*m.Tiers.msPerToken(TierCPU)
	got := float64(g.PredictedTTFT) / float64(time.Millisecond)
	require.InDelta(t, want, got, 1e-3)
	assert.Less(t, got, m.prefillTime(4096-1024, 0, 0), "not a full prefill of the offloaded prefix")
	assert.Greater(t, got, m.prefillTime(256, 0, 0), "not free either")
}

func TestTheLedgerBooksALowerTierPrefixAtItsLoadCost(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), func(c *Config) { c.TTFT.CalibrationWindow = 0 }, classCfg("c", PolicyFCFS))
	m := DefaultTTFTModel()
	r := req("a", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 64}, {Worker: "w0", Blocks: 240, Tier: TierCPU}}
	h.enqueue(r)
	g := h.granted("a")
	// 1,024 tokens on GPU, 2,816 loaded from host memory: they are booked
	// as the tokens the engine could prefill in their load time, as the
	// booked prediction counts them, not as 2,816 prefilled tokens.
	want := m.tierCreditTokens(r, 2816, 2816*m.Tiers.msPerToken(TierCPU))
	require.Positive(t, want)
	require.Less(t, want, 2816.0)
	assert.Equal(t, int(want), g.TierCreditTokens)
	booked := h.core.Load("w0").PrefillTokens
	assert.Equal(t, 4096-1024-int(want), booked)
	assert.Less(t, booked, 4096-1024, "not a full prefill of the offloaded prefix")
	assert.Greater(t, booked, 256, "not free either")

	// Re-homed, the booking carries the same load.
	rec, ok := h.core.Booking(g.Booking)
	require.True(t, ok)
	assert.Equal(t, g.TierCreditTokens, rec.TierCreditTokens)
	other := ttftHarness(t, workers(1, 0), func(c *Config) { c.TTFT.CalibrationWindow = 0 }, classCfg("c", PolicyFCFS))
	other.core.Adopt(rec)
	assert.Equal(t, h.core.Load("w0"), other.core.Load("w0"))

	// The first token ends the prefill load.
	h.core.FirstToken(g.Booking)
	assert.Zero(t, h.core.Load("w0").PrefillTokens)
}

func TestADiskPrefixSlowerToLoadThanToPrefillIsBookedAsAPrefill(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), func(c *Config) { c.TTFT.CalibrationWindow = 0 }, classCfg("c", PolicyFCFS))
	r := req("a", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 64}, {Worker: "w0", Blocks: 240, Tier: TierDisk}}
	h.enqueue(r)
	g := h.granted("a")
	assert.Zero(t, g.TierCreditTokens)
	assert.Equal(t, 4096-1024, h.core.Load("w0").PrefillTokens, "never more than a recompute")
}
