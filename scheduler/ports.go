package scheduler

import "time"

// Clock is the scheduler's only source of time. The Core reads Now; the
// Actor also sleeps on timers. RealClock is wall time; FakeClock is driven by
// tests and the simulator.
type Clock interface {
	Now() time.Time
	NewTimer(d time.Duration) Timer
}

// Timer is a one-shot timer from a Clock, like *time.Timer.
type Timer interface {
	// C delivers the fire time once the timer expires. It has a buffer of one.
	C() <-chan time.Time
	// Reset re-arms the timer to fire after d. Like time.Timer (Go 1.23+), a
	// value not yet received from C is discarded.
	Reset(d time.Duration)
	// Stop disarms the timer; it reports whether it was armed.
	Stop() bool
}

// LoadView reports the load other replicas have booked on a worker (their
// gossiped ledgers). The selector adds it to the local ledger. It is called
// on the admission hot path, once per candidate worker: it must be cheap,
// non-blocking and safe for use from the actor goroutine.
type LoadView interface {
	RemoteLoad(worker string) WorkerLoad
}

// VersionedLoadView is a LoadView whose content changes in discrete updates
// (gossip rounds). When the LoadView also implements it, the Core caches every
// worker's remote load and calls RemoteLoad again only after LoadVersion
// changes, so a selection over 1000 workers costs no interface calls.
type VersionedLoadView interface {
	LoadView
	// LoadVersion changes (e.g. increments) whenever any RemoteLoad answer may
	// have changed.
	LoadVersion() uint64
}
