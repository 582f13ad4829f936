package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRequestLimitScalesWithWorkerCountAndNamesTheLimit(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.Requests = 2 // per worker: 4 with two workers
	h := newHarness(t, workers(2, 1), c)
	h.occupy("c", 2)
	for i := range 4 {
		h.enqueue(req(fmt.Sprintf("q%d", i), "c", 10))
		h.pending(fmt.Sprintf("q%d", i))
	}
	h.enqueue(req("over", "c", 10))

	rej := h.rejected("over", ErrQueueFull)
	require.Equal(t, ReasonQueueFull, rej.Reason)
	require.Equal(t, LimitRequests, rej.Limit)
	require.Equal(t, uint64(1), h.counters("c").Rejected[ReasonQueueFull])
	require.Equal(t, 4, h.core.Queued(), "a rejected request is never added")
}

func TestISLTokenLimitCountsQueuedPromptTokens(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.ISLTokens = 500
	h := newHarness(t, workers(1, 1), c)
	h.occupy("c", 1)
	h.enqueue(req("a", "c", 300))
	h.enqueue(req("b", "c", 200)) // exactly at the limit: accepted
	h.enqueue(req("c", "c", 1))

	h.pending("a")
	h.pending("b")
	require.Equal(t, LimitISLTokens, h.rejected("c", ErrQueueFull).Limit)
	require.Equal(t, int64(500), h.core.Snapshot().Classes["c"].PendingTokens)
}

func TestCachedTokenLimitCountsQueuedCachedTokens(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.CachedTokens = 100
	h := newHarness(t, workers(1, 1), c)
	h.occupy("c", 1)
	cached := func(id string) *Request {
		r := req(id, "c", 200)
		r.BlockHashes = seqHashes(7, 12)
		r.Overlaps = []Overlap{{Worker: "w0", Blocks: 4}} // 64 cached tokens
		return r
	}
	h.enqueue(cached("a"))
	h.enqueue(req("plain", "c", 5000)) // no cached tokens: not limited here
	h.enqueue(cached("b"))

	h.pending("a")
	h.pending("plain")
	require.Equal(t, LimitCachedTokens, h.rejected("b", ErrQueueFull).Limit)
}

func TestZeroLimitClassAdmitsAtOnceWhenAWorkerIsFree(t *testing.T) {
	c := classCfg("z", PolicyFCFS)
	c.Limits.Requests = 0
	h := newHarness(t, workers(1, 1), c)
	h.enqueue(req("r", "z", 10))
	require.Equal(t, "w0", h.granted("r").Worker)
}

func TestZeroLimitClassRejectsInsteadOfQueueing(t *testing.T) {
	c := classCfg("z", PolicyFCFS)
	c.Limits.ISLTokens = 0
	h := newHarness(t, workers(1, 1), c)
	h.occupy("z", 1)
	h.enqueue(req("r", "z", 10))

	rej := h.rejected("r", ErrQueueFull)
	require.Equal(t, LimitISLTokens, rej.Limit, "the rejection names the zero limit")
	require.Zero(t, h.core.Queued())
}

func TestZeroRegisteredWorkersRejectWithNoEndpointsNotQueueFull(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.Requests = 1
	h := newHarness(t, nil, c)
	h.enqueue(req("r", "c", 10))

	rej := h.rejected("r", ErrNoEndpoints)
	require.Empty(t, rej.Limit)
	cs := h.counters("c")
	require.Equal(t, uint64(1), cs.Received)
	require.Equal(t, uint64(1), cs.Rejected[ReasonNoEndpoints])
}

func TestWorkersLeavingRejectsQueuedRequestsWithNoEndpoints(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 2)
	pinned := req("pinned", "c", 10)
	pinned.Pinned = "w1"
	h.enqueue(pinned)
	h.enqueue(req("free", "c", 10))

	h.core.SetWorkers(workers(1, 1)) // w1 leaves
	h.rejected("pinned", ErrNoEndpoints)
	h.pending("free")

	h.core.SetWorkers(nil)
	h.rejected("free", ErrNoEndpoints)
	require.Zero(t, h.core.Queued())
}

func TestPinnedWorkerMustBeRegistered(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 10)
	r.Pinned = "ghost"
	h.enqueue(r)
	h.rejected("r", ErrInvalidConstraint)
	require.Equal(t, uint64(1), h.counters("c").Rejected[ReasonInvalidConstraint])
}

func TestPinnedWorkerMustBeInTheAllowedList(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 10)
	r.Pinned = "w0"
	r.Allowed = []string{"w1"}
	h.enqueue(r)
	h.rejected("r", ErrInvalidConstraint)
}

