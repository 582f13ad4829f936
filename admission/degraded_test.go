package admission

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// degradedSetup starts three replicas that see each other alive; b is
// behind a proxy. gold's owner is a. It cuts b from NATS and returns b
// once b admits locally (NATS degraded mode), with policy installed.
func degradedSetup(t *testing.T, policy QuotaPolicy, classes []scheduler.ClassConfig, ws []scheduler.Worker) *replica {
	h := newHarness(t, classes, ws)
	px := testenv.StartProxy(t, strings.TrimPrefix(h.nats.URL, "nats://"))
	alive := func() int { return 3 } // a, b and c, as gossip and the registry would say
	h.start("a", func(c *ClientConfig) { c.ReplicasAlive = alive })
	b := h.startAt("b", "nats://"+px.Addr(), func(c *ClientConfig) { c.ReplicasAlive = alive })
	h.start("c", func(c *ClientConfig) { c.ReplicasAlive = alive })
	for _, cc := range classes {
		h.own(cc.Name, "a", 1)
	}
	b.client.SetDegradedPolicy(policy, classes)
	testenv.Eventually(t, 5*time.Second, func() bool { return b.client.DegradedQuotas().Divisor == 3 },
		"b to sample the three replicas alive")

	px.Cut()
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, m := range b.client.DegradedModes() {
			if m == "nats" {
				return true
			}
		}
		return false
	}, "b to enter NATS degraded mode")
	dq := b.client.DegradedQuotas()
	require.True(t, dq.Frozen, "the divisor is frozen while degraded")
	require.Equal(t, 3, dq.Divisor, "the replicas last seen alive before the cut")
	require.Equal(t, policy, dq.Policy)
	return b
}

// A replica cut from NATS admits every class on its own scheduler; so does
// every other cut replica. Under split it admits a tenant's concurrency
// quota divided by the replicas it last saw alive (7 / 3 -> 2: the three
// cut replicas together stay within 7); under whole, the whole quota; under
// closed, none of it (429 quota_exceeded).
func TestADegradedReplicaAdmitsItsShareOfATenantsConcurrency(t *testing.T) {
	const quota = 7
	for _, tc := range []struct {
		policy QuotaPolicy
		want   int
	}{{QuotasSplit, quota / 3}, {QuotasWhole, quota}, {QuotasClosed, 0}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			b := degradedSetup(t, tc.policy, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
			ctx := testenv.Context(t)
			admitted := 0
			var err error
			for range quota + 1 {
				r := request("gold", 0)
				r.Tenant = scheduler.Tenant{ID: "acme", Quota: scheduler.TenantQuota{Concurrent: quota}}
				var tk *Ticket
				if tk, err = b.client.Admit(ctx, r); err != nil {
					break
				}
				require.Equal(t, "b", tk.Owner().Replica, "admitted by the cut replica itself")
				require.Equal(t, quota, r.Tenant.Quota.Concurrent, "the caller's request keeps its whole quota")
				tk.Dispatched()
				t.Cleanup(func() { tk.Finish(false) })
				admitted++
			}
			require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "the next request is over the share: %v", err)
			require.Equal(t, tc.want, admitted)
			require.EqualValues(t, tc.want, testutil.ToFloat64(b.client.m.degradedQuotaAdmits.WithLabelValues(tc.policy.String())))
			require.EqualValues(t, 1, testutil.ToFloat64(b.client.m.degradedQuotaRejects.WithLabelValues(tc.policy.String(), "quota_exceeded")))
			require.EqualValues(t, tc.want, testutil.ToFloat64(b.client.m.degradedAdmits))
		})
	}
}

