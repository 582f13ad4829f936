package adapter

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestTheOrderGivesBackLiveEntriesOldestFirstAcrossGrowth(t *testing.T) {
	var o order
	var gens []uint64
	for h := uint64(1); h <= 5000; h++ {
		if o.full() {
			o.skipDead()
			if o.full() {
				o.grow()
			}
		}
		gens = append(gens, o.push(h))
		if h%3 != 0 { // keep every third
			o.drop(gens[h-1])
		}
	}
	for want := uint64(3); want <= 5000; want += 3 {
		h, g, ok := o.oldest()
		require.True(t, ok)
		require.Equal(t, want, h)
		require.Equal(t, gens[want-1], g)
		o.drop(g)
	}
	_, _, ok := o.oldest()
	require.False(t, ok)
}

// churn stores and removes n one-block prompts, one batch each.
func churn(f *feeder, seed uint32, n int) {
	for i := range n {
		p := newPrompt(seed+uint32(i), 1, testBS)
		f.batch(p.stored(0, 1))
		f.batch(p.removed(0, 1))
	}
}

func TestABlockThatOutlivesManyLaterStoresStaysAndKeepsTheOrderBounded(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 1<<16)
	reg := prometheus.NewRegistry()
	m := startMirror(t, n, "w1", testShape(), reg)
	f := &feeder{h: m}
	hot := newPrompt(1, 1, testBS) // a system prompt the engine keeps
	f.batch(hot.stored(0, 1))
	churn(f, 1000, 1500)
	y := newPrompt(2, 1, testBS) // stored after hot, still held
	f.batch(y.stored(0, 1))
	churn(f, 100000, 20000)
	router.holdsExactly(t, "w1", append(hot.want(testModel, 1), y.want(testModel, 1)...), "only the two held blocks")
	// 20,000 stores went by two live blocks: the ring stays proportional
	// to the live entries, not to the stores since the oldest.
	m.mu.Lock()
	ring := len(m.ord.ring)
	m.mu.Unlock()
	assert.LessOrEqual(t, ring, 4096)
	// hot outlived a ring's worth of stores and was renewed: it now counts
	// as newer than y, so a bound of one entry forgets y, not hot.
	shape := testShape()
	shape.MaxEntries = 1
	require.NoError(t, m.Configure(shape))
	router.holdsExactly(t, "w1", hot.want(testModel, 1), "y evicted, the renewed hot block kept")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.evictions))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.m.unknownRemoved))
}