func TestAllowedListWithNoRegisteredWorkerIsRejected(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 10)
	r.Allowed = []string{"ghost", "phantom"}
	h.enqueue(r)
	h.rejected("r", ErrInvalidConstraint)
}

func TestAdmissionHonoursTheAllowListEvenAgainstACheaperWorker(t *testing.T) {
	h := newHarness(t, workers(3, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 1000)
	r.BlockHashes = seqHashes(3, 60)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 60}} // w0 is by far the cheapest
	r.Allowed = []string{"w2"}
	h.enqueue(r)
	require.Equal(t, "w2", h.granted("r").Worker)
}

func TestPinnedRequestWaitsForItsWorkerWhileOthersAreFree(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyFCFS))
	ids := h.occupy("c", 1) // w0 busy, w1 free
	r := req("r", "c", 10)
	r.Pinned = "w0"
	h.enqueue(r)
	h.pending("r")
	h.core.Finish(ids[0])
	require.Equal(t, "w0", h.granted("r").Worker)
}

func TestMalformedRequestsAreRejectedAndCounted(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(&Request{Class: "c", PromptTokens: 1}) // no ID
	h.enqueue(&Request{ID: "neg", Class: "c", PromptTokens: -1})
	require.Equal(t, uint64(2), h.counters("c").Rejected[ReasonInvalidConstraint])
	h.rejected("neg", ErrInvalidConstraint)
}

func TestUnknownClassIsRejectedAndCountedOutsideAnyClass(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "nope", 10))
	h.rejected("r", ErrUnknownClass)
	require.Equal(t, uint64(1), h.core.Snapshot().UnknownClass)
}

func TestRetriesAndProbesAreCountedSeparately(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("first", "c", 10))
	retry := req("retry", "c", 10)
	retry.Attempt = 1
	h.enqueue(retry)
	probe := req("probe", "c", 10)
	probe.Probe = true
	h.enqueue(probe)

	cs := h.counters("c")
	require.Equal(t, uint64(1), cs.Received)
	require.Equal(t, uint64(1), cs.Retried)
	require.Equal(t, uint64(2), cs.Admitted, "the probe was granted but is not counted")
	h.granted("probe")
}

// ---------------------------------------------------------------- expiry

func TestAlreadyExpiredRequestIsCountedReceivedAndRejectedBeforeQueueAccounting(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.Limits.Requests = 0 // even a zero-limit class reports the deadline, not the limit
	h := newHarness(t, workers(1, 0), c)
	h.clock.Advance(time.Minute)
	r := req("late", "c", 10)
	r.Due = t0.Add(time.Second)
	h.enqueue(r)

	h.rejected("late", ErrDeadlineExceeded)
	cs := h.counters("c")
	require.Equal(t, uint64(1), cs.Received)
	require.Equal(t, uint64(1), cs.Rejected[ReasonDueTimePassed])
	require.Equal(t, uint64(0), cs.Rejected[ReasonQueueFull])
	require.Zero(t, h.core.Snapshot().Classes["c"].PendingTokens)
}

func TestQueuedRequestExpiresOnTheTickAfterItsDueTime(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 1)
	r := req("r", "c", 10)
	r.Due = t0.Add(5 * time.Second)
	h.enqueue(r)
	keep := req("keep", "c", 10)
	keep.Due = t0.Add(time.Hour)
	h.enqueue(keep)

	wake, ok := h.core.NextWake()
	require.True(t, ok)
	require.Equal(t, r.Due, wake.UTC(), "the core wakes at the earliest due time")

	h.clock.Advance(4 * time.Second)
	h.core.Tick()
	h.pending("r")
	h.clock.Advance(time.Second)
	h.core.Tick()
	h.core.Tick() // a second sweep must not count it again

	h.rejected("r", ErrDeadlineExceeded)
	h.pending("keep")
	cs := h.counters("c")
	require.Equal(t, uint64(1), cs.Rejected[ReasonDueTimePassed])
	require.Equal(t, int64(10), h.core.Snapshot().Classes["c"].PendingTokens)
}

func TestExpiryIsCheckedAgainRightBeforeBooking(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	r := req("r", "c", 10)
	r.Due = t0.Add(time.Second)
	h.enqueue(r)
	h.enqueue(req("next", "c", 10))

	h.clock.Advance(2 * time.Second) // past due, but no Tick has swept yet
	h.core.Finish(running)

	h.rejected("r", ErrDeadlineExceeded)
	h.granted("next")
	require.Equal(t, uint64(1), h.counters("c").Rejected[ReasonDueTimePassed])
	require.Equal(t, 1, h.core.Bookings(), "the expired request holds no booking")
}

