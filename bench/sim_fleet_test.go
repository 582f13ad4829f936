package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

func TestFleetTimeScaleKeepsSectionOnesLoadPerEngine(t *testing.T) {
	assert.InDelta(t, 6.0, FleetTimeScale(8, 1), 1e-12, "one copy on 8 workers is §1")
	assert.InDelta(t, 7500.0, FleetTimeScale(10_000, 1), 1e-9)
	assert.InDelta(t, 750.0, FleetTimeScale(10_000, 10), 1e-9, "ten copies share the load")
}

func TestFleetTraceCopiesShareNoBlockAndCarryTheFleetsRate(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	const copies, scale = 3, 2.0
	fleet, err := FleetTrace(reqs, copies, scale)
	require.NoError(t, err)
	require.Len(t, fleet, copies*len(reqs))

	// The span 3000.5 ms at 2× is 1500.25 ms; the rotation's period adds a
	// mean gap (a fifth of it): copies start a third of 1800.3 ms apart.
	period := 1500250*time.Microsecond + 1500250*time.Microsecond/5
	owner := map[uint64]int{} // block id → copy
	perCopy := make([]int, copies)
	for n, r := range fleet {
		assert.Equal(t, n, r.Index, "renumbered in arrival order")
		if n > 0 {
			assert.GreaterOrEqual(t, r.Arrival, fleet[n-1].Arrival, "merged in arrival order")
		}
		assert.Less(t, r.Arrival, period, "rotated within the period")
		k := int(r.HashIDs[0] >> fleetNamespaceBits)
		require.Less(t, k, copies)
		perCopy[k]++
		require.Len(t, r.Segments, len(r.HashIDs))
		for j, id := range r.HashIDs {
			if c, ok := owner[id]; ok {
				assert.Equal(t, k, c, "block %d is in two copies", id)
			}
			owner[id] = k
			assert.Equal(t, MooncakeBlockSeed(id), r.Segments[j].Seed, "tokens follow the copy's id")
		}
	}
	assert.Equal(t, []int{5, 5, 5}, perCopy, "every copy is the whole trace")

	// Copy 0 is the trace compressed; copy 1 the same shifted by a third
	// of the period, wrapped.
	assert.Equal(t, time.Duration(0), fleet[0].Arrival)
	assert.Equal(t, reqs[0].HashIDs, fleet[0].HashIDs, "copy 0 keeps the trace's ids")
	shift := time.Duration(float64(period) / 3)
	var copy1 []time.Duration
	for _, r := range fleet {
		if r.HashIDs[0]>>fleetNamespaceBits == 1 {
			copy1 = append(copy1, r.Arrival)
		}
	}
	want := []time.Duration{shift, shift, 750*time.Millisecond + shift, 1500*time.Millisecond + shift, 1500250*time.Microsecond + shift}
	for i := range want {
		if want[i] >= period {
			want[i] -= period
		}
	}
	assert.ElementsMatch(t, want, copy1)

	// Equal prompts stay equal within a copy and differ across copies.
	v := DefaultVocab()
	var a0, a1 []uint32
	for _, r := range fleet {
		if r.InputLength == 1024 && r.HashIDs[0]>>fleetNamespaceBits == 0 {
			a0 = r.Tokens(v)
		}
		if r.InputLength == 1024 && r.HashIDs[0]>>fleetNamespaceBits == 1 {
			a1 = r.Tokens(v)
		}
	}
	require.Len(t, a0, 1024)
	require.Len(t, a1, 1024)
	assert.NotEqual(t, a0, a1)
	assert.Equal(t, reqs[1].Tokens(v), a0)
}

func TestFleetTraceIsTheSameEveryTime(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	a, err := FleetTrace(reqs, 4, 3)
	require.NoError(t, err)
	b, err := FleetTrace(reqs, 4, 3)
	require.NoError(t, err)
	assert.Equal(t, a, b)
}

func TestFleetTraceRejectsBadInputWithTypedErrors(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	for name, f := range map[string]func() error{
		"no copies":   func() error { _, err := FleetTrace(reqs, 0, 1); return err },
		"too many":    func() error { _, err := FleetTrace(reqs, MaxFleetCopies+1, 1); return err },
		"zero scale":  func() error { _, err := FleetTrace(reqs, 1, 0); return err },
		"no hash ids": func() error { _, err := FleetTrace([]TraceRequest{{Segments: []Segment{{Len: 1}}}}, 1, 1); return err },
		"id too wide": func() error {
			_, err := FleetTrace([]TraceRequest{{HashIDs: []uint64{1 << 40}, Segments: []Segment{{Len: 1}}}}, 1, 1)
			return err
		},
	} {
		assert.ErrorIs(t, f(), ErrInvalidConfig, name)
	}
	out, err := FleetTrace(nil, 2, 1)
	require.NoError(t, err)
	assert.Empty(t, out)
}

// A fleet run through the simulator: copies at the fleet's load, the same
// report twice (the scale section's runs are deterministic apart from the
// ingest CPU time, which is only measured on request), and the ingest
// accounting counts every block the engines published.
func TestSimOnAFleetTraceIsDeterministicAndCountsIngest(t *testing.T) {
	reqs, err := ReadAll(openMooncake(t, "testdata/mooncake_small.jsonl", BadLineFail), 0)
	require.NoError(t, err)
	fleet, err := FleetTrace(reqs, 4, FleetTimeScale(16, 4))
	require.NoError(t, err)
	cfg := simTestConfig()
	cfg.Workers, cfg.Replicas, cfg.SplitClasses, cfg.IndexSample = 16, 4, 8, 4
	cfg.GossipRound = 5 * time.Millisecond
	first := reportJSON(t, runSim(t, cfg, fleet))
	second := reportJSON(t, runSim(t, cfg, fleet))
	require.Equal(t, string(first), string(second))

	cfg.MeasureIngest = true
	var published uint64
	cfg.KVTap = func(b *wire.KVEventBatch) {
		for _, e := range b.Events {
			published += uint64(len(e.Hashes))
		}
	}
	rep := runSim(t, cfg, fleet)
	require.NotNil(t, rep.Ingest)
	assert.Positive(t, rep.Ingest.StoredBlocks)
	assert.Equal(t, published, rep.Ingest.StoredBlocks+rep.Ingest.RemovedBlocks)
	assert.Positive(t, rep.Ingest.BlocksPerS)
}

// The running sum behind simLoadView.RemoteLoad answers what the loop
// over every other origin answered.
func TestSimRemoteLoadFromTheRunningSumIsTheSumOverOtherOrigins(t *testing.T) {
	const replicas, workers = 4, 3
	s := &simulation{widx: map[string]int{}, gossipSum: make([]scheduler.WorkerLoad, workers)}
	for w := range workers {
		s.widx[fmt.Sprint("w", w)] = w
	}
	for range replicas {
		s.gossip = append(s.gossip, make([]scheduler.WorkerLoad, workers))
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range 500 {
		s.setLoad(rng.IntN(replicas), rng.IntN(workers), scheduler.WorkerLoad{
			ActiveRequests: rng.IntN(9), PrefillTokens: rng.IntN(5000), DecodeBlocks: rng.IntN(700)})
		for self := range replicas {
			for w := range workers {
				var want scheduler.WorkerLoad
				for o := range replicas {
					if o != self {
						want = want.Add(s.gossip[o][w])
					}
				}
				require.Equal(t, want, simLoadView{s: s, self: self}.RemoteLoad(fmt.Sprint("w", w)))
			}
		}
	}
	assert.Equal(t, scheduler.WorkerLoad{}, simLoadView{s: s}.RemoteLoad("unknown"))
}
