package scheduler

import (
	"fmt"
	"math"
	"time"
)

// Disaggregated prefill and decode (docs/architecture.md, "Disaggregated
// prefill and decode"). Within a model (a request's allowed workers),
// workers of role both serve aggregated requests; prefill and decode
// workers serve disaggregated ones, as a pair. The decider runs a request
// disaggregated only when its uncached prefill on the best prefill worker
// exceeds a threshold in tokens (with the threshold derived from the timing
// model: only when that prefill would stall a decode batch longer than
// moving the KV the chosen decode worker lacks takes), and only when both
// roles have a worker; else it runs aggregated on a both-worker, or, in a
// model without both-workers, on a decode (else a prefill) worker.
//
// A decode engine pulls only the prompt blocks it does not hold (the
// simulated engine's admitPull; vLLM's NixlConnector reads the remote
// blocks for its unhashed blocks only, and on a full local hit sends just
// the completion notice): the transfer the decider weighs and the grant
// predicts is of the prompt tokens the decode worker lacks, from the same
// overlap lookup that chose it (transferTokens).
//
// A pair is one grant: the prefill worker is Grant.Worker (its booking is
// Grant.Booking, the one every lifecycle mark names), the decode worker is
// Grant.Decode, booked beside it and linked to it, so that acknowledging,
// renewing, finishing, cancelling or expiring either frees or keeps both.

// Worker roles (wire.RoleBoth, wire.RolePrefill, wire.RoleDecode; the
// scheduler imports nothing of the wire package).
const (
	RoleBoth    = "both"
	RolePrefill = "prefill"
	RoleDecode  = "decode"
)

// roleOf reads a worker's role ("" is both; an unknown role is both too:
// registration validates it).
func roleOf(w *Worker) string {
	switch w.Role {
	case RolePrefill, RoleDecode:
		return w.Role
	}
	return RoleBoth
}

// Decision is why a request ran aggregated or disaggregated. The zero value
// is no decision: no worker of the request's model has a role.
type Decision int

// Decisions. String gives the metric label.
const (
	// DecisionNone: the fleet has no prefill or decode workers.
	DecisionNone Decision = iota
	// DecisionShort: the uncached prefill is below the threshold (with the
	// derived threshold: it stalls a decode batch less than the transfer
	// takes).
	DecisionShort
	// DecisionNoPair: the model lacks a prefill or a decode worker.
	DecisionNoPair
	// DecisionPinned: the request is pinned to one worker.
	DecisionPinned
	// DecisionPairBusy: the decider wanted a pair but no prefill or decode
	// worker was free, and a both-worker was.
	DecisionPairBusy
	// DecisionLong: the uncached prefill is at or above the threshold (with
	// the derived threshold: it stalls a decode batch longer than the
	// transfer of what the decode worker lacks takes).
	DecisionLong
	// DecisionOnlyPairs: the model has no both-workers and the uncached
	// prefill is at or above the threshold.
	DecisionOnlyPairs
	// DecisionBothBusy: the prefill was short, but no worker that could run it
	// aggregated (a both-worker; without both-workers, a role worker) was free
	// and a pair was.
	DecisionBothBusy
	// DecisionPrefillBusy: no prefill worker was free (or allowed), so the
	// decider could not weigh a pair, and the request ran aggregated on a
	// worker that was: a both-worker, else a decode worker (overflow from a
	// saturated prefill role). Counted apart from short_prefill so that an
	// undersized prefill role shows as such.
	DecisionPrefillBusy
	numDecisions
)

// Decisions lists every decision, in label export order.
var Decisions = []Decision{DecisionNone, DecisionShort, DecisionNoPair, DecisionPinned,
	DecisionPairBusy, DecisionLong, DecisionOnlyPairs, DecisionBothBusy, DecisionPrefillBusy}

// Disaggregated reports whether the decision ran the request on a pair.
func (d Decision) Disaggregated() bool {
	return d == DecisionLong || d == DecisionOnlyPairs || d == DecisionBothBusy
}

