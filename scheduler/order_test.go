package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// drainOneByOne frees the running booking, lets exactly one queued request in
// (single worker, MaxRunning 1), and repeats; it returns the grant order.
func (h *harness) drainOneByOne(running BookingID, n int) []string {
	h.t.Helper()
	start := len(h.order)
	for range n {
		h.core.Finish(running)
		require.Len(h.t, h.order, start+1, "freeing one slot must admit exactly one request")
		running = h.granted(h.order[len(h.order)-1]).Booking
		start++
	}
	return h.order[len(h.order)-n:]
}

func TestSeedExamplePopsHigherTierThenEarliestDeadlineThenScore(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyWSPT))
	running := h.occupy("c", 1)[0]

	a := req("A", "c", 4000)
	a.Due = t0.Add(10 * time.Second)
	b := req("B", "c", 10) // best WSPT score, but no deadline
	c := req("C", "c", 4000)
	c.StrictPriority = 1
	c.Due = t0.Add(20 * time.Second)
	h.enqueue(a)
	h.enqueue(b)
	h.enqueue(c)
	h.pending("A")
	h.pending("B")
	h.pending("C")

	require.Equal(t, []string{"C", "A", "B"}, h.drainOneByOne(running, 3))
}

func TestFCFSServesEarlierIngressFirstEvenWhenItArrivesLater(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	late := req("late", "c", 100)
	late.Ingress = t0.Add(2 * time.Second)
	early := req("early", "c", 100)
	early.Ingress = t0.Add(1 * time.Second)
	h.enqueue(late)
	h.enqueue(early)

	require.Equal(t, []string{"early", "late"}, h.drainOneByOne(running, 2))
}

func TestLCFSServesLaterIngressFirst(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyLCFS))
	running := h.occupy("c", 1)[0]
	early := req("early", "c", 100)
	early.Ingress = t0.Add(1 * time.Second)
	late := req("late", "c", 100)
	late.Ingress = t0.Add(2 * time.Second)
	h.enqueue(early)
	h.enqueue(late)

	require.Equal(t, []string{"late", "early"}, h.drainOneByOne(running, 2))
}

func TestFCFSPriorityJumpOutranksArrivalAndNegativeJumpCountsAsZero(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	first := req("first", "c", 100)
	negative := req("negative", "c", 100)
	negative.PriorityJump = -50 // must not sink below "first"'s peers: counts as 0
	negative.Ingress = t0.Add(time.Second)
	jumper := req("jumper", "c", 100)
	jumper.PriorityJump = 5 // five seconds of arrival credit
	jumper.Ingress = t0.Add(3 * time.Second)
	h.enqueue(first)
	h.enqueue(negative)
	h.enqueue(jumper)

	require.Equal(t, []string{"jumper", "first", "negative"}, h.drainOneByOne(running, 3))
}

func TestWSPTPrefersTheShortestUncachedPrefillUsingTheBestAllowedWorkersCache(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyWSPT))
	ids := h.occupy("c", 2)
	// 1000 tokens, 960 cached on w1: 40 uncached. 200 tokens uncached: 200.
	cached := req("cached", "c", 1000)
	cached.BlockHashes = seqHashes(1, 62)
	cached.Overlaps = []Overlap{{Worker: "w1", Blocks: 60}}
	short := req("short", "c", 200)
	h.enqueue(short)
	h.enqueue(cached)

	h.core.Finish(ids[0]) // w0 frees: the order, not the placement, is under test
	require.Equal(t, []string{"cached"}, h.order[2:])
}

func TestWSPTUsesThePinnedWorkersCacheNotTheBestWorkers(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyWSPT))
	ids := h.occupy("c", 2)
	// Well cached on w1 but pinned to w0 where nothing is cached: 1000 uncached.
	pinned := req("pinned", "c", 1000)
	pinned.BlockHashes = seqHashes(1, 62)
	pinned.Overlaps = []Overlap{{Worker: "w1", Blocks: 60}}
	pinned.Pinned = "w0"
	short := req("short", "c", 200)
	short.Pinned = "w0"
	h.enqueue(pinned)
	h.enqueue(short)

	h.core.Finish(ids[0])
	require.Equal(t, []string{"short"}, h.order[2:])
	g := h.granted("short")
	require.Equal(t, "w0", g.Worker)
}

func TestStrictPriorityBeatsAnEarlierDeadline(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	urgent := req("urgent", "c", 10)
	urgent.Due = t0.Add(time.Second)
	high := req("high", "c", 10)
	high.StrictPriority = 3
	h.enqueue(urgent)
	h.enqueue(high)

	require.Equal(t, []string{"high", "urgent"}, h.drainOneByOne(running, 2))
}

// seqHashes returns n distinct sequence hashes of one prompt family.
func seqHashes(family uint64, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = family<<32 | uint64(i+1)
	}
	return out
}
