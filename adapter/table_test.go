package adapter

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTheTableAgreesWithAGoMapOverRandomInsertsUpdatesAndDeletes(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var tb table[uint32]
	ref := map[uint64]uint32{}
	// A small key space makes long probe runs, wraparound and key 0 common.
	key := func() uint64 {
		switch rng.IntN(10) {
		case 0:
			return 0
		case 1:
			return rng.Uint64()
		}
		return uint64(rng.IntN(3000)) << uint(rng.IntN(3)*20)
	}
	for op := 0; op < 300000; op++ {
		k := key()
		switch rng.IntN(4) {
		case 0, 1:
			s, existed := tb.upsert(k)
			_, had := ref[k]
			require.Equal(t, had, existed, "op %d key %d", op, k)
			*tb.at(s)++
			ref[k]++
		case 2:
			_, had := ref[k]
			require.Equal(t, had, tb.delete(k), "op %d key %d", op, k)
			delete(ref, k)
		case 3:
			v, ok := tb.get(k)
			rv, rok := ref[k]
			require.Equal(t, rok, ok)
			require.Equal(t, rv, v)
		}
		if op%50000 == 0 {
			require.Equal(t, len(ref), tb.Len())
			seen := map[uint64]uint32{}
			tb.each(func(k uint64, v uint32) { seen[k] = v })
			require.Equal(t, ref, seen)
		}
	}
	require.Equal(t, len(ref), tb.Len())
	tb.clear()
	require.Equal(t, 0, tb.Len())
	_, ok := tb.get(0)
	require.False(t, ok)
}
