package admission

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// threeOwners starts replicas a, b and c leasing quotas, each owning one of
// the classes gold, silver and bronze; the tenant acme's home class is gold
// (quota owner a).
func threeOwners(t *testing.T, clk clock.Clock) (*harness, []*replica, []string) {
	return threeOwnersHold(t, clk, 0)
}

// threeOwnersHold is threeOwners with the owners' adoption hold.
func threeOwnersHold(t *testing.T, clk clock.Clock, hold time.Duration) (*harness, []*replica, []string) {
	classes := []string{"gold", "silver", "bronze"}
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold"), fcfs("silver"), fcfs("bronze")}, workers(4, 0))
	qc := DefaultQuotaConfig()
	qc.HomeOf = func(string) string { return "gold" }
	h.quota, h.clock = &qc, clk
	withHold := func(c *ClientConfig) { c.AdoptHold = hold }
	reps := []*replica{h.start("a", withHold), h.start("b", withHold), h.start("c", withHold)}
	all := map[string]Owner{}
	for i, class := range classes {
		require.NoError(t, reps[i].server.Own(class, int64(i+1)))
		all[class] = Owner{Replica: reps[i].id, Epoch: int64(i + 1)}
	}
	for _, r := range reps {
		r.client.OwnersChanged(all)
	}
	return h, reps, classes
}

func tenantRequest(class string, quota scheduler.TenantQuota) *scheduler.Request {
	r := request(class, 0)
	r.Tenant = scheduler.Tenant{ID: "acme", Quota: quota}
	return r
}

// A tenant with concurrent: 10 whose requests go to three classes owned by
// three replicas, entering at all three, has at most 10 in flight: the 11th
// is 429 whichever replica it enters and whichever class it asks for, also
// after one of the classes moved to another owner with the tenant's streams
// in flight. A freed slot held idle by one class's owner is recalled for
// another class, so the tenant is not refused below its quota. Without
// leasing each owner admits up to 10: 30 in flight.
func TestATenantsConcurrencyQuotaHoldsAcrossItsClassesAndOwners(t *testing.T) {
	const quota = 10
	_, reps, classes := threeOwners(t, nil)
	ctx := testenv.Context(t)
	q := scheduler.TenantQuota{Concurrent: quota}
	inflight := admitWholeQuota(ctx, t, reps, classes, q)
	eleventh := func(when string) {
		t.Helper()
		for _, r := range reps {
			for _, class := range classes {
				_, err := r.client.Admit(ctx, tenantRequest(class, q))
				require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err),
					"%s: the 11th request via %s in %s must be 429: %v", when, r.id, class, err)
				var rej *scheduler.RejectError
				require.ErrorAs(t, err, &rej)
				require.Equal(t, scheduler.LimitTenantConcurrent, rej.Limit)
			}
		}
	}
	eleventh("with 10 in flight over three owners")

	// A slot freed in gold (owner a, which keeps it as slack) serves a
	// request of bronze (owner c): the quota owner recalls it.
	inflight[0].Finish(false)
	inflight = inflight[1:]
	testenv.Eventually(t, 5*time.Second, func() bool {
		tk, err := reps[1].client.Admit(ctx, tenantRequest("bronze", q))
		if err != nil {
			require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "%v", err)
			return false
		}
		tk.Dispatched()
		t.Cleanup(func() { tk.Finish(false) })
		inflight = append(inflight, tk)
		return true
	}, "the freed slot is admitted in another class at another owner")
	require.Positive(t, testutil.ToFloat64(reps[0].client.m.quotaRecalls.WithLabelValues("returned")),
		"the quota owner recalled idle slack")
	eleventh("after a slot moved between classes")

	// silver moves from b to c with the tenant's streams in flight; the
	// entries re-home them (adopt), c claims their slots.
	reps[1].server.Disown("silver")
	require.NoError(t, reps[2].server.Own("silver", 4))
	for _, r := range reps {
		r.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 1}, "silver": {Replica: "c", Epoch: 4}, "bronze": {Replica: "c", Epoch: 3}})
	}
	testenv.Eventually(t, 5*time.Second, func() bool { return reps[1].snapshot(t).Bookings == 0 },
		"the streams of silver are re-homed away from b")
	eleventh("after silver moved to c")
	requireLedgersCarry(t, reps, quota)
}

