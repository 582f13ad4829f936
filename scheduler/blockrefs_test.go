package scheduler

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestBlockRefsAgreesWithAMapUnderRandomAddsAndRemoves(t *testing.T) {
	for seed := range uint64(30) {
		rng := rand.New(rand.NewPCG(seed, 3))
		var s blockRefs
		ref := map[uint64]int32{}
		// few distinct keys, including 0 and keys colliding in their low bits
		key := func() uint64 {
			switch rng.IntN(4) {
			case 0:
				return uint64(rng.IntN(3))
			case 1:
				return uint64(rng.IntN(64)) << 40
			default:
				return uint64(rng.IntN(500))
			}
		}
		for range 5000 {
			k := key()
			if rng.IntN(2) == 0 {
				s.inc(k)
				ref[k]++
			} else {
				s.dec(k)
				if ref[k] > 1 {
					ref[k]--
				} else {
					delete(ref, k)
				}
			}
			require.Equal(t, len(ref), s.count(), "seed %d", seed)
		}
		for k := range uint64(600) {
			_, want := ref[k]
			require.Equal(t, want, s.has(k), "seed %d key %d", seed, k)
			_, want = ref[k<<40]
			require.Equal(t, want, s.has(k<<40), "seed %d key %d<<40", seed, k)
		}
		for k, n := range ref {
			for range n {
				s.dec(k)
			}
		}
		require.Zero(t, s.count(), "seed %d: every reference released", seed)
	}
}

func TestALedgerWhoseLastBookingLeavesHoldsNoBlocksAndTakesNewOnes(t *testing.T) {
	var l workerLedger
	a := &booking{hashes: seqHashes(1, 100), prefill: 10, private: 3}
	b := &booking{hashes: seqHashes(1, 40), prefill: 5, private: 2}
	l.add(a)
	l.add(b)
	l.remove(a)
	require.Equal(t, 40, l.refs.count(), "the remaining booking's blocks stay")
	require.True(t, l.refs.has(seqHashes(1, 40)[39]))
	l.remove(b) // the last one: the table is cleared at once
	require.Equal(t, WorkerLoad{}, l.load())
	require.False(t, l.refs.has(seqHashes(1, 1)[0]))
	c := &booking{hashes: seqHashes(2, 30)}
	l.add(c)
	require.Equal(t, 30, l.refs.count())
	require.True(t, l.refs.has(seqHashes(2, 30)[29]))
	require.False(t, l.refs.has(seqHashes(1, 40)[39]))
}
