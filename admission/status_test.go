package admission

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// withRespond replaces how the owner side publishes an admit reply.
func withRespond(f func(m *nats.Msg, data []byte) error) ServerOption {
	return func(s *Server) { s.respond = f }
}

// dropFirstGrant is an owner's reply publisher that loses its first grant
// as NATS core may (at-most-once): the owner believes it published it.
type dropFirstGrant struct {
	mu      sync.Mutex
	dropped *nats.Msg
	data    []byte
	lost    chan struct{} // closed at the drop
}

func newDropFirstGrant() *dropFirstGrant { return &dropFirstGrant{lost: make(chan struct{})} }

func (d *dropFirstGrant) respond(m *nats.Msg, data []byte) error {
	rep, err := wire.DecodeAdmitReply(data)
	d.mu.Lock()
	drop := err == nil && rep.OK && d.dropped == nil
	if drop {
		d.dropped, d.data = m, data
		close(d.lost)
	}
	d.mu.Unlock()
	if drop {
		return nil
	}
	return m.Respond(data)
}

const statusAfter = 3 * time.Second

// statusHarness runs owner a and entry b of class gold on one fake clock.
func statusHarness(t *testing.T, ws []scheduler.Worker, opts ...ServerOption) (*harness, *clock.Fake, *replica, *replica) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, ws)
	fake := clock.NewFake(time.Now())
	h.clock = fake
	h.serverOpts = opts
	cfg := func(c *ClientConfig) { c.StatusAfter = statusAfter }
	a := h.start("a", cfg)
	h.serverOpts = nil
	b := h.start("b", cfg)
	return h, fake, a, b
}

// advanceToProbe waits until an attempt's probe timer is armed at
// StatusAfter from now on the fake clock, and fires it.
func advanceToProbe(t *testing.T, fake *clock.Fake) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return slices.ContainsFunc(fake.Deadlines(), func(at time.Time) bool { return at.Equal(fake.Now().Add(statusAfter)) })
	}, "the probe timer of the silent attempt")
	fake.Advance(statusAfter)
}

// awaitResult waits for an admission's result in wall time: the bound
// fails the test, it does not time the pass (the fake clock never reaches
// OwnerReplyTimeout, so without a probe the admission would never end).
func awaitResult(t *testing.T, res <-chan admitResult, what string) admitResult {
	t.Helper()
	select {
	case r := <-res:
		return r
	case <-time.After(20 * time.Second):
		t.Fatalf("%s: not answered after StatusAfter; without the status probe it waits OwnerReplyTimeout", what)
		return admitResult{}
	}
}

// bookings is how many bookings r's ledger holds.
func bookings(t *testing.T, r *replica) (n int) {
	t.Helper()
	require.NoError(t, r.actor.Do(context.Background(), func(c *scheduler.Core) { n = c.Bookings() }))
	return n
}

func TestALostGrantReplyIsRecoveredByTheStatusProbeAndUsedExactlyOnce(t *testing.T) {
	drop := newDropFirstGrant()
	_, fake, a, b := statusHarness(t, workers(2, 0), withRespond(drop.respond))
	require.NoError(t, a.server.Own("gold", 1))
	b.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 1}})
	a.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 1}})

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := request("gold", 0)
	res := admitAsync(ctx, b.client, req)
	<-drop.lost // granted at a; the reply is lost on the way
	advanceToProbe(t, fake)
	out := awaitResult(t, res, "a grant whose reply was lost")
	require.NoError(t, out.err)
	lost, err := wire.DecodeAdmitReply(drop.data)
	require.NoError(t, err)
	require.Equal(t, scheduler.BookingID(lost.Booking), out.t.Grant().Booking, "the probe returns the lost grant itself")
	require.Equal(t, Owner{Replica: "a", Epoch: 1}, out.t.Owner())
	require.Equal(t, 0, req.Attempt, "no resubmission")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.statusProbes.WithLabelValues("granted")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.server.m.statusAnswers.WithLabelValues("granted")))
	require.Equal(t, 0.0, testutil.ToFloat64(b.client.m.retries.WithLabelValues("reply_timeout")))
	out.t.Dispatched()

	// The original reply arrives after all: its inbox is gone, and it
	// names the booking the entry already holds.
	require.NoError(t, a.nc.Publish(drop.dropped.Reply, drop.data))
	require.NoError(t, a.nc.Flush())
	require.NoError(t, b.nc.Flush())
	n := bookings(t, a)
	require.Equal(t, 1, n, "one request, one booking in the owner's ledger")
	require.Equal(t, uint64(1), a.counters(t, "gold").Admitted)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.server.sent.len() == 0 }, "the dispatched mark forgets the kept reply")

	out.t.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return bookings(t, a) == 0 }, "the finished booking is freed, none leaked")
}

