package kvindex

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/wire"
)

func mustApply(t *testing.T, ix *Index, worker string, instance, firstID uint64, events ...wire.KVEvent) Outcome {
	t.Helper()
	o, err := ix.ApplyBatch(batch(worker, instance, firstID, events...))
	require.NoError(t, err)
	return o
}

func TestLookupReturnsEachWorkersMatchedDepth(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 6)
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 7, 1, stored(nil, h[:6]...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "b", 7, 1, stored(nil, h[:2]...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "c", 7, 1, stored(nil, chain(2, 3)...)))

	got := ix.Lookup(h[:4], nil)
	require.Equal(t, []Match{{"a", 4}, {"b", 2}}, sortedMatches(got))
}

func TestLookupStopsAtTheFirstBlockAWorkerLacks(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 5)
	mustApply(t, ix, "a", 7, 1, stored(nil, h[0], h[1], h[3], h[4]))
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(h, nil), "block 2 is missing, so only two leading blocks match")
}

func TestLookupOfUnknownPrefixFindsNothing(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 7, 1, stored(nil, chain(1, 3)...))
	require.Empty(t, ix.Lookup(chain(9, 3), nil))
	require.Empty(t, ix.Lookup(nil, nil))
}

func TestLookupAppendsToTheCallersSlice(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 2)
	mustApply(t, ix, "a", 7, 1, stored(nil, h...))
	dst := []Match{{"keep", 1}}
	require.Equal(t, []Match{{"keep", 1}, {"a", 2}}, ix.Lookup(h, dst))
}

func TestHashesSharedByManyWorkersStayExactThroughPromotionAndDemotion(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(3, 3)
	const n = 150 // ids past the first bitset words
	for i := 0; i < n; i++ {
		mustApply(t, ix, fmt.Sprintf("w%03d", i), 1, 1, stored(nil, h[:1+i%3]...))
	}
	got := ix.Lookup(h, nil)
	require.Len(t, got, n)
	for _, m := range got {
		var i int
		_, err := fmt.Sscanf(m.Worker, "w%03d", &i)
		require.NoError(t, err)
		require.Equal(t, 1+i%3, m.Blocks, "worker %s", m.Worker)
	}
	for i := 1; i < n; i++ {
		mustApply(t, ix, fmt.Sprintf("w%03d", i), 1, 2, removed(h[:1+i%3]...))
	}
	require.Equal(t, []Match{{"w000", 1}}, ix.Lookup(h, nil), "after the others left only w000 holds block 0")
	require.Equal(t, 1, ix.TotalBlocks())
}

func TestRemoveWorkerDropsAllItsEntriesAndItsIdIsReusedCleanly(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 4)
	mustApply(t, ix, "a", 1, 1, stored(nil, h...))
	mustApply(t, ix, "b", 1, 1, stored(nil, h[:2]...))
	ix.RemoveWorker("a")
	require.Equal(t, []Match{{"b", 2}}, ix.Lookup(h, nil))
	require.Zero(t, ix.Blocks("a"))
	_, ok := ix.Digest("a")
	require.False(t, ok, "a removed worker has no digest")

	// Once reclaimed, a new worker takes a's interned id; none of a's
	// entries may resurface.
	require.Equal(t, 4, ix.ClearStale())
	mustApply(t, ix, "c", 1, 1, stored(nil, chain(5, 1)...))
	require.Equal(t, []Match{{"b", 2}}, ix.Lookup(h, nil))
	require.Equal(t, 3, ix.TotalBlocks())
}

// TestLookupAgreesWithANaiveModel drives random stores and removals for many
// workers and compares every lookup with a per-worker set model.
func TestLookupAgreesWithANaiveModel(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	rng := rand.New(rand.NewPCG(1, 2))
	prompts := make([][]uint64, 40)
	for i := range prompts {
		prompts[i] = chain(uint64(100+i), 12)
		if i%4 != 0 { // most prompts share a prefix with prompt 0
			copy(prompts[i][:4], prompts[0][:4])
		}
	}
	const workers = 130
	model := make([]map[uint64]bool, workers)
	next := make([]uint64, workers)
	for w := range model {
		model[w] = map[uint64]bool{}
		next[w] = 1
	}
	name := func(w int) string { return fmt.Sprintf("w%d", w) }
	for step := 0; step < 4000; step++ {
		w := rng.IntN(workers)
		p := prompts[rng.IntN(len(prompts))]
		k := 1 + rng.IntN(len(p))
		var e wire.KVEvent
		if rng.IntN(3) == 0 {
			e = removed(p[k-1:]...)
			for _, h := range p[k-1:] {
				delete(model[w], h)
			}
		} else {
			// Store the prefix from the start so parents are always known.
			e = stored(nil, p[:k]...)
			for _, h := range p[:k] {
				model[w][h] = true
			}
		}
		require.Equal(t, OutcomeApplied, mustApply(t, ix, name(w), 1, next[w], e))
		next[w]++
		if step%10 == 0 {
			q := prompts[rng.IntN(len(prompts))]
			var want []Match
			for v := range model {
				d := 0
				for d < len(q) && model[v][q[d]] {
					d++
				}
				if d > 0 {
					want = append(want, Match{name(v), d})
				}
			}
			require.Equal(t, sortedMatches(want), sortedMatches(ix.Lookup(q, nil)), "step %d", step)
		}
	}
	total := 0
	for w := range model {
		require.Equal(t, len(model[w]), ix.Blocks(name(w)))
		total += len(model[w])
	}
	require.Equal(t, total, ix.TotalBlocks())
}

