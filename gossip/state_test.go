package gossip

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// randomState draws a state over a small key space, so that random states
// overlap, tie on versions and hit floors often.
func randomState(r *rand.Rand) State {
	var s State
	for o := range 3 {
		origin := fmt.Sprintf("o%d", o)
		if r.IntN(4) == 0 {
			s.setFloor(origin, uint64(r.IntN(6)))
		}
		for w := range 4 {
			if r.IntN(2) == 0 {
				continue
			}
			if s.Origins == nil {
				s.Origins = map[string]map[string]Entry{}
			}
			if s.Origins[origin] == nil {
				s.Origins[origin] = map[string]Entry{}
			}
			s.Origins[origin][fmt.Sprintf("w%d", w)] = Entry{
				Version: uint64(r.IntN(8)),
				Load:    WorkerLoad{ActiveRequests: r.IntN(3), PrefillTokens: r.IntN(3), DecodeBlocks: r.IntN(2)},
				Digest:  Digest{LastEventID: uint64(r.IntN(2)), Blocks: r.IntN(2)},
				Health:  Health{SuspectSince: int64(r.IntN(2)), RecoveredAt: int64(r.IntN(2))},
			}
		}
	}
	return s
}

func TestMergeIsIdempotentCommutativeAndAssociative(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 5000 {
		a, b, c := randomState(r), randomState(r), randomState(r)
		require.Truef(t, Merge(a, a).Equal(a), "case %d: idempotent: a ⊔ a = a\na=%+v", i, a)
		require.Truef(t, Merge(a, b).Equal(Merge(b, a)), "case %d: commutative\na=%+v\nb=%+v", i, a, b)
		require.Truef(t, Merge(Merge(a, b), c).Equal(Merge(a, Merge(b, c))), "case %d: associative\na=%+v\nb=%+v\nc=%+v", i, a, b, c)
		require.Truef(t, Merge(a, State{}).Equal(a), "case %d: the empty state is the identity", i)
	}
}

func TestMergeDoesNotModifyItsArguments(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		a, b := randomState(r), randomState(r)
		ac, bc := a.clone(), b.clone()
		_ = Merge(a, b)
		require.True(t, a.Equal(ac))
		require.True(t, b.Equal(bc))
	}
}

func TestMergeKeepsTheNewestVersionPerOriginAndWorker(t *testing.T) {
	older := State{Origins: map[string]map[string]Entry{
		"a": {"w1": {Version: 5, Load: WorkerLoad{ActiveRequests: 9}}, "w2": {Version: 5, Load: WorkerLoad{ActiveRequests: 2}}},
	}}
	newer := State{Origins: map[string]map[string]Entry{
		"a": {"w1": {Version: 6, Load: WorkerLoad{ActiveRequests: 1}}},
		"b": {"w1": {Version: 1, Load: WorkerLoad{ActiveRequests: 4}}},
	}}
	got := Merge(older, newer)
	require.Equal(t, 1, got.Origins["a"]["w1"].Load.ActiveRequests, "newer version of a/w1 wins")
	require.Equal(t, 2, got.Origins["a"]["w2"].Load.ActiveRequests, "a/w2, untouched by the newer state, stays")
	require.Equal(t, 4, got.Origins["b"]["w1"].Load.ActiveRequests, "b's entry is independent of a's versions")
	require.True(t, Merge(newer, older).Equal(got))
}

func TestFloorRemovesAnOriginsEntriesAndLateCopiesStayRemoved(t *testing.T) {
	live := State{Origins: map[string]map[string]Entry{
		"dead": {"w1": {Version: 7, Load: WorkerLoad{ActiveRequests: 3}}},
		"live": {"w1": {Version: 2, Load: WorkerLoad{ActiveRequests: 1}}},
	}}
	removal := State{Floors: map[string]uint64{"dead": 7}}
	got := Merge(live, removal)
	require.NotContains(t, got.Origins, "dead")
	require.Contains(t, got.Origins, "live")

	lateCopy := State{Origins: map[string]map[string]Entry{"dead": {"w1": {Version: 7, Load: WorkerLoad{ActiveRequests: 3}}}}}
	require.NotContains(t, Merge(got, lateCopy).Origins, "dead", "a delayed copy at or below the floor is not resurrected")

	rejoined := State{Origins: map[string]map[string]Entry{"dead": {"w1": {Version: 8, Load: WorkerLoad{ActiveRequests: 1}}}}}
	require.Equal(t, 1, Merge(got, rejoined).Origins["dead"]["w1"].Load.ActiveRequests, "a newer version above the floor is accepted")
}

func TestJoinReportsExactlyTheEntriesItChanged(t *testing.T) {
	s := State{Origins: map[string]map[string]Entry{"a": {"w1": {Version: 3}, "w2": {Version: 3}}}}
	var changed []string
	s.join(State{Origins: map[string]map[string]Entry{"a": {"w1": {Version: 2}, "w2": {Version: 4}, "w3": {Version: 1}}}},
		func(o, w string, _ Entry, ok bool) {
			require.True(t, ok)
			changed = append(changed, o+"/"+w)
		})
	require.ElementsMatch(t, []string{"a/w2", "a/w3"}, changed)
}
