package scheduler

import (
	"flag"
	"fmt"
	"math"
)

// Tier is where a worker holds a prefix: its GPU cache, or a lower tier
// (host memory, disk) the engine loads blocks back from before reusing
// them. The values are kvindex.Tier's.
type Tier uint8

// The tiers, fastest first.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	// NumTiers bounds the tiers, for arrays indexed by Tier.
	NumTiers
)

// TierCosts is how the TTFT selector prices a prefix held on a lower tier.
// A block there is neither free (a GPU hit) nor a miss (a recompute): the
// engine copies it back at the tier's bandwidth, so its price is its load
// time, KVBytesPerToken × tokens ÷ bandwidth, added to the request's
// predicted time to first token, and its tokens are not prefilled.
//
// Weights, when set for a tier, replace that with the constant weighting
// other routers use (a lower-tier block counts as that fraction of a GPU
// hit, with no load time): it exists to measure the two against each
// other (docs/benchmarks.md, "KV tiers").
type TierCosts struct {
	// KVBytesPerToken is the KV cache's size per token: 2 (K and V) ×
	// layers × KV heads × head dim × bytes per element. The default,
	// 131,072, is Llama-3-8B's in 16-bit (2 × 32 × 8 × 128 × 2).
	KVBytesPerToken float64
	// HostGBps and DiskGBps are the bandwidths, in GB/s, a block comes
	// back to the GPU at from host memory (pinned, over PCIe) and from
	// disk (or a remote store).
	HostGBps float64
	DiskGBps float64
	// Weights[t] > 0 prices tier t by constant weight instead of load time.
	Weights [NumTiers]float64
}

// DefaultTierCosts: Llama-3-8B's KV size, 20 GB/s from pinned host memory
// (PCIe 4.0 x16 in practice) and 2 GB/s from a local NVMe disk.
func DefaultTierCosts() TierCosts {
	return TierCosts{KVBytesPerToken: 131072, HostGBps: 20, DiskGBps: 2}
}

// Validate reports the first bad field.
func (t TierCosts) Validate() error {
	// 0 stands for the default, so a TTFTModel written without Tiers
	// keeps the default prices rather than failing validation.
	ok := func(f float64) bool { return f >= 0 && !math.IsInf(f, 0) }
	switch {
	case !ok(t.KVBytesPerToken):
		return fmt.Errorf("%w: TTFT tier KVBytesPerToken must be >= 0 (0: default), got %v", ErrInvalidConfig, t.KVBytesPerToken)
	case !ok(t.HostGBps) || !ok(t.DiskGBps):
		return fmt.Errorf("%w: TTFT tier bandwidths must be >= 0 (0: default), got host %v, disk %v GB/s", ErrInvalidConfig, t.HostGBps, t.DiskGBps)
	}
	for i, w := range t.Weights {
		if !(w >= 0 && w <= 1) {
			return fmt.Errorf("%w: TTFT tier weight %d must be in [0, 1], got %v", ErrInvalidConfig, i, w)
		}
	}
	return nil
}

// RegisterFlags registers prefix+"kv-bytes-per-token", "host-gbps",
// "disk-gbps", "cpu-weight" and "disk-weight".
func (t *TierCosts) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Float64Var(&t.KVBytesPerToken, prefix+"kv-bytes-per-token", t.KVBytesPerToken, "ttft selector: KV cache bytes per token (2 x layers x KV heads x head dim x element bytes), for the load time of a lower-tier hit")
	fs.Float64Var(&t.HostGBps, prefix+"host-gbps", t.HostGBps, "ttft selector: GB/s a KV block loads back from host memory at")
	fs.Float64Var(&t.DiskGBps, prefix+"disk-gbps", t.DiskGBps, "ttft selector: GB/s a KV block loads back from disk at")
	fs.Float64Var(&t.Weights[TierCPU], prefix+"cpu-weight", t.Weights[TierCPU], "ttft selector: price a host-memory hit as this fraction of a GPU hit instead of by load time (0: load time)")
	fs.Float64Var(&t.Weights[TierDisk], prefix+"disk-weight", t.Weights[TierDisk], "ttft selector: price a disk hit as this fraction of a GPU hit instead of by load time (0: load time)")
}

// msPerToken is the load time of one token's KV from tier t.
func (t *TierCosts) msPerToken(tier Tier) float64 {
	d := DefaultTierCosts()
	or := func(v, def float64) float64 {
		if v > 0 {
			return v
		}
		return def
	}
	gbps := or(t.HostGBps, d.HostGBps)
	if tier == TierDisk {
		gbps = or(t.DiskGBps, d.DiskGBps)
	}
	return or(t.KVBytesPerToken, d.KVBytesPerToken) / (gbps * 1e6) // bytes ÷ (GB/s) in ms
}