// admitWholeQuota admits q.Concurrent of the tenant's requests spread over
// the replicas and classes, all dispatched, returns their tickets and
// finishes them when the test ends (Finish is idempotent).
func admitWholeQuota(ctx context.Context, t *testing.T, reps []*replica, classes []string, q scheduler.TenantQuota) []*Ticket {
	t.Helper()
	var tickets []*Ticket
	for i := range q.Concurrent {
		tk, err := reps[i%3].client.Admit(ctx, tenantRequest(classes[(i/3+i)%3], q))
		require.NoError(t, err, "request %d is within the quota", i)
		tk.Dispatched()
		t.Cleanup(func() { tk.Finish(false) })
		tickets = append(tickets, tk)
	}
	return tickets
}

// requireLedgersCarry asserts that the owners' ledgers together book exactly
// want requests.
func requireLedgersCarry(t *testing.T, reps []*replica, want int) {
	t.Helper()
	total := 0
	for _, r := range reps {
		total += r.snapshot(t).Bookings
	}
	require.Equal(t, want, total, "the owners' ledgers carry exactly the quota")
}

// When the tenant's home class moves, so does its quota owner: the new one
// starts an empty ledger, holds grants for the adoption hold while the
// holders re-report what they hold, and then refuses the 11th request like
// the old one did. Without the hold the new owner grants against an empty
// ledger: the 11th request in gold is admitted.
func TestATenantsConcurrencyQuotaHoldsWhenItsQuotaOwnerMoves(t *testing.T) {
	const quota = 10
	_, reps, classes := threeOwnersHold(t, nil, 500*time.Millisecond)
	ctx := testenv.Context(t)
	q := scheduler.TenantQuota{Concurrent: quota}
	admitWholeQuota(ctx, t, reps, classes, q)
	// gold, the home class, moves from a to b: b is the quota owner now.
	reps[0].server.Disown("gold")
	require.NoError(t, reps[1].server.Own("gold", 4))
	for _, r := range reps {
		r.client.OwnersChanged(map[string]Owner{"gold": {Replica: "b", Epoch: 4}, "silver": {Replica: "b", Epoch: 2}, "bronze": {Replica: "c", Epoch: 3}})
	}
	for _, r := range reps {
		for _, class := range classes {
			_, err := r.client.Admit(ctx, tenantRequest(class, q))
			require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err),
				"after the quota owner moved, the 11th request via %s in %s must be 429: %v", r.id, class, err)
		}
	}
	require.Positive(t, testutil.ToFloat64(reps[1].client.m.quotaGrants.WithLabelValues("held"))+
		testutil.ToFloat64(reps[1].client.m.heldForAdoption), "the new owner held the tenant's requests or its grants")
	requireLedgersCarry(t, reps, quota)
}

