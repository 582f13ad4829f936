package kvindex

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

// The fleet benchmarks share one index of 1000 workers × 16384 blocks
// (16.4 M entries) shaped like prefix-cached chat traffic:
//
//   - 64 system prompts of 64 blocks; each worker holds 8 of them, so each
//     system-prompt block is held by ~125 workers (bitset entries);
//   - 62 conversations of 256 blocks per worker extending its system
//     prompts; 6 of them are copies of another worker's conversation (a
//     session that moved), the rest are the worker's own.
//
// A 4k-token prompt at block size 16 is 256 sequence hashes.
const (
	fleetWorkers      = 1000
	fleetSystems      = 64
	fleetSystemBlocks = 64
	fleetHeldSystems  = 8
	fleetConvs        = 62
	fleetSharedConvs  = 6
	fleetConvBlocks   = 256
	promptBlocks      = 256
)

type fleet struct {
	ix           *Index
	entries      int
	bytesPerEnt  float64
	queries      [][]uint64
	systemChains [][]uint64
}

var (
	fleetOnce sync.Once
	theFleet  *fleet
)

func convSeed(w, c int) uint64 { return uint64(1_000_000 + w*fleetConvs + c) }

func buildFleet(b *testing.B) *fleet {
	fleetOnce.Do(func() {
		rng := rand.New(rand.NewPCG(7, 7))
		f := &fleet{}
		for s := 0; s < fleetSystems; s++ {
			f.systemChains = append(f.systemChains, chain(uint64(10+s), fleetSystemBlocks))
		}
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)

		ix, err := New(DefaultConfig(), clock.Real{}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		for w := 0; w < fleetWorkers; w++ {
			name := fmt.Sprintf("worker-%04d", w)
			events := make([]wire.KVEvent, 0, fleetHeldSystems+fleetConvs)
			for _, s := range rng.Perm(fleetSystems)[:fleetHeldSystems] {
				events = append(events, wire.KVEvent{Kind: wire.KVStored, Hashes: f.systemChains[s]})
			}
			for c := 0; c < fleetConvs; c++ {
				seed := convSeed(w, c)
				if c < fleetSharedConvs && w > 0 {
					seed = convSeed(rng.IntN(w), fleetSharedConvs+rng.IntN(fleetConvs-fleetSharedConvs))
				}
				events = append(events, wire.KVEvent{Kind: wire.KVStored, Hashes: chain(seed, fleetConvBlocks)})
			}
			if _, err := ix.ApplyBatch(&wire.KVEventBatch{Worker: name, Instance: 1, FirstID: 1, Events: events}); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		f.ix = ix
		f.entries = ix.TotalBlocks()
		f.bytesPerEnt = float64(after.HeapAlloc-before.HeapAlloc) / float64(f.entries)

		// Queries: half continue a known conversation (one worker matches
		// 256 blocks, ~125 match the 64-block system prompt), 30% are new
		// conversations on a known system prompt, 20% match nothing.
		for q := 0; q < 4096; q++ {
			sys := f.systemChains[rng.IntN(fleetSystems)]
			var p []uint64
			switch r := rng.IntN(10); {
			case r < 5:
				w := rng.IntN(fleetWorkers)
				conv := chain(convSeed(w, fleetSharedConvs+rng.IntN(fleetConvs-fleetSharedConvs)), fleetConvBlocks)
				// The worker's conversation is stored after one of its own
				// system prompts; the prompt's conversation part is what
				// makes the worker win.
				p = append(slices.Clone(sys[:0]), conv...)
			case r < 8:
				p = append(slices.Clone(sys), chain(uint64(5_000_000+q), promptBlocks-fleetSystemBlocks)...)
			default:
				p = chain(uint64(9_000_000+q), promptBlocks)
			}
			f.queries = append(f.queries, p[:promptBlocks])
		}
		theFleet = f
	})
	return theFleet
}

// BenchmarkLookup measures one routing lookup of a 256-block prompt against
// the fleet index, with concurrent readers only. It reports the p50 and p99
// latency of single lookups and the index's real heap bytes per (block,
// worker) entry (measured with runtime.MemStats around the build).
//
// On a shared machine the p99 of single lookups is mostly preemption by
// other processes, not the index. So it also reports query-min-p99: the p99
// over the queries of each query's fastest run (every query runs many times
// at -benchtime 2s), which is the index's own tail.
func BenchmarkLookup(b *testing.B) {
	b.Run(fmt.Sprintf("workers=%d/blocks=%d", fleetWorkers, promptBlocks), func(b *testing.B) {
		f := buildFleet(b)
		dst := make([]Match, 0, fleetWorkers)
		lat := make([]time.Duration, 0, b.N)
		fastest := make([]time.Duration, min(b.N, len(f.queries)))
		matched := 0
		b.ReportAllocs()
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			q := f.queries[i%len(f.queries)]
			t0 := time.Now()
			dst = f.ix.Lookup(q, dst[:0])
			d := time.Since(t0)
			lat = append(lat, d)
			if j := i % len(f.queries); i < len(f.queries) || d < fastest[j] {
				fastest[j] = d
			}
			matched += len(dst)
		}
		b.StopTimer()
		slices.Sort(lat)
		slices.Sort(fastest)
		b.ReportMetric(float64(fastest[len(fastest)*99/100].Nanoseconds())/1e3, "query-min-p99-µs")
		b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds())/1e3, "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds())/1e3, "p99-µs")
		b.ReportMetric(float64(matched)/float64(b.N), "workers/lookup")
		b.ReportMetric(f.bytesPerEnt, "B/entry")
		b.ReportMetric(float64(f.ix.Memory())/float64(f.entries), "est-B/entry")
		b.ReportMetric(float64(f.entries)/1e6, "M-entries")
	})
}

