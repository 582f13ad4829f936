package admission

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

func TestARemoteGrantCarriesTheOwnersRoutingQualityFigures(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	h.start("a", nil)
	b := h.start("b", nil)
	h.own("gold", "a", 7) // b is the entry, a the owner: the grant crosses NATS

	r := request("gold", 0)
	// Some worker holds 3 of the 4 blocks; pinning to another one forbids it.
	holder, other := "w0", "w1"
	r.Overlaps = []scheduler.Overlap{{Worker: holder, Blocks: 3}}
	r.Pinned = other
	tk, err := b.client.Admit(testenv.Context(t), r)
	require.NoError(t, err)
	g := tk.Grant()
	require.Equal(t, other, g.Worker)
	require.Positive(t, g.ReachableTokens)
	require.Zero(t, g.CachedTokens)
	require.Equal(t, scheduler.ShortfallPinned, g.Shortfall)
	require.Positive(t, g.PredictedTTFT, "the default TTFT selector predicts")
	require.Len(t, g.CandidateList(), 2, "the winner and the holder, for the operators' page")
	require.Equal(t, scheduler.GrantCandidate{Worker: other, PredictedTTFT: g.PredictedTTFT}, g.Candidates[0])
	require.Equal(t, holder, g.Candidates[1].Worker)
	require.Equal(t, g.ReachableTokens, g.Candidates[1].CachedTokens)
	require.Positive(t, g.Candidates[1].PredictedTTFT)
	tk.Dispatched()
	tk.Finish(false)
}
