package bench

import (
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func arrivals(t *testing.T, src Source) []time.Duration {
	t.Helper()
	reqs, err := ReadAll(src, 0)
	require.NoError(t, err)
	out := make([]time.Duration, len(reqs))
	for i, r := range reqs {
		require.Equal(t, i, r.Index, "order is kept")
		out[i] = r.Arrival
	}
	return out
}

func stamped(at ...time.Duration) []TraceRequest {
	reqs := make([]TraceRequest, len(at))
	for i, a := range at {
		reqs[i] = TraceRequest{Index: i, Arrival: a}
	}
	return reqs
}

func TestSpreadArrivalsSpacesEachStepEvenlyOverTheWindow(t *testing.T) {
	s := time.Second
	src := &SpreadArrivals{Src: NewSliceSource(stamped(0, 0, 0, 0, 3*s, 6*s, 6*s)), Window: 3 * s}
	require.Equal(t, []time.Duration{0, 750 * time.Millisecond, 1500 * time.Millisecond, 2250 * time.Millisecond,
		3 * s, 6 * s, 7500 * time.Millisecond}, arrivals(t, src))
}

func TestSpreadArrivalsWithoutAWindowChangesNothing(t *testing.T) {
	at := []time.Duration{0, 0, time.Second, time.Second}
	require.Equal(t, at, arrivals(t, &SpreadArrivals{Src: NewSliceSource(stamped(at...))}))
}

// errAfter yields reqs, then err.
type errAfter struct {
	reqs []TraceRequest
	err  error
}

func (e *errAfter) Next() (TraceRequest, error) {
	if len(e.reqs) == 0 {
		return TraceRequest{}, e.err
	}
	r := e.reqs[0]
	e.reqs = e.reqs[1:]
	return r, nil
}

func TestSpreadArrivalsHandsOutTheBufferedStepBeforeTheSourcesError(t *testing.T) {
	bad := errors.New("line 4: bad record")
	src := &SpreadArrivals{Src: &errAfter{reqs: stamped(0, 0, 0), err: bad}, Window: 3 * time.Second}
	for i := range 3 {
		r, err := src.Next()
		require.NoError(t, err)
		require.Equal(t, time.Duration(i)*time.Second, r.Arrival)
	}
	_, err := src.Next()
	require.ErrorIs(t, err, bad)
	_, err = src.Next()
	require.ErrorIs(t, err, bad, "the error stays")
	_, err = (&SpreadArrivals{Src: NewSliceSource(nil), Window: time.Second}).Next()
	require.ErrorIs(t, err, io.EOF)
}

func TestArrivalSpreadMustNotBeNegative(t *testing.T) {
	o := DefaultOptions()
	o.ArrivalSpread = -time.Second
	require.ErrorIs(t, o.Validate(), ErrInvalidConfig)
}
