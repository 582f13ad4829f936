package cluster

import (
	"fmt"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

func replicaIDs(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("replica-%d", i)
	}
	return out
}

func TestPlacementIsDeterministicAndIgnoresCandidateOrder(t *testing.T) {
	reps := replicaIDs(5)
	reversed := slices.Clone(reps)
	slices.Reverse(reversed)
	for _, c := range classNames(50) {
		p := Place(c, reps)
		require.Contains(t, reps, p)
		require.Equal(t, p, Place(c, reversed), "class %s", c)
		for _, r := range reps {
			require.LessOrEqual(t, Score(c, r), Score(c, p), "the winner has the highest score")
		}
	}
	require.Equal(t, "", Place("c", nil), "no candidates, no owner")
}

func TestAddingAReplicaMovesOnlyTheClassesItWins(t *testing.T) {
	classes := classNames(64)
	before := replicaIDs(4)
	after := append(slices.Clone(before), "newcomer")
	moved := 0
	for _, c := range classes {
		old, cur := Place(c, before), Place(c, after)
		if old != cur {
			moved++
			require.Equal(t, "newcomer", cur, "class %s moved between two old replicas", c)
		}
	}
	require.Positive(t, moved, "the newcomer wins some classes")
	require.Less(t, moved, len(classes)/2, "a fifth replica takes about a fifth of the classes")
}

func TestPlacementSpreadsClassesOverAllReplicas(t *testing.T) {
	count := map[string]int{}
	for _, c := range classNames(64) {
		count[Place(c, replicaIDs(8))]++
	}
	require.Len(t, count, 8, "every replica owns something")
	for r, n := range count {
		require.LessOrEqual(t, n, 20, "replica %s owns %d of 64 classes", r, n)
	}
}

func BenchmarkRendezvous(b *testing.B) {
	for _, size := range []struct{ classes, replicas int }{{64, 8}, {64, 32}} {
		b.Run(fmt.Sprintf("classes=%d/replicas=%d", size.classes, size.replicas), func(b *testing.B) {
			classes, reps := classNames(size.classes), replicaIDs(size.replicas)
			b.ReportAllocs()
			for b.Loop() {
				for _, c := range classes {
					_ = Place(c, reps)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size.classes), "ns/class")
		})
	}
}
