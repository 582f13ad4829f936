package scheduler

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Seed 000: queue capacity checks respect the workers a request may use.
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

	allowed := func(id string) *Request { r := req(id, "c", 10); r.Allowed = []string{"w1", "w2", "w2", "gone"}; return r }
	h.enqueue(allowed("a1")) // the queue holds p1: two of two allowed slots
	h.pending("a1")
	h.enqueue(allowed("a2"))
	require.Equal(t, LimitRequests, h.rejected("a2", ErrQueueFull).Limit, "two distinct registered allowed workers: limit 2")

	h.enqueue(req("free", "c", 10)) // unconstrained: 4 workers, 2 queued
	h.pending("free")
}