// A class's queue limits are split the same way: a class limited to 6
// queued requests per worker queues 2 on a degraded replica under split
// (6 / 3), 6 under whole, and under closed refuses the class (overloaded,
// HTTP 503); an unlimited class is still admitted under closed.
func TestADegradedReplicaQueuesItsShareOfAClassLimit(t *testing.T) {
	const limit, sent = 6, 10
	for _, tc := range []struct {
		policy QuotaPolicy
		queued int
		reason scheduler.Reason
	}{{QuotasSplit, limit / 3, scheduler.ReasonQueueFull}, {QuotasWhole, limit, scheduler.ReasonQueueFull}, {QuotasClosed, 0, scheduler.ReasonOverloaded}} {
		t.Run(tc.policy.String(), func(t *testing.T) {
			limited := fcfs("gold")
			limited.Limits.Requests = limit
			b := degradedSetup(t, tc.policy, []scheduler.ClassConfig{limited, fcfs("free")}, workers(1, 1))
			ctx, cancel := context.WithCancel(testenv.Context(t))
			defer cancel()

			// The one worker slot is taken by a request of the unlimited
			// class (admitted under every policy): gold's requests queue.
			tk, err := b.client.Admit(ctx, request("free", 0))
			require.NoError(t, err, "an unlimited class is admitted whatever the policy")
			tk.Dispatched()
			defer tk.Finish(false)

			var pending []<-chan admitResult
			for range sent {
				pending = append(pending, admitAsync(ctx, b.client, request("gold", 0)))
			}
			rejected := sent - tc.queued
			rejects := b.client.m.degradedQuotaRejects.WithLabelValues(tc.policy.String(), tc.reason.String())
			testenv.Eventually(t, 10*time.Second, func() bool { return testutil.ToFloat64(rejects) == float64(rejected) },
				"the requests beyond the share to be rejected")
			require.Equal(t, tc.queued, b.snapshot(t).Classes["gold"].QueueDepth, "the share is queued")
			cancel()
			n := 0
			for r := range merge(pending) {
				if r.err != nil && !errors.Is(r.err, context.Canceled) {
					require.Equal(t, tc.reason, scheduler.ReasonOf(r.err), "%v", r.err)
					n++
				}
			}
			require.Equal(t, rejected, n)
		})
	}
}

// Split never rounds a quota or limit to 0 (unlimited for a quota, "never
// queue" for a limit): below the divisor each replica keeps one.
func TestSplitRoundsDownButNeverToZero(t *testing.T) {
	require.Equal(t, 2, SplitQuota(7, 3))
	require.Equal(t, 1, SplitQuota(2, 3))
	require.Equal(t, 0, SplitQuota(0, 3), "unlimited stays unlimited")
	require.Equal(t, 5, SplitQuota(5, 1))
	l := scheduler.Limits{Requests: 2, ISLTokens: 9000, CachedTokens: scheduler.Unlimited}.Split(3)
	require.Equal(t, scheduler.Limits{Requests: 1, ISLTokens: 3000, CachedTokens: scheduler.Unlimited}, l)
	require.Equal(t, 0, scheduler.Limits{Requests: 0}.Split(3).Requests, "a zero-limit class stays one")
}

func TestAnUnknownDegradedQuotaPolicyIsATypedError(t *testing.T) {
	for _, p := range QuotaPolicies {
		got, err := ParseQuotaPolicy(p.String())
		require.NoError(t, err)
		require.Equal(t, p, got)
	}
	got, err := ParseQuotaPolicy("")
	require.NoError(t, err)
	require.Equal(t, QuotasSplit, got, "the default")
	_, err = ParseQuotaPolicy("halves")
	require.ErrorIs(t, err, ErrBadQuotaPolicy)
	require.Contains(t, err.Error(), "split, whole, closed")
}

// The etcd degraded mode (the session unhealthy: a request that finds no
// owner it can trust is admitted locally after EtcdDegradedAfter) splits
// the same way, with the divisor sampled before the session failed.
func TestAnEtcdDegradedReplicaAdmitsItsShareOfATenantsConcurrency(t *testing.T) {
	const quota = 7
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	var etcdDown atomic.Bool
	alive := atomic.Int32{}
	alive.Store(3)
	b := h.start("b", func(c *ClientConfig) {
		c.ReplicasAlive = func() int { return int(alive.Load()) }
		c.ClusterHealthy = func() bool { return !etcdDown.Load() }
		c.EtcdDegradedAfter = 20 * time.Millisecond
	})
	b.client.SetDegradedPolicy(QuotasSplit, h.classes)
	testenv.Eventually(t, 5*time.Second, func() bool { return b.client.DegradedQuotas().Divisor == 3 }, "the sample")
	etcdDown.Store(true)
	testenv.Eventually(t, 5*time.Second, func() bool { return b.client.DegradedQuotas().Frozen }, "etcd degraded mode")
	alive.Store(1)         // what a partitioned view would shrink to: the frozen divisor ignores it
	b.client.sampleAlive() // as Run's status poll does every 100 ms
	require.Equal(t, 3, b.client.DegradedQuotas().Divisor, "frozen while degraded")

	ctx := testenv.Context(t)
	admitted := 0
	var err error
	for range quota {
		r := request("gold", 0) // gold has no owner: b's view of etcd is gone
		r.Tenant = scheduler.Tenant{ID: "acme", Quota: scheduler.TenantQuota{Concurrent: quota}}
		var tk *Ticket
		if tk, err = b.client.Admit(ctx, r); err != nil {
			break
		}
		tk.Dispatched()
		t.Cleanup(func() { tk.Finish(false) })
		admitted++
	}
	require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "%v", err)
	require.Equal(t, quota/3, admitted)

	etcdDown.Store(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return b.client.DegradedQuotas().Divisor == 1 },
		"the divisor follows the replicas alive again once healthy")
}
