package kvindex

import (
	"sort"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/kvtest"
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

func sortedMatches(ms []Match) []Match {
	out := append([]Match(nil), ms...)
	sort.Slice(out, func(i, j int) bool { return out[i].Worker < out[j].Worker })
	return out
}

// The event builders the index's and its ingest's tests share.
var (
	chain        = kvtest.Chain
	stored       = kvtest.Stored
	removed      = kvtest.Removed
	batch        = kvtest.Batch
	sortedHashes = kvtest.SortedHashes
	ptr          = kvtest.Ptr
)