func TestAQueuedAttemptProbedStaysQueuedAndIsGrantedOnce(t *testing.T) {
	_, fake, a, b := statusHarness(t, workers(1, 1))
	require.NoError(t, a.server.Own("gold", 1))
	owners := map[string]Owner{"gold": {Replica: "a", Epoch: 1}}
	a.client.OwnersChanged(owners)
	b.client.OwnersChanged(owners)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	busy := occupy(t, ctx, a) // the only slot: b's request queues at a

	req := request("gold", 0)
	res := admitAsync(ctx, b.client, req)
	testenv.Eventually(t, 10*time.Second, func() bool { return a.snapshot(t).Classes["gold"].QueueDepth == 1 }, "b's request queued at a")
	for i := 1; i <= 2; i++ {
		advanceToProbe(t, fake)
		testenv.Eventually(t, 10*time.Second, func() bool {
			return testutil.ToFloat64(b.client.m.statusProbes.WithLabelValues("queued")) == float64(i)
		}, "probe answered queued")
	}
	busy.Dispatched()
	busy.Finish(false)
	out := awaitResult(t, res, "the queued request")
	require.NoError(t, out.err)
	require.Equal(t, 0, req.Attempt, "a queued attempt is never resubmitted")
	out.t.Dispatched()
	require.Equal(t, uint64(2), a.counters(t, "gold").Admitted, "the occupying request and this one, once")
	require.Equal(t, 0.0, testutil.ToFloat64(b.client.m.statusProbes.WithLabelValues("unknown")))
	require.Equal(t, 0.0, testutil.ToFloat64(b.client.m.statusProbes.WithLabelValues("granted")))
	n := bookings(t, a)
	require.Equal(t, 1, n)
	out.t.Finish(false)
}

func TestAnAdmitDeliveredToASubscriptionNobodyAnswersIsResubmittedOnUnknown(t *testing.T) {
	h, fake, a, b := statusHarness(t, workers(2, 0))
	// b believes a owns gold, but gold's admits reach a subscription that
	// never answers (a leftover of a previous life, say); a does not own
	// gold yet, so it has no admit subscription of its own.
	owners := map[string]Owner{"gold": {Replica: "a", Epoch: 1}}
	b.client.OwnersChanged(owners)
	zombie := rawConn(t, h)
	swallowed := make(chan *nats.Msg, 1)
	sub, err := zombie.Subscribe(wire.NewSubjects(cluster).Admit("gold"), func(m *nats.Msg) {
		select {
		case swallowed <- m:
		default:
		}
	})
	require.NoError(t, err)
	require.NoError(t, zombie.Flush())

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := request("gold", 0)
	res := admitAsync(ctx, b.client, req)
	<-swallowed
	require.NoError(t, sub.Unsubscribe())
	require.NoError(t, zombie.Flush())
	require.NoError(t, a.server.Own("gold", 1))
	a.client.OwnersChanged(owners)
	advanceToProbe(t, fake) // a answers unknown: b cancels and resubmits
	out := awaitResult(t, res, "an admit nobody answered")
	require.NoError(t, out.err)
	require.Equal(t, "a", out.t.Owner().Replica)
	require.Equal(t, 1, req.Attempt, "resubmitted once, as a retry")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.retries.WithLabelValues("status_unknown")))
	require.Equal(t, 1.0, testutil.ToFloat64(a.server.m.statusAnswers.WithLabelValues("unknown")))
	out.t.Dispatched()
	out.t.Finish(false)
}
