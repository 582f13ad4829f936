package scheduler

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestASnapshotShowsTheQueueByPriorityTierAndEachTenantAgainstItsQuota(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 1) // w0 is full: what comes next queues
	q := TenantQuota{Concurrent: 4, RequestsPerMinute: 60, TokensPerMinute: 6000}
	for i, prio := range []int32{0, 2, 2} {
		r := tenantReq("t"+string(rune('a'+i)), "c", "acme", 1, 100, q)
		r.StrictPriority = prio
		h.enqueue(r)
	}
	s := h.core.Snapshot()
	require.Equal(t, map[int32]int{0: 1, 2: 2}, s.Classes["c"].QueueByPriority)
	require.Len(t, s.Tenants, 1)
	ts := s.Tenants[0]
	require.Equal(t, "acme", ts.ID)
	require.Equal(t, q, ts.Quota)
	require.Equal(t, 3, ts.InFlight)
	require.Equal(t, 3, ts.Queued)
	require.InDelta(t, 60, ts.Requests, 0.001, "nothing booked yet: the requests bucket is full")
	require.Contains(t, s.Calibration, "w0")
	require.InDelta(t, 1, s.Calibration["w0"].Scale, 1e-9, "no first-token mark yet")
}

func TestAGrantListsTheWinnerFirstThenTheDeepestOtherHolders(t *testing.T) {
	h := newHarness(t, workers(3, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w2", Blocks: 10}, {Worker: "w1", Blocks: 30}, {Worker: "w2", Blocks: 20}, {Worker: "gone", Blocks: 40}}
	r.Pinned = "w0"
	h.enqueue(r)
	g := h.granted("r")
	require.Len(t, g.CandidateList(), 3, "the winner and the two registered holders; an unregistered worker is no candidate")
	require.Equal(t, GrantCandidate{Worker: "w0", CachedTokens: 0, PredictedTTFT: g.PredictedTTFT}, g.Candidates[0])
	require.Equal(t, "w1", g.Candidates[1].Worker)
	require.Equal(t, 480, g.Candidates[1].CachedTokens)
	require.Equal(t, "w2", g.Candidates[2].Worker)
	require.Equal(t, 320, g.Candidates[2].CachedTokens, "a worker reported twice counts with its deepest report")
	require.Positive(t, g.Candidates[1].PredictedTTFT)
	require.Less(t, g.Candidates[1].PredictedTTFT, g.PredictedTTFT, "the holder of 30 blocks would have started sooner than the pinned worker")
}

func TestAGrantKeepsTheThreeDeepestHoldersTiesByWorkerID(t *testing.T) {
	h := newHarness(t, workers(6, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Overlaps = []Overlap{{Worker: "w1", Blocks: 5}, {Worker: "w5", Blocks: 20}, {Worker: "w3", Blocks: 20},
		{Worker: "w2", Blocks: 10}, {Worker: "w4", Blocks: 1}, {Worker: "w1", Blocks: 30}}
	r.Pinned = "w0"
	h.enqueue(r)
	g := h.granted("r")
	var got []string
	for _, c := range g.CandidateList() {
		got = append(got, fmt.Sprintf("%s:%d", c.Worker, c.CachedTokens))
	}
	require.Equal(t, []string{"w0:0", "w1:480", "w3:320", "w5:320"}, got,
		"w1's second report makes it the deepest; w3 and w5 tie and sort by ID; w2 and w4 drop out")
}
