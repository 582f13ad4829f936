package scheduler

import (
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// ttftHarness is a harness whose Core selects by predicted TTFT.
func ttftHarness(t *testing.T, ws []Worker, mutate func(*Config), classes ...ClassConfig) *harness {
	t.Helper()
	h := newHarness(t, ws, classes...)
	cfg := DefaultConfig()
	cfg.Selector = SelectorTTFT
	if mutate != nil {
		mutate(&cfg)
	}
	require.NoError(t, cfg.Validate())
	h.core = NewCore(cfg, h.clock, h, rand.New(rand.NewPCG(1, 2)))
	h.core.SetWorkers(ws)
	h.core.SetClasses(classes)
	return h
}

func TestTTFTModelPrefillTimeMatchesHandComputedSteps(t *testing.T) {
	m := DefaultTTFTModel()
	// Values computed by hand from design §9's polynomials:
	// P(T) = 4.209989e-7·T² + 0.01518344·T + 16.50142, D(u) = −25.74u² + 54.01u + 5.74.
	for _, tc := range []struct {
		name string
		n, d int
		u    float64
		want float64
	}{
		{"nothing to prefill costs nothing", 0, 5, 0.3, 0},
		{"one step of 1000 tokens is P(1000)", 1000, 0, 0, 32.1058589},
		{"10000 tokens are a full 8192-token step and 1808 more", 10000, 0, 0, 214.4661860724992},
		{"exactly two budgets are two full steps", 16384, 0, 0, 338.2738368084992},
		// 100 decoders leave 8092 prefill tokens per step; each step also
		// pays D(0.5) − D(0) = 20.57 ms: P(8192)+20.57 + P(908+100)+20.57.
		{"decoders shrink the chunk and add their KV read", 9000, 100, 0.5, 242.51100775057918},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.InDelta(t, tc.want, m.prefillTime(tc.n, tc.d, tc.u), 1e-9)
		})
	}
}

// stepByStep is an independent reference for prefillTime: it runs the
// engine's schedule one step at a time.
func stepByStep(m TTFTModel, n, d int, u float64) float64 {
	total := 0.0
	for n > 0 {
		chunk := min(n, max(1, m.StepTokens-d))
		t := float64(chunk + d)
		ms := m.Prefill[0]*t*t + m.Prefill[1]*t + m.Prefill[2]
		if d > 0 {
			ms += m.Decode[0]*u*u + m.Decode[1]*u
		}
		total += ms
		n -= chunk
	}
	return total
}

func TestTTFTModelPrefillTimeAgreesWithAStepByStepSchedule(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	m := DefaultTTFTModel()
	for i := range 2000 {
		m.StepTokens = 1 + rng.IntN(9000)
		n, d, u := rng.IntN(100000), rng.IntN(300), rng.Float64()
		want := stepByStep(m, n, d, u)
		require.InEpsilon(t, want+1, m.prefillTime(n, d, u)+1, 1e-9, "case %d: n=%d d=%d u=%v budget=%d", i, n, d, u, m.StepTokens)
	}
}

// markFirstTokens runs n requests of varying size on the one worker of h,
// each alone, with the first token arriving factor × the reference model's
// prediction after the grant (± 20% noise).
func markFirstTokens(t *testing.T, h *harness, n int, factor float64, rng *rand.Rand) {
	t.Helper()
	m := DefaultTTFTModel()
	for i := range n {
		id := fmt.Sprintf("cal-%v-%d", factor, i)
		prompt := 256 + rng.IntN(20000)
		h.enqueue(req(id, "c", prompt))
		g := h.granted(id)
		pred := m.prefillTime(prompt, 0, 0)
		noise := 0.8 + 0.4*rng.Float64()
		h.clock.Advance(time.Duration(factor * noise * pred * float64(time.Millisecond)))
		h.core.FirstToken(g.Booking)
		h.core.Finish(g.Booking)
	}
}

func TestCalibrationConvergesOnAWorkerTwiceAsSlowAsTheModel(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	require.Equal(t, 1.0, h.core.TTFTScale("w0"), "no marks yet: the reference speed")
	markFirstTokens(t, h, 200, 2, rand.New(rand.NewPCG(1, 1)))
	require.InDelta(t, 2, h.core.TTFTScale("w0"), 0.15)
}