// String returns the snake_case metric label.
func (d Decision) String() string {
	switch d {
	case DecisionNone:
		return "no_roles"
	case DecisionShort:
		return "short_prefill"
	case DecisionNoPair:
		return "no_pair"
	case DecisionPinned:
		return "pinned"
	case DecisionPairBusy:
		return "pair_busy"
	case DecisionLong:
		return "long_prefill"
	case DecisionOnlyPairs:
		return "only_pairs"
	case DecisionBothBusy:
		return "both_busy"
	case DecisionPrefillBusy:
		return "prefill_busy"
	}
	return fmt.Sprintf("decision(%d)", int(d))
}

// Mode is "disaggregated" or "aggregated", the decision's metric label.
func (d Decision) Mode() string {
	if d.Disaggregated() {
		return "disaggregated"
	}
	return "aggregated"
}

// DisaggConfig is the decider's timing model: what moving a prompt's KV
// cache from the prefill to the decode worker costs.
type DisaggConfig struct {
	// MinTokens is the default threshold: a request disaggregates when its
	// uncached prefill on the best prefill worker is at least this many
	// tokens (a class may override it: ClassConfig.DisaggMinTokens). 0
	// derives it from the timing model (DefaultDisaggMinTokens); -1 never
	// disaggregates (without both-workers: aggregated on a role worker).
	MinTokens int
	// TransferSetupMs is a transfer's fixed cost (handshake, block
	// lookup), ms.
	TransferSetupMs float64
	// TransferMsPerToken is the transfer time per prompt token (KV bytes
	// per token over the link bandwidth), ms.
	TransferMsPerToken float64
}

// DefaultDisaggConfig is a 5 ms setup and 0.005 ms per token: 128 KiB of
// KV per token (an 8B model in bf16) over a 25 GB/s link.
func DefaultDisaggConfig() DisaggConfig {
	return DisaggConfig{TransferSetupMs: 5, TransferMsPerToken: 0.005}
}

// Validate reports the first bad field.
func (d DisaggConfig) Validate() error {
	bad := func(f float64) bool { return math.IsNaN(f) || math.IsInf(f, 0) || f < 0 }
	switch {
	case d.MinTokens < -1:
		return fmt.Errorf("%w: Disagg.MinTokens must be -1 or >= 0, got %d", ErrInvalidConfig, d.MinTokens)
	case bad(d.TransferSetupMs):
		return fmt.Errorf("%w: Disagg.TransferSetupMs must be a finite number >= 0, got %v", ErrInvalidConfig, d.TransferSetupMs)
	case bad(d.TransferMsPerToken):
		return fmt.Errorf("%w: Disagg.TransferMsPerToken must be a finite number >= 0, got %v", ErrInvalidConfig, d.TransferMsPerToken)
	}
	return nil
}

// TransferTime is the timing model's time to move tokens of a prompt's
// KV (the tokens the decode worker lacks: transferTokens), setup included.
func (d DisaggConfig) TransferTime(tokens int) time.Duration {
	return time.Duration(d.transferMs(float64(max(tokens, 0))) * float64(time.Millisecond))
}

func (d DisaggConfig) transferMs(tokens float64) float64 {
	return d.TransferSetupMs + d.TransferMsPerToken*tokens
}

// prefillStallMs is the token-dependent time a prefill of n tokens adds to
// the steps of a decode batch sharing its engine: TTFT.Prefill[0]·n² +
// TTFT.Prefill[1]·n.
func prefillStallMs(m TTFTModel, n float64) float64 { return m.Prefill[0]*n*n + m.Prefill[1]*n }

// transferPays reports whether moving the KV of moved tokens costs less
// than computing an uncached prefill of n tokens beside a decode batch:
// the timing model's test behind DefaultDisaggMinTokens, with the
// transfer counted in the tokens the decode worker lacks.
func (d DisaggConfig) transferPays(m TTFTModel, n, moved int) bool {
	return prefillStallMs(m, float64(n)) > d.transferMs(float64(max(moved, 0)))
}

