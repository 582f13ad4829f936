package frontend

import (
	"context"
	"testing"
	"time"
)

// BenchmarkFirstByteGuard is what the first-byte timeout adds to every
// attempt that gets its first byte: arming the timer over a child context,
// the arrival, the release, and the success check against the suspicion
// (a worker nobody suspects: the common case).
func BenchmarkFirstByteGuard(b *testing.B) {
	ctx := context.Background()
	s := &suspicion{after: 2, port: &suspectsRecorder{}}
	s.timedOut("other") // a streak on another worker: the map is not empty
	b.ReportAllocs()
	for b.Loop() {
		fb, _ := startFirstByte(ctx, 10*time.Second)
		if !fb.arrived() {
			b.Fatal("the timer fired")
		}
		s.succeeded("w1")
		fb.stop()
	}
}