func TestCalibrationConvergesOnAWorkerTwiceAsFastAsTheModel(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	markFirstTokens(t, h, 200, 0.5, rand.New(rand.NewPCG(2, 2)))
	require.InDelta(t, 0.5, h.core.TTFTScale("w0"), 0.04)
}

func TestCalibrationFollowsAWorkerThatSlowsDown(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	rng := rand.New(rand.NewPCG(3, 3))
	markFirstTokens(t, h, 100, 1, rng)
	require.InDelta(t, 1, h.core.TTFTScale("w0"), 0.08)
	markFirstTokens(t, h, 200, 2, rng) // about six windows of 32 marks
	require.InDelta(t, 2, h.core.TTFTScale("w0"), 0.15)
}

func TestCalibrationOffKeepsTheReferenceScale(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), func(c *Config) { c.TTFT.CalibrationWindow = 0 }, classCfg("c", PolicyFCFS))
	markFirstTokens(t, h, 20, 2, rand.New(rand.NewPCG(4, 4)))
	require.Equal(t, 1.0, h.core.TTFTScale("w0"))
}

func TestARepeatedFirstTokenMarkIsCountedOnce(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	h.enqueue(req("a", "c", 4096))
	g := h.granted("a")
	m := DefaultTTFTModel()
	pred := m.prefillTime(4096, 0, 0)
	h.clock.Advance(time.Duration(2 * pred * float64(time.Millisecond)))
	h.core.FirstToken(g.Booking)
	// One mark cannot tell a slower engine from a fixed overhead: the
	// prior reads the excess as overhead.
	require.InDelta(t, 1, h.core.TTFTScale("w0"), 1e-6)
	require.InDelta(t, pred, float64(h.core.TTFTOverhead("w0"))/float64(time.Millisecond), 1e-3)
	h.clock.Advance(time.Minute)
	h.core.FirstToken(g.Booking) // a duplicate mark, much later
	require.InDelta(t, 1, h.core.TTFTScale("w0"), 1e-6)
	require.InDelta(t, pred, float64(h.core.TTFTOverhead("w0"))/float64(time.Millisecond), 1e-3)
}

func TestACalibratedSlowWorkerLosesToAnEqualReferenceWorker(t *testing.T) {
	h := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	// Teach the Core that w0 is twice as slow: pin calibration requests of
	// several sizes to it (equal sizes could not tell slow from overhead).
	m := DefaultTTFTModel()
	for i := range 60 {
		isl := 1000 + 3000*(i%10)
		r := req(fmt.Sprintf("cal-%d", i), "c", isl)
		r.Pinned = "w0"
		h.enqueue(r)
		g := h.granted(r.ID)
		h.clock.Advance(time.Duration(2 * m.prefillTime(isl, 0, 0) * float64(time.Millisecond)))
		h.core.FirstToken(g.Booking)
		h.core.Finish(g.Booking)
	}
	require.InDelta(t, 2, h.core.TTFTScale("w0"), 0.1)
	require.Less(t, h.core.TTFTOverhead("w0"), 20*time.Millisecond, "no overhead in the marks (the prior reads a little)")
	for i := range 20 {
		id := fmt.Sprintf("r%d", i)
		h.enqueue(req(id, "c", 1000))
		g := h.granted(id)
		require.Equal(t, "w1", g.Worker, "both idle: the faster worker gives the earlier first token")
		h.core.Finish(g.Booking)
	}
}

func TestTTFTSelectorPrefersCacheAffinityWhenQueueingIsEqual(t *testing.T) {
	h := ttftHarness(t, workers(3, 0), nil, classCfg("c", PolicyFCFS))
	for _, w := range []string{"w0", "w1", "w2"} {
		h.remote[w] = WorkerLoad{ActiveRequests: 3, PrefillTokens: 2000, DecodeBlocks: 300}
	}
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 8}, {Worker: "w2", Blocks: 30}}
	h.enqueue(r)
	g := h.granted("r")
	require.Equal(t, "w2", g.Worker)
	require.Equal(t, 480, g.CachedTokens)
}

