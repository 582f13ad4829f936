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

// An owner cut from NATS keeps its etcd key until it withdraws, and its
// entries used to retry "no responders" for NoOwnerTimeout (30 s) before
// answering 503. Here NoOwnerTimeout is an hour: only treating the silent
// owner as unreachable after the short bound lets the request through.
func TestARequestWhoseRegisteredOwnerAnswersNoRespondersIsAdmittedLocallyAfterTheBound(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 4))
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	a := h.startAt("a", "nats://"+px.Addr(), nil)
	b := h.start("b", func(c *ClientConfig) {
		c.NoOwnerTimeout = time.Hour
		c.OwnerUnreachableAfter = 300 * time.Millisecond
	})
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)

	subs := h.nats.Server.NumSubscriptions()
	px.Cut() // a's subscriptions leave the server with its connection; its key (here: b's view) stays
	// (Until the server has noticed, a request would be delivered to the
	// dead connection and wait for a reply; in a cluster the owner's
	// withdrawal then moves the class and the entry resubmits.)
	testenv.Eventually(t, 10*time.Second, func() bool { return h.nats.Server.NumSubscriptions() < subs },
		"the server to drop a's subscriptions")
	var r admitResult
	select {
	case r = <-admitAsync(ctx, b.client, request("gold", 0)):
	case <-time.After(20 * time.Second):
		t.Fatal("the request still waits for an owner that answers no responders")
	}
	require.NoError(t, r.err)
	require.Equal(t, "b", r.t.Owner().Replica, "admitted by the entry's own scheduler")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.ownerUnreachableAdmits.WithLabelValues("gold")), "counted per class")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.degradedAdmits), "and as a degraded admission")
	require.Equal(t, map[string]string{"gold": "a"}, b.client.UnreachableOwners())
	require.Contains(t, b.client.DegradedModes(), "owner_unreachable", "shown on /readyz")
	require.True(t, b.client.Degraded())

	// Once a is back (its connection resubscribes), the next request goes
	// to it and the fallback ends.
	px.Restore()
	testenv.Eventually(t, 10*time.Second, func() bool { return a.nc.IsConnected() }, "a to reconnect")
	var r2 admitResult
	testenv.Eventually(t, 10*time.Second, func() bool {
		r2 = <-admitAsync(ctx, b.client, request("gold", 0))
		if r2.err == nil && r2.t.Owner().Replica != "a" {
			r2.t.Dispatched()
			r2.t.Finish(false)
			return false
		}
		return true
	}, "a request to be admitted by the owner again")
	require.NoError(t, r2.err)
	require.Empty(t, b.client.UnreachableOwners(), "the owner answered: the fallback is over")
	require.NotContains(t, b.client.DegradedModes(), "owner_unreachable")
	for _, tk := range []*Ticket{r.t, r2.t} {
		tk.Dispatched()
		tk.Finish(false)
	}
}

// A request sent to the old owner just before a class moved gets "no
// responders" after the move (the old owner unsubscribed when it let go).
// That answer must not mark the class's owner unreachable: nothing would
// forget it until the owners changed again, and the replica stayed
// degraded for a class it had come to own itself (seen in make e2e).
func TestANoRespondersAnswerFromAFormerOwnerMarksNothingUnreachable(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 4))
	h.start("a", nil)
	b := h.start("b", func(c *ClientConfig) { c.OwnerUnreachableAfter = time.Nanosecond })
	h.own("gold", "a", 1)
	h.own("gold", "b", 2) // the class moved to b while a request to a was in flight

	b.client.noteNoResponders("gold", Owner{Replica: "a", Epoch: 1}) // that request's late answer
	require.Empty(t, b.client.UnreachableOwners())
	require.NotContains(t, b.client.DegradedModes(), "owner_unreachable")

	// The registered owner answering "no responders" is still recorded.
	h.own("gold", "a", 3)
	b.client.noteNoResponders("gold", Owner{Replica: "a", Epoch: 3})
	require.Equal(t, map[string]string{"gold": "a"}, b.client.UnreachableOwners())
}
