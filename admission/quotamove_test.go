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

// A burst of a tenant's requests reaching a class's new owner before the
// entries have re-homed the tenant's streams there is held (adoption hold),
// then checked against the adopted bookings: the tenant never has more than
// its concurrency quota in flight across the move. Without the hold the
// new owner admits the burst against a count of 0 and the tenant runs twice
// its quota.
func TestANewOwnerAdmitsATenantOnlyAgainstItsAdoptedConcurrency(t *testing.T) {
	t.Run("a burst entering at the new owner", func(t *testing.T) { adoptionHoldBurst(t, false) })
	t.Run("a burst entering at another replica", func(t *testing.T) { adoptionHoldBurst(t, true) })
}

// adoptionHoldBurst moves a class whose tenant has its concurrency quota in
// flight through entry b, and sends a burst of the tenant's requests to the
// new owner c before b has re-homed them: through c's own entry side, or
// (remote) through d's, over NATS.
func adoptionHoldBurst(t *testing.T, remote bool) {
	const quota = 3
	// The new owner's owner side runs on a fake clock: its hold ends when
	// the test says, after the adoption, however slow the machine.
	fake := clock.NewFake(time.Now())
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	c := h.start("c", func(c *ClientConfig) { c.AdoptHold, c.Clock = time.Second, fake })
	via := c
	if remote {
		via = h.start("d", nil)
	}
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	tenantReq := func() *scheduler.Request {
		r := request("gold", 0)
		r.Tenant = scheduler.Tenant{ID: "acme", Quota: scheduler.TenantQuota{Concurrent: quota}}
		return r
	}
	for range quota { // the tenant's quota of streams, entering at b
		tk, err := b.client.Admit(ctx, tenantReq())
		require.NoError(t, err)
		tk.Dispatched()
		defer tk.Finish(false)
	}
	_, err := b.client.Admit(ctx, tenantReq())
	require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "precondition: the quota is full at the old owner: %v", err)

	// The class moves to c. c knows at once (it acquired the class); b's
	// etcd watch shows the move only later.
	// a's subscriptions drain asynchronously; until they are gone a request
	// on admit.gold reaches both a and c, and a's "moved" answer, when it
	// wins, has the entry resubmit what c already holds (a flake: c held 6
	// of a burst of 5). In a cluster the old owner has let go before the
	// new one claims.
	oldSubs := a.server.subscriptions("gold")
	a.server.Disown("gold")
	testenv.Eventually(t, 5*time.Second, func() bool {
		for _, sub := range oldSubs {
			if sub.IsValid() {
				return false
			}
		}
		return true
	}, "a's subscriptions to drain")
	require.NoError(t, c.server.Own("gold", 2))
	c.client.OwnersChanged(map[string]Owner{"gold": {Replica: "c", Epoch: 2}})
	via.client.OwnersChanged(map[string]Owner{"gold": {Replica: "c", Epoch: 2}})
	const n = quota + 2
	burst := make([]<-chan admitResult, n)
	for i := range burst {
		burst[i] = admitAsync(ctx, via.client, tenantReq())
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		return c.counters(t, "gold").Received+uint64(testutil.ToFloat64(c.client.m.heldForAdoption)) >= n
	}, "every request of the burst has reached the new owner (answered or held)")
	require.Zero(t, c.counters(t, "gold").Received, "the whole burst is held, none queued")

	// Now b learns of the move and re-homes the tenant's streams to c.
	for _, r := range []*replica{a, b} {
		r.client.OwnersChanged(map[string]Owner{"gold": {Replica: "c", Epoch: 2}})
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return c.snapshot(t).Bookings >= quota },
		"the tenant's streams are adopted by c")
	fake.Advance(time.Second) // the hold ends

	admitted := 0
	for r := range merge(burst) {
		if r.err == nil {
			admitted++
			r.t.Dispatched()
			t.Cleanup(func() { r.t.Finish(false) })
			continue
		}
		require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(r.err), "%v", r.err)
	}
	require.Zero(t, admitted, "the tenant had its quota in flight: none of the burst may be admitted")
	require.Equal(t, quota, c.snapshot(t).Bookings, "the new owner's ledger carries exactly the quota")
	require.EqualValues(t, n, testutil.ToFloat64(c.client.m.heldForAdoption), "the whole burst was held")
}
