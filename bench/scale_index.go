package bench

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// IndexScaleConfig shapes one fleet index for MeasureIndexScale.
//
// Every worker holds BlocksPerWorker blocks, built like a prefix-cached
// chat fleet serving one model:
//   - 4 of 64 system prompts of 64 blocks, so each system-prompt block is
//     held by a sixteenth of the fleet (a bitset entry);
//   - 2 of Workers/8 shared documents of 32 blocks (RAG context, a popular
//     few-shot block), so each document block is held by about 16 workers:
//     more than a slot's four inline ids, so also a bitset, whose width
//     grows with the fleet;
//   - conversations of 240 blocks for the rest, one of them a copy of
//     another worker's (a session that moved).
//
// Queries are 256-block prompts (4k tokens at block size 16): half continue
// a conversation after its system prompt, 30% start a new one on a known
// system prompt, 20% match nothing.
type IndexScaleConfig struct {
	Workers         int
	BlocksPerWorker int
	Queries         int
	// Rounds is how often each query is looked up; the fastest round of
	// each query gives the index's own tail (QueryMinP99).
	Rounds int
	// ChurnBatches is the number of timed steady-state batches (16 blocks
	// removed and 16 stored again, chained to their parent) applied to the
	// full index.
	ChurnBatches int
	Seed         uint64
	// Sample is the index's sampling rate (kvindex.Config.Sample; 0 or 1:
	// every block).
	Sample int
}

// Shape of IndexScaleConfig's fleet.
const (
	scaleSystems      = 64
	scaleSystemBlocks = 64
	scaleHeldSystems  = 4
	scaleDocBlocks    = 32
	scaleHeldDocs     = 2
	scaleConvBlocks   = 240
	scalePromptBlocks = 256
	scaleChurnBlocks  = 16
)

// DefaultIndexScaleConfig is the goal's case: 10,000 workers × 2,000 blocks.
func DefaultIndexScaleConfig() IndexScaleConfig {
	return IndexScaleConfig{Workers: 10_000, BlocksPerWorker: 2_000, Queries: 2048, Rounds: 5, ChurnBatches: 20_000, Seed: 1}
}

// IndexScaleResult is one fleet index's measurements.
type IndexScaleResult struct {
	Workers         int     `json:"workers"`
	BlocksPerWorker int     `json:"blocks_per_worker"`
	Entries         int     `json:"entries"`
	HeapBytes       int64   `json:"heap_bytes"`
	BytesPerBlock   float64 `json:"bytes_per_block"`
	BytesPerWorker  float64 `json:"bytes_per_worker"`
	LookupP50us     float64 `json:"lookup_p50_us"`
	LookupP99us     float64 `json:"lookup_p99_us"`
	QueryMinP99us   float64 `json:"query_min_p99_us"`
	BuildNsPerBlock float64 `json:"build_ns_per_block"`
	ApplyNsPerBlock float64 `json:"apply_ns_per_block"`
	MatchesPerQuery float64 `json:"matches_per_query"`
	BuildSeconds    float64 `json:"build_seconds"`
	// Sample is the index's sampling rate; RawBlocks the blocks the
	// workers stored (Entries is the sampled part of them), and the
	// per-raw-block figures divide by RawBlocks, so rates compare.
	Sample             int     `json:"sample,omitempty"`
	RawBlocks          int     `json:"raw_blocks,omitempty"`
	BytesPerRawBlock   float64 `json:"bytes_per_raw_block,omitempty"`
	BuildNsPerRawBlock float64 `json:"build_ns_per_raw_block,omitempty"`
}

// scaleChain returns n distinct pseudo-random sequence hashes of seed
// (splitmix64 of seed and position): the index only compares hashes, so
// they need not come from tokens.
func scaleChain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		z := seed<<24 ^ uint64(i)
		z += 0x9E3779B97F4A7C15
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		out[i] = z ^ (z >> 31)
	}
	return out
}

func scaleConvSeed(w, c int) uint64 { return uint64(1<<32) + uint64(w)<<8 + uint64(c) }
func scaleDocSeed(d int) uint64     { return uint64(1<<31) + uint64(d) }
func scaleWorkerName(w int) string  { return fmt.Sprintf("worker-%05d", w) }
func scaleConvs(blocksPerWorker int) int {
	rest := blocksPerWorker - scaleHeldSystems*scaleSystemBlocks - scaleHeldDocs*scaleDocBlocks
	return max(1, rest/scaleConvBlocks)
}

