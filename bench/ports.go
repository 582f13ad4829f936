package bench

import (
	"context"
	"time"
)

// Clock is the time source of the live runner: pacing, progress refreshes
// and latency measurements all read it, so tests can drive a run with a fake
// clock. Per-request timeouts are the one exception: they are network
// deadlines and use the context's wall-clock deadline.
type Clock interface {
	Now() time.Time
	// SleepUntil blocks until the clock reaches t or ctx is done, returning
	// ctx.Err() in the latter case. A t in the past returns at once.
	SleepUntil(ctx context.Context, t time.Time) error
}

// WallClock is the real clock.
type WallClock struct{}

// Now implements Clock.
func (WallClock) Now() time.Time { return time.Now() }

// SleepUntil implements Clock.
func (WallClock) SleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