// ---------------------------------------------------------------- cancel, rollback

func TestCancelRemovesAQueuedRequestAndCountsItOnce(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	r := req("r", "c", 10)
	r.Due = t0.Add(time.Second)
	h.enqueue(r)

	require.True(t, h.core.Cancel("r"))
	require.False(t, h.core.Cancel("r"), "a second cancel finds nothing")
	o := h.one("r")
	require.ErrorIs(t, o.err, ErrCancelled)
	require.Equal(t, uint64(1), h.counters("c").Cancelled)

	h.clock.Advance(time.Hour)
	h.core.Tick()
	h.core.Finish(running)
	h.one("r") // neither the due index nor the queue still holds it
	_, ok := h.core.NextWake()
	require.False(t, ok)
}

func TestCancellingABlockedHeadLetsTheNextRequestIn(t *testing.T) {
	c := classCfg("c", PolicyFCFS)
	c.BusyPrefillTokens = 1000
	h := newHarness(t, workers(1, 0), c)
	h.enqueue(req("running", "c", 500)) // 500 prefill tokens in flight
	h.granted("running")
	h.enqueue(req("head", "c", 800)) // 1300 > 1000: the worker is busy for it
	h.enqueue(req("behind", "c", 100))
	h.pending("head")
	h.pending("behind") // it would fit, but it is behind an unconstrained head

	h.core.Cancel("head")
	h.granted("behind")
}

func TestAHeadBlockedOnlyByItsPinnedWorkerDoesNotHoldUpItsClass(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyFCFS))
	ids := h.occupy("c", 1) // w0 busy, w1 free
	head := req("head", "c", 10)
	head.Pinned = "w0"
	h.enqueue(head)
	allowed := req("allowed", "c", 10)
	allowed.Allowed = []string{"w0"}
	h.enqueue(allowed)
	h.enqueue(req("free", "c", 10))

	require.Equal(t, "w1", h.granted("free").Worker, "the class goes on past entries waiting for w0")
	h.pending("head")
	h.pending("allowed")
	h.core.Finish(ids[0])
	require.Equal(t, "w0", h.granted("head").Worker, "queue order holds among the entries waiting for w0")
	h.pending("allowed")
}

func TestRefusedGrantRollsTheBookingBackAndCountsCancelled(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.refuse["gone"] = true
	h.enqueue(req("gone", "c", 100))

	require.Len(t, h.got["gone"], 1)
	require.Zero(t, h.core.Bookings())
	require.Equal(t, WorkerLoad{}, h.core.Load("w0"))
	cs := h.counters("c")
	require.Equal(t, uint64(0), cs.Admitted)
	require.Equal(t, uint64(1), cs.Cancelled)
}

func TestRollbackFreesTheBookingAndAdmitsTheNextRequest(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	h.enqueue(req("next", "c", 10))
	h.core.Rollback(running)
	h.granted("next")
	require.Equal(t, 1, h.core.Bookings())
}

// ---------------------------------------------------------------- bookings

func TestUnacknowledgedGrantIsRolledBackAfterTheAckTimeout(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "c", 10))
	g := h.granted("r")
	h.enqueue(req("next", "c", 10))

	h.clock.Advance(DefaultConfig().AckTimeout - time.Millisecond)
	h.core.Tick()
	require.Equal(t, 1, h.core.Bookings())
	h.clock.Advance(time.Millisecond)
	h.core.Tick()

	_, ok := h.core.Booking(g.Booking)
	require.False(t, ok, "the unacknowledged booking is gone")
	h.granted("next") // and its capacity went to the queue
}

func TestAcknowledgedBookingExpiresWhenNotRenewed(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "c", 10))
	g := h.granted("r")
	h.core.Ack(g.Booking)

	h.clock.Advance(DefaultConfig().BookingExpiry / 2)
	h.core.Tick()
	_, ok := h.core.Booking(g.Booking)
	require.True(t, ok, "an acknowledged booking lives until its renewal window passes")

	h.clock.Advance(DefaultConfig().BookingExpiry)
	h.core.Tick()
	_, ok = h.core.Booking(g.Booking)
	require.False(t, ok, "a booking not renewed within the expiry is freed")
	require.Equal(t, WorkerLoad{}, h.core.Load("w0"))
}

