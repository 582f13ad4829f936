package frontend

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestABodyDeadlineBeyondADayIsABadRequestLikeTheHeaderForm(t *testing.T) {
	for _, ms := range []int64{
		18446744073710,                           // overflowed to a 448 µs deadline before
		int64(24*time.Hour/time.Millisecond) + 1, // just past the bound
		1<<63 - 1,
	} {
		_, apiErr := parseHints(&hintBody{DeadlineMS: ptr(ms)}, http.Header{})
		require.NotNil(t, apiErr, "deadline_ms %d must be rejected, not turned into a deadline", ms)
		require.Equal(t, http.StatusBadRequest, apiErr.Status)
		require.Equal(t, "switchyard.deadline_ms", apiErr.Param)
		require.ErrorIs(t, apiErr.err, ErrBadRequest)
	}
	got, apiErr := parseHints(&hintBody{DeadlineMS: ptr(int64(24 * time.Hour / time.Millisecond))}, http.Header{})
	require.Nil(t, apiErr, "exactly 24 h is allowed")
	require.Equal(t, 24*time.Hour, *got.deadline)
}