// BenchmarkApplyStored measures stored-block application on one goroutine:
// batches of 16 chained stored events of 16 blocks each (every event's
// parent is checked). It reports blocks per second.
func BenchmarkApplyStored(b *testing.B) {
	for _, sample := range []int{1, 4, 16} {
		for _, workers := range []int{1, 8} {
			benchApplyStored(b, workers, sample)
		}
	}
}

// benchApplyStored is BenchmarkApplyStored for one fleet and sampling rate
// (Config.Sample); blocks/s counts every block stored, sampled or not.
func benchApplyStored(b *testing.B, workers, sample int) {
	name := fmt.Sprintf("sharing_workers=%d", workers)
	if sample > 1 {
		name += fmt.Sprintf("/sample=%d", sample)
	}
	b.Run(name, func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.Sample = sample
		ix, err := New(cfg, clock.Real{}, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		const cycle = 1 << 18 // blocks stored before the worker is cleared
		hashes := chain(42, cycle)
		next := make([]uint64, workers)
		names := make([]string, workers)
		for w := range names {
			names[w] = fmt.Sprintf("w%d", w)
			if err := ix.SetCapacity(names[w], 1<<30); err != nil {
				b.Fatal(err)
			}
			next[w] = 1
		}
		const perEvent, perBatch = 16, 16
		events := make([]wire.KVEvent, perBatch)
		bt := &wire.KVEventBatch{Instance: 1}
		b.ReportAllocs()
		b.ResetTimer()
		pos := 0
		for done := 0; done < b.N; {
			if pos+perEvent*perBatch > cycle {
				b.StopTimer()
				for w, name := range names {
					bt.Worker, bt.FirstID, bt.Events = name, next[w], []wire.KVEvent{{Kind: wire.KVCleared}}
					_, _ = ix.ApplyBatch(bt)
					next[w]++
				}
				pos = 0
				b.StartTimer()
			}
			for e := range events {
				start := pos + e*perEvent
				events[e] = wire.KVEvent{Kind: wire.KVStored, Hashes: hashes[start : start+perEvent]}
				if start > 0 {
					events[e].Parent, events[e].HasParent = hashes[start-1], true
				}
			}
			for w, name := range names {
				bt.Worker, bt.FirstID, bt.Events = name, next[w], events
				if o, err := ix.ApplyBatch(bt); o != OutcomeApplied || err != nil {
					b.Fatalf("batch not applied: %v %v", o, err)
				}
				next[w] += perBatch
				done += perEvent * perBatch
			}
			pos += perEvent * perBatch
		}
		b.StopTimer()
		b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "blocks/s")
	})
}

