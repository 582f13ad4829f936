package admission

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestCancelledAttemptsAreForgottenAfterTheirMemory(t *testing.T) {
	var c cancelledAttempts
	t0 := time.Unix(1000, 0)
	c.add("r1", 0, t0)
	c.add("r2", 1, t0.Add(time.Minute))
	require.True(t, c.has("r1", 0))
	require.False(t, c.has("r1", 1), "another attempt of the same request was not cancelled")
	c.add("r3", 0, t0.Add(cancelMemory))
	require.False(t, c.has("r1", 0), "kept past its memory")
	require.True(t, c.has("r2", 1))
	require.Equal(t, 2, c.len())
	c.add("r2", 1, t0.Add(cancelMemory+30*time.Second)) // cancelled again: still remembered from the first time
	c.add("r4", 0, t0.Add(cancelMemory+2*time.Minute))
	require.False(t, c.has("r2", 1))
	require.False(t, c.has("r3", 0))
	require.True(t, c.has("r4", 0))
	require.Equal(t, 1, c.len())
}

// BenchmarkGrantCancelledCheck is the check every grant now makes on the
// actor's turn, with nothing remembered (the baseline) and with 100,000
// cancels remembered (about 800 cancels a second over cancelMemory).
func BenchmarkGrantCancelledCheck(b *testing.B) {
	for _, n := range []int{0, 100_000} {
		b.Run("remembered="+strconv.Itoa(n), func(b *testing.B) {
			var c cancelledAttempts
			now := time.Now()
			for i := range n {
				c.add("req-"+strconv.Itoa(i), 0, now)
			}
			b.ResetTimer()
			for i := 0; b.Loop(); i++ {
				if c.has("req-live", i&7) {
					b.Fatal("not cancelled")
				}
			}
		})
	}
}
