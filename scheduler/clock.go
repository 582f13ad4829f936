package scheduler

import (
	"sort"
	"sync"
	"time"
)

// RealClock is wall time.
type RealClock struct{}

// Now returns time.Now().
func (RealClock) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (RealClock) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop() bool            { return r.t.Stop() }

// FakeClock is a manually advanced clock for tests and the simulator. Timers
// fire (a non-blocking send on their size-one channel) when Advance or Set
// moves time to or past their deadline. Safe for concurrent use.
type FakeClock struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer // armed timers
}

// NewFakeClock returns a fake clock reading t0.
func NewFakeClock(t0 time.Time) *FakeClock { return &FakeClock{now: t0} }

// Now returns the fake time.
func (f *FakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves time forward by d and fires the timers that became due, in
// deadline order.
func (f *FakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	f.setLocked(f.now.Add(d))
	f.mu.Unlock()
}

// Set moves time to t (never backwards) and fires due timers.
func (f *FakeClock) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.setLocked(t)
	}
	f.mu.Unlock()
}

func (f *FakeClock) setLocked(t time.Time) {
	f.now = t
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	kept := f.timers[:0]
	for _, tm := range f.timers {
		if tm.at.After(t) {
			kept = append(kept, tm)
			continue
		}
		tm.armed = false
		select {
		case tm.c <- tm.at:
		default: // an unreceived earlier fire is still pending: one is enough
		}
	}
	clear(f.timers[len(kept):])
	f.timers = kept
}

// Timers returns how many timers are armed: tests poll it to know that a
// component has gone to sleep before advancing time.
func (f *FakeClock) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextTimer returns the earliest armed timer's deadline.
func (f *FakeClock) NextTimer() (time.Time, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.timers) == 0 {
		return time.Time{}, false
	}
	at := f.timers[0].at
	for _, t := range f.timers[1:] {
		if t.at.Before(at) {
			at = t.at
		}
	}
	return at, true
}

// NewTimer returns a timer firing at Now()+d.
func (f *FakeClock) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

type fakeTimer struct {
	clock *FakeClock
	c     chan time.Time
	at    time.Time
	armed bool
}

func (t *fakeTimer) C() <-chan time.Time { return t.c }

func (t *fakeTimer) Reset(d time.Duration) {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	t.disarmLocked()
	select { // Go 1.23 semantics: a stale fire is not delivered after Reset
	case <-t.c:
	default:
	}
	t.at = f.now.Add(d)
	if d <= 0 {
		t.c <- t.at
		return
	}
	t.armed = true
	f.timers = append(f.timers, t)
}

func (t *fakeTimer) Stop() bool {
	f := t.clock
	f.mu.Lock()
	defer f.mu.Unlock()
	was := t.armed
	t.disarmLocked()
	select {
	case <-t.c:
	default:
	}
	return was
}

func (t *fakeTimer) disarmLocked() {
	if !t.armed {
		return
	}
	t.armed = false
	f := t.clock
	for i, x := range f.timers {
		if x == t {
			f.timers = append(f.timers[:i], f.timers[i+1:]...)
			return
		}
	}
}
