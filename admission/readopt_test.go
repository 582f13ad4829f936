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

// An entry cut from NATS for longer than the booking expiry loses its
// remote bookings at their owner: no renewal reaches it. Its streams go on,
// so when the entry is back the owner's ledger must carry them again; the
// owner and epoch did not change, so the re-home on an ownership change
// never did that, and the owner under-counted until the streams ended.
func TestAnEntryBackFromACutLongerThanTheBookingExpiryReadoptsItsLiveBookings(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 8))
	// The cut may come before the dispatched marks reach a: then the
	// grants expire at the ack timeout, which bounds them like the expiry.
	h.sched = func(c *scheduler.Config) { c.BookingExpiry, c.AckTimeout = time.Second, time.Second }
	a := h.start("a", nil)
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	b := h.startAt("b", "nats://"+px.Addr(), func(c *ClientConfig) { c.RenewInterval = 100 * time.Millisecond })
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)

	var tickets []*Ticket
	for range 2 {
		tk, err := b.client.Admit(ctx, request("gold", 0))
		require.NoError(t, err)
		require.Equal(t, "a", tk.Owner().Replica)
		tk.Dispatched()
		tickets = append(tickets, tk)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Bookings == 2 }, "a books b's two streams")

	px.Cut()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Bookings == 0 },
		"a's bookings of the cut entry to expire (no renewal reaches it)")

	px.Restore()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Bookings == 2 },
		"a's ledger to carry b's two live streams again")
	testenv.Eventually(t, 10*time.Second, func() bool { return testutil.ToFloat64(b.client.m.rehomed) == 2 },
		"both bookings re-adopted and their old ids freed")
	for _, tk := range tickets {
		require.Equal(t, "a", tk.Owner().Replica)
		require.Equal(t, int64(1), tk.Owner().Epoch, "same owner, same epoch")
	}
	// Renewals keep the new bookings (expiry 1 s, renewed every 100 ms),
	// and finishing the streams frees them: the ledger equals the streams.
	require.Never(t, func() bool { return a.snapshot(t).Bookings != 2 }, 1500*time.Millisecond, 100*time.Millisecond,
		"re-adopted bookings are renewed, not expired again")
	for _, tk := range tickets {
		tk.Finish(false)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Bookings == 0 }, "the finished streams to leave a's ledger")
}
