package bench

import (
	"time"

	"github.com/switchyard/switchyard/wire"
)

// simIngest accounts what the replicas' indexes spend on KV events
// (SimConfig.MeasureIngest): the batches delivered and their blocks, and the
// thread CPU time of applying each batch to every replica's index.
type simIngest struct {
	cpu             time.Duration
	batches         uint64
	stored, removed uint64
}

func (g *simIngest) count(b *wire.KVEventBatch) {
	g.batches++
	for _, e := range b.Events {
		switch e.Kind {
		case wire.KVStored:
			g.stored += uint64(len(e.Hashes))
		case wire.KVRemoved:
			g.removed += uint64(len(e.Hashes))
		}
	}
}

// SimIngestReport is one replica's KV event ingest in a run, as the mean
// over the replicas: every replica applies the same batches, so their work
// differs only in cache effects. Cores is the apply CPU per simulated
// second; the wire decode a live replica also pays (a cost per raw block,
// docs/benchmarks.md §10) is not in it, since the simulator hands batches
// over decoded.
type SimIngestReport struct {
	Batches       uint64  `json:"batches"`
	StoredBlocks  uint64  `json:"stored_blocks"`
	RemovedBlocks uint64  `json:"removed_blocks"`
	BlocksPerS    float64 `json:"blocks_per_s"`
	ApplyCPUs     float64 `json:"apply_cpu_s_per_replica"`
	ApplyNsBlock  float64 `json:"apply_ns_per_block"`
	Cores         float64 `json:"cores_per_replica"`
}

func (g *simIngest) report(replicas int, simulatedS float64) *SimIngestReport {
	per := g.cpu.Seconds() / float64(max(1, replicas))
	blocks := g.stored + g.removed
	r := &SimIngestReport{Batches: g.batches, StoredBlocks: g.stored, RemovedBlocks: g.removed, ApplyCPUs: per}
	if simulatedS > 0 {
		r.BlocksPerS = float64(blocks) / simulatedS
		r.Cores = per / simulatedS
	}
	if blocks > 0 {
		r.ApplyNsBlock = per * 1e9 / float64(blocks)
	}
	return r
}