// DefaultDisaggMinTokens is the threshold the timing model gives: the least
// uncached prefill n whose transfer (setup + n × per-token) takes less time
// than the prefill would stall a decode batch sharing its engine (the
// prefill steps' token-dependent time, TTFT.Prefill[0]·n² +
// TTFT.Prefill[1]·n). Past it, moving the KV costs the decode batch less
// than computing it there. math.MaxInt when transfer never pays.
//
// The threshold assumes the decode worker lacks exactly the uncached
// tokens; the decider, holding the decode worker's overlap, tests the
// real pair (transferPays).
func DefaultDisaggMinTokens(m TTFTModel, d DisaggConfig) int {
	stall := func(n float64) float64 { return prefillStallMs(m, n) }
	xfer := d.transferMs
	if stall(1<<24) <= xfer(1<<24) {
		return math.MaxInt
	}
	lo, hi := 0, 1<<24 // stall(hi) > xfer(hi)
	for lo < hi {
		mid := (lo + hi) / 2
		if stall(float64(mid)) > xfer(float64(mid)) {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	return lo
}

// sanitizeDisagg replaces a bad decider configuration with the defaults
// and resolves the derived threshold.
func sanitizeDisagg(cfg Config) Config {
	if cfg.Disagg.Validate() != nil || (cfg.Disagg == DisaggConfig{}) {
		min := cfg.Disagg.MinTokens
		cfg.Disagg = DefaultDisaggConfig()
		if min >= -1 {
			cfg.Disagg.MinTokens = min
		}
	}
	return cfg
}

// disaggState is the Core's decider state.
type disaggState struct {
	roles     int // registered workers with role prefill or decode
	threshold int // resolved default threshold (Config.Disagg.MinTokens, or derived)
	counts    [numDecisions]uint64
	// scratch: the request's allowed workers by role, and selectDecode's
	// candidates
	both, prefill, decode []string
	scratch               []decodeCand
}

// noteRoles recounts the role workers after SetWorkers.
func (c *Core) noteRoles() {
	c.disagg.roles = 0
	for i := range c.workers {
		if roleOf(&c.workers[i].Worker) != RoleBoth {
			c.disagg.roles++
		}
	}
	c.disagg.threshold = c.cfg.Disagg.MinTokens
	if c.disagg.threshold == 0 {
		c.disagg.threshold = DefaultDisaggMinTokens(c.cfg.TTFT, c.cfg.Disagg)
	}
}

// DisaggThreshold is the uncached prefill, in tokens, from which cls's
// requests run disaggregated (-1: never).
func (c *Core) DisaggThreshold(cls string) int {
	if k := c.classes[cls]; k != nil && k.cfg.DisaggMinTokens != 0 {
		return k.cfg.DisaggMinTokens
	}
	if c.disagg.threshold == 0 {
		c.noteRoles()
	}
	return c.disagg.threshold
}

// DisaggCounts returns how many grants each decision made (probes
// excluded), indexed by Decision.
func (c *Core) DisaggCounts() [numDecisions]uint64 { return c.disagg.counts }

// A placement is a selection's outcome carried through the queue walks as
// one int: the worker index, plus (decode index + 1) << placementShift and
// the decision << decisionShift for a pair or a decided request. A fleet
// without roles places by the bare worker index, as before.
const (
	placementShift = 24
	decisionShift  = 48
	placementMask  = 1<<placementShift - 1
)

func placePair(prefill, decode int, d Decision) int {
	return prefill | (decode+1)<<placementShift | int(d)<<decisionShift
}

func placeOne(idx int, d Decision) int { return idx | int(d)<<decisionShift }

// unplace splits a placement: the (prefill or only) worker, the decode
// worker (-1: none) and the decision.
func unplace(p int) (idx, decode int, d Decision) {
	return p & placementMask, (p>>placementShift)&placementMask - 1, Decision(p >> decisionShift)
}

// selectPlacement is selectWorker with the decider: the placement of r
// under cfg, or false when it must wait.
func (c *Core) selectPlacement(r *Request, cfg *ClassConfig) (int, bool) {
	if c.disagg.roles == 0 {
		return c.selectWorker(r, cfg)
	}
	return c.selectDisagg(r, cfg)
}

// withAllowed runs the selector on r restricted to ids.
func (c *Core) withAllowed(r *Request, cfg *ClassConfig, ids []string) (int, bool) {
	if len(ids) == 0 {
		return -1, false
	}
	rr := *r
	rr.Allowed = ids
	rr.Session = SessionAffinity{}
	if sw := c.sessionWorker(r); sw >= 0 {
		for _, id := range ids {
			if id == c.workers[sw].ID {
				rr.Session = r.Session // the session's worker is among them
				break
			}
		}
	}
	return c.selectWorker(&rr, cfg)
}

// selectDisagg is selectPlacement for a fleet with role workers.
func (c *Core) selectDisagg(r *Request, cfg *ClassConfig) (int, bool) {
	if r.Pinned != "" {
		idx, ok := c.selectWorker(r, cfg)
		return placeOne(idx, DecisionPinned), ok
	}
	st := &c.disagg
	st.both, st.prefill, st.decode = st.both[:0], st.prefill[:0], st.decode[:0]
	add := func(i int) {
		w := &c.workers[i].Worker
		switch roleOf(w) {
		case RolePrefill:
			st.prefill = append(st.prefill, w.ID)
		case RoleDecode:
			st.decode = append(st.decode, w.ID)
		default:
			st.both = append(st.both, w.ID)
		}
	}
	if len(r.Allowed) == 0 {
		for i := range c.workers {
			add(i)
		}
	} else {
		c.stamp++
		for _, a := range r.Allowed {
			if i, ok := c.workerIdx[a]; ok && c.allow[i] != c.stamp {
				c.allow[i] = c.stamp
				add(i)
			}
		}
	}
	if len(st.prefill) == 0 || len(st.decode) == 0 {
		if len(st.both) == 0 {
			// Only one role serves the model: it runs on what there is.
			idx, ok := c.selectWorker(r, cfg)
			return placeOne(idx, DecisionNoPair), ok
		}
		idx, ok := c.withAllowed(r, cfg, st.both)
		return placeOne(idx, DecisionNoPair), ok
	}
	p, pok := c.withAllowed(r, cfg, st.prefill)
	d, dok := c.selectDecode(r, st.decode)
	long := false
	if pok {
		long = c.pairPays(r, cfg, p, d, dok)
	}
	// Why a request that does not run on a pair runs aggregated.
	aggregated := DecisionShort
	switch {
	case long:
		aggregated = DecisionPairBusy
	case !pok:
		aggregated = DecisionPrefillBusy
	}
	if len(st.both) == 0 {
		return c.selectOnlyPairs(r, cfg, p, d, pok && dok, long, aggregated)
	}
	if long && dok {
		return placePair(p, d, DecisionLong), true
	}
	if a, ok := c.withAllowed(r, cfg, st.both); ok {
		return placeOne(a, aggregated), true
	}
	if pok && dok {
		return placePair(p, d, DecisionBothBusy), true
	}
	return -1, false
}

// pairPays is the decider's test for r on prefill worker p and, when dok,
// decode worker d: the uncached prefill on p against the threshold. With
// the threshold derived from the timing model (no class or fleet
// setting), the test is the model's own, on this pair: the stall the
// prefill would cause in the decode batch of the worker that would run the
// request aggregated (aggregatedLack) against the transfer of the tokens d
// lacks.
func (c *Core) pairPays(r *Request, cfg *ClassConfig, p, d int, dok bool) bool {
	w := &c.workers[p].Worker
	// At least one token is computed on a pair: a threshold of 1 pairs
	// every request.
	n := max(1, r.PrefillTokens(w.ID, w.BlockSize))
	th := cfg.DisaggMinTokens
	derived := th == 0 && c.cfg.Disagg.MinTokens == 0
	if th == 0 {
		th = c.disagg.threshold
	}
	switch {
	case th < 0:
		return false
	case derived && dok && th != math.MaxInt:
		return c.cfg.Disagg.transferPays(c.cfg.TTFT, max(1, c.aggregatedLack(r, d)), c.transferTokens(r, d))
	}
	return n >= th
}

// aggregatedLack is the prompt tokens the worker that would run r
// aggregated lacks, which it would prefill in its decode batch: in a model
// with both-workers the best-cached one's (the selector prefers it; a
// both-worker without an overlap lacks the whole prompt), else decode
// worker d's (selectOnlyPairs runs a short request on a decode worker,
// which the selector picks by cache as selectDecode picked d). Not the
// prefill worker's uncached tokens: the prefill worker's cache spares the
// pair's prefill, not the aggregated run's, and a decider that weighed it
// sent conversations whose decode worker lacked the prompt to compute it
// whole on that decode worker (the simulator's 6P2D fleet, synthetic
// load: goodput 45.8 to 3.3 requests/s).
func (c *Core) aggregatedLack(r *Request, d int) int {
	if len(c.disagg.both) == 0 {
		return c.transferTokens(r, d)
	}
	cached := 0
	r.eachOverlap(func(id string, _ int) {
		if i, ok := c.workerIdx[id]; ok && roleOf(&c.workers[i].Worker) == RoleBoth && r.Allows(id) {
			cached = max(cached, r.CachedTokens(id, c.workers[i].BlockSize))
		}
	})
	return max(0, r.PromptTokens-cached)
}

// transferTokens is the prompt tokens decode worker d lacks, which it pulls
// from the prefill worker: the prompt minus d's cached prefix, the overlap
// selectDecode weighed.
func (c *Core) transferTokens(r *Request, d int) int {
	w := &c.workers[d].Worker
	return max(0, r.PromptTokens-r.CachedTokens(w.ID, w.BlockSize))
}

// selectOnlyPairs decides for a model without both-workers: a long
// prefill runs on the pair (prefill p, decode d; pairOK when both are
// free); a short one runs aggregated on the decode worker the selector
// picks (KV-aware: a decode engine caches the prompts it pulled and ran),
// else on a prefill worker, since a vLLM engine with a KV connector serves
// a request without transfer parameters on its own. When no role worker
// takes it aggregated, the pair does.
// why is the decision recorded when it runs aggregated.
func (c *Core) selectOnlyPairs(r *Request, cfg *ClassConfig, p, d int, pairOK, long bool, why Decision) (int, bool) {
	st := &c.disagg
	if long {
		if !pairOK {
			return -1, false
		}
		return placePair(p, d, DecisionOnlyPairs), true
	}
	if a, ok := c.withAllowed(r, cfg, st.decode); ok {
		return placeOne(a, why), true
	}
	if a, ok := c.withAllowed(r, cfg, st.prefill); ok {
		return placeOne(a, why), true
	}
	if pairOK {
		return placePair(p, d, DecisionBothBusy), true
	}
	return -1, false
}

// decodeCacheMargin is how much more projected KV use (a fraction of the
// pool) selectDecode accepts on a decode worker that already caches more
// of the prompt: those tokens are not pulled (the engine skips the blocks
// it holds), so the transfer is shorter (transferTokens).
const decodeCacheMargin = 0.05

// selectDecode picks the decode worker by load, and by cache among the
// nearly least loaded: the least projected KV use (booked decode blocks
// plus the request's, over the worker's KV blocks when known); among the
// workers within decodeCacheMargin of it, the one caching the most of the
// prompt; then the least use and the fewest active requests. Workers at
// their MaxRunning are skipped. The decode engine receives the prompt's
// KV, so its prefill load does not count.
func (c *Core) selectDecode(r *Request, ids []string) (int, bool) {
	cands := c.disagg.scratch[:0]
	least := math.Inf(1)
	for _, id := range ids {
		i := c.workerIdx[id]
		s := &c.workers[i]
		load := s.projectLoad()
		if s.maxRunning > 0 && load.ActiveRequests+max(1, r.Sequences) > int(s.maxRunning) {
			continue
		}
		use := float64(load.DecodeBlocks + r.BlockCount(int(s.blockSize)) + r.privateBlocks(int(s.blockSize)))
		if s.kvBlocks > 0 {
			use /= float64(s.kvBlocks)
		}
		least = min(least, use)
		cands = append(cands, decodeCand{idx: i, active: load.ActiveRequests, use: use,
			cached: r.CachedTokens(id, int(s.blockSize))})
	}
	c.disagg.scratch = cands
	best := -1
	var b decodeCand
	for _, x := range cands {
		if x.use > least+decodeCacheMargin {
			continue
		}
		if best < 0 || x.cached > b.cached ||
			x.cached == b.cached && (x.use < b.use || x.use == b.use && x.active < b.active) {
			best, b = x.idx, x
		}
	}
	return best, best >= 0
}

// decodeCand is one decode worker selectDecode weighs.
type decodeCand struct {
	idx, active, cached int
	use                 float64
}

// admitPair books the decode side of a pair placement beside the prefill
// booking b (which carries the request's tenant and lifecycle) and fills
// the grant's decode half.
func (c *Core) admitPair(r *Request, b *booking, decode int, g *Grant, now time.Time) {
	w := &c.workers[decode]
	d := c.book(r.ID, b.class, w.ID, w.BlockSize, r.HashesFor(w.BlockSize), r.PromptTokens, r.PromptTokens,
		r.ExpectedOutputTokens, r.Sequences, true, now)
	d.attempt = r.Attempt
	linkPair(b, d)
	xfer := c.cfg.Disagg.TransferTime(c.transferTokens(r, decode))
	g.Decode = GrantDecode{Worker: w.ID, URL: w.URL, BlockSize: w.BlockSize, Booking: d.id, Transfer: xfer}
	if g.PredictedTTFT > 0 {
		g.PredictedTTFT += xfer
	}
}

// linkPair makes b and d one grant's two bookings. d, the decode side,
// is booked with no prefill load (book's firstToken): the engine receives
// the KV.
func linkPair(b, d *booking) {
	b.pair, d.pair = d, b
	d.decodeSide = true
}

// adoptPair books the decode side of an adopted pair beside b.
func (c *Core) adoptPair(rec BookingRecord, b *booking) {
	if rec.Decode.Worker == "" {
		return
	}
	blockSize := 0
	if i, ok := c.workerIdx[rec.Decode.Worker]; ok {
		blockSize = c.workers[i].BlockSize
	}
	d := c.book(rec.RequestID, rec.Class, rec.Decode.Worker, blockSize, rec.Decode.BlockHashes,
		max(0, rec.PromptTokens), max(0, rec.PromptTokens), max(0, rec.ExpectedOutputTokens), rec.Sequences, true, c.clock.Now())
	linkPair(b, d)
}

// pairRecord is the decode side of b's record (zero: b is no pair).
func pairRecord(b *booking) DecodeRecord {
	if b.pair == nil {
		return DecodeRecord{}
	}
	return DecodeRecord{Worker: b.pair.worker, BlockHashes: b.pair.hashes}
}

// pairOutput is the expected output of b's grant: a pair books it on its
// decode side.
func pairOutput(b *booking) int {
	if b.pair != nil {
		return max(b.output, b.pair.output)
	}
	return b.output
}

// ParseDecision is the inverse of Decision.String ("" is DecisionNone).
func ParseDecision(s string) (Decision, error) {
	if s == "" {
		return DecisionNone, nil
	}
	for _, d := range Decisions {
		if d.String() == s {
			return d, nil
		}
	}
	return DecisionNone, fmt.Errorf("%w: unknown decision %q", ErrInvalidConfig, s)
}
