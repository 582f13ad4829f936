package kvindex

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestLookupWithInternedSetsAgreesWithAModelOnRandomTraces is the
// differential test of interned holder sets: random traces of a fleet whose
// workers share system prompts (so runs of blocks have the same holders,
// well past the four inline ids), store and evict conversation tails, drop
// whole prefixes (splitting a shared run's sets), and are removed and come
// back (retired ids, masked until ClearStale). After every step a set of
// prompts is looked up and each answer compared with the answer of a plain
// map from worker to hashes, the specification the index had before sets
// were shared.
//
// It runs at sampling rates 1, 4 and 16 (Config.Sample) against a model that
// applies the same rule: it stores only sampled hashes, and a worker's depth
// is the position of the last sampled hash it holds before the first
// sampled one it lacks, plus one. Chains grow with the rate so that prompts
// still have several sampled positions.
func TestLookupWithInternedSetsAgreesWithAModelOnRandomTraces(t *testing.T) {
	for _, n := range []int{1, 4, 16} {
		for seed := uint64(1); seed <= 4; seed++ {
			t.Run(fmt.Sprintf("sample=%d/seed=%d", n, seed), func(t *testing.T) {
				agreeWithModelOnRandomTrace(t, n, seed)
			})
		}
	}
}

func agreeWithModelOnRandomTrace(t *testing.T, n int, seed uint64) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 200; c.Sample = n })
	rng := rand.New(rand.NewPCG(seed, 30))
	const workers = 150
	scale := max(1, n/4)
	systems := make([][]uint64, 6)
	for s := range systems {
		systems[s] = chain(uint64(100+s), 24*scale)
	}
	convs := make([][]uint64, 40)
	for c := range convs {
		convs[c] = chain(uint64(1000+c), 16*scale)
	}
	model := make([]map[uint64]bool, workers)
	nextID := make([]uint64, workers)
	for w := range model {
		model[w] = map[uint64]bool{}
		nextID[w] = 1
	}
	name := func(w int) string { return fmt.Sprintf("w%03d", w) }
	apply := func(w int, hs []uint64, store bool) {
		ev := removed(hs...)
		if store {
			ev = stored(nil, hs...)
		}
		require.Equal(t, OutcomeApplied, mustApply(t, ix, name(w), 1, nextID[w], ev))
		nextID[w]++
		for _, h := range hs {
			if !Sampled(h, n) {
				continue
			}
			if store {
				model[w][h] = true
			} else {
				delete(model[w], h)
			}
		}
	}
	prompt := func() []uint64 {
		sys := systems[rng.IntN(len(systems))]
		switch rng.IntN(4) {
		case 0:
			return sys[:1+rng.IntN(len(sys))]
		case 1:
			return chain(uint64(9_000+rng.IntN(1000)), 8*scale)
		default:
			return append(append([]uint64(nil), sys...), convs[rng.IntN(len(convs))]...)
		}
	}
	check := func(step int) {
		for range 20 {
			p := prompt()
			want := map[string]int{}
			for w := range model {
				d := 0
				for i, h := range p {
					if !Sampled(h, n) {
						continue
					}
					if !model[w][h] {
						break
					}
					d = i + 1
				}
				if d > 0 {
					want[name(w)] = d
				}
			}
			got := map[string]int{}
			for _, m := range ix.Lookup(p, nil) {
				_, dup := got[m.Worker]
				require.False(t, dup, "step %d: %s twice", step, m.Worker)
				got[m.Worker] = m.Blocks
			}
			require.Equal(t, want, got, "step %d", step)
		}
	}
	for step := 0; step < 3000; step++ {
		w := rng.IntN(workers)
		switch r := rng.IntN(100); {
		case r < 40: // a system prompt, whole or a prefix of it
			sys := systems[rng.IntN(len(systems))]
			apply(w, sys[:1+rng.IntN(len(sys))], true)
		case r < 60: // a conversation after it
			apply(w, convs[rng.IntN(len(convs))], true)
		case r < 80: // evict a tail
			sys := systems[rng.IntN(len(systems))]
			apply(w, sys[rng.IntN(len(sys)):], false)
		case r < 90: // evict a block in the middle of a run
			sys := systems[rng.IntN(len(systems))]
			k := rng.IntN(len(sys))
			apply(w, sys[k:k+1], false)
		case r < 95:
			ix.RemoveWorker(name(w))
			model[w] = map[uint64]bool{}
			nextID[w] = 1
		default:
			ix.ClearStale()
		}
		if step%100 == 0 {
			check(step)
		}
	}
	check(-1)
	ix.ClearStale()
	check(-2)
}

