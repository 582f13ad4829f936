package admission

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// The nemesis (seeds 2 and 3, nats_cut) saw a request sent 0.1 s before its
// entry's NATS connection dropped answered after 61 s: the owner's reply went
// to an inbox that no longer existed, and the entry waited the whole
// OwnerReplyTimeout. Here the reply timeout is an hour, so only a prompt
// reaction to the lost connection lets the request through.
func TestAnAdmitInFlightWhenTheEntrysNATSConnectionDropsIsResubmittedAtOnce(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a := h.start("a", nil)
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	b := h.startAt("b", "nats://"+px.Addr(), func(c *ClientConfig) { c.OwnerReplyTimeout = time.Hour })
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)

	hold := occupy(t, ctx, a) // a's only slot: b's request queues at a
	res := admitAsync(ctx, b.client, request("gold", 0))
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Classes["gold"].QueueDepth == 1 },
		"b's request to queue at its owner a")

	px.Cut() // b's connection drops with the attempt in flight
	var r admitResult
	select {
	case r = <-res:
	case <-time.After(30 * time.Second):
		t.Fatal("the request still waits for a reply its lost connection can never bring")
	}
	require.NoError(t, r.err, "NATS is down: the entry admits on its own actor (degraded mode)")
	require.Equal(t, "b", r.t.Owner().Replica)
	require.Equal(t, 1, r.req.Attempt, "resubmitted as a retry: the owner counted the first attempt")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.retries.WithLabelValues("connection_lost")))

	// Back on NATS, the cancel b sent for the lost attempt reaches a: the
	// queued attempt is withdrawn, not granted to a request that runs
	// elsewhere, and a's ledger empties once its own request ends.
	px.Restore()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.counters(t, "gold").Cancelled == 1 },
		"the lost attempt to be cancelled at its owner")
	// Back on NATS, b re-homes the booking it made in degraded mode to the
	// owner a (when that lands is a race), so both requests end before the
	// ledger check: a superseded attempt granted at a would stay booked there
	// until its renewal window (30 s) and fail it.
	hold.Finish(false)
	r.t.Dispatched()
	r.t.Finish(false)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Bookings == 0 },
		"a's ledger to empty: the superseded attempt was never booked")
	require.Zero(t, a.counters(t, "gold").Admitted-1, "a admitted only its own request")
}
