package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func tenantReq(id, cls, tenant string, weight, isl int, q TenantQuota) *Request {
	r := req(id, cls, isl)
	r.Tenant = Tenant{ID: tenant, Weight: weight, Quota: q}
	return r
}

func TestATenantOverItsConcurrencyQuotaIsRejectedUntilOneOfItsRequestsEnds(t *testing.T) {
	h := newHarness(t, workers(4, 100), classCfg("c", PolicyFCFS))
	q := TenantQuota{Concurrent: 10}
	var bookings []BookingID
	for i := range 10 {
		id := fmt.Sprintf("a-%d", i)
		h.enqueue(tenantReq(id, "c", "acme", 1, 64, q))
		bookings = append(bookings, h.granted(id).Booking)
	}
	h.enqueue(tenantReq("a-10", "c", "acme", 1, 64, q))
	rej := h.rejected("a-10", ErrQuotaExceeded)
	require.Equal(t, LimitTenantConcurrent, rej.Limit)
	require.Equal(t, ReasonQuotaExceeded, rej.Reason)

	h.enqueue(tenantReq("b-0", "c", "other", 1, 64, q))
	h.granted("b-0") // quotas are per tenant

	h.core.Finish(bookings[0])
	h.enqueue(tenantReq("a-11", "c", "acme", 1, 64, q))
	h.granted("a-11")
	require.Equal(t, 10, h.core.TenantInflight("acme"))
	c := h.counters("c")
	require.Equal(t, uint64(1), c.Rejected[ReasonQuotaExceeded])
	require.Equal(t, c.Received, c.Admitted+c.Rejected[ReasonQuotaExceeded])
}

func TestQueuedRequestsHoldATenantsConcurrencySlotsAndCancelReleasesThem(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 1)
	q := TenantQuota{Concurrent: 2}
	h.enqueue(tenantReq("q1", "c", "acme", 1, 64, q))
	h.enqueue(tenantReq("q2", "c", "acme", 1, 64, q))
	h.pending("q1")
	h.pending("q2")
	h.enqueue(tenantReq("q3", "c", "acme", 1, 64, q))
	h.rejected("q3", ErrQuotaExceeded)

	require.True(t, h.core.Cancel("q1"))
	h.enqueue(tenantReq("q4", "c", "acme", 1, 64, q))
	h.pending("q4")
	require.Equal(t, 2, h.core.TenantInflight("acme"))
}

func TestRequestsPerMinuteIsATokenBucketWithARetryAfter(t *testing.T) {
	h := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	q := TenantQuota{RequestsPerMinute: 6} // one every 10 s
	for i := range 6 {
		id := fmt.Sprintf("r-%d", i)
		h.enqueue(tenantReq(id, "c", "acme", 1, 16, q))
		h.core.Finish(h.granted(id).Booking)
	}
	h.enqueue(tenantReq("r-6", "c", "acme", 1, 16, q))
	rej := h.rejected("r-6", ErrQuotaExceeded)
	require.Equal(t, LimitTenantRequestsPerMinute, rej.Limit)
	require.Equal(t, 10*time.Second, rej.RetryAfter)

	h.clock.Advance(4 * time.Second)
	h.enqueue(tenantReq("r-7", "c", "acme", 1, 16, q))
	require.Equal(t, 6*time.Second, h.rejected("r-7", ErrQuotaExceeded).RetryAfter)
	h.clock.Advance(6 * time.Second)
	h.enqueue(tenantReq("r-8", "c", "acme", 1, 16, q))
	h.granted("r-8")
}

func TestTokensPerMinuteIsChargedTheEstimateAndCorrectedWithTheReportedUsage(t *testing.T) {
	h := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	q := TenantQuota{TokensPerMinute: 1000}
	a := tenantReq("a", "c", "acme", 1, 300, q)
	a.ExpectedOutputTokens = 500 // estimate 800
	h.enqueue(a)
	ba := h.granted("a").Booking

	h.enqueue(tenantReq("b", "c", "acme", 1, 300, q)) // needs 300, 200 left
	rej := h.rejected("b", ErrQuotaExceeded)
	require.Equal(t, LimitTenantTokensPerMinute, rej.Limit)
	require.Equal(t, 6*time.Second, rej.RetryAfter, "100 tokens at 1000/min")

	// The engine reports 350 tokens used: 450 come back.
	h.core.FinishUsage(ba, 350)
	h.enqueue(tenantReq("c", "c", "acme", 1, 300, q))
	bc := h.granted("c").Booking

	// A request that used more than estimated leaves the bucket in debt.
	h.core.FinishUsage(bc, 1650) // 650 - 300 + 300 - 1650 = -1000
	h.enqueue(tenantReq("d", "c", "acme", 1, 10, q))
	// 1010 tokens to go at 1000 per minute.
	require.Equal(t, 61*time.Second, h.rejected("d", ErrQuotaExceeded).RetryAfter.Round(time.Second))
}

