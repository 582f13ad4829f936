package kvindex

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestShardTableAgreesWithAMapUnderRandomOperations drives one shard through
// growth, promotions to bitsets, demotions, backward-shift deletions that
// wrap around the table's end, and whole-worker clears, checking every key
// against a map model as it goes.
func TestShardTableAgreesWithAMapUnderRandomOperations(t *testing.T) {
	var s shard
	s.init(newSetStore(2)) // ids below 128
	rng := rand.New(rand.NewPCG(3, 4))
	keys := chain(77, 2000)
	model := map[uint64]map[uint16]bool{}
	check := func(step int) {
		out := make([]uint64, 2)
		for _, h := range keys {
			present := s.readInto(h, out, nil, 0, 1)
			require.Equal(t, len(model[h]) > 0, present, "step %d: presence of %x", step, h)
			want := make([]uint64, 2)
			for id, ok := range model[h] {
				if ok {
					want[id/64] |= 1 << (id % 64)
				}
			}
			require.Equal(t, want, out, "step %d: workers of %x", step, h)
		}
		n := 0
		for _, ws := range model {
			if len(ws) > 0 {
				n++
			}
		}
		require.Equal(t, n, s.count, "step %d: occupied slots", step)
	}
	for step := 0; step < 40000; step++ {
		h := keys[rng.IntN(len(keys))]
		id := uint16(1 + rng.IntN(12))
		if rng.IntN(4) == 0 {
			id = uint16(1 + rng.IntN(127))
		}
		switch r := rng.IntN(1000); {
		case r == 0:
			want := 0
			for _, ws := range model {
				if ws[id] {
					delete(ws, id)
					want++
				}
			}
			s.mu.Lock()
			require.Equal(t, want, s.clearLocked(id), "step %d: clear worker %d", step, id)
			s.mu.Unlock()
		case r < 450:
			s.mu.Lock()
			require.Equal(t, model[h][id], s.removeLocked(h, id), "step %d: remove", step)
			s.mu.Unlock()
			delete(model[h], id)
		default:
			s.mu.Lock()
			require.Equal(t, !model[h][id], s.addLocked(h, id), "step %d: add", step)
			s.mu.Unlock()
			if model[h] == nil {
				model[h] = map[uint16]bool{}
			}
			model[h][id] = true
		}
		if step%8000 == 0 {
			check(step)
		}
	}
	check(-1)
}

// keysHomedAt returns n keys of chain seed whose home line in a table of
// size slots starts at slot want.
func keysHomedAt(seed uint64, size, want, n int) []uint64 {
	var out []uint64
	for _, h := range chain(seed, 1<<16) {
		if home(h, size) == want {
			if out = append(out, h); len(out) == n {
				break
			}
		}
	}
	return out
}

// TestGetFindsKeysPushedPastTheirHomeLineAndAcrossTheTableEnd fills the last
// line of a table with more keys than it holds, so some wrap to slot 0, and
// checks the readers' branch-free probe against the writers' find for every
// key, for absent keys with the same home, and for the hash 0, which equals
// an empty slot's key.
func TestGetFindsKeysPushedPastTheirHomeLineAndAcrossTheTableEnd(t *testing.T) {
	var s shard
	s.init(newSetStore(1))
	size := len(s.tab.Load().slots)
	last := size - lineSlots
	keys := keysHomedAt(5, size, last, 9)
	require.Len(t, keys, 9)
	present, absent := keys[:6], keys[6:]
	s.mu.Lock()
	for i, h := range present {
		require.True(t, s.addLocked(h, uint16(1+i)))
	}
	require.Equal(t, size, len(s.tab.Load().slots), "the table must not have grown, or homes moved")
	tab := s.tab.Load()
	wrapped := 0
	for i, h := range present {
		j, ok := tab.find(h)
		require.True(t, ok)
		if j < last {
			wrapped++
		}
		require.Equal(t, uint64(1+i), tab.get(h), "key %d at slot %d", i, j)
	}
	require.Equal(t, 2, wrapped, "two of six keys homed on the last line wrap to the table's start")
	for _, h := range absent {
		require.Zero(t, tab.get(h))
	}

	require.Zero(t, tab.get(0), "hash 0 is absent: empty slots' zero keys must not make it present")
	require.True(t, s.addLocked(0, 9))
	require.Equal(t, uint64(9), s.tab.Load().get(0))
	require.True(t, s.removeLocked(0, 9))
	require.Zero(t, s.tab.Load().get(0))
	s.mu.Unlock()
}

// TestLaneHoldsAgreesWithComparingEachLane checks the word-parallel lane
// test against a loop over the lanes, on lane values at the edges of the
// borrow trick (1, 0x7FFF, 0x8000, 0xFFFE, neighbours of the id) and random
// ones.
func TestLaneHoldsAgreesWithComparingEachLane(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 9))
	edges := []uint16{0, 1, 2, 0x7FFF, 0x8000, 0x8001, 0xFFFE}
	naive := func(v uint64, id uint16) bool {
		for l := 0; l < lanes; l++ {
			if uint16(v>>(16*l)) == id {
				return true
			}
		}
		return false
	}
	for i := 0; i < 200000; i++ {
		id := uint16(1 + rng.IntN(maxWorkerID))
		if i%3 == 0 {
			id = edges[1+rng.IntN(len(edges)-1)]
		}
		var v uint64
		for l := 0; l < lanes; l++ {
			var x uint16
			switch rng.IntN(4) {
			case 0:
				x = edges[rng.IntN(len(edges))]
			case 1:
				x = id + uint16(rng.IntN(3)) - 1
			default:
				x = uint16(rng.Uint32())
			}
			v |= uint64(x) << (16 * l)
		}
		require.Equal(t, naive(v, id), laneHolds(v, id), "v=%016x id=%04x", v, id)
	}
}

// TestHoldingReportsEachOfAFewWorkersForInlineAndBitsetSets checks the
// narrow lookup step on a hash held inline by three workers and on one held
// by seven (a bitset), for every subset of four query workers.
func TestHoldingReportsEachOfAFewWorkersForInlineAndBitsetSets(t *testing.T) {
	var s shard
	s.init(newSetStore(2))
	inline, big := chain(6, 2)[0], chain(6, 2)[1]
	holders := map[uint64][]uint16{inline: {3, 70, 100}, big: {1, 3, 64, 65, 70, 99, 127}}
	s.mu.Lock()
	for h, ids := range holders {
		for _, id := range ids {
			s.addLocked(h, id)
		}
	}
	s.mu.Unlock()
	require.False(t, isBig(s.tab.Load().get(inline)))
	require.True(t, isBig(s.tab.Load().get(big)))
	query := [lanes]uint16{3, 64, 100, 126}
	for h, ids := range holders {
		for n := 1; n <= lanes; n++ {
			var want uint8
			for k := 0; k < n; k++ {
				for _, id := range ids {
					if id == query[k] {
						want |= 1 << k
					}
				}
			}
			require.Equal(t, want, s.holding(h, &query, n), "hash %x, first %d query workers", h, n)
		}
	}
	require.Zero(t, s.holding(chain(7, 1)[0], &query, lanes), "an absent hash is held by none")
}
