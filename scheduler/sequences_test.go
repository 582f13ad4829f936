package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestARequestOfSeveralSequencesCountsEachAsARunningRequest(t *testing.T) {
	h := newHarness(t, workers(1, 4), classCfg("c", PolicyFCFS))
	r := req("n4", "c", 32)
	r.Sequences, r.ExpectedOutputTokens = 4, 4*16
	h.enqueue(r)
	g := h.granted("n4")
	require.Equal(t, 4, h.core.Load("w0").ActiveRequests, "n=4 runs four sequences")
	h.enqueue(req("next", "c", 32))
	h.pending("next") // MaxRunning 4 is full

	rec, ok := h.core.Booking(g.Booking)
	require.True(t, ok)
	require.Equal(t, 4, rec.Sequences)
	moved := newHarness(t, workers(1, 4), classCfg("c", PolicyFCFS))
	id := moved.core.Adopt(rec)
	require.Equal(t, 4, moved.core.Load("w0").ActiveRequests, "an adopted booking keeps its sequences")
	moved.core.Finish(id)
	require.Zero(t, moved.core.Load("w0").ActiveRequests)

	h.core.Finish(g.Booking)
	h.granted("next")
	require.Equal(t, 1, h.core.Load("w0").ActiveRequests)
}

func TestTheTokensBucketIsChargedTheOutputBoundNotTheBookedOutput(t *testing.T) {
	h := newHarness(t, workers(1, 100), classCfg("c", PolicyFCFS))
	q := TenantQuota{TokensPerMinute: 1000}
	// Booked 10 output tokens each (a default), but each may produce 800:
	// the second does not fit in what the first left.
	a := tenantReq("a", "c", "acme", 1, 100, q)
	a.ExpectedOutputTokens, a.OutputBound = 10, 800
	h.enqueue(a)
	h.granted("a")
	b := tenantReq("b", "c", "acme", 1, 100, q)
	b.ExpectedOutputTokens, b.OutputBound = 10, 800
	h.enqueue(b)
	require.Equal(t, LimitTenantTokensPerMinute, h.rejected("b", ErrQuotaExceeded).Limit)
}
