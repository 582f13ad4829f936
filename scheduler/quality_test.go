package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// prefixRequest is a 640-token prompt of 40 blocks that w1 holds 30 blocks
// of and w0 none.
func prefixRequest(id string) *Request {
	r := req(id, "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w1", Blocks: 30}}
	return r
}

func TestAGrantOnTheDeepestPrefixReachesWhatWasReachable(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	h.enqueue(prefixRequest("r"))
	g := h.granted("r")
	require.Equal(t, "w1", g.Worker)
	require.Equal(t, 480, g.ReachableTokens)
	require.Equal(t, 480, g.CachedTokens)
	require.Equal(t, ShortfallNone, g.Shortfall)
	require.Positive(t, g.PredictedTTFT, "the TTFT selector's prediction travels with the grant")
}

func TestAWorkerAtItsCapMakesTheGrantFallShortForCap(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyFCFS))
	h.remote["w1"] = WorkerLoad{ActiveRequests: 1} // another replica's booking fills w1
	h.enqueue(prefixRequest("r"))
	g := h.granted("r")
	require.Equal(t, "w0", g.Worker)
	require.Equal(t, 480, g.ReachableTokens)
	require.Zero(t, g.CachedTokens)
	require.Equal(t, ShortfallCap, g.Shortfall)
}

func TestAHeavilyLoadedHolderMakesTheGrantFallShortForLoad(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	h.remote["w1"] = WorkerLoad{ActiveRequests: 8, PrefillTokens: 60000, DecodeBlocks: 900}
	h.enqueue(prefixRequest("r"))
	g := h.granted("r")
	require.Equal(t, "w0", g.Worker)
	require.Equal(t, ShortfallLoad, g.Shortfall)
}

func TestConstraintsNameThemselvesAsTheShortfall(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	pinned := prefixRequest("pinned")
	pinned.Pinned = "w0"
	h.enqueue(pinned)
	require.Equal(t, ShortfallPinned, h.granted("pinned").Shortfall)
	allowed := prefixRequest("allowed")
	allowed.Allowed = []string{"w0"}
	h.enqueue(allowed)
	g := h.granted("allowed")
	require.Equal(t, ShortfallAllowed, g.Shortfall)
	require.Equal(t, 480, g.ReachableTokens)
}

func TestShortfallLabelsRoundTrip(t *testing.T) {
	for _, s := range append([]Shortfall{ShortfallNone}, Shortfalls...) {
		got, err := ParseShortfall(s.String())
		require.NoError(t, err)
		require.Equal(t, s, got)
	}
	_, err := ParseShortfall("bogus")
	require.ErrorIs(t, err, ErrInvalidConfig)
}
