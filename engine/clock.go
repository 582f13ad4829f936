package engine

import "time"

// Clock is the engine's view of time: Submit stamps arrivals with Now, and
// Run waits with After. A simulator passes a virtual clock and never calls
// Run.
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
