package kvingest

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/clock"
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

// newFakeClock is the tests' manually advanced clock.
func newFakeClock() *clock.Fake { return clock.NewFake(time.Unix(1_700_000_000, 0)) }

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