func TestAQueuedBurstCannotRunPastTheTokenBucket(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	h.occupy("c", 1)
	q := TenantQuota{TokensPerMinute: 1000}
	for i := range 5 {
		h.enqueue(tenantReq(fmt.Sprintf("q%d", i), "c", "acme", 1, 300, q))
	}
	h.pending("q0")
	h.pending("q1")
	h.pending("q2")
	h.rejected("q3", ErrQuotaExceeded)
	h.rejected("q4", ErrQuotaExceeded)
}

func TestAdoptedBookingsRebuildTheTenantsConcurrencyAtTheNewOwner(t *testing.T) {
	old := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	q := TenantQuota{Concurrent: 3}
	var recs []BookingRecord
	for i := range 3 {
		id := fmt.Sprintf("a-%d", i)
		old.enqueue(tenantReq(id, "c", "acme", 1, 64, q))
		rec, ok := old.core.Booking(old.granted(id).Booking)
		require.True(t, ok)
		require.Equal(t, "acme", rec.Tenant)
		recs = append(recs, rec)
	}

	h := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	var adopted []BookingID
	for _, rec := range recs {
		adopted = append(adopted, h.core.Adopt(rec))
	}
	require.Equal(t, 3, h.core.TenantInflight("acme"))
	h.enqueue(tenantReq("a-3", "c", "acme", 1, 64, q))
	h.rejected("a-3", ErrQuotaExceeded)
	h.core.Finish(adopted[1])
	h.enqueue(tenantReq("a-4", "c", "acme", 1, 64, q))
	h.granted("a-4")
}

func TestIdleTenantsAreForgottenOnceTheirBucketsRefill(t *testing.T) {
	h := newHarness(t, workers(1, 100), classCfg("c", PolicyFCFS))
	h.enqueue(tenantReq("a", "c", "acme", 1, 64, TenantQuota{RequestsPerMinute: 60}))
	h.core.Finish(h.granted("a").Booking)
	h.core.Snapshot()
	require.Contains(t, h.core.tenants, "acme", "its bucket is not full yet")
	h.clock.Advance(time.Second)
	h.core.Snapshot()
	require.NotContains(t, h.core.tenants, "acme")
}

// serveShares saturates one slot with two tenants' backlogs in one class
// and returns how many of n grants each tenant got.
func serveShares(t *testing.T, n int, islA, islB int) map[string]int {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	owner := map[string]string{}
	for i := range 2 * n {
		a, b := fmt.Sprintf("heavy-%d", i), fmt.Sprintf("light-%d", i)
		owner[a], owner[b] = "heavy", "light"
		h.enqueue(tenantReq(a, "c", "heavy", 3, islA, TenantQuota{}))
		h.enqueue(tenantReq(b, "c", "light", 1, islB, TenantQuota{}))
	}
	served := map[string]int{}
	for _, id := range h.drainOneByOne(running, n) {
		served[owner[id]]++
	}
	return served
}

func TestTwoTenantsWithWeightsThreeToOneShareAContendedClassThreeToOne(t *testing.T) {
	served := serveShares(t, 400, 64, 64)
	ratio := float64(served["heavy"]) / float64(served["light"])
	t.Logf("served %v, ratio %.3f", served, ratio)
	require.InDelta(t, 3.0, ratio, 0.15, "within 5%% of 3:1")
}

func TestTenantSharesAreInTokensWhenRequestSizesDiffer(t *testing.T) {
	// The light tenant's requests are three times as large: by tokens the
	// 3:1 weights give the heavy tenant nine times the requests.
	served := serveShares(t, 400, 64, 192)
	ratio := float64(served["heavy"]) / float64(served["light"])
	t.Logf("served %v, ratio %.3f", served, ratio)
	require.InDelta(t, 9.0, ratio, 0.45)
}

func TestOneTenantsBurstDoesNotStarveAnotherTenantThatArrivesLater(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	for i := range 500 {
		h.enqueue(tenantReq(fmt.Sprintf("burst-%d", i), "c", "burst", 1, 64, TenantQuota{}))
	}
	h.enqueue(tenantReq("late", "c", "late", 1, 64, TenantQuota{}))
	// Equal weights and costs: the burst's first turn is one quantum (four
	// requests), then the late tenant's.
	order := h.drainOneByOne(running, 5)
	require.Equal(t, "late", order[4], "FCFS alone would serve it after 500 others")
}

func TestRequestsWithoutATenantShareWithTenantsAsOneTenantOfWeightOne(t *testing.T) {
	h := newHarness(t, workers(1, 1), classCfg("c", PolicyFCFS))
	running := h.occupy("c", 1)[0]
	for i := range 100 {
		h.enqueue(req(fmt.Sprintf("anon-%d", i), "c", 64))
	}
	for i := range 100 {
		h.enqueue(tenantReq(fmt.Sprintf("t-%d", i), "c", "acme", 1, 64, TenantQuota{}))
	}
	served := map[byte]int{}
	for _, id := range h.drainOneByOne(running, 40) {
		served[id[0]]++
	}
	require.Equal(t, 20, served['a'])
	require.Equal(t, 20, served['t'])
}

