package admission

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// A new owner holds a quota'd tenant's requests after acquiring a class
// until the entries have re-homed their streams. Every entry ends its
// re-home round with a done report, even with nothing to move, so with
// every entry alive the hold ends as soon as the last report lands. The
// hold's bound here is an hour: only the reports can end it, and a
// tenant request the new owner admits proves it did.
func TestAnAdoptionHoldEndsWhenEveryLiveEntryHasReportedItsRehomeRound(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	h.serverOpts = []ServerOption{WithEntries(func() []string { return []string{"a", "b", "c"} })}
	hour := func(c *ClientConfig) { c.AdoptHold = time.Hour }
	a, b, c := h.start("a", hour), h.start("b", hour), h.start("c", hour)
	ctx := testenv.Context(t)
	h.own("gold", "a", 1)
	testenv.Eventually(t, 10*time.Second, func() bool { st, _ := a.server.AdoptHold("gold"); return st == holdComplete },
		"a's hold to end when a, b and c have reported")

	tenant := func() *scheduler.Request {
		r := request("gold", 0)
		r.Tenant = scheduler.Tenant{ID: "acme", Quota: scheduler.TenantQuota{Concurrent: 4}}
		return r
	}
	tk, err := b.client.Admit(ctx, tenant()) // a stream that moves with the class
	require.NoError(t, err)
	tk.Dispatched()
	defer tk.Finish(false)

	h.own("gold", "c", 2) // the class moves to c; every entry learns it
	testenv.Eventually(t, 10*time.Second, func() bool { st, _ := c.server.AdoptHold("gold"); return st == holdComplete },
		"c's hold to end when a, b and c have reported")
	require.Equal(t, 1, c.snapshot(t).Bookings, "b's stream was adopted before its report")
	c.server.mu.Lock()
	t.Logf("c's adoption hold (bound 1h) ended after %v", c.server.owned["gold"].hold.lasted) // measured, not asserted
	c.server.mu.Unlock()
	require.EqualValues(t, 1, testutil.ToFloat64(c.server.m.adoptHolds.WithLabelValues(holdComplete)))
	require.Zero(t, testutil.ToFloat64(c.server.m.adoptHolds.WithLabelValues(holdBound)))

	for _, via := range []*replica{c, b} { // the owner's own entry and a remote one
		tk, err := via.client.Admit(ctx, tenant())
		require.NoError(t, err, "admitted without waiting out the hour")
		require.Equal(t, "c", tk.Owner().Replica)
		tk.Dispatched()
		tk.Finish(false)
	}
	require.Zero(t, testutil.ToFloat64(c.client.m.heldForAdoption), "nothing was held: the hold had ended")
}

// An entry that never reports (cut from NATS, or an older version) leaves
// the hold to its bound: it still ends then, counted as such.
func TestAnAdoptionHoldWithASilentEntryEndsAtItsBound(t *testing.T) {
	fake := clock.NewFake(time.Now())
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	// d is registered but never answers.
	h.serverOpts = []ServerOption{WithEntries(func() []string { return []string{"a", "b", "c", "d"} })}
	h.start("a", nil)
	h.start("b", nil)
	c := h.start("c", func(c *ClientConfig) { c.AdoptHold, c.Clock = time.Second, fake })
	h.own("gold", "c", 1)
	reported := func() int {
		c.server.mu.Lock()
		defer c.server.mu.Unlock()
		return len(c.server.owned["gold"].hold.reported)
	}
	testenv.Eventually(t, 10*time.Second, func() bool { return reported() == 3 }, "a, b and c to report")
	st, _ := c.server.AdoptHold("gold")
	require.Empty(t, st, "still holding: d has not reported")

	// A tenant request arriving now is held.
	r := request("gold", 0)
	r.Tenant = scheduler.Tenant{ID: "acme", Quota: scheduler.TenantQuota{Concurrent: 4}}
	res := admitAsync(testenv.Context(t), h.replicas["a"].client, r)
	testenv.Eventually(t, 10*time.Second, func() bool { return testutil.ToFloat64(c.client.m.heldForAdoption) == 1 },
		"the request to be held")

	fake.Advance(time.Second)
	testenv.Eventually(t, 10*time.Second, func() bool { st, _ := c.server.AdoptHold("gold"); return st == holdBound },
		"the hold to end at its bound")
	require.EqualValues(t, 1, testutil.ToFloat64(c.server.m.adoptHolds.WithLabelValues(holdBound)))
	require.Zero(t, testutil.ToFloat64(c.server.m.adoptHolds.WithLabelValues(holdComplete)))
	got := <-res
	require.NoError(t, got.err)
	got.t.Dispatched()
	got.t.Finish(false)
}
