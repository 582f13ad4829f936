package clock

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock is a source of time: the only one a component reads and waits on.
type Clock interface {
	Now() time.Time
	// NewTimer returns a one-shot timer firing after d.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a ticker firing every d (d > 0).
	NewTicker(d time.Duration) Ticker
	// After is NewTimer(d).C() for a wait that is never stopped early.
	After(d time.Duration) <-chan time.Time
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

// Ticker is a periodic timer from a Clock, like *time.Ticker: C has a
// buffer of one, and ticks a slow receiver misses are dropped.
type Ticker interface {
	C() <-chan time.Time
	Stop()
}

// Real is wall time.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer wraps time.NewTimer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker wraps time.NewTicker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

// After returns time.After(d); unreferenced timers are collected (Go ≥ 1.23).
func (Real) After(d time.Duration) <-chan time.Time { return time.After(d) }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time   { return r.t.C }
func (r realTimer) Reset(d time.Duration) { r.t.Reset(d) }
func (r realTimer) Stop() bool            { return r.t.Stop() }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time { return r.t.C }
func (r realTicker) Stop()               { r.t.Stop() }

// Fake is a manually advanced clock for tests. Timers and tickers fire (a
// non-blocking send on their size-one channel) when Advance or Set moves
// time to or past their deadline. Safe for concurrent use.
type Fake struct {
	mu     sync.Mutex
	now    time.Time
	timers []*fakeTimer // armed timers
}

// NewFake returns a fake clock reading t0.
func NewFake(t0 time.Time) *Fake { return &Fake{now: t0} }

// Now returns the fake time.
func (f *Fake) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// Advance moves time forward by d and fires the timers that became due, in
// deadline order.
func (f *Fake) Advance(d time.Duration) {
	f.mu.Lock()
	f.setLocked(f.now.Add(d))
	f.mu.Unlock()
}

// Set moves time to t (never backwards) and fires due timers.
func (f *Fake) Set(t time.Time) {
	f.mu.Lock()
	if t.After(f.now) {
		f.setLocked(t)
	}
	f.mu.Unlock()
}

func (f *Fake) setLocked(t time.Time) {
	f.now = t
	sort.Slice(f.timers, func(i, j int) bool { return f.timers[i].at.Before(f.timers[j].at) })
	kept := f.timers[:0]
	for _, tm := range f.timers {
		if tm.at.After(t) {
			kept = append(kept, tm)
			continue
		}
		select {
		case tm.c <- tm.at:
		default: // an unreceived earlier fire is still pending: one is enough
		}
		if tm.period > 0 { // a ticker: next tick after t, missed ones dropped
			tm.at = tm.at.Add(tm.period * (t.Sub(tm.at)/tm.period + 1))
			kept = append(kept, tm)
			continue
		}
		tm.armed = false
	}
	clear(f.timers[len(kept):])
	f.timers = kept
}

// Timers returns how many timers are armed: tests poll it to know that a
// component has gone to sleep before advancing time.
func (f *Fake) Timers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.timers)
}

// NextTimer returns the earliest armed timer's deadline.
func (f *Fake) NextTimer() (time.Time, bool) {
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

// Deadlines returns every armed timer's next deadline, earliest first: a
// test sees exactly when the code under test means to wake up.
func (f *Fake) Deadlines() []time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]time.Time, 0, len(f.timers))
	for _, t := range f.timers {
		out = append(out, t.at)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// NewTimer returns a timer firing at Now()+d.
func (f *Fake) NewTimer(d time.Duration) Timer {
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1)}
	t.Reset(d)
	return t
}

// NewTicker returns a ticker firing every d from Now().
func (f *Fake) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	t := &fakeTimer{clock: f, c: make(chan time.Time, 1), period: d}
	t.Reset(d)
	return fakeTicker{t}
}

// After returns the channel of a new timer firing at Now()+d.
func (f *Fake) After(d time.Duration) <-chan time.Time { return f.NewTimer(d).C() }

type fakeTicker struct{ t *fakeTimer }

func (t fakeTicker) C() <-chan time.Time { return t.t.c }
func (t fakeTicker) Stop()               { t.t.Stop() }

type fakeTimer struct {
	clock  *Fake
	c      chan time.Time
	at     time.Time
	armed  bool
	period time.Duration // a ticker's interval; zero for a timer
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

// SleepUntil blocks until c reaches t or ctx is done, returning ctx.Err() in
// the latter case. A t that is not in c's future returns at once. The wait
// is armed as a duration from c.Now(): on a Fake that another goroutine
// advances concurrently, the timer may land past t by that advance, so a
// test should advance only once the sleeper's deadline shows in Deadlines
// (as bench's runner tests do).
func SleepUntil(ctx context.Context, c Clock, t time.Time) error {
	d := t.Sub(c.Now())
	if d <= 0 {
		return ctx.Err()
	}
	tm := c.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C():
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
