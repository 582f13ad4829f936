package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// Queue capacity checks respect the workers a request may use: a class
// limit is per worker, scaled by the registered workers a request is pinned
// or allowed to, not by the whole fleet.
func TestQueueLimitsScaleByTheWorkersARequestMayUseNotByEveryWorker(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.Requests = 1 // per worker
	h := newHarness(t, workers(4, 1), c)
	h.occupy("c", 4)
	pinned := func(id string) *Request { r := req(id, "c", 10); r.Pinned = "w0"; return r }
	h.enqueue(pinned("p1"))
	h.pending("p1")
	h.enqueue(pinned("p2"))
	rej := h.rejected("p2", ErrQueueFull)
	require.Equal(t, LimitRequests, rej.Limit, "a request pinned to one worker may queue one per-worker limit, not four")

	allowed := func(id string) *Request {
		r := req(id, "c", 10)
		r.Allowed = []string{"w1", "w2", "w2", "gone"}
		return r
	}
	h.enqueue(allowed("a1")) // the queue holds p1: two of two allowed slots
	h.pending("a1")
	h.enqueue(allowed("a2"))
	require.Equal(t, LimitRequests, h.rejected("a2", ErrQueueFull).Limit, "two distinct registered allowed workers: limit 2")

	h.enqueue(req("free", "c", 10)) // unconstrained: 4 workers, 2 queued
	h.pending("free")
}

// The Request helpers are the one source of cache arithmetic. The
// Core's WSPT/DRR cached figure, and the overlap and cached tokens of every
// grant, must equal what the helpers say, for requests with duplicate,
// negative, over-deep and unknown-worker overlaps, pins and allow-lists.
func TestTheCoresCachedTokensAndOverlapsAreTheRequestHelpersOwn(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 0))
	ws := workers(6, 0)
	ws[1].BlockSize, ws[2].BlockSize = 32, 1
	names := []string{"w0", "w1", "w2", "w3", "w4", "w5", "gone"}
	for i := range 2000 {
		h := newHarness(t, ws, classCfg("c", PolicyWSPT))
		r := req(fmt.Sprintf("r%d", i), "c", rng.IntN(600))
		r.BlockHashes = seqHashes(uint64(i), rng.IntN(40))
		for range rng.IntN(6) {
			r.Overlaps = append(r.Overlaps, Overlap{Worker: names[rng.IntN(len(names))], Blocks: rng.IntN(60) - 5})
		}
		switch rng.IntN(3) {
		case 0:
			r.Pinned = names[rng.IntN(6)]
		case 1:
			for range 1 + rng.IntN(3) {
				r.Allowed = append(r.Allowed, names[rng.IntN(len(names))])
			}
		}
		e := h.core.newEntry(r, nil, h.core.classes["c"], t0)
		require.Equal(t, r.BestCachedTokens(h.core.Workers()), e.cold.cached, "request %+v", r)
		h.core.release(e)
		h.enqueue(r)
		o := h.one(r.ID)
		if o.err != nil {
			continue
		}
		g := o.grant
		bs := ws[h.core.workerIdx[g.Worker]].BlockSize
		require.Equal(t, r.OverlapBlocks(g.Worker), g.OverlapBlocks, "request %+v", r)
		require.Equal(t, r.CachedTokens(g.Worker, bs), g.CachedTokens, "request %+v", r)
	}
}

func TestAResubmissionSupersedesItsEarlierAttemptStillQueuedAtTheSameCore(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 1)
	h.enqueue(req("x", "c", 10))
	again := req("x", "c", 10)
	again.Attempt = 1
	h.enqueue(again)
	require.Len(t, h.got["x"], 1, "only the first attempt is answered")
	require.ErrorIs(t, h.got["x"][0].err, ErrCancelled)
	require.Equal(t, 1, h.core.Queued(), "the retry is queued in its place")
	c := h.counters("c")
	require.Equal(t, uint64(1), c.Cancelled)
	require.Equal(t, uint64(1), c.Retried)
}

func TestRemoteLoadsChangesItsVersionOnlyWhenALoadChanges(t *testing.T) {
	v := &RemoteLoads{}
	require.Zero(t, v.LoadVersion())
	require.True(t, v.Store(map[string]WorkerLoad{"w0": {ActiveRequests: 1}, "w1": {}}))
	ver := v.LoadVersion()
	require.False(t, v.Store(map[string]WorkerLoad{"w0": {ActiveRequests: 1}}), "an idle worker is the same as a missing one")
	require.Equal(t, ver, v.LoadVersion(), "an unchanged gossip round keeps the version: the blocked-class memo holds")
	require.True(t, v.Store(map[string]WorkerLoad{"w0": {ActiveRequests: 2}}))
	require.Greater(t, v.LoadVersion(), ver)
	require.Equal(t, WorkerLoad{ActiveRequests: 2}, v.RemoteLoad("w0"))
	require.Equal(t, WorkerLoad{}, v.RemoteLoad("w1"))
}
