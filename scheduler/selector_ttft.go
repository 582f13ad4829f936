package scheduler

import (
	"flag"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Selector names a worker-selection cost. Values start at one so the zero
// value is recognisably unset (NewCore replaces it with the default).
type Selector int

// Selectors.
const (
	// SelectorBlocks is design §5's cost in KV blocks: booked prefill plus
	// the prompt minus the credited overlap, plus potential decode blocks.
	SelectorBlocks Selector = iota + 1
	// SelectorTTFT is the predicted time to first token on the worker under
	// the engine's timing model, calibrated per worker from first-token
	// marks (ttftCost).
	SelectorTTFT
)

// String returns the selector's lower-case name, as accepted by ParseSelector.
func (s Selector) String() string {
	switch s {
	case SelectorBlocks:
		return "blocks"
	case SelectorTTFT:
		return "ttft"
	}
	return fmt.Sprintf("selector(%d)", int(s))
}

// ParseSelector parses "blocks" or "ttft" (case-insensitive).
func ParseSelector(s string) (Selector, error) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "blocks":
		return SelectorBlocks, nil
	case "ttft":
		return SelectorTTFT, nil
	}
	return 0, fmt.Errorf("%w: unknown selector %q (want blocks or ttft)", ErrInvalidConfig, s)
}

