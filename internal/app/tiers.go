package app

import (
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// A worker's lower KV tiers are indexed as streams of their own
// (kvindex.TierStream); these are the replica's few places that know it.

// setTierCapacities bounds each tier stream the worker advertises.
func setTierCapacities(ix *kvindex.Index, wi *wire.WorkerInfo) {
	for name, n := range wi.TierBlocks {
		if t, ok := tierNamed(name); ok {
			_ = ix.SetCapacity(kvindex.TierStream(wi.ID, t), n)
		}
	}
}

// streamRegistered reports whether an indexed stream belongs to a
// registered worker: the worker itself, or a tier it advertises.
func streamRegistered(items map[string]cluster.Worker, stream string) bool {
	if _, ok := items[stream]; ok {
		return true
	}
	w, t := kvindex.SplitTier(stream)
	if t == kvindex.TierGPU {
		return false
	}
	it, ok := items[w]
	if !ok {
		return false
	}
	_, ok = it.Info.TierBlocks[t.String()]
	return ok
}

func tierNamed(name string) (kvindex.Tier, bool) {
	for t := kvindex.TierCPU; t < kvindex.NumTiers; t++ {
		if t.String() == name {
			return t, true
		}
	}
	return 0, false
}

// tierOverlap folds an index match into the scheduler's overlap: a tier
// stream's match is a lower-tier overlap of its worker.
func tierOverlap(m kvindex.Match) scheduler.Overlap {
	w, t := kvindex.SplitTier(m.Worker)
	return scheduler.Overlap{Worker: w, Blocks: m.Blocks, Tier: scheduler.Tier(t)}
}