// noteTiers files the request's lower-tier overlaps into the selection's
// workers (their tierDepth; c.touched so the indexed selection evaluates
// them exactly and resetOverlaps clears them).
func (c *Core) noteTiers(r *Request) {
	for _, o := range r.Overlaps {
		if o.Tier == TierGPU || o.Tier >= NumTiers {
			continue
		}
		i, ok := c.workerIdx[o.Worker]
		if !ok {
			continue
		}
		d := int32(r.effectiveOverlap(o.Blocks))
		if d <= 0 {
			continue
		}
		s := &c.workers[i]
		if d > s.tierDepth[o.Tier] {
			s.tierDepth[o.Tier] = d
		}
		c.touched = append(c.touched, i)
	}
}

// inLowerTier reports whether the request has a lower-tier prefix on s in
// the current selection.
func (s *workerSlot) inLowerTier() bool {
	return s.tierDepth[TierCPU] > 0 || s.tierDepth[TierDisk] > 0
}

// tierLoad is what the lower tiers add for r on s, beyond cached tokens
// already on GPU: the tokens that need no prefill and the ms of loading
// them (under Weights, the weighted tokens and no ms). Each tier's depth
// is its own prefix from the prompt's start (kvindex, "Offloaded tiers"):
// the host tier covers the blocks past the GPU's, the disk tier those past
// both.
func (m *TTFTModel) tierLoad(r *Request, s *workerSlot, cached int) (tokens int, ms float64) {
	return m.tierLoadAt(r, int(s.blockSize), s.tierDepth, cached, true)
}

// tierLoadAt is tierLoad for a worker of block size bs holding depth[t]
// blocks of the prompt on tier t; weighted applies Weights (the selector's
// pricing), else every tier is priced by its load time (what the engine
// really does, for the booked prediction).
func (m *TTFTModel) tierLoadAt(r *Request, bs int, depth [NumTiers]int32, cached int, weighted bool) (tokens int, ms float64) {
	have := cached
	for _, t := range [...]Tier{TierCPU, TierDisk} {
		upto := r.cachedFromOverlap(int(depth[t]), bs)
		n := upto - have
		if n <= 0 {
			continue
		}
		if w := m.Tiers.Weights[t]; weighted && w > 0 {
			tokens += int(w * float64(n))
		} else {
			tokens += n
			ms += float64(n) * m.Tiers.msPerToken(t)
		}
		have = upto
	}
	return tokens, ms
}

// tierDepths is the request's effective prefix depth on worker's lower
// tiers (the deepest report of each), outside a selection.
func (r *Request) tierDepths(worker string) [NumTiers]int32 {
	var d [NumTiers]int32
	for _, o := range r.Overlaps {
		if o.Tier == TierGPU || o.Tier >= NumTiers || o.Worker != worker {
			continue
		}
		d[o.Tier] = max(d[o.Tier], int32(r.effectiveOverlap(o.Blocks)))
	}
	return d
}

// tierCreditBlocks is the blocks selector's credit, in blocks of s, for
// r's lower-tier prefix on s beyond cached GPU tokens: a partial hit. The
// tokens loaded back count as cached less the tokens the engine could have
// prefilled in their load time (at r's own mean prefill ms per token on an
// idle engine, under the TTFT model): a host-memory hit is worth most of a
// GPU hit, a disk hit slower to load than to recompute is worth nothing
// (never less: the worker can always recompute). Under Weights the
// weighted tokens count, as for the TTFT selector.
func (m *TTFTModel) tierCreditBlocks(r *Request, s *workerSlot, cached int) float64 {
	tokens, ms := m.tierLoad(r, s, cached)
	return m.tierCreditTokens(r, tokens, ms) * s.invB
}

// tierCreditTokens is what tokens loaded back from a lower tier in ms are
// worth against prefilling them: the tokens less those the engine could
// prefill in ms (at r's marginal prefill ms per token on an idle engine;
// loading saves no step's fixed part), never below 0.
func (m *TTFTModel) tierCreditTokens(r *Request, tokens int, ms float64) float64 {
	if tokens <= 0 {
		return 0
	}
	n := max(1, r.PromptTokens)
	steps := (n-1)/m.StepTokens + 1
	perToken := (m.prefillTime(n, 0, 0) - float64(steps)*m.Prefill[2]) / float64(n)
	credit := float64(tokens)
	if ms > 0 && perToken > 0 {
		credit -= ms / perToken
	}
	return max(0, credit)
}

// bookedTierCredit is the booking's tierCredit for r on a worker of block
// size bs holding cached GPU tokens of it: its lower-tier prefix there at
// the tiers' load time (whatever the selector's Weights, as the booked
// TTFT prediction: the engine really loads them), so the ledger's queued
// prefill counts those tokens as their load cost, not as a full prefill.
func (m *TTFTModel) bookedTierCredit(r *Request, worker string, bs, cached int) int {
	tokens, ms := m.tierLoadAt(r, bs, r.tierDepths(worker), cached, false)
	return int(m.tierCreditTokens(r, tokens, ms))
}