// MarshalText makes the selector a flag (flag.TextVar) and a config value.
func (s Selector) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText is the inverse of MarshalText.
func (s *Selector) UnmarshalText(b []byte) error {
	v, err := ParseSelector(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// TTFTModel is what SelectorTTFT predicts with: design §9's step-time model
// of a chunked-prefill engine, in milliseconds at the reference speed. Each
// worker's predictions are multiplied by a scale calibrated online from its
// first-token marks (observed grant-to-first-token time = fixed overhead +
// scale × predicted), so one model serves engines faster or slower than the
// reference, behind any hand-off.
type TTFTModel struct {
	// Prefill is a step's time with T new tokens in it:
	// Prefill[0]·T² + Prefill[1]·T + Prefill[2] ms.
	Prefill [3]float64
	// Decode is a pure decode step's time at KV utilisation u:
	// Decode[0]·u² + Decode[1]·u + Decode[2] ms. In a mixed step the D
	// decoding sequences are D more tokens through prefill and the
	// u-dependent part, Decode(u) − Decode(0), comes on top.
	Decode [3]float64
	// PrefillScale charges each uncached prompt token's prefill work this
	// many times: once in the request's own TTFT and PrefillScale − 1 times
	// more as the work it adds to the worker, which later requests queue
	// behind, and the duplicate prefix it caches there. At 1 the cost is
	// the predicted TTFT alone; docs/benchmarks.md §7 measures the choice.
	PrefillScale float64
	// Externality adds, on top of PrefillScale, Externality × L prefill
	// works per uncached token, where L is the fleet's mean number of
	// prefills booked per worker (its booked prefill time over the mean
	// request's). Work placed now delays every request that queues behind
	// it, and in an M/M/1 queue the expected number of those is
	// ρ/(1−ρ) = L: so the weight is near 0 at light load, where
	// recomputing on an idle worker is cheap, and grows as the fleet
	// saturates, where cache affinity is what keeps it out of saturation.
	// 0 turns it off.
	Externality float64
	// StepTokens is the engine's token budget per step (decodes first, then
	// prefill chunks): prefill beyond it takes more steps.
	StepTokens int
	// Interference weighs the decode stall the request's own prefill causes:
	// the cost adds Interference × (decoding sequences) × (own prefill ms).
	// 0 predicts the request's own TTFT only.
	Interference float64
	// Spread adds to every worker's cost a fixed offset in [0, Spread) ms
	// that this Core draws per worker. Replicas deciding at the same
	// instant on the same gossiped view then break near-ties differently
	// instead of all sending a burst to one worker. 0 turns it off.
	Spread float64
	// Herd weighs the band of near-equal costs a decision spreads over
	// (herd.go): Herd × (remote bookings a decision is blind to, counted
	// over the last decisions) × (the mean booked request's prefill ms).
	// Inside it a rendezvous draw keyed by the request's first uncached
	// block and the worker breaks near-ties, so replicas deciding at the
	// same instant on the same gossiped view send different requests to
	// different workers. With one replica, or arrivals that do not
	// coincide, the count is near 0 and so is the band. 0 turns it off.
	Herd float64
	// HerdWindow is how long after a decision, in ms, a remote booking
	// showing up in this replica's view counts as one the decision could
	// not see: about two gossip periods.
	HerdWindow float64
	// CalibrationWindow is how many first-token marks per worker the
	// calibration (observed = overhead + scale × predicted) remembers
	// (each older mark weighs 1 − 1/CalibrationWindow less); 0 turns
	// calibration off (scale 1).
	CalibrationWindow int
	// Tiers prices a prefix held on a lower KV tier (tiers.go).
	Tiers TierCosts
}

// DefaultTTFTModel is design §9's fit (an H100-like engine at speedup 1),
// prefill scale 1 with externality 1 and interference 0.02 (measured,
// docs/benchmarks.md §7), the simulated engine's default budget of 8,192
// tokens and a calibration window of 32 marks.
func DefaultTTFTModel() TTFTModel {
	return TTFTModel{
		Prefill:           [3]float64{4.209989e-7, 0.01518344, 16.50142},
		Decode:            [3]float64{-25.74, 54.01, 5.74},
		PrefillScale:      1,
		Externality:       1,
		StepTokens:        8192,
		Interference:      0.02,
		Herd:              2,
		HerdWindow:        100,
		CalibrationWindow: 32,
		Tiers:             DefaultTierCosts(),
	}
}

// Validate reports the first bad field.
func (m TTFTModel) Validate() error {
	fin := func(f float64) bool { return !math.IsNaN(f) && !math.IsInf(f, 0) }
	for i, f := range m.Prefill {
		if !fin(f) {
			return fmt.Errorf("%w: TTFT.Prefill[%d] must be finite, got %v", ErrInvalidConfig, i, f)
		}
	}
	for i, f := range m.Decode {
		if !fin(f) {
			return fmt.Errorf("%w: TTFT.Decode[%d] must be finite, got %v", ErrInvalidConfig, i, f)
		}
	}
	switch {
	case m.Prefill[0] < 0 || m.Prefill[1] <= 0 || m.Prefill[2] < 0:
		// A step must cost more the more tokens it carries, or the model
		// would prefer piling prefill onto one worker.
		return fmt.Errorf("%w: TTFT.Prefill must be increasing (quad >= 0, lin > 0, const >= 0), got %v", ErrInvalidConfig, m.Prefill)
	case !fin(m.PrefillScale) || m.PrefillScale < 0:
		return fmt.Errorf("%w: TTFT.PrefillScale must be a finite number >= 0, got %v", ErrInvalidConfig, m.PrefillScale)
	case !fin(m.Externality) || m.Externality < 0:
		return fmt.Errorf("%w: TTFT.Externality must be a finite number >= 0, got %v", ErrInvalidConfig, m.Externality)
	case m.StepTokens <= 0:
		return fmt.Errorf("%w: TTFT.StepTokens must be > 0, got %d", ErrInvalidConfig, m.StepTokens)
	case !fin(m.Interference) || m.Interference < 0:
		return fmt.Errorf("%w: TTFT.Interference must be a finite number >= 0, got %v", ErrInvalidConfig, m.Interference)
	case !fin(m.Spread) || m.Spread < 0:
		return fmt.Errorf("%w: TTFT.Spread must be a finite number >= 0, got %v", ErrInvalidConfig, m.Spread)
	case !fin(m.Herd) || m.Herd < 0:
		return fmt.Errorf("%w: TTFT.Herd must be a finite number >= 0, got %v", ErrInvalidConfig, m.Herd)
	case !fin(m.HerdWindow) || m.HerdWindow < 0:
		return fmt.Errorf("%w: TTFT.HerdWindow must be a finite number >= 0, got %v", ErrInvalidConfig, m.HerdWindow)
	case m.CalibrationWindow < 0:
		return fmt.Errorf("%w: TTFT.CalibrationWindow must be >= 0, got %d", ErrInvalidConfig, m.CalibrationWindow)
	}
	return m.Tiers.Validate()
}

// RegisterFlags registers prefix+"prefill", "decode" (three comma-separated
// coefficients each), "step-tokens", "interference" and
// "calibration-window", with the receiver's values as defaults.
func (m *TTFTModel) RegisterFlags(fs *flag.FlagSet, prefix string) {
	coeffs := func(name, usage string, dst *[3]float64) {
		fs.Func(prefix+name, fmt.Sprintf("%s (default %s)", usage, formatCoeffs(*dst)), func(s string) error {
			parts := strings.Split(s, ",")
			if len(parts) != 3 {
				return fmt.Errorf("want three comma-separated numbers, got %q", s)
			}
			var v [3]float64
			for i, p := range parts {
				f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
				if err != nil {
					return fmt.Errorf("coefficient %d: %w", i, err)
				}
				v[i] = f
			}
			*dst = v
			return nil
		})
	}
	coeffs("prefill", "ttft selector: prefill step ms = a·T² + b·T + c for T tokens, as a,b,c", &m.Prefill)
	coeffs("decode", "ttft selector: decode step ms = a·u² + b·u + c at KV utilisation u, as a,b,c", &m.Decode)
	fs.Float64Var(&m.PrefillScale, prefix+"prefill-scale", m.PrefillScale, "ttft selector: weight of the request's own uncached prefill against the queue ahead of it")
	fs.Float64Var(&m.Externality, prefix+"externality", m.Externality, "ttft selector: extra prefill works per uncached token per prefill booked on the mean worker (0: off)")
	fs.IntVar(&m.StepTokens, prefix+"step-tokens", m.StepTokens, "ttft selector: the engines' token budget per step")
	fs.Float64Var(&m.Interference, prefix+"interference", m.Interference, "ttft selector: weight of the decode stall a prefill causes (per decoding sequence)")
	fs.Float64Var(&m.Spread, prefix+"spread", m.Spread, "ttft selector: ms of fixed per-replica, per-worker offset that spreads simultaneous decisions of several replicas (0: off)")
	fs.Float64Var(&m.Herd, prefix+"herd", m.Herd, "ttft selector: weight of the band of near-equal costs spread by a rendezvous draw, per remote booking a decision cannot see (0: off)")
	fs.Float64Var(&m.HerdWindow, prefix+"herd-window", m.HerdWindow, "ttft selector: ms after a decision within which a remote booking counts as unseen by it (about two gossip periods)")
	fs.IntVar(&m.CalibrationWindow, prefix+"calibration-window", m.CalibrationWindow, "ttft selector: first-token marks per worker the calibration (scale and fixed overhead) remembers (0: no calibration)")
	m.Tiers.RegisterFlags(fs, prefix)
}

func formatCoeffs(c [3]float64) string {
	return strconv.FormatFloat(c[0], 'g', -1, 64) + "," + strconv.FormatFloat(c[1], 'g', -1, 64) + "," + strconv.FormatFloat(c[2], 'g', -1, 64)
}

// sanitizeSelector replaces an unset or invalid selector or model with the
// defaults (NewCore's rule for every field).
func sanitizeSelector(cfg Config) Config {
	d := DefaultConfig()
	if cfg.Selector != SelectorBlocks && cfg.Selector != SelectorTTFT {
		cfg.Selector = d.Selector
	}
	if cfg.TTFT.Validate() != nil {
		cfg.TTFT = d.TTFT
	}
	return cfg
}

func (m *TTFTModel) prefillMs(t int) float64 {
	x := float64(t)
	return (m.Prefill[0]*x+m.Prefill[1])*x + m.Prefill[2]
}

func (m *TTFTModel) decodeMs(u float64) float64 {
	return (m.Decode[0]*u+m.Decode[1])*u + m.Decode[2]
}

// prefillTime is how long, in reference ms, an engine with d decoding
// sequences at KV utilisation u takes to prefill n tokens starting now:
// every step carries the d decode tokens first and at most StepTokens − d
// prefill tokens, the last step the remainder. 0 for n <= 0.
func (m *TTFTModel) prefillTime(n, d int, u float64) float64 {
	if n <= 0 {
		return 0
	}
	chunk := max(1, m.StepTokens-d)
	full := (n - 1) / chunk
	extra := 0.0
	if d > 0 {
		extra = m.decodeMs(u) - m.Decode[2]
	}
	last := m.prefillMs(n-full*chunk+d) + extra
	if full == 0 {
		return last
	}
	return float64(full)*(m.prefillMs(chunk+d)+extra) + last
}

// ttftInputs is one worker's state as the TTFT prediction sees it.
type ttftInputs struct {
	queued   int     // booked prefill tokens ahead of the request (local + remote)
	own      int     // the request's uncached prompt tokens there
	decoding int     // sequences the worker runs (each takes a decode token per step)
	kvUse    float64 // projected KV utilisation with the request, clamped to [0, 1]
	overflow float64 // projected KV blocks beyond the pool, as a fraction of it
}

// ttftPrediction is the request's predicted time to first token in
// reference ms (before the worker's calibrated scale): the booked prefill
// ahead of it, then its own.
func (m *TTFTModel) ttftPrediction(in ttftInputs) float64 {
	return m.prefillTime(in.queued+in.own, in.decoding, in.kvUse)
}

// ttftInputsFor gathers the prediction's inputs for r on s. cached is the
// request's cached prompt tokens there; decode its projected decode blocks.
func ttftInputsFor(r *Request, s *workerSlot, load WorkerLoad, cached, decode int) ttftInputs {
	in := ttftInputs{
		queued:   max(0, load.PrefillTokens),
		own:      max(1, r.PromptTokens-cached), // an engine always computes one token
		decoding: max(0, load.ActiveRequests),
	}
	if s.kvBlocks > 0 {
		f := float64(decode) / float64(s.kvBlocks)
		in.kvUse = min(1, max(0, f))
		in.overflow = max(0, f-1)
	}
	return in
}

// ttftCost is SelectorTTFT's cost of r on s in calibrated ms, or false when
// s is full or busy for this class (the same eligibility as workerCost):
//
//	uncached = isl − credit × cached
//	ttft     = prefillTime(booked prefill ahead + uncached), with the
//	           worker's decoders in every step
//	work     = prefillTime(uncached) on an otherwise idle engine
//	stall    = interference × decoding sequences × own prefill time
//	kv_wait  = overflow fraction × expected output tokens × decode(1)
//	L        = mean booked prefill time per worker ÷ mean request's work
//	           (smoothed over decisions; see TTFTModel.Externality)
//	cost     = scale_w × (ttft + (prefill_scale − 1 + externality × L) × work
//	           + stall + kv_wait)
//
// work is the same wherever the tokens are uncached, so the scale weighs
// recomputing against queueing without amplifying the decoders' share of
// the steps (which ttft already counts once).
// kv_wait stands for the time a request waits when the worker's pool is
// oversubscribed: the engine admits it only as running requests finish,
// roughly one generation later per pool's worth of excess.
func (c *Core) ttftCost(r *Request, cfg *ClassConfig, s *workerSlot, ovl, priv int) (float64, bool) {
	booked := s.projectLoad()
	if s.maxRunning > 0 && booked.ActiveRequests >= int(s.maxRunning) {
		return 0, false
	}
	load := s.costLoad()
	scale := 1 + s.ledger.ttftSlow
	if ovl == 0 && load == (WorkerLoad{}) && !s.inLowerTier() {
		// An idle worker without the prefix costs the same as every other
		// such worker of its pool size: most of a large fleet, once per
		// decision. Its calibration counts only when it is slower than the
		// model (idleScale): only chosen workers are measured, so the first
		// engine found faster than the model would win every idle decision
		// while its peers, as fast for all anyone knows, got nothing at
		// light load. Idle workers at least as fast as the model tie, and
		// the draw spreads them.
		m := &c.ttft
		if !m.valid || m.kvBlocks != s.kvBlocks || m.blockSize != s.blockSize {
			m.valid, m.kvBlocks, m.blockSize = true, s.kvBlocks, s.blockSize
			m.cost = c.ttftLoadedCost(r, s, load, 0, len(r.HashesFor(int(s.blockSize)))+priv)
		}
		return c.ttftOffsets(m.cost*idleScale(s.ledger.ttftSlow), s, 0), true
	}
	held := 0
	hashes := r.HashesFor(int(s.blockSize))
	if s.ledger.refs.n > 0 || s.ledger.refs.zero > 0 {
		held = s.ledger.activeDepth(hashes)
	}
	if s.remote.ActiveRequests > 0 {
		held = max(held, ovl) // as workerCost: remote bookings' blocks arrive as counts only
	}
	cached := r.cachedFromOverlap(ovl, int(s.blockSize))
	if booked.ActiveRequests > 0 { // eligibility on the booked load (engineSlot)
		if cfg.BusyPrefillTokens > 0 && booked.PrefillTokens+r.PromptTokens-cached > cfg.BusyPrefillTokens {
			return 0, false
		}
		if cfg.BusyDecodeFraction > 0 && s.kvBlocks > 0 &&
			float64(booked.DecodeBlocks+len(hashes)-held+priv)/float64(s.kvBlocks) > cfg.BusyDecodeFraction {
			return 0, false
		}
	}
	if s.engineRaises() {
		held = max(held, ovl)
	}
	decode := load.DecodeBlocks + len(hashes) - held + priv
	return c.ttftOffsets(c.ttftLoadedCost(r, s, load, cached, decode)*scale, s, ovl), true
}

// ttftOffsets adds to cost, worker s's TTFT cost for a request of which it
// holds ovl blocks, the offsets that spread simultaneous decisions: the
// fixed per-replica spread (TTFTConfig.Spread) and the herd draw.
func (c *Core) ttftOffsets(cost float64, s *workerSlot, ovl int) float64 {
	if c.cfg.TTFT.Spread > 0 {
		cost += c.cfg.TTFT.Spread * c.ttftOffset(s.ID)
	}
	if c.herdDraws(ovl) || c.herdShallow(s, ovl) {
		cost += c.herdOffset(s)
	}
	return cost
}

// ttftOffset is this Core's fixed offset of worker in [0, 1): a hash of
// the worker ID under a seed drawn once from the Core's random source.
func (c *Core) ttftOffset(worker string) float64 {
	m := &c.ttft
	if !m.seeded {
		m.seed, m.seeded = c.rng.Uint64()|1, true
	}
	h := m.seed
	for i := 0; i < len(worker); i++ {
		h = (h ^ uint64(worker[i])) * 0x100000001b3
	}
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	return float64(h>>11) / (1 << 53)
}

// ttftScratch is the ttft selector's scratch in the Core: the cost of an
// idle worker holding none of the prompt, memoized within one selection
// (valid; the selector resets it), and ttftOffset's seed.
type ttftScratch struct {
	seed      uint64 // ttftOffset's, drawn at first use
	seeded    bool
	valid     bool
	kvBlocks  int32
	blockSize int32
	cost      float64
	// The fleet's load L for Externality: queue is the mean booked
	// prefill ms per registered worker, work the mean booked request's
	// prefill ms (both smoothed), load their ratio.
	queue float64
	work  float64
	load  float64
}

// loadSmoothing is how many decisions L is smoothed over.
const loadSmoothing = 32

// begin starts a selection: it drops the idle-worker memo.
func (m *ttftScratch) begin() { m.valid = false }

// booked folds a booked request's own prefill work (reference ms) into the
// mean request's, and the fleet's booked prefill time before the booking
// (queueSum over n registered workers, each at its own KV use; the
// selection index keeps the sum as loads change) into the mean queue, and
// updates L. Once per admission, so L does not depend on how many
// selections a turn tried.
func (m *ttftScratch) booked(work, queueSum float64, n int) {
	if m.work == 0 {
		m.work = work
	} else {
		m.work += (work - m.work) / loadSmoothing
	}
	if n > 0 {
		m.queue += (max(0, queueSum/float64(n)) - m.queue) / loadSmoothing
	}
	if m.work > 0 {
		m.load = m.queue / m.work
	}
}

// ttftLoadedCost is ttftCost before the worker's scale, for r with cached
// prompt tokens and decode projected blocks on s under load.
func (c *Core) ttftLoadedCost(r *Request, s *workerSlot, load WorkerLoad, cached, decode int) float64 {
	credited := cached
	if c.cfg.OverlapCredit != 1 {
		credited = min(r.PromptTokens, int(c.cfg.OverlapCredit*float64(cached)))
	}
	m := &c.cfg.TTFT
	loadMs := 0.0
	if s.inLowerTier() {
		var loaded int
		loaded, loadMs = m.tierLoad(r, s, cached)
		credited = min(r.PromptTokens, credited+loaded)
	}
	in := ttftInputsFor(r, s, load, credited, decode)
	queue, total := m.queueAndTotal(in.queued, in.own, in.decoding, in.kvUse)
	cost := total + loadMs
	if w := m.PrefillScale - 1 + m.Externality*c.ttft.load; w != 0 {
		cost += w * m.prefillTime(in.own, 0, 0)
	}
	if m.Interference > 0 {
		cost += m.Interference * float64(in.decoding) * (total - queue)
	}
	if in.overflow > 0 {
		cost += in.overflow * float64(max(1, r.ExpectedOutputTokens)) * m.decodeMs(1)
	}
	return cost
}

// queueAndTotal is prefillTime(q) and prefillTime(q+x) sharing their
// per-step terms.
func (m *TTFTModel) queueAndTotal(q, x, d int, u float64) (queue, total float64) {
	chunk := max(1, m.StepTokens-d)
	extra := 0.0
	if d > 0 {
		extra = m.decodeMs(u) - m.Decode[2]
	}
	step := m.prefillMs(chunk+d) + extra
	at := func(n int) float64 {
		if n <= 0 {
			return 0
		}
		full := (n - 1) / chunk
		return float64(full)*step + m.prefillMs(n-full*chunk+d) + extra
	}
	return at(q), at(q + x)
}

// ttftPredict is the reference-ms TTFT prediction for r on worker slot idx
// as it would be booked now (credit 1: what the engine will really reuse).
// The Core stores it in the booking and calibrates against the first token.
func (c *Core) ttftPredict(r *Request, idx int) float64 {
	// What a waiting request in an engine's queue stands for (engineState),
	// under either selector: admit calls this once per booking.
	w := &c.workers[idx]
	c.eng.noteBooked(r.PrefillTokens(w.ID, w.BlockSize))
	if c.cfg.Selector != SelectorTTFT {
		return 0
	}
	in, loadMs := c.ttftPredictInputs(r, idx)
	m := &c.cfg.TTFT
	c.ensureIndex()
	c.ttft.booked(m.prefillTime(in.own, 0, 0), c.ix.queueSum, len(c.workers))
	return m.ttftPrediction(in) + loadMs
}

// ttftPredictInputs are ttftPredict's inputs for r on worker slot idx, and
// the ms of loading its lower-tier prefix there back to the GPU: those
// tokens are neither prefilled nor free (tierLoad, at the tiers' load time
// whatever the selector's Weights: the engine really loads them).
func (c *Core) ttftPredictInputs(r *Request, idx int) (ttftInputs, float64) {
	s := &c.workers[idx]
	load := s.costLoad()
	bs := int(s.blockSize)
	cached := r.cachedFromOverlap(r.OverlapBlocks(s.ID), bs)
	loaded, loadMs := c.cfg.TTFT.tierLoadAt(r, bs, r.tierDepths(s.ID), cached, false)
	decode := load.DecodeBlocks + len(r.HashesFor(bs)) + r.privateBlocks(bs)
	return ttftInputsFor(r, s, load, min(r.PromptTokens, cached+loaded), decode), loadMs
}

// ttftPeek is ttftPredict without booking anything: what the prediction
// for r on slot idx would be, calibrated, for the operators' page (0
// without a TTFT model).
func (c *Core) ttftPeek(r *Request, idx int) time.Duration {
	if c.cfg.Selector != SelectorTTFT {
		return 0
	}
	in, loadMs := c.ttftPredictInputs(r, idx)
	return c.workers[idx].ledger.calibrated(c.cfg.TTFT.ttftPrediction(in) + loadMs)
}

// idleScale is the calibrated scale an idle worker without the prompt's
// prefix is costed at: never below the model's own (ttftCost says why).
func idleScale(slow float64) float64 { return 1 + max(slow, 0) }

// calibrate folds one first-token mark into its worker's fit of
//
//	observed = overhead + scale × predicted
//
// (grant-to-first-token ms against the reference model's prediction). On a
// live router the observed time also carries a fixed hand-off cost (HTTP to
// the worker, its first flush, goroutine scheduling) that does not grow with
// the prompt; a ratio of observed to predicted would fold it into the scale,
// and with fast engines the worker holding a conversation would look many
// times slower than an idle one. The selector uses the scale only: the
// hand-off is paid wherever the request goes.
func (c *Core) calibrate(b *booking, nowNs int64) {
	w := c.cfg.TTFT.CalibrationWindow
	if b.predMs <= 0 || b.grantedAt == 0 || w == 0 {
		return
	}
	obs := float64(nowNs-b.grantedAt) / 1e6
	if obs < 0 {
		return
	}
	pred := b.predMs
	b.predMs = 0 // one mark per booking: FirstToken may be repeated
	l := b.ledger
	l.cal.add(pred, obs, 1-1/float64(w))
	scale, overhead := l.cal.fit()
	l.ttftSlow, l.ttftOverhead = scale-1, overhead
}

// calibrationFit is a weighted least-squares fit of observed = overhead +
// scale × predicted over exponentially decayed sums (each older mark
// weighs 1 − 1/CalibrationWindow less). Each mark weighs 1/predicted: the
// engine's noise grows with the prompt, and with no overhead the fit is
// then the ratio of the sums of observed and predicted times, so the many
// short cache-hit prefills do not outvote the long ones, which carry the
// engine's speed. A prior (calibrationPrior marks) pulls the scale to 1:
// until the marks' predictions differ enough to tell a slope from an offset
// (one mark, or a run of equal prompts), the excess over the reference
// model is read as overhead, not as a slower engine.
type calibrationFit struct {
	// decayed Σ 1/pred, Σ 1, Σ obs/pred, Σ pred, Σ obs: the weighted sums
	// Σw, Σw·x, Σw·y, Σw·x², Σw·x·y with w = 1/x.
	w, n, r, x, y float64
	// fade is the start prior's remaining weight: 1 before the first
	// mark, decayed like a mark's.
	fade float64
}

func (f *calibrationFit) add(pred, obs, keep float64) {
	if f.n == 0 {
		f.fade = 1
	}
	f.fade *= keep
	f.w = f.w*keep + 1/pred
	f.n = f.n*keep + 1
	f.r = f.r*keep + obs/pred
	f.x = f.x*keep + pred
	f.y = f.y*keep + obs
}

// fit returns the scale, within [1/maxTTFTScale, maxTTFTScale], and the
// overhead in ms, at least 0 and at most the weighted mean observed time.
func (f *calibrationFit) fit() (scale, overhead float64) {
	if f.n <= 0 || f.x <= 0 || f.w <= 0 {
		return 1, 0
	}
	// The prior's marks' Σw·x² at slope 1.
	prior := (calibrationPrior + calibrationStartPrior*f.fade) * f.x / f.n
	// Normal equations with the prior on the slope b (a the overhead):
	//	w·a + n·b = r,  n·a + (x + prior)·b = y + prior.
	// det = w·x − n² + w·prior ≥ w·prior > 0 (Cauchy–Schwarz).
	det := f.w*(f.x+prior) - f.n*f.n
	b := (f.w*(f.y+prior) - f.n*f.r) / det
	if a := (f.r - b*f.n) / f.w; a < 0 || !(det > 0) || math.IsNaN(b) {
		// No overhead: the slope through the origin, with the prior.
		b = (f.y + prior) / (f.x + prior)
	}
	if math.IsNaN(b) {
		b = 1
	}
	b = min(maxTTFTScale, max(1/maxTTFTScale, b))
	return b, max(0, (f.r-b*f.n)/f.w)
}

// calibrationPrior is the prior's weight on scale 1, in marks: enough to
// hold the scale near 1 while the predictions barely differ, little enough
// to leave a spread of prompts a bias of a few per cent.
const calibrationPrior = 0.2

// calibrationStartPrior is a stronger prior on scale 1 that fades with the
// first window of marks: a worker's first marks carry the noisiest
// overheads (a cold connection, a first flush), and two or three of them
// at different prompt sizes would otherwise pass for a steep slope.
const calibrationStartPrior = 8.0

// maxTTFTScale bounds the calibrated scale both ways: a worker reporting
// nonsense (a stuck clock, marks lost for minutes) cannot make itself free
// or unusable.
const maxTTFTScale = 64.0

// TTFTScale returns worker's calibrated scale (observed grant-to-first-token
// time per predicted ms, the fixed overhead aside; 1 before any mark or for
// unknown workers).
func (c *Core) TTFTScale(worker string) float64 {
	if l := c.ledgers[worker]; l != nil {
		return 1 + l.ttftSlow
	}
	return 1
}

// TTFTOverhead returns worker's calibrated fixed overhead: the part of its
// observed grant-to-first-token times that does not grow with the
// prediction (0 before any mark or for unknown workers).
func (c *Core) TTFTOverhead(worker string) time.Duration {
	if l := c.ledgers[worker]; l != nil {
		return time.Duration(l.ttftOverhead * float64(time.Millisecond))
	}
	return 0
}

// calibrated turns a reference-ms prediction into this worker's expected
// grant-to-first-token time: overhead + scale × predicted (0 when there is
// no prediction).
func (l *workerLedger) calibrated(predMs float64) time.Duration {
	if predMs <= 0 {
		return 0
	}
	return time.Duration((l.ttftOverhead + (1+l.ttftSlow)*predMs) * float64(time.Millisecond))
}