// The quota owner's central tokens bucket travels with the home class: a
// tenant that spent it through one class is still refused in another class
// after its home class moved (the new quota owner starts from the saved
// level). Without the carry the new quota owner starts a full bucket and
// the request is admitted.
func TestASpentCentralTokensBucketStaysSpentWhenTheHomeClassMoves(t *testing.T) {
	const tpm = 3000
	fake := clock.NewFake(time.Now())
	store := &memBuckets{owner: 1, data: map[string][]byte{}}
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold"), fcfs("silver"), fcfs("bronze")}, workers(4, 0))
	qc := DefaultQuotaConfig()
	qc.HomeOf = func(string) string { return "gold" }
	h.quota, h.clock, h.quotaStore = &qc, fake, store
	noHold := func(c *ClientConfig) { c.AdoptHold = 0 }
	reps := []*replica{h.start("a", noHold), h.start("b", noHold), h.start("c", noHold)}
	owners := map[string]Owner{}
	for i, class := range []string{"gold", "silver", "bronze"} {
		require.NoError(t, reps[i].server.Own(class, int64(i+1)))
		owners[class] = Owner{Replica: reps[i].id, Epoch: int64(i + 1)}
	}
	for _, r := range reps {
		r.client.OwnersChanged(owners)
	}
	ctx := testenv.Context(t)
	q := scheduler.TenantQuota{TokensPerMinute: tpm}
	req := func(class string) *scheduler.Request {
		r := tenantRequest(class, q)
		r.PromptTokens, r.ExpectedOutputTokens = 150, 100
		return r
	}
	spent := false
	for range tpm/250 + 1 { // spend the bucket through silver (owner b)
		tk, err := reps[1].client.Admit(ctx, req("silver"))
		if err != nil {
			require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "%v", err)
			spent = true
			break
		}
		tk.Dispatched()
		tk.Finish(false)
	}
	require.True(t, spent, "precondition: the bucket is spent")

	// gold moves from a to b: a saves its central levels, b loads them.
	reps[0].server.Disown("gold")
	reps[0].quota.Released("gold", 1)
	store.mu.Lock()
	store.owner = 4
	store.mu.Unlock()
	reps[1].quota.Acquired("gold")
	require.NoError(t, reps[1].server.Own("gold", 4))
	owners["gold"] = Owner{Replica: "b", Epoch: 4}
	for _, r := range reps {
		r.client.OwnersChanged(owners)
	}
	_, err := reps[2].client.Admit(ctx, req("bronze"))
	require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err),
		"bronze's owner never charged its own bucket: only the carried central bucket refuses: %v", err)
	var rej *scheduler.RejectError
	require.ErrorAs(t, err, &rej)
	require.Equal(t, scheduler.LimitTenantTokensPerMinute, rej.Limit)
}

// tokens_per_minute holds within 5% over three classes owned by three
// replicas, entered at all three, over two minutes of load that never
// reports usage (the estimates stand). The replicas run on one fake clock
// advanced in steps of 250 ms, so the two minutes take seconds. Without
// leasing each owner admits a full bucket per minute: about three times
// the quota.
func TestATenantsTokensQuotaHoldsAcrossItsClassesAndOwners(t *testing.T) {
	const tpm = 20_000
	fake := clock.NewFake(time.Now())
	_, reps, classes := threeOwners(t, fake)
	ctx := testenv.Context(t)
	q := scheduler.TenantQuota{TokensPerMinute: tpm}
	var admitted int64
	const step, steps = 250 * time.Millisecond, 480 // 2 minutes
	for s := range steps {
		for i := range 9 {
			r := tenantRequest(classes[i%3], q)
			r.PromptTokens, r.ExpectedOutputTokens = 150, 100 // 250 tokens charged
			tk, err := reps[(i/3+s)%3].client.Admit(ctx, r)
			if err != nil {
				require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "%v", err)
				continue
			}
			admitted += r.TenantEstimate()
			tk.Dispatched()
			tk.Finish(false) // no usage reported: the estimate stands
		}
		fake.Advance(step)
	}
	// A token bucket admits at most its capacity plus the refill of the
	// window.
	bound := float64(tpm + 2*tpm)
	t.Logf("admitted %d tokens over 2 minutes; bound %.0f (%.1f%%)", admitted, bound, 100*float64(admitted)/bound)
	require.LessOrEqual(t, float64(admitted), 1.05*bound, "the tenant got more than its tokens quota")
	require.GreaterOrEqual(t, float64(admitted), 0.95*bound, "the tenant got much less than its quota: false 429s")
}

// When the tenant's quota owner does not answer (it is cut from NATS), a
// class owner falls back to its own per-owner enforcement, counted.
func TestAClassOwnerFallsBackToItsOwnQuotaWhenTheQuotaOwnerIsUnreachable(t *testing.T) {
	_, reps, _ := threeOwners(t, nil)
	ctx := testenv.Context(t)
	q := scheduler.TenantQuota{Concurrent: 2}
	reps[0].quota.cfg.Refresh = time.Hour
	// a, the quota owner, stops answering lease requests.
	reps[0].stop()
	var tks []*Ticket
	for i := range 2 {
		tk, err := reps[2].client.Admit(ctx, tenantRequest("bronze", q))
		require.NoError(t, err, "request %d", i)
		tks = append(tks, tk)
	}
	_, err := reps[2].client.Admit(ctx, tenantRequest("bronze", q))
	require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "the per-owner quota still applies: %v", err)
	require.Positive(t, testutil.ToFloat64(reps[2].client.m.quotaFallbacks.WithLabelValues("unreachable"))+
		testutil.ToFloat64(reps[2].client.m.quotaFallbacks.WithLabelValues("no_owner")), "the fallback is counted")
	for _, tk := range tks {
		tk.Finish(false)
	}
}