func TestTTFTSelectorRecomputesOnAnIdleWorkerWhenTheCachedQueueCostsMore(t *testing.T) {
	h := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	// w0 caches half the prompt but has 50k tokens of prefill booked ahead
	// (six full steps, ~1.1 s); recomputing all 640 tokens on w1 takes one
	// step (26 ms), even weighed 3× as the default prefill scale does.
	h.remote["w0"] = WorkerLoad{ActiveRequests: 4, PrefillTokens: 50000, DecodeBlocks: 800}
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 20}}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestTTFTSelectorKeepsTheCachedWorkerWhenItsQueueIsShorterThanTheRecompute(t *testing.T) {
	h := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	// w0 caches 30k of a 32k prompt and has 2k tokens booked ahead: one
	// step of 4k tokens there against four steps of the whole prompt on w1.
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 2000, DecodeBlocks: 200}
	r := req("r", "c", 32000)
	r.BlockHashes = seqHashes(1, 2000)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 1875}}
	h.enqueue(r)
	g := h.granted("r")
	require.Equal(t, "w0", g.Worker)
	require.Equal(t, 30000, g.CachedTokens)
}

func TestTTFTSelectorBreaksExactTiesAtRandom(t *testing.T) {
	seen := map[string]bool{}
	cfg := DefaultConfig()
	cfg.Selector = SelectorTTFT
	for seed := range uint64(40) {
		c := NewCore(cfg, clock.NewFake(t0), nil, rand.New(rand.NewPCG(seed, 1)))
		c.SetWorkers(workers(3, 0))
		idx, ok := c.selectWorker(req("r", "c", 100), &ClassConfig{})
		require.True(t, ok)
		seen[c.workers[idx].ID] = true
	}
	require.Len(t, seen, 3, "identical idle workers must all be chosen sometimes")
}

func TestTTFTSelectorRespectsAllowedAndPinnedWorkers(t *testing.T) {
	h := ttftHarness(t, workers(4, 0), nil, classCfg("c", PolicyFCFS))
	h.remote["w3"] = WorkerLoad{ActiveRequests: 8, PrefillTokens: 90000, DecodeBlocks: 900}
	mk := func(id string) *Request {
		r := req(id, "c", 1600)
		r.BlockHashes = seqHashes(1, 100)
		r.Overlaps = []Overlap{{Worker: "w0", Blocks: 100}, {Worker: "w1", Blocks: 50}}
		return r
	}
	a := mk("allowed")
	a.Allowed = []string{"w1", "w2"}
	h.enqueue(a)
	require.Equal(t, "w1", h.granted("allowed").Worker, "the best cache among the allowed workers, not w0's")

	p := mk("pinned")
	p.Pinned = "w3"
	h.enqueue(p)
	require.Equal(t, "w3", h.granted("pinned").Worker, "pinned to the busiest, uncached worker")
}

func TestTTFTSelectorAvoidsAnOversubscribedPool(t *testing.T) {
	h := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	// w0 caches the whole prompt but its pool (1000 blocks) is booked 50%
	// over: the request would wait for running generations to end.
	h.remote["w0"] = WorkerLoad{ActiveRequests: 20, DecodeBlocks: 1500}
	r := req("r", "c", 1600)
	r.BlockHashes = seqHashes(1, 100)
	r.ExpectedOutputTokens = 300
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 100}}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

// referenceTTFTCost recomputes ttftCost from its documented formula,
// independently of the selector's code path.
func referenceTTFTCost(cfg Config, r *Request, w Worker, local, remote WorkerLoad, heldLocal int, scale float64) (float64, bool) {
	load := local.Add(remote)
	if w.MaxRunning > 0 && load.ActiveRequests >= w.MaxRunning {
		return 0, false
	}
	ovl := r.OverlapBlocks(w.ID)
	held := heldLocal
	if remote.ActiveRequests > 0 {
		held = max(held, ovl)
	}
	decode := load.DecodeBlocks + len(r.BlockHashes) - held + r.privateBlocks(w.BlockSize)
	cached := min(r.PromptTokens, ovl*w.BlockSize)
	credited := min(r.PromptTokens, int(cfg.OverlapCredit*float64(cached)))
	m := cfg.TTFT
	d := load.ActiveRequests
	frac := float64(decode) / float64(w.KVBlocks)
	u := min(1, frac)
	queue := stepByStep(m, load.PrefillTokens, d, u)
	own := stepByStep(m, load.PrefillTokens+max(1, r.PromptTokens-credited), d, u) - queue
	work := stepByStep(m, max(1, r.PromptTokens-credited), 0, 0)
	cost := queue + own + (m.PrefillScale-1)*work + m.Interference*float64(d)*own
	if frac > 1 {
		cost += (frac - 1) * float64(max(1, r.ExpectedOutputTokens)) * (m.Decode[0] + m.Decode[1] + m.Decode[2])
	}
	return cost * scale, true
}