// Validate names the first bad field.
func (c IndexScaleConfig) Validate() error {
	switch {
	case c.Workers < 16:
		return fmt.Errorf("%w: scale index workers %d: want at least 16", ErrInvalidConfig, c.Workers)
	case c.BlocksPerWorker < scaleHeldSystems*scaleSystemBlocks+scaleHeldDocs*scaleDocBlocks+scaleConvBlocks:
		return fmt.Errorf("%w: scale index blocks per worker %d: want at least %d", ErrInvalidConfig, c.BlocksPerWorker,
			scaleHeldSystems*scaleSystemBlocks+scaleHeldDocs*scaleDocBlocks+scaleConvBlocks)
	case c.Queries < 100 || c.Rounds < 1 || c.ChurnBatches < 1:
		return fmt.Errorf("%w: scale index: want at least 100 queries, 1 round and 1 churn batch", ErrInvalidConfig)
	}
	return nil
}

// threadCPU is the CPU time of the calling OS thread (the caller locks its
// goroutine to it). Apply costs are measured in CPU time, not wall time,
// because the machines these run on are shared: wall time there counts
// other processes' turns on the core.
func threadCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// MeasureIndexScale builds one index of cfg.Workers workers and measures
// its heap, lookups and event application. It holds the whole index in
// memory: 41 bytes per block at 50,000 workers, 6.6 GB resident while it
// builds (docs/benchmarks.md §10).
func MeasureIndexScale(cfg IndexScaleConfig) (IndexScaleResult, error) {
	if err := cfg.Validate(); err != nil {
		return IndexScaleResult{}, err
	}
	icfg := kvindex.DefaultConfig()
	icfg.MaxWorkers = cfg.Workers
	icfg.DefaultWorkerBlocks = 2 * cfg.BlocksPerWorker
	icfg.Sample = max(1, cfg.Sample)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x5ca1e))
	systems := make([][]uint64, scaleSystems)
	for s := range systems {
		systems[s] = scaleChain(uint64(10+s), scaleSystemBlocks)
	}
	docs := max(1, cfg.Workers/8)
	convs := scaleConvs(cfg.BlocksPerWorker)

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	ix, err := kvindex.New(icfg, clock.Real{}, nil, nil)
	if err != nil {
		return IndexScaleResult{}, err
	}
	nextID := make([]uint64, cfg.Workers)
	var build time.Duration
	raw := 0
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	events := make([]wire.KVEvent, 0, scaleHeldSystems+scaleHeldDocs+convs)
	for w := 0; w < cfg.Workers; w++ {
		events = events[:0]
		for _, s := range rng.Perm(scaleSystems)[:scaleHeldSystems] {
			events = append(events, wire.KVEvent{Kind: wire.KVStored, Hashes: systems[s]})
		}
		for range scaleHeldDocs {
			events = append(events, wire.KVEvent{Kind: wire.KVStored, Hashes: scaleChain(scaleDocSeed(rng.IntN(docs)), scaleDocBlocks)})
		}
		for c := 0; c < convs; c++ {
			seed := scaleConvSeed(w, c)
			if c == 0 && w > 0 {
				seed = scaleConvSeed(rng.IntN(w), 1+rng.IntN(max(1, convs-1)))
			}
			events = append(events, wire.KVEvent{Kind: wire.KVStored, Hashes: scaleChain(seed, scaleConvBlocks)})
		}
		b := &wire.KVEventBatch{Worker: scaleWorkerName(w), Instance: 1, FirstID: 1, Events: events}
		for _, e := range events {
			raw += len(e.Hashes)
		}
		t0 := threadCPU()
		o, err := ix.ApplyBatch(b)
		build += threadCPU() - t0
		if err != nil || o != kvindex.OutcomeApplied {
			return IndexScaleResult{}, fmt.Errorf("scale index: build worker %d: %v %w", w, o, err)
		}
		nextID[w] = b.LastID() + 1
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	res := IndexScaleResult{
		Workers:         cfg.Workers,
		BlocksPerWorker: cfg.BlocksPerWorker,
		Entries:         ix.TotalBlocks(),
		HeapBytes:       int64(after.HeapAlloc) - int64(before.HeapAlloc),
		BuildSeconds:    build.Seconds(),
		Sample:          icfg.Sample,
		RawBlocks:       raw,
	}
	res.BytesPerBlock = float64(res.HeapBytes) / float64(res.Entries)
	res.BytesPerWorker = float64(res.HeapBytes) / float64(cfg.Workers)
	res.BuildNsPerBlock = float64(build.Nanoseconds()) / float64(res.Entries)
	res.BytesPerRawBlock = float64(res.HeapBytes) / float64(raw)
	res.BuildNsPerRawBlock = float64(build.Nanoseconds()) / float64(raw)

	res.LookupP50us, res.LookupP99us, res.QueryMinP99us, res.MatchesPerQuery = measureLookups(ix, cfg, systems, convs, rng)
	res.ApplyNsPerBlock, err = measureChurn(ix, cfg, nextID, convs, rng)
	if err != nil {
		return res, err
	}
	runtime.KeepAlive(ix)
	return res, nil
}

