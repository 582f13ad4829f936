package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The nemesis (seed 2, life_drop) saw w6 hold 4 requests with cap 2: the
// entry's dispatched and first_token marks were lost, the owner rolled the
// grant back after a 2 s ack timeout while the worker ran the request, and
// booked the slot again. The owner cannot tell a lost grant from a lost
// mark, so an unacknowledged grant holds its worker as long as a booking
// whose renewals stopped; the entry's first renewal (every 10 s) keeps it.
func TestAGrantWhoseDispatchedMarkIsLostKeepsItsWorkerUntilItsRenewalArrives(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.enqueue(req("running", "c", 10))
	g := h.granted("running")
	h.enqueue(req("next", "c", 10))

	const entryRenewInterval = 10 * time.Second // admission.DefaultClientConfig
	h.clock.Advance(entryRenewInterval)
	h.core.Tick()
	h.pending("next") // the worker may be running the request: its slot is not free
	h.core.Renew([]BookingID{g.Booking})
	_, ok := h.core.Booking(g.Booking)
	require.True(t, ok, "the renewal finds the booking and acknowledges it")

	h.core.Finish(g.Booking)
	h.granted("next")
}

func TestAnUnacknowledgedGrantWithNoMarkAtAllIsFreedWhenTheRenewalWindowPasses(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.enqueue(req("lost", "c", 10))
	h.granted("lost")
	h.enqueue(req("next", "c", 10))

	h.clock.Advance(DefaultConfig().BookingExpiry)
	h.core.Tick()
	h.granted("next")
}

// An entry that gives up on an attempt whose reply it never got (reply
// timeout, lost connection, stale grant) cancels that attempt: if the owner
// granted it, the grant is lost and its worker slot is freed at once,
// without waiting for the renewal window.
func TestCancellingTheAttemptOfAnUnacknowledgedGrantFreesItsWorker(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	lost := req("lost", "c", 10)
	lost.Attempt = 2
	h.enqueue(lost)
	g := h.granted("lost")
	h.enqueue(req("next", "c", 10))
	before := h.counters("c")

	require.False(t, h.core.CancelAttempt("lost", 1), "another attempt's cancel")
	h.pending("next")
	h.core.CancelAttempt("lost", 2)
	_, ok := h.core.Booking(g.Booking)
	require.False(t, ok, "the lost grant's booking is freed")
	after := h.counters("c")
	require.Equal(t, before.Admitted+1, after.Admitted, "only next is admitted: the lost grant stays counted once")
	require.Equal(t, before.Cancelled, after.Cancelled, "the request was admitted: its booking just ends early")
	h.granted("next")
}

func TestACancelDoesNotFreeAGrantItsEntryAcknowledged(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.enqueue(req("running", "c", 10))
	g := h.granted("running")
	h.core.Ack(g.Booking)
	h.enqueue(req("next", "c", 10))

	h.core.CancelAttempt("running", 0)
	_, ok := h.core.Booking(g.Booking)
	require.True(t, ok, "a dispatched request runs on its worker: a stale cancel does not free it")
	h.pending("next")
}