func TestTTFTSelectorPicksAWorkerOfMinimalReferenceCost(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 13))
	for trial := range 300 {
		cfg := DefaultConfig()
		cfg.Selector = SelectorTTFT
		cfg.OverlapCredit = []float64{0.5, 1, 2}[rng.IntN(3)]
		cfg.TTFT.PrefillScale = []float64{1, 3, 5}[rng.IntN(3)]
		cfg.TTFT.Interference = []float64{0, 0.05}[rng.IntN(2)]
		n := 2 + rng.IntN(8)
		ws := workers(n, 0)
		for i := range ws {
			ws[i].MaxRunning = []int{0, 4, 16}[rng.IntN(3)]
		}
		remote := map[string]WorkerLoad{}
		view := loadFunc(func(w string) WorkerLoad { return remote[w] })
		c := NewCore(cfg, clock.NewFake(t0), view, rand.New(rand.NewPCG(uint64(trial), 3)))
		c.SetWorkers(ws)
		for _, w := range ws {
			if rng.IntN(3) > 0 {
				remote[w.ID] = WorkerLoad{ActiveRequests: rng.IntN(20), PrefillTokens: rng.IntN(40000), DecodeBlocks: rng.IntN(1500)}
			}
		}
		prompt := 16 + rng.IntN(8000)
		r := &Request{ID: "r", Class: "c", PromptTokens: prompt, BlockHashes: seqHashes(uint64(trial), prompt/16),
			ExpectedOutputTokens: rng.IntN(500)}
		for _, w := range ws {
			if rng.IntN(2) == 0 {
				r.Overlaps = append(r.Overlaps, Overlap{Worker: w.ID, Blocks: rng.IntN(len(r.BlockHashes) + 1)})
			}
		}
		if rng.IntN(4) == 0 {
			r.Allowed = []string{ws[0].ID, ws[n-1].ID}
		}
		idx, ok := c.selectWorker(r, &ClassConfig{})
		best, any := math.Inf(1), false
		for _, w := range ws {
			if !r.Allows(w.ID) {
				continue
			}
			cost, eligible := referenceTTFTCost(cfg, r, w, WorkerLoad{}, remote[w.ID], 0, 1)
			if eligible {
				any = true
				best = min(best, cost)
			}
		}
		require.Equal(t, any, ok, "trial %d: a worker is selected exactly when one is eligible", trial)
		if !ok {
			continue
		}
		w := c.workers[idx].Worker
		require.True(t, r.Allows(w.ID), "trial %d: selected %s is not allowed", trial, w.ID)
		got, eligible := referenceTTFTCost(cfg, r, w, WorkerLoad{}, remote[w.ID], 0, 1)
		require.True(t, eligible, "trial %d: selected %s is full", trial, w.ID)
		require.InEpsilon(t, best, got, 1e-9, "trial %d: selected %s costs %v, the cheapest %v", trial, w.ID, got, best)
	}
}

type loadFunc func(string) WorkerLoad

func (f loadFunc) RemoteLoad(w string) WorkerLoad { return f(w) }

func TestSelectorParsesAndPrintsItsNames(t *testing.T) {
	for _, s := range []Selector{SelectorBlocks, SelectorTTFT} {
		got, err := ParseSelector(s.String())
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	_, err := ParseSelector("fastest")
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestConfigValidateNamesTheBadTTFTField(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*Config)
	}{
		{"Selector", func(c *Config) { c.Selector = 7 }},
		{"TTFT.Prefill", func(c *Config) { c.TTFT.Prefill[1] = 0 }},
		{"TTFT.Decode[2]", func(c *Config) { c.TTFT.Decode[2] = math.NaN() }},
		{"TTFT.StepTokens", func(c *Config) { c.TTFT.StepTokens = 0 }},
		{"TTFT.PrefillScale", func(c *Config) { c.TTFT.PrefillScale = -1 }},
		{"TTFT.Interference", func(c *Config) { c.TTFT.Interference = math.Inf(1) }},
		{"TTFT.CalibrationWindow", func(c *Config) { c.TTFT.CalibrationWindow = -1 }},
		{"TTFT.Herd", func(c *Config) { c.TTFT.Herd = -1 }},
		{"TTFT.HerdWindow", func(c *Config) { c.TTFT.HerdWindow = math.NaN() }},
	} {
		cfg := DefaultConfig()
		tc.mutate(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, tc.field)
		require.Contains(t, err.Error(), tc.field)
	}
}

