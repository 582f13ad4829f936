package bench

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// sharedTrace returns the path of a public trace in ../shared/traces next to
// the module root, or skips the test when the traces are not checked out.
func sharedTrace(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skipf("module root (go.mod) not found above the test directory; cannot locate ../shared/traces/%s", name)
		}
		dir = parent
	}
	path := filepath.Join(dir, "..", "shared", "traces", name)
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("public trace %s not present (%v); the testdata readers tests cover the format", path, err)
	}
	return path
}

// fakeClock is a manually advanced Clock. Waiters are exposed so tests can
// see exactly when the runner means to wake up.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters map[*fakeWaiter]struct{}
}

type fakeWaiter struct {
	until time.Time
	ch    chan struct{}
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), waiters: map[*fakeWaiter]struct{}{}}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) SleepUntil(ctx context.Context, t time.Time) error {
	c.mu.Lock()
	if !t.After(c.now) {
		c.mu.Unlock()
		return ctx.Err()
	}
	w := &fakeWaiter{until: t, ch: make(chan struct{})}
	c.waiters[w] = struct{}{}
	c.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.waiters, w)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Advance moves the clock and wakes every waiter whose time has come.
func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for w := range c.waiters {
		if !w.until.After(c.now) {
			close(w.ch)
			delete(c.waiters, w)
		}
	}
}

// Waiting returns the wake-up times of current sleepers, sorted.
func (c *fakeClock) Waiting() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []time.Time
	for w := range c.waiters {
		out = append(out, w.until)
	}
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

func itoa(n int) string { return strconv.Itoa(n) }
