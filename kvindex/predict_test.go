package kvindex

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestLookupTakesTheLargerOfExactAndPredictedDepth(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 6)
	mustApply(t, ix, "a", 1, 1, stored(nil, h[:2]...))
	mustApply(t, ix, "b", 1, 1, stored(nil, h[:5]...))
	require.NoError(t, ix.Predict("a", h[:4], 5*time.Second))
	require.NoError(t, ix.Predict("b", h[:3], 5*time.Second))
	require.NoError(t, ix.Predict("c", h[:1], 5*time.Second))
	require.Equal(t, []Match{{"a", 4}, {"b", 5}, {"c", 1}}, sortedMatches(ix.Lookup(h, nil)))
}

func TestExpiredPredictionsVanishFromLookupsBeforeAnySweep(t *testing.T) {
	ix, _, clk := newTestIndex(t)
	h := chain(1, 3)
	require.NoError(t, ix.Predict("a", h, 5*time.Second))
	clk.Advance(4 * time.Second)
	require.Equal(t, []Match{{"a", 3}}, ix.Lookup(h, nil))
	clk.Advance(time.Second)
	require.Empty(t, ix.Lookup(h, nil), "a prediction is gone at its expiry")
	require.Equal(t, 3, ix.PredictedEntries(), "until swept, expired entries still take memory")
}

func TestSweepRemovesOnlyExpiredPredictions(t *testing.T) {
	ix, reg, clk := newTestIndex(t)
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Second))
	require.NoError(t, ix.Predict("b", chain(2, 2), time.Minute))
	clk.Advance(2 * time.Second)
	require.Equal(t, 3, ix.SweepPredictions())
	require.Equal(t, 2, ix.PredictedEntries())
	require.Equal(t, 2.0, testenv.MetricValue(t, reg, "switchyard_index_predicted_entries", nil))
	require.Equal(t, []Match{{"b", 2}}, ix.Lookup(chain(2, 2), nil))
}

func TestRepeatedPredictionsExtendTheExpiryWithoutDuplicating(t *testing.T) {
	ix, _, clk := newTestIndex(t)
	h := chain(1, 2)
	require.NoError(t, ix.Predict("a", h, 2*time.Second))
	clk.Advance(time.Second)
	require.NoError(t, ix.Predict("a", h, 2*time.Second))
	require.NoError(t, ix.PredictUntil("a", h, clk.Now().Add(time.Millisecond)), "an earlier expiry never shortens one")
	require.Equal(t, 2, ix.PredictedEntries())
	clk.Advance(1500 * time.Millisecond)
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(h, nil))
}

func TestPredictionsBeyondTheLimitAreDroppedAndCounted(t *testing.T) {
	ix, reg, _ := newTestIndex(t, func(c *Config) { c.MaxPredictedEntries = 2 })
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Second))
	require.Equal(t, 2, ix.PredictedEntries())
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_dropped_total", map[string]string{"kind": "predicted_entries"}))
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(chain(1, 3), nil))
}

func TestRemovingAWorkerDropsItsPredictions(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	require.NoError(t, ix.Predict("a", chain(1, 3), time.Minute))
	require.NoError(t, ix.Predict("b", chain(1, 1), time.Minute))
	ix.RemoveWorker("a")
	require.Equal(t, []Match{{"b", 1}}, ix.Lookup(chain(1, 3), nil), "a removed worker's predictions vanish at once")
	ix.ClearStale()
	require.Equal(t, 1, ix.PredictedEntries(), "and the next ClearStale reclaims them")
}