// TestBlocksWithTheSameHoldersShareOneSet checks the point of interning:
// the 24 blocks of a system prompt cached by 20 workers cost one set, and
// the sets are freed with their last reference.
func TestBlocksWithTheSameHoldersShareOneSet(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	sys := chain(5, 24)
	for w := 0; w < 20; w++ {
		mustApply(t, ix, fmt.Sprintf("w%02d", w), 1, 1, stored(nil, sys...))
	}
	require.Equal(t, 1, ix.sets.live, "one set for the whole run")
	mustApply(t, ix, "w00", 1, 2, removed(sys[12:]...))
	require.Equal(t, 2, ix.sets.live, "the run splits in two")
	for w := 1; w < 20; w++ {
		mustApply(t, ix, fmt.Sprintf("w%02d", w), 1, 2, removed(sys...))
	}
	require.Equal(t, 0, ix.sets.live, "demoted to inline ids, no set left")
	require.Len(t, ix.Lookup(sys, nil), 1)
}

// TestLookupBeyondTheStackSetsUsesPooledScratch drives lookups whose sets
// are wider than the stack arrays (more than 4096 interned ids) twice, so
// the second reuses the first's pooled scratch, which must start clean.
func TestLookupBeyondTheStackSetsUsesPooledScratch(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 4300 })
	sys := chain(7, 4)
	for w := 0; w < 4200; w++ {
		depth := 1 + w%4
		mustApply(t, ix, fmt.Sprintf("w%04d", w), 1, 1, stored(nil, sys[:depth]...))
	}
	require.Greater(t, int(ix.words.Load()), 64)
	for range 3 {
		got := ix.Lookup(sys, nil)
		require.Len(t, got, 4200)
		for _, m := range got {
			var w int
			_, err := fmt.Sscanf(m.Worker, "w%04d", &w)
			require.NoError(t, err)
			require.Equal(t, 1+w%4, m.Blocks, m.Worker)
		}
		require.Empty(t, ix.Lookup(chain(8, 4), nil))
	}
}

// TestLookupsSeeStableHoldersWhileSharedSetsChurn runs lookups while other
// workers keep joining and leaving the same blocks, so the blocks' shared
// sets are replaced, freed and their ids reused all the time. Six workers
// hold the whole prefix throughout: every lookup must find each of them at
// full depth (a reader that read a freed or reused set would miss them).
func TestLookupsSeeStableHoldersWhileSharedSetsChurn(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	sys := chain(11, 32)
	const stable, churners = 6, 8
	for w := 0; w < stable; w++ {
		mustApply(t, ix, fmt.Sprintf("s%d", w), 1, 1, stored(nil, sys...))
	}
	done := make(chan struct{})
	errs := make(chan error, churners)
	for c := 0; c < churners; c++ {
		go func(c int) {
			rng := rand.New(rand.NewPCG(uint64(c), 7))
			id := uint64(1)
			name := fmt.Sprintf("c%d", c)
			for {
				select {
				case <-done:
					errs <- nil
					return
				default:
				}
				k := rng.IntN(len(sys))
				ev := stored(nil, sys[k:]...)
				if id%2 == 0 {
					ev = removed(sys[k:]...)
				}
				if o, err := ix.ApplyBatch(batch(name, 1, id, ev)); err != nil || o != OutcomeApplied {
					errs <- fmt.Errorf("%s: %v %w", name, o, err)
					return
				}
				id++
			}
		}(c)
	}
	for i := 0; i < 20000; i++ {
		got := map[string]int{}
		for _, m := range ix.Lookup(sys, nil) {
			got[m.Worker] = m.Blocks
		}
		for w := 0; w < stable; w++ {
			require.Equal(t, len(sys), got[fmt.Sprintf("s%d", w)], "lookup %d: %v", i, got)
		}
	}
	close(done)
	for c := 0; c < churners; c++ {
		require.NoError(t, <-errs)
	}
}
