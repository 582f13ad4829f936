package kvindex

import (
	"fmt"
	"strings"
)

// Tier is the storage tier a worker's stream of KV events describes. The
// GPU tier is the worker's own stream under its own name; every lower tier
// is a stream of its own under TierStream's name, indexed as one more
// worker (see doc.go, "Offloaded tiers").
type Tier uint8

// The tiers, fastest first.
const (
	TierGPU Tier = iota
	TierCPU
	TierDisk
	// NumTiers bounds the tiers, for arrays indexed by Tier.
	NumTiers
)

// tierSuffixes are the stream-name suffixes of the lower tiers. A worker
// id ending in one of them is read as that tier of the worker before it:
// such ids are reserved.
var tierSuffixes = [NumTiers]string{TierCPU: "--cpu", TierDisk: "--disk"}

func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	case TierDisk:
		return "disk"
	}
	return fmt.Sprintf("tier(%d)", uint8(t))
}

// TierStream is the worker id under which tier t of worker publishes its
// KV events and is indexed: worker itself for the GPU tier.
func TierStream(worker string, t Tier) string {
	if t == TierGPU || t >= NumTiers {
		return worker
	}
	return worker + tierSuffixes[t]
}

// SplitTier is TierStream's inverse: the worker and tier an indexed name
// stands for. Lookup's matches are per name, so a router folds a lower
// tier's match into its worker with it.
func SplitTier(name string) (worker string, t Tier) {
	// Most names are GPU streams: one byte test before any suffix test.
	if len(name) < 6 || name[len(name)-1] != 'u' && name[len(name)-1] != 'k' {
		return name, TierGPU
	}
	for t := TierCPU; t < NumTiers; t++ {
		if w, ok := strings.CutSuffix(name, tierSuffixes[t]); ok && w != "" {
			return w, t
		}
	}
	return name, TierGPU
}
