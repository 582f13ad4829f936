package kvingest

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestConfigValidationNamesTheBadField(t *testing.T) {
	s := DefaultConfig()
	require.NoError(t, s.Validate())
	s.DumpRetryMax = s.DumpRetry / 2
	require.ErrorContains(t, s.Validate(), "DumpRetryMax")
}

// fakeClock is a manually advanced kvindex.Clock.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []fakeWaiter
}

type fakeWaiter struct {
	at time.Time
	ch chan time.Time
}

func newFakeClock() *fakeClock { return &fakeClock{now: time.Unix(1_700_000_000, 0)} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	if d <= 0 {
		ch <- c.now
		return ch
	}
	c.waiters = append(c.waiters, fakeWaiter{at: c.now.Add(d), ch: ch})
	return ch
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if !w.at.After(c.now) {
			w.ch <- c.now
		} else {
			kept = append(kept, w)
		}
	}
	c.waiters = kept
}

// chain returns n distinct pseudo-random hashes derived from seed.
func chain(seed uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		z := seed<<24 ^ uint64(i) // distinct inputs for seeds below 2^40 and chains below 2^24
		z += 0x9E3779B97F4A7C15
		z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
		z = (z ^ (z >> 27)) * 0x94D049BB133111EB
		out[i] = z ^ (z >> 31)
	}
	return out
}

func ptr(h uint64) *uint64 { return &h }

func stored(parent *uint64, hs ...uint64) wire.KVEvent {
	e := wire.KVEvent{Kind: wire.KVStored, Hashes: hs}
	if parent != nil {
		e.Parent, e.HasParent = *parent, true
	}
	return e
}

func removed(hs ...uint64) wire.KVEvent { return wire.KVEvent{Kind: wire.KVRemoved, Hashes: hs} }

func batch(worker string, instance, firstID uint64, events ...wire.KVEvent) *wire.KVEventBatch {
	return &wire.KVEventBatch{Worker: worker, Instance: instance, FirstID: firstID, Events: events}
}

func sortedHashes(hs []uint64) []uint64 {
	out := slices.Clone(hs)
	slices.Sort(out)
	return out
}