func TestConcurrentLookupsSeeConsistentDepthsWhileEventsApply(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	base := chain(7, 8)
	mustApply(t, ix, "stable", 1, 1, stored(nil, base...))
	var readers, writers sync.WaitGroup
	stop := make(chan struct{})
	for r := 0; r < 2; r++ {
		readers.Go(func() {
			var dst []Match
			for {
				select {
				case <-stop:
					return
				default:
				}
				dst = ix.Lookup(base, dst[:0])
				for _, m := range dst {
					if m.Worker == "stable" && m.Blocks != len(base) {
						t.Errorf("stable worker matched %d blocks, want %d", m.Blocks, len(base))
					}
				}
			}
		})
	}
	for i := 0; i < 4; i++ {
		w := fmt.Sprintf("churn%d", i)
		writers.Go(func() {
			for id := uint64(1); id <= 400; id += 2 {
				if _, err := ix.ApplyBatch(batch(w, 1, id, stored(nil, base[:1+id%8]...))); err != nil {
					t.Error(err)
				}
				if _, err := ix.ApplyBatch(batch(w, 1, id+1, removed(base[:1+id%8]...))); err != nil {
					t.Error(err)
				}
			}
		})
	}
	writers.Wait()
	close(stop)
	readers.Wait()
	require.Equal(t, len(base), ix.TotalBlocks(), "every churn store was removed again")
}

// TestATableALookupHoldsNeverNamesTheNextHolderOfAnId holds the id → name
// table to what lookups rely on without a lock: a lookup that loaded the
// table before an id was freed never reports that id under the worker it
// is bound to next, whose entries it may meet in the index.
func TestATableALookupHoldsNeverNamesTheNextHolderOfAnId(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 1, 1, stored(nil, chain(1, 2)...))
	id := int(ix.lookupWorker("a").ID())
	held := *ix.names.Load() // a lookup starts
	require.Equal(t, "a", held.name(id))

	ix.RemoveWorker("a")
	ix.ClearStale()
	mustApply(t, ix, "b", 1, 1, stored(nil, chain(2, 2)...))
	require.Equal(t, id, int(ix.lookupWorker("b").ID()), "b takes a's freed id")
	require.Equal(t, "b", (*ix.names.Load()).name(id), "lookups that start now name b")
	require.NotEqual(t, "b", held.name(id), "the earlier lookup may meet b's entries under the id")
}

// TestLookupsNameEveryWorkerOfAFleetRegisteredOneByOne registers more
// workers than the table's first sizes, so it grows several times, with
// entries of each worker's own, and checks each lookup names its owner.
func TestLookupsNameEveryWorkerOfAFleetRegisteredOneByOne(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 3000 })
	early := map[int]nameTable{}
	for w := range 3000 {
		mustApply(t, ix, fmt.Sprintf("w%04d", w), 1, 1, stored(nil, chain(uint64(w), 3)...))
		if w == 9 || w == 700 {
			early[w] = *ix.names.Load()
		}
	}
	for w := range 3000 {
		require.Equal(t, []Match{{fmt.Sprintf("w%04d", w), 3}}, ix.Lookup(chain(uint64(w), 3), nil))
	}
	for upTo, table := range early {
		for w := 0; w <= upTo; w++ {
			name := fmt.Sprintf("w%04d", w)
			require.Equal(t, name, table.name(int(ix.lookupWorker(name).ID())), "a table loaded earlier still names the workers it had")
		}
	}
}

// TestConcurrentLookupsNeverNameAnotherWorkerWhileIdsChangeHands churns
// workers through removal, ClearStale and re-registration (so ids change
// hands and the name table grows) while lookups run; each worker holds
// hashes no other worker holds, so a lookup that names any worker but the
// owner of what it looked up misread the table (and the race detector
// reports unsynchronised writes to it).
func TestConcurrentLookupsNeverNameAnotherWorkerWhileIdsChangeHands(t *testing.T) {
	const workers = 40
	// Room for a round's restarts and removals to retire an id each
	// before ClearStale frees them.
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 2 * workers })
	own := func(w int) []uint64 { return chain(uint64(1000+w), 4) }
	var readers, writer sync.WaitGroup
	stop := make(chan struct{})
	for r := range 2 {
		readers.Go(func() {
			var dst []Match
			for i := r; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				w := i % workers
				dst = ix.Lookup(own(w), dst[:0])
				for _, m := range dst {
					if want := fmt.Sprintf("w%02d", w); m.Worker != want {
						t.Errorf("a lookup of %s's hashes named %s", want, m.Worker)
					}
				}
			}
		})
	}
	writer.Go(func() {
		for round := range 30 {
			for w := range workers {
				name := fmt.Sprintf("w%02d", w)
				if (w+round)%3 == 0 {
					ix.RemoveWorker(name)
					continue
				}
				if _, err := ix.ApplyBatch(batch(name, uint64(round+1), 1, stored(nil, own(w)...))); err != nil {
					t.Error(err)
				}
			}
			ix.ClearStale()
		}
	})
	writer.Wait()
	close(stop)
	readers.Wait()
}