// TestLookupOfAPrefixPredictedOnManyWorkersMatchesABruteForceWalk holds the
// lookup's long-list path (more predicted workers than predScanActive) and
// its short one to a per-worker brute force: a worker's depth is the
// larger of its exact depth and the longest run of unexpired predictions
// from the first block.
func TestLookupOfAPrefixPredictedOnManyWorkersMatchesABruteForceWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 30))
	for trial := range 40 {
		ix, _, clk := newTestIndex(t, func(c *Config) { c.MaxWorkers = 400 })
		h := chain(uint64(trial), 12)
		workers := 1 + rng.IntN(300) // many trials above predScanActive
		type pw struct {
			blocks int
			until  time.Duration
		}
		preds := map[string][]pw{}
		exact := map[string]int{}
		for w := range workers {
			name := fmt.Sprintf("w%03d", w)
			if rng.IntN(5) == 0 {
				n := 1 + rng.IntN(len(h))
				mustApply(t, ix, name, 1, 1, stored(nil, h[:n]...))
				exact[name] = n
			}
			for range rng.IntN(3) {
				p := pw{blocks: 1 + rng.IntN(len(h)), until: time.Duration(1+rng.IntN(8)) * time.Second}
				require.NoError(t, ix.Predict(name, h[:p.blocks], p.until))
				preds[name] = append(preds[name], p)
			}
		}
		for step := range 3 {
			elapsed := time.Duration(step*3) * time.Second
			var want []Match
			for w := range workers {
				name := fmt.Sprintf("w%03d", w)
				// Block i is predicted while some prediction covering it
				// is unexpired: the run from block 0 is the longest prefix
				// every block of which is covered.
				depth := 0
				for i := range h {
					covered := false
					for _, p := range preds[name] {
						covered = covered || (p.blocks > i && p.until > elapsed)
					}
					if !covered {
						break
					}
					depth = i + 1
				}
				if d := max(depth, exact[name]); d > 0 {
					want = append(want, Match{Worker: name, Blocks: d})
				}
			}
			require.Equal(t, sortedMatches(want), sortedMatches(ix.Lookup(h, nil)), "trial %d, %v in", trial, elapsed)
			clk.Advance(3 * time.Second)
		}
	}
}

// predictSharedPrefix predicts on each of workers a shared prefix of 32
// blocks and 1 to 8 blocks of its own beyond it, gives every third worker
// exact entries for part of the prefix, and returns the queries: the
// prefix followed by each worker's own blocks.
func predictSharedPrefix(t *testing.T, ix *Index, workers int) [][]uint64 {
	t.Helper()
	shared := chain(1<<30, 32)
	var queries [][]uint64
	for w := range workers {
		name := fmt.Sprintf("w%04d", w)
		own := append(slices.Clone(shared), chain(uint64(w), 1+w%8)...)
		require.NoError(t, ix.Predict(name, own, time.Hour))
		if w%3 == 0 {
			mustApply(t, ix, name, 1, 1, stored(nil, shared[:1+w%32]...))
		}
		queries = append(queries, own)
	}
	return queries
}

func TestLookupOfAWidelyPredictedPrefixAllocatesNothingOnceWarm(t *testing.T) {
	if raceBuild {
		t.Skip("the race detector drops sync.Pool puts on purpose")
	}
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 300 })
	queries := predictSharedPrefix(t, ix, 300)
	dst := make([]Match, 0, 300)
	for _, q := range queries[:8] {
		dst = ix.Lookup(q, dst[:0]) // warm: the scratch grows to its largest
	}
	require.Len(t, dst, 300, "every worker predicted the shared prefix")
	allocs := testing.AllocsPerRun(50, func() {
		dst = ix.Lookup(queries[len(queries)-1], dst[:0])
	})
	require.Zero(t, allocs)
}

// TestConcurrentLookupsOfAWidelyPredictedPrefixAgreeWithSequentialOnes runs
// lookups that take the pooled scratch from several goroutines at once,
// each with a dst that already holds matches of its own, and compares them
// with the answers of lookups made one at a time: scratch shared between
// lookups, or left dirty by one, changes an answer (and the race detector
// reports the sharing).
func TestConcurrentLookupsOfAWidelyPredictedPrefixAgreeWithSequentialOnes(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 200 })
	queries := predictSharedPrefix(t, ix, 200)
	prior := []Match{{Worker: "before", Blocks: 1}}
	want := make([][]Match, len(queries))
	for i, q := range queries {
		want[i] = sortedMatches(ix.Lookup(q, slices.Clone(prior)))
	}
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for g := range 4 {
		wg.Go(func() {
			for round := range 5 {
				for k := range queries {
					i := (k*7 + g*13 + round) % len(queries)
					got := sortedMatches(ix.Lookup(queries[i], slices.Clone(prior)))
					if !slices.Equal(got, want[i]) {
						errs <- fmt.Errorf("goroutine %d, query %d: %d matches, want %d", g, i, len(got), len(want[i]))
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