func TestNewCoreReplacesAnUnsetSelectorWithTheDefault(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Selector = 0
	cfg.TTFT.StepTokens = -5
	c := NewCore(cfg, clock.NewFake(t0), nil, nil)
	require.Equal(t, DefaultConfig().Selector, c.Config().Selector)
	require.Equal(t, DefaultTTFTModel(), c.Config().TTFT)
}

func TestTTFTFlagsSetTheModel(t *testing.T) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg.RegisterFlags(fs, "s.")
	require.NoError(t, fs.Parse([]string{"-s.selector", "blocks", "-s.ttft-prefill", "1e-7,0.02,10",
		"-s.ttft-decode", "0,10,5", "-s.ttft-step-tokens", "4096", "-s.ttft-prefill-scale", "2",
		"-s.ttft-interference", "0.1", "-s.ttft-calibration-window", "8", "-s.ttft-externality", "0.5", "-s.ttft-spread", "20",
		"-s.ttft-herd", "0.5", "-s.ttft-herd-window", "30", "-s.ttft-host-gbps", "25", "-s.ttft-disk-gbps", "3",
		"-s.ttft-kv-bytes-per-token", "65536", "-s.ttft-cpu-weight", "0.8"}))
	require.Equal(t, SelectorBlocks, cfg.Selector)
	require.Equal(t, TTFTModel{Prefill: [3]float64{1e-7, 0.02, 10}, Decode: [3]float64{0, 10, 5}, StepTokens: 4096,
		PrefillScale: 2, Externality: 0.5, Interference: 0.1, Spread: 20, Herd: 0.5, HerdWindow: 30, CalibrationWindow: 8,
		Tiers: TierCosts{KVBytesPerToken: 65536, HostGBps: 25, DiskGBps: 3, Weights: [NumTiers]float64{TierCPU: 0.8}}}, cfg.TTFT)
	require.Error(t, fs.Parse([]string{"-s.ttft-prefill", "1,2"}))
	require.Error(t, fs.Parse([]string{"-s.selector", "nope"}))
}

func TestFleetLoadIsTheMeanBookedPrefillInRequestsWorth(t *testing.T) {
	h := ttftHarness(t, workers(4, 0), nil, classCfg("c", PolicyFCFS))
	m := DefaultTTFTModel()
	step := m.prefillTime(8192, 0, 0)
	run := func(n int) {
		for range n {
			id := fmt.Sprintf("r%d", h.arrived)
			h.arrived++
			h.enqueue(req(id, "c", 8192)) // uncached: one full step of work
			h.core.Finish(h.granted(id).Booking)
		}
	}
	// Every worker has one such request's prefill booked elsewhere: L = 1.
	for _, w := range []string{"w0", "w1", "w2", "w3"} {
		h.remote[w] = WorkerLoad{PrefillTokens: 8192}
	}
	run(300)
	require.InDelta(t, 1, h.core.ttft.load, 0.01)
	require.InDelta(t, step, h.core.ttft.work, 1e-6)
	// Two of them carry three: the mean is two requests' worth.
	h.remote["w0"] = WorkerLoad{PrefillTokens: 3 * 8192}
	h.remote["w1"] = WorkerLoad{PrefillTokens: 3 * 8192}
	run(300)
	want := (2*m.prefillTime(3*8192, 0, 0) + 2*step) / 4 / step
	require.InDelta(t, want, h.core.ttft.load, 0.02)
}

