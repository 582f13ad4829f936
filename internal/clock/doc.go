// Package clock is the one time abstraction every component takes: Clock
// (Now, timers, tickers), Real for wall time and Fake for tests. Anything
// that waits or reads the time takes a Clock, so tests advance a Fake
// instead of sleeping. The simulator (bench) implements Clock in virtual
// time.
//
// It imports nothing of ours, so the I/O-free core packages (scheduler,
// kvindex) and the leaf packages may use it.
//
// Concurrency: Real and Fake are safe for concurrent use.
package clock