func TestRenewedBookingStaysAlive(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("r", "c", 10))
	g := h.granted("r")
	for range 5 {
		h.clock.Advance(DefaultConfig().BookingExpiry / 2)
		h.core.Renew([]BookingID{g.Booking})
		h.core.Tick()
	}
	_, ok := h.core.Booking(g.Booking)
	require.True(t, ok)
	h.core.Finish(g.Booking)
	require.Zero(t, h.core.Bookings())
}

func TestAdoptCarriesTheLoadOfAnotherOwnersBookingUntilItFinishes(t *testing.T) {
	h := newHarness(t, workers(1, 2), classCfg("c", PolicyFCFS))
	id := h.core.Adopt(BookingRecord{
		RequestID: "moved", Class: "c", Worker: "w0", BlockHashes: seqHashes(9, 4),
		PromptTokens: 64, CachedTokens: 16, ExpectedOutputTokens: 32,
	})
	require.Equal(t, WorkerLoad{ActiveRequests: 1, PrefillTokens: 48, DecodeBlocks: 4 + 2}, h.core.Load("w0"))

	h.enqueue(req("a", "c", 10))
	h.granted("a")
	h.enqueue(req("b", "c", 10))
	h.pending("b") // MaxRunning 2 counts the adopted booking

	h.clock.Advance(DefaultConfig().BookingExpiry / 2)
	h.core.Tick()
	_, ok := h.core.Booking(id)
	require.True(t, ok, "an adopted booking is already acknowledged")
	h.core.Finish(id)
	h.granted("b")
}

func TestSharedPromptBlocksAmongActiveRequestsCountOnce(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	shared := seqHashes(5, 10)
	a := req("a", "c", 160)
	a.BlockHashes = shared
	b := req("b", "c", 160)
	b.BlockHashes = shared
	h.enqueue(a)
	h.enqueue(b)
	require.Equal(t, 10, h.core.Load("w0").DecodeBlocks)

	h.core.Finish(h.granted("a").Booking)
	require.Equal(t, 10, h.core.Load("w0").DecodeBlocks, "b still holds the shared blocks")
	h.core.Finish(h.granted("b").Booking)
	require.Equal(t, WorkerLoad{}, h.core.Load("w0"))
}

func TestPrefillLoadIsUncachedTokensUntilTheFirstToken(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 100)
	r.BlockHashes = seqHashes(2, 6)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 4}}
	h.enqueue(r)
	g := h.granted("r")
	require.Equal(t, 64, g.CachedTokens)
	require.Equal(t, 4, g.OverlapBlocks)
	require.Equal(t, 36, h.core.Load("w0").PrefillTokens)

	h.core.FirstToken(g.Booking)
	require.Zero(t, h.core.Load("w0").PrefillTokens)
	require.Equal(t, 1, h.core.Load("w0").ActiveRequests)
}

func TestNextWakeIncludesBookingDeadlines(t *testing.T) {
	h := newHarness(t, workers(1, 0), classCfg("c", PolicyFCFS))
	_, ok := h.core.NextWake()
	require.False(t, ok, "nothing queued, nothing booked: no wake")
	h.enqueue(req("r", "c", 10))
	wake, ok := h.core.NextWake()
	require.True(t, ok)
	require.Equal(t, t0.Add(DefaultConfig().AckTimeout), wake.UTC())
}

// ---------------------------------------------------------------- classes

func TestRemoveClassRejectsQueuedEntriesWithTheGivenReason(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS), classCfg("d", PolicyFCFS))
	h.occupy("d", 1)
	h.enqueue(req("r", "c", 10))
	h.core.RemoveClass("c", ReasonOwnershipLost)

	rej := h.rejected("r", ErrOwnershipMoved)
	require.Equal(t, ReasonOwnershipLost, rej.Reason)
	h.enqueue(req("later", "c", 10))
	h.rejected("later", ErrUnknownClass)
	require.Equal(t, uint64(1), h.counters("c").Rejected[ReasonOwnershipLost], "counters survive removal")
}

func TestSetClassesKeepsQueuedEntriesOfClassesStillPresent(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS), classCfg("gone", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	h.enqueue(req("r", "c", 10))
	h.enqueue(req("g", "gone", 10))
	updated := classCfg("c", PolicyLCFS)
	updated.Quantum = 1024
	h.core.SetClasses([]ClassConfig{updated, {Name: "broken"}})

	h.pending("r")
	h.rejected("g", ErrUnknownClass)
	require.Equal(t, uint64(1), h.core.Snapshot().InvalidConfigs)
	h.core.Finish(running)
	h.granted("r")
}
