package adapter

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/listflag"
	"github.com/switchyard/switchyard/kvindex"
)

// Offloaded tiers. An engine that offloads KV blocks (vLLM's offloading
// connectors, SGLang's hierarchical cache) reports each tier's stores and
// removals with the block's medium. The adapter runs one Mirror per tier it
// is told to follow (-kv-tiers): the GPU mirror as before, and a mirror per
// lower tier publishing as the worker's tier stream (kvindex.TierStream),
// all fed the same batches (tierFanout). Each mirror keeps the blocks of
// its own tier and skips the others (counted as "medium"); a medium no
// engine is known to write is counted as "medium_unknown".
//
// vLLM's offloading connector reports a CPU store without token ids: the
// blocks are copies of GPU blocks the GPU mirror already rehashed, so a
// lower tier's mirror takes their Switchyard hashes from it (resolve).
// SGLang's host tier sends tokens and is rehashed like the GPU tier; a
// parent that only the GPU tier knows is resolved the same way.

// tierOf maps an engine medium to the tier routers index it under.
func tierOf(m enginekv.Medium) kvindex.Tier {
	switch m {
	case enginekv.MediumCPU:
		return kvindex.TierCPU
	case enginekv.MediumDisk:
		return kvindex.TierDisk
	}
	return kvindex.TierGPU
}

// tierSkip is skipReason's medium test: skipMediumUnknown for a medium
// that does not parse, skipMedium for another tier's block.
func (m *Mirror) tierSkip(e *enginekv.Event) skipReason {
	if e.Medium == "" || e.Medium == "GPU" {
		// The common case, without a parse.
		if m.cfg.Tier == kvindex.TierGPU {
			return skipNone
		}
		return skipMedium
	}
	med, err := e.Tier()
	if err != nil {
		return skipMediumUnknown
	}
	if tierOf(med) != m.cfg.Tier {
		return skipMedium
	}
	return skipNone
}

// resolvable: a lower tier's store without token ids, whose hashes the
// GPU mirror can resolve.
func (m *Mirror) resolvable(e *enginekv.Event) bool {
	return m.above != nil && len(e.TokenIDs) == 0
}

// resolve is the Switchyard hash the mirror maps engine hash h to.
func (m *Mirror) resolve(h uint64) (uint64, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.configured {
		return 0, false
	}
	e, ok := m.engine.get(h)
	return e.sy, ok
}

// resolveLocked appends to the arena the Switchyard hash of each engine
// hash in hs, from the mirror's own map or the GPU mirror's. It reports
// false, counting the blocks as unknown parents, when one is unknown to
// both (a block the GPU tier evicted before it was copied down, or one
// stored before the adapter started): the run cannot be placed.
func (m *Mirror) resolveLocked(hs []uint64) bool {
	for _, h := range hs {
		if e, ok := m.engine.get(h); ok {
			m.arena = append(m.arena, e.sy)
			continue
		}
		sy, ok := m.above.resolve(h)
		if !ok {
			m.m.skipped[skipUnknownParent].Add(float64(len(hs)))
			return false
		}
		m.arena = append(m.arena, sy)
	}
	return true
}

// tierFanout hands every batch and reset to each tier's mirror in turn,
// GPU first (a lower tier resolves through it), on the subscriber's
// goroutine.
type tierFanout []*Mirror

func (f tierFanout) Batch(b enginekv.Batch) { f.BatchTransient(&b) }

// BatchTransient keeps nothing of b: every mirror copies what it keeps.
func (f tierFanout) BatchTransient(b *enginekv.Batch) {
	for _, m := range f {
		m.BatchTransient(b)
	}
}

func (f tierFanout) Reset(r enginekv.ResetReason) {
	for _, m := range f {
		m.Reset(r)
	}
}

// parseTiers reads -kv-tiers: a comma-separated list of cpu and disk.
func parseTiers(s string) ([]kvindex.Tier, error) {
	var out []kvindex.Tier
	for _, p := range listflag.Split(s) {
		var t kvindex.Tier
		switch strings.ToLower(p) {
		case "cpu", "host":
			t = kvindex.TierCPU
		case "disk":
			t = kvindex.TierDisk
		default:
			return nil, fmt.Errorf("%w: -kv-tiers %q: want cpu or disk", ErrInvalidConfig, p)
		}
		for _, o := range out {
			if o == t {
				return nil, fmt.Errorf("%w: -kv-tiers names %s twice", ErrInvalidConfig, t)
			}
		}
		out = append(out, t)
	}
	return out, nil
}

// newTierMirrors builds a mirror per tier of -kv-tiers beside the GPU
// mirror configured by gpu. Their metrics carry a tier label and live in a
// registry of their own: one registry cannot hold a family both with and
// without the label, and the GPU mirror's series keep their names.
func (a *Adapter) newTierMirrors(gpu MirrorConfig) error {
	tiers, err := parseTiers(a.cfg.KVTiers)
	if err != nil || len(tiers) == 0 {
		return err
	}
	a.tierReg = prometheus.NewRegistry()
	for _, t := range tiers {
		mc := gpu
		mc.Worker, mc.Tier = kvindex.TierStream(gpu.Worker, t), t
		reg := prometheus.WrapRegistererWith(prometheus.Labels{"tier": t.String()}, a.tierReg)
		m, err := NewMirror(mc, a.deps.NATS, a.log.With(zap.Stringer("tier", t)), reg)
		if err != nil {
			return err
		}
		m.above = a.mirror
		a.tiers = append(a.tiers, m)
	}
	return nil
}

// handler is what the engine event subscriber feeds: the GPU mirror, or
// every tier's mirror.
func (a *Adapter) handler() enginekv.Handler {
	if len(a.tiers) == 0 {
		return a.mirror
	}
	return append(tierFanout{a.mirror}, a.tiers...)
}

// TierMirror is the mirror of lower tier t (nil when -kv-tiers lacks it).
func (a *Adapter) TierMirror(t kvindex.Tier) *Mirror {
	for _, m := range a.tiers {
		if m.cfg.Tier == t {
			return m
		}
	}
	return nil
}

// parseTierBlocks reads -kv-tier-blocks: tier=blocks pairs.
func parseTierBlocks(s string) (map[string]int, error) {
	out := map[string]int{}
	for _, p := range listflag.Split(s) {
		k, v, ok := strings.Cut(p, "=")
		ts, err := parseTiers(k)
		n, nerr := strconv.Atoi(strings.TrimSpace(v))
		if !ok || err != nil || len(ts) != 1 || nerr != nil || n <= 0 {
			return nil, fmt.Errorf("%w: -kv-tier-blocks %q: want cpu=N or disk=N with N > 0", ErrInvalidConfig, p)
		}
		out[ts[0].String()] = n
	}
	return out, nil
}

// tierBlocks is the registration's TierBlocks: every mirrored lower
// tier, sized by -kv-tier-blocks or left 0 for the registrar's default.
func (a *Adapter) tierBlocks() map[string]int {
	if len(a.tiers) == 0 {
		return nil
	}
	sizes, _ := parseTierBlocks(a.cfg.KVTierBlocks) // validated
	out := make(map[string]int, len(a.tiers))
	for _, m := range a.tiers {
		out[m.cfg.Tier.String()] = sizes[m.cfg.Tier.String()]
	}
	return out
}
