package kvindex

import "time"

// Clock is the index's view of time: predicted entries expire by Now, and the
// subscriber's sweep and dump-retry loops wait with After. Tests pass a fake.
type Clock interface {
	Now() time.Time
	After(d time.Duration) <-chan time.Time
}

// RealClock is the wall clock.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// After returns time.After(d); unreferenced timers are collected (Go ≥ 1.23).
func (RealClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