func TestALoadedFleetKeepsARequestOnItsCacheThatAnIdleOneWouldMove(t *testing.T) {
	// w0 caches half of a 16k prompt but has 12k tokens booked ahead: its
	// first token comes later than a full recompute on idle w1.
	mk := func(h *harness, id string) *Request {
		h.remote["w0"] = WorkerLoad{PrefillTokens: 12000}
		r := req(id, "c", 16384)
		r.BlockHashes = seqHashes(1, 1024)
		r.Overlaps = []Overlap{{Worker: "w0", Blocks: 512}}
		return r
	}
	idle := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	idle.enqueue(mk(idle, "r"))
	require.Equal(t, "w1", idle.granted("r").Worker, "an unloaded fleet: the earliest first token wins")

	// With two prefills booked per worker fleet-wide, the 8k tokens the
	// recompute would add cost two more requests' wait each: stay cached.
	loaded := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	loaded.core.ttft.load = 2
	loaded.enqueue(mk(loaded, "r"))
	require.Equal(t, "w0", loaded.granted("r").Worker)
}

// markWithOverhead runs n requests of varying size on worker w of h, each
// alone, whose first token arrives overhead + speed × the reference
// prediction after the grant (an engine speed× as fast... or slow, behind a
// fixed hand-off).
func markWithOverhead(t *testing.T, h *harness, w string, n int, overhead time.Duration, speed float64, rng *rand.Rand) {
	t.Helper()
	m := DefaultTTFTModel()
	for i := range n {
		id := fmt.Sprintf("oh-%s-%d-%d", w, i, rng.Int())
		prompt := 128 + rng.IntN(16000)
		r := req(id, "c", prompt)
		r.Pinned = w
		h.enqueue(r)
		g := h.granted(id)
		pred := m.prefillTime(prompt, 0, 0)
		h.clock.Advance(overhead + time.Duration(speed*pred*float64(time.Millisecond)))
		h.core.FirstToken(g.Booking)
		h.core.Finish(g.Booking)
	}
}

func TestAWorkerWithALargeFixedOverheadAndAFastEngineDoesNotLookSlower(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	// An engine 20× faster than the reference behind 80 ms of hand-off:
	// observed/predicted is 0.3–4× depending on the prompt.
	markWithOverhead(t, h, "w0", 100, 80*time.Millisecond, 0.05, rand.New(rand.NewPCG(8, 8)))
	require.Less(t, h.core.TTFTScale("w0"), 0.15, "the engine is fast; the overhead is not its speed")
	require.InDelta(t, 80, float64(h.core.TTFTOverhead("w0"))/float64(time.Millisecond), 8)
}

func TestCalibrationSeparatesAnOverheadFromASlowEngine(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	markWithOverhead(t, h, "w0", 200, 30*time.Millisecond, 3, rand.New(rand.NewPCG(9, 9)))
	require.InDelta(t, 3, h.core.TTFTScale("w0"), 0.15)
	require.InDelta(t, 30, float64(h.core.TTFTOverhead("w0"))/float64(time.Millisecond), 5)
}

func TestTurnTwoOfAConversationStaysOnTurnOnesWorkerBehindAHandOffOverhead(t *testing.T) {
	// Eight idle workers with a fast engine behind a 150 ms hand-off (a
	// live router under the race detector): each turn's first token
	// calibrates the worker that served it, and the next turn, whose
	// prefix that worker caches, must still go there.
	h := ttftHarness(t, workers(8, 0), nil, classCfg("c", PolicyFCFS))
	m := DefaultTTFTModel()
	hashes := seqHashes(9, 400)
	holder := ""
	for turn := range 6 {
		isl := 1000 + 900*turn
		r := req(fmt.Sprintf("turn-%d", turn), "c", isl)
		r.BlockHashes = hashes[:isl/16]
		if holder != "" {
			prev := 1000 + 900*(turn-1)
			r.Overlaps = []Overlap{{Worker: holder, Blocks: prev / 16}}
		}
		h.enqueue(r)
		g := h.granted(r.ID)
		if holder == "" {
			holder = g.Worker
		}
		require.Equal(t, holder, g.Worker, "turn %d left the worker holding the conversation (scale %.2f)", turn, h.core.TTFTScale(holder))
		pred := m.prefillTime(isl-g.CachedTokens, 0, 0)
		h.clock.Advance(150*time.Millisecond + time.Duration(0.02*pred*float64(time.Millisecond)))
		h.core.FirstToken(g.Booking)
		h.core.Finish(g.Booking)
	}
}
