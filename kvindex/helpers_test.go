package kvindex

import (
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

// newFakeClock is the tests' manually advanced clock.
func newFakeClock() *clock.Fake { return clock.NewFake(time.Unix(1_700_000_000, 0)) }

func newTestIndex(t testing.TB, mutate ...func(*Config)) (*Index, *prometheus.Registry, *clock.Fake) {
	t.Helper()
	cfg := DefaultConfig()
	for _, m := range mutate {
		m(&cfg)
	}
	reg := prometheus.NewRegistry()
	clk := newFakeClock()
	ix, err := New(cfg, clk, nil, reg)
	require.NoError(t, err)
	return ix, reg, clk
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

func sortedMatches(ms []Match) []Match {
	out := append([]Match(nil), ms...)
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

func sortedHashes(hs []uint64) []uint64 {
	out := append([]uint64(nil), hs...)
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}
