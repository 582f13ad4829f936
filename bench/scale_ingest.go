package bench

import (
	"context"
	"fmt"
	"math"
	"runtime"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// IngestScaleConfig sets up MeasureIngestScale: the trace load whose KV
// events it records (the simulator's engines at Speedup, as in
// docs/benchmarks.md §1) and the fleet sizes it extrapolates to.
type IngestScaleConfig struct {
	Sim SimConfig
	// Fleets are the fleet sizes (engines) of the ingest curve.
	Fleets []int
	// Sample is the replayed index's sampling rate (kvindex.Config.Sample;
	// 0 or 1: every block). The index measurements passed with it should
	// be at the same rate: those at another are not used.
	Sample int
}

// DefaultIngestScaleConfig is §1's load: 8 engines, the Mooncake trace 6×
// time-compressed, one replica.
func DefaultIngestScaleConfig() IngestScaleConfig {
	sim := DefaultSimConfig()
	sim.Label = "ingest"
	sim.TimeScale = 6
	return IngestScaleConfig{Sim: sim, Fleets: []int{100, 300, 1_000, 3_000, 10_000, 30_000, 50_000}}
}

// IngestPoint is one replica's ingest CPU at one fleet size.
type IngestPoint struct {
	Engines int `json:"engines"`
	// ApplyNsPerBlock is the apply cost used at this size: the highest of
	// the index measurements at or below it (a larger index misses the
	// caches more) and the replay's.
	ApplyNsPerBlock float64 `json:"apply_ns_per_block"`
	// Cores is CPU seconds per second the replica spends decoding and
	// applying every engine's events.
	Cores float64 `json:"cores"`
}

// IngestScaleResult is the event rate of one engine under the trace load
// and what one replica's ingest costs as the fleet grows.
type IngestScaleResult struct {
	SimulatedS float64 `json:"simulated_s"`
	Engines    int     `json:"engines"`
	// Sample is the replayed index's sampling rate. The block rates and
	// per-block costs below count every block the engines published
	// (raw), sampled or not.
	Sample int `json:"sample,omitempty"`
	// Per engine, per second of the trace load.
	BatchesPerS       float64 `json:"batches_per_s"`
	EventsPerS        float64 `json:"events_per_s"`
	StoredBlocksPerS  float64 `json:"stored_blocks_per_s"`
	RemovedBlocksPerS float64 `json:"removed_blocks_per_s"`
	WireBytesPerS     float64 `json:"wire_bytes_per_s"`
	// Measured by replaying the recorded stream into one fresh index on one
	// thread (thread CPU time).
	DecodeNsPerBlock float64 `json:"decode_ns_per_block"`
	ApplyNsPerBlock  float64 `json:"apply_ns_per_block"`
	DecodeNsPerBatch float64 `json:"decode_ns_per_batch"`
	// CoresPerEngine is one replica's CPU per engine at the replayed index
	// size; OneCoreAt the fleet size at which ingest takes one core, with
	// the apply cost of the largest index measured.
	CoresPerEngine float64       `json:"cores_per_engine"`
	OneCoreAt      int           `json:"one_core_at_engines"`
	Curve          []IngestPoint `json:"curve"`
}

// MeasureIngestScale runs the simulator on reqs, records every engine's KV
// event batches, replays them as a replica's ingest does (wire decode, then
// kvindex apply) and extrapolates the CPU to cfg.Fleets engines. index are
// the index scale measurements (may be empty): they give the apply cost
// per block in a fleet-sized index, which misses the caches where the
// replay's small index does not.
func MeasureIngestScale(ctx context.Context, cfg IngestScaleConfig, reqs []TraceRequest, index []IndexScaleResult) (IngestScaleResult, error) {
	var batches []*wire.KVEventBatch
	sim := cfg.Sim
	sim.KVTap = func(b *wire.KVEventBatch) { batches = append(batches, b) }
	rep, err := RunSim(ctx, sim, reqs, nil)
	if err != nil {
		return IngestScaleResult{}, fmt.Errorf("ingest: simulate: %w", err)
	}
	if len(batches) == 0 || rep.SimulatedS <= 0 {
		return IngestScaleResult{}, fmt.Errorf("%w: ingest: the simulation published no KV events", ErrInvalidConfig)
	}
	sample := max(1, cfg.Sample)
	res := IngestScaleResult{SimulatedS: rep.SimulatedS, Engines: sim.Workers, Sample: sample}
	payloads := make([][]byte, len(batches))
	var events, stored, removed, bytes int
	for i, b := range batches {
		payloads[i] = wire.AppendKVEventBatch(nil, b)
		bytes += len(payloads[i])
		events += len(b.Events)
		for _, e := range b.Events {
			switch e.Kind {
			case wire.KVStored:
				stored += len(e.Hashes)
			case wire.KVRemoved:
				removed += len(e.Hashes)
			}
		}
	}
	perEngineS := rep.SimulatedS * float64(sim.Workers)
	res.BatchesPerS = float64(len(batches)) / perEngineS
	res.EventsPerS = float64(events) / perEngineS
	res.StoredBlocksPerS = float64(stored) / perEngineS
	res.RemovedBlocksPerS = float64(removed) / perEngineS
	res.WireBytesPerS = float64(bytes) / perEngineS

	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	decoded := make([]*wire.KVEventBatch, len(payloads))
	t0 := threadCPU()
	for i, p := range payloads {
		if decoded[i], err = wire.DecodeKVEventBatch(p); err != nil {
			return res, fmt.Errorf("ingest: decode recorded batch %d: %w", i, err)
		}
	}
	decodeCPU := threadCPU() - t0
	icfg := kvindex.DefaultConfig()
	icfg.DefaultWorkerBlocks = sim.Engine.NumBlocks
	icfg.Sample = sample
	ix, err := kvindex.New(icfg, clock.Real{}, nil, nil)
	if err != nil {
		return res, err
	}
	t0 = threadCPU()
	for i, b := range decoded {
		if o, err := ix.ApplyBatch(b); err != nil || o != kvindex.OutcomeApplied {
			return res, fmt.Errorf("ingest: apply recorded batch %d: %v %w", i, o, err)
		}
	}
	applyCPU := threadCPU() - t0
	blocks := float64(stored + removed)
	res.DecodeNsPerBlock = float64(decodeCPU.Nanoseconds()) / blocks
	res.DecodeNsPerBatch = float64(decodeCPU.Nanoseconds()) / float64(len(batches))
	res.ApplyNsPerBlock = float64(applyCPU.Nanoseconds()) / blocks
	res.CoresPerEngine = (decodeCPU + applyCPU).Seconds() / perEngineS

	blocksPerS := res.StoredBlocksPerS + res.RemovedBlocksPerS
	decodePerEngine := decodeCPU.Seconds() / perEngineS
	at := func(engines int) IngestPoint {
		apply := res.ApplyNsPerBlock
		for _, ir := range index {
			if ir.Workers <= engines && max(1, ir.Sample) == sample && ir.ApplyNsPerBlock > apply {
				apply = ir.ApplyNsPerBlock
			}
		}
		return IngestPoint{Engines: engines, ApplyNsPerBlock: apply,
			Cores: float64(engines) * (decodePerEngine + blocksPerS*apply*1e-9)}
	}
	for _, f := range cfg.Fleets {
		res.Curve = append(res.Curve, at(f))
	}
	// The fleet size at one core, with the apply cost of the largest
	// index measured (or the replay's when there is none).
	worst := at(math.MaxInt32)
	res.OneCoreAt = int(float64(worst.Engines) / worst.Cores)
	return res, nil
}