// BenchmarkQuotaCheck measures what leasing adds to an admission at its
// class's owner: the owner's local admit through its actor (today's
// single-owner check, in the Core) against the same with the lease taken
// from the local lease (fast path) or from the quota owner (slow path: in
// process when the holder is the quota owner, else over NATS), reporting
// each iteration's p50 and p99.
func BenchmarkQuotaCheck(b *testing.B) {
	run := func(b *testing.B, leaseQuota bool, slow bool, class string) {
		h := newHarnessTB(b, []scheduler.ClassConfig{fcfs("gold"), fcfs("silver")}, workers(4, 0))
		if leaseQuota {
			qc := DefaultQuotaConfig()
			qc.HomeOf = func(string) string { return "gold" }
			h.quota = &qc
		}
		noHold := func(c *ClientConfig) { c.AdoptHold = 0 }
		a, bb := h.start("a", noHold), h.start("b", noHold)
		at := bb
		if class == "gold" {
			at = a // the holder is the quota owner
		}
		require.NoError(b, h.replicas["a"].server.Own("gold", 1))
		require.NoError(b, h.replicas["b"].server.Own("silver", 2))
		for _, r := range h.replicas {
			r.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 1}, "silver": {Replica: "b", Epoch: 2}})
		}
		quota := scheduler.TenantQuota{Concurrent: 1000, TokensPerMinute: 1 << 30}
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for range b.N {
			r := tenantRequest(class, quota) // silver: admitted at b, quota owner a
			start := time.Now()
			g, _, _, err := at.client.admitLocal(ctx, r, true)
			lat = append(lat, time.Since(start))
			if err != nil {
				b.Fatal(err)
			}
			at.actor.Finish(g.Booking)
			if slow {
				at.quota.recallLocal("acme") // the next check finds the lease empty
			}
		}
		b.StopTimer()
		reportPercentiles(b, lat)
	}
	b.Run("single_owner", func(b *testing.B) { run(b, false, false, "silver") })
	b.Run("lease_fast_path", func(b *testing.B) { run(b, true, false, "silver") })
	b.Run("lease_slow_path_local_quota_owner", func(b *testing.B) { run(b, true, true, "gold") })
	b.Run("lease_slow_path_remote_quota_owner", func(b *testing.B) { run(b, true, true, "silver") })
}

// BenchmarkQuotaAcquireFastPath is the fast path alone: a slot and tokens
// from the local lease and back, with no actor.
func BenchmarkQuotaAcquireFastPath(b *testing.B) {
	h := newHarnessTB(b, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	qc := DefaultQuotaConfig()
	qc.HomeOf = func(string) string { return "gold" }
	h.quota = &qc
	a := h.start("a", func(c *ClientConfig) { c.AdoptHold = 0 })
	h.own("gold", "a", 1)
	quota := scheduler.TenantQuota{Concurrent: 1000, TokensPerMinute: 1 << 30}
	r := tenantRequest("gold", quota)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		start := time.Now()
		t, err := a.quota.acquire(ctx, r)
		lat = append(lat, time.Since(start))
		if err != nil {
			b.Fatal(err)
		}
		t.cancel()
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

func reportPercentiles(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	sorted := append([]time.Duration(nil), lat...)
	slices.Sort(sorted)
	b.ReportMetric(float64(sorted[len(sorted)/2].Nanoseconds())/1e3, "p50-µs")
	b.ReportMetric(float64(sorted[len(sorted)*99/100].Nanoseconds())/1e3, "p99-µs")
}
