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
	s.init(2) // ids below 128
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