func TestTenantSharingKeepsEveryRequestCompletedExactlyOnce(t *testing.T) {
	// Random arrivals, cancels and finishes over three tenants: every
	// request ends exactly once, and the tenant accounting returns to zero.
	rng := rand.New(rand.NewPCG(7, 7))
	h := newHarness(t, workers(2, 2), classCfg("c", PolicyFCFS))
	var live []BookingID
	ids := []string{}
	for i := range 2000 {
		switch op := rng.IntN(10); {
		case op < 6:
			id := fmt.Sprintf("r%d", i)
			ids = append(ids, id)
			tn := []string{"", "a", "b"}[rng.IntN(3)]
			h.enqueue(tenantReq(id, "c", tn, 1+rng.IntN(3), 1+rng.IntN(200), TenantQuota{Concurrent: 20}))
		case op < 8 && len(ids) > 0:
			h.core.Cancel(ids[rng.IntN(len(ids))])
		default:
			for _, id := range h.order {
				if o := h.got[id]; len(o) == 1 && o[0].err == nil {
					live = append(live, o[0].grant.Booking)
				}
			}
			h.order = h.order[:0]
			if len(live) > 0 {
				k := rng.IntN(len(live))
				h.core.Finish(live[k])
				live = append(live[:k], live[k+1:]...)
			}
		}
	}
	for _, id := range ids {
		require.LessOrEqual(t, len(h.got[id]), 1, id)
	}
	// Wind down: cancel what is queued, finish what is booked.
	for len(h.core.entries) > 0 {
		for id := range h.core.entries {
			h.core.Cancel(id)
			break
		}
	}
	for _, b := range live {
		h.core.Finish(b)
	}
	for _, id := range h.order {
		h.core.Finish(h.granted(id).Booking)
	}
	require.Zero(t, h.core.TenantInflight("a"))
	require.Zero(t, h.core.TenantInflight("b"))
	require.Zero(t, h.core.Bookings(), "every booking ended")
	for _, id := range ids {
		require.Len(t, h.got[id], 1, id)
	}
}

// spendRPM books n requests of tenant acme in class cls and finishes them.
func spendRPM(h *harness, cls string, n int, q TenantQuota) {
	for i := range n {
		id := fmt.Sprintf("%s-%d", cls, i)
		h.enqueue(tenantReq(id, cls, "acme", 1, 16, q))
		h.core.Finish(h.granted(id).Booking)
	}
}

func TestABucketCarriedToTheNextOwnerIsNotRefilledByTheMove(t *testing.T) {
	q := TenantQuota{RequestsPerMinute: 6, TokensPerMinute: 6000} // one request every 10 s
	old := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	spendRPM(old, "c", 6, q)
	old.clock.Advance(4 * time.Second)
	carried := old.core.TenantBuckets("c")
	require.Len(t, carried, 1)
	require.Equal(t, "acme", carried[0].Tenant)
	require.InDelta(t, 0.4, carried[0].Requests, 1e-9, "four seconds refilled 0.4 of a request")

	// The next owner merges the carried levels one second later (by its
	// clock): the bucket is as empty as at the old owner, refilled by the
	// time that passed, not full.
	next := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	next.clock.Advance(5 * time.Second)
	next.core.MergeTenantBuckets("c", carried)
	next.enqueue(tenantReq("n-0", "c", "acme", 1, 16, q))
	rej := next.rejected("n-0", ErrQuotaExceeded)
	require.Equal(t, LimitTenantRequestsPerMinute, rej.Limit)
	require.Equal(t, 5*time.Second, rej.RetryAfter, "0.5 of a request refilled: 5 s to go")
	next.clock.Advance(5 * time.Second)
	next.enqueue(tenantReq("n-1", "c", "acme", 1, 16, q))
	next.granted("n-1")

	// What the next owner exports carries on to a third owner.
	carried = next.core.TenantBuckets("c")
	require.Len(t, carried, 1)
	require.InDelta(t, 0, carried[0].Requests, 1e-9)
}

func TestMergingCarriedBucketsNeverRaisesALevel(t *testing.T) {
	q := TenantQuota{RequestsPerMinute: 6}
	h := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS))
	spendRPM(h, "c", 6, q)
	h.core.MergeTenantBuckets("c", []TenantBucket{{Tenant: "acme", RequestsPerMinute: 6, Requests: 6, At: t0.UnixNano()}})
	h.enqueue(tenantReq("x", "c", "acme", 1, 16, q))
	h.rejected("x", ErrQuotaExceeded)
}

func TestOnlyTheBucketsAClassChargedAndThatAreNotFullTravelWithIt(t *testing.T) {
	q := TenantQuota{RequestsPerMinute: 6}
	h := newHarness(t, workers(2, 100), classCfg("c", PolicyFCFS), classCfg("d", PolicyFCFS))
	spendRPM(h, "d", 2, q)
	require.Empty(t, h.core.TenantBuckets("c"), "acme never booked in c")
	require.Len(t, h.core.TenantBuckets("d"), 1)
	h.clock.Advance(time.Minute)
	require.Empty(t, h.core.TenantBuckets("d"), "a full bucket is what a new owner starts with")
}