// BenchmarkClearStale measures dropping the 16k blocks of k fleet workers
// at once (a gap storm, a restart wave or removals): each drop is O(1) on
// the apply path, and one ClearStale scan of the whole index reclaims them
// all. The workers' blocks are restored between iterations, untimed.
func BenchmarkClearStale(b *testing.B) {
	for _, k := range []int{1, 32} {
		b.Run(fmt.Sprintf("dropped_workers=%d", k), func(b *testing.B) {
			f := buildFleet(b)
			ws := make([]*workerState, k)
			held := make([][]uint64, k)
			for i := range ws {
				name := fmt.Sprintf("worker-%04d", i)
				ws[i] = f.ix.lookupWorker(name)
				held[i] = f.ix.WorkerHashes(name, nil)
			}
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				for _, w := range ws {
					w.mu.Lock()
					f.ix.dropEntries(w)
					w.mu.Unlock()
				}
				f.ix.ClearStale()
				b.StopTimer()
				for i, w := range ws {
					for _, h := range held[i] {
						f.ix.add(h, w.ID())
					}
					w.blocks.Store(int64(len(held[i])))
				}
				b.StartTimer()
			}
			dropped := 0
			for _, h := range held {
				dropped += len(h)
			}
			b.ReportMetric(float64(dropped), "blocks-dropped")
		})
	}
}

// BenchmarkLookupPredictedSharedPrefix is a lookup whose first blocks are
// predicted on a large part of the fleet: routers predict every prompt
// they route, so a system prompt a fleet shares ends up predicted on every
// worker it was sent to. Each of the workers holds predictions for the
// shared 64 blocks and 16 of its own beyond them; the query is the shared
// prefix and one worker's continuation.
func BenchmarkLookupPredictedSharedPrefix(b *testing.B) {
	for _, workers := range []int{1, 16, 256, 2500} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			ix, _, _ := newTestIndex(b, func(c *Config) {
				c.MaxWorkers = workers
				c.MaxPredictedEntries = workers * 128
			})
			shared := chain(1<<30, 64)
			var query []uint64
			for w := range workers {
				own := append(slices.Clone(shared), chain(uint64(w), 16)...)
				if err := ix.Predict(fmt.Sprintf("w%05d", w), own, time.Hour); err != nil {
					b.Fatal(err)
				}
				query = own
			}
			dst := make([]Match, 0, workers)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst = ix.Lookup(query, dst[:0])
			}
			if len(dst) != workers {
				b.Fatalf("matched %d workers, want %d", len(dst), workers)
			}
		})
	}
}

// BenchmarkBindWorkers registers a fleet of workers into an empty index, as
// a router does when it starts or a fleet scales out: each registration
// binds a fresh id to its worker's name. It reports the time per bind
// across the whole fleet, so a bind that grows with the fleet shows as a
// per-bind cost that grows with workers.
func BenchmarkBindWorkers(b *testing.B) {
	for _, workers := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			names := make([]string, workers)
			for w := range names {
				names[w] = fmt.Sprintf("w%05d", w)
			}
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				ix, _, _ := newTestIndex(b, func(c *Config) { c.MaxWorkers = workers })
				b.StartTimer()
				for _, n := range names {
					if err := ix.SetCapacity(n, 1); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*workers), "ns/bind")
		})
	}
}