func measureLookups(ix *kvindex.Index, cfg IndexScaleConfig, systems [][]uint64, convs int, rng *rand.Rand) (p50, p99, minP99, matches float64) {
	queries := make([][]uint64, cfg.Queries)
	for q := range queries {
		sys := systems[rng.IntN(scaleSystems)]
		var p []uint64
		switch r := rng.IntN(10); {
		case r < 5:
			conv := scaleChain(scaleConvSeed(rng.IntN(cfg.Workers), 1+rng.IntN(max(1, convs-1))), scaleConvBlocks)
			p = append(slices.Clone(sys), conv...)
		case r < 8:
			p = append(slices.Clone(sys), scaleChain(uint64(5_000_000+q), scalePromptBlocks-scaleSystemBlocks)...)
		default:
			p = scaleChain(uint64(9_000_000+q), scalePromptBlocks)
		}
		queries[q] = p[:scalePromptBlocks]
	}
	dst := make([]kvindex.Match, 0, cfg.Workers)
	lat := make([]time.Duration, 0, cfg.Queries*cfg.Rounds)
	fastest := make([]time.Duration, cfg.Queries)
	found := 0
	for r := 0; r < cfg.Rounds; r++ {
		for q, hs := range queries {
			t0 := time.Now()
			dst = ix.Lookup(hs, dst[:0])
			d := time.Since(t0)
			lat = append(lat, d)
			if r == 0 || d < fastest[q] {
				fastest[q] = d
			}
			found += len(dst)
		}
	}
	slices.Sort(lat)
	slices.Sort(fastest)
	us := func(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }
	return us(lat[len(lat)/2]), us(lat[len(lat)*99/100]), us(fastest[len(fastest)*99/100]), float64(found) / float64(len(lat))
}

// measureChurn applies the steady state of a full cache: each batch evicts
// the last 16 blocks of one of a random worker's conversations and stores
// them again, chained to the block before (the parent check is one more
// probe). It returns nanoseconds per block event.
func measureChurn(ix *kvindex.Index, cfg IndexScaleConfig, nextID []uint64, convs int, rng *rand.Rand) (float64, error) {
	type job struct {
		w     int
		batch *wire.KVEventBatch
	}
	jobs := make([]job, cfg.ChurnBatches)
	for i := range jobs {
		w := rng.IntN(cfg.Workers)
		conv := scaleChain(scaleConvSeed(w, 1+rng.IntN(max(1, convs-1))), scaleConvBlocks)
		tail := conv[scaleConvBlocks-scaleChurnBlocks:]
		jobs[i] = job{w: w, batch: &wire.KVEventBatch{
			Worker: scaleWorkerName(w), Instance: 1, Events: []wire.KVEvent{
				{Kind: wire.KVRemoved, Hashes: tail},
				{Kind: wire.KVStored, Hashes: tail, Parent: conv[scaleConvBlocks-scaleChurnBlocks-1], HasParent: true},
			},
		}}
	}
	blocks := 0
	t0 := threadCPU()
	for _, j := range jobs {
		j.batch.FirstID = nextID[j.w]
		nextID[j.w] += uint64(len(j.batch.Events))
		o, err := ix.ApplyBatch(j.batch)
		if err != nil || o != kvindex.OutcomeApplied {
			return 0, fmt.Errorf("scale index: churn on %s: %v %w", j.batch.Worker, o, err)
		}
		blocks += 2 * scaleChurnBlocks
	}
	return float64((threadCPU() - t0).Nanoseconds()) / float64(blocks), nil
}
