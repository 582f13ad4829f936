package admission

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

// A request waiting for an owner that a leaving replica will never learn of
// is answered at once with ownership_lost (503 ownership_moved at the HTTP
// edge) when the replica leaves, not after the no-owner timeout.
func TestLeaveAnswersARequestWaitingForAnOwnerAtOnce(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("c")}, workers(1, 4))
	a := h.start("a", func(c *ClientConfig) { c.NoOwnerTimeout = time.Hour })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	res := admitAsync(ctx, a.client, request("c", 0))
	select {
	case r := <-res:
		t.Fatalf("answered before any owner existed: %+v", r)
	case <-time.After(100 * time.Millisecond): // it is waiting
	}
	a.client.Leave()
	r := <-res
	require.Equal(t, scheduler.ReasonOwnershipLost, scheduler.ReasonOf(r.err), "%v", r.err)
	require.ErrorIs(t, r.err, scheduler.ErrOwnershipMoved)
	require.NoError(t, ctx.Err(), "answered at once, not at a timeout")

	// After Leave nothing waits: a new request without an owner is answered too.
	_, err := a.client.Admit(ctx, request("c", 0))
	require.ErrorIs(t, err, scheduler.ErrOwnershipMoved)
}

// While the etcd session is unhealthy a request that finds no owner for
// EtcdDegradedAfter is admitted by the entry's own actor (counted as a
// degraded admission); with a healthy session it keeps waiting for one.
func TestWithEtcdUnhealthyARequestWithoutAnOwnerIsAdmittedLocallyAfterTheBound(t *testing.T) {
	var healthy atomic.Bool
	h := newHarness(t, []scheduler.ClassConfig{fcfs("c")}, workers(1, 4))
	a := h.start("a", func(c *ClientConfig) {
		c.NoOwnerTimeout = time.Hour
		c.EtcdDegradedAfter = 200 * time.Millisecond
		c.ClusterHealthy = healthy.Load
	})
	healthy.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	waiting := admitAsync(ctx, a.client, request("c", 0))
	select {
	case r := <-waiting:
		t.Fatalf("admitted without an owner while etcd was healthy: %+v", r)
	case <-time.After(500 * time.Millisecond): // more than the bound
	}

	healthy.Store(false)
	r := <-waiting
	require.NoError(t, r.err, "admitted locally once etcd is unhealthy and the bound passed")
	require.Equal(t, "a", r.t.Owner().Replica)
	r.t.Dispatched()
	r.t.Finish(false)
	require.Equal(t, 1.0, testutil.ToFloat64(a.client.m.degradedAdmits))
	require.EqualValues(t, 1, a.counters(t, "c").Admitted)
	require.Eventually(t, func() bool { return testutil.ToFloat64(a.client.m.etcdDegraded) == 1 }, 5*time.Second, 10*time.Millisecond,
		"the etcd degraded mode shows in its gauge")
	require.Equal(t, []string{"etcd"}, a.client.DegradedModes())

	healthy.Store(true)
	require.Eventually(t, func() bool { return !a.client.Degraded() }, 5*time.Second, 10*time.Millisecond,
		"normal mode resumes by itself")
}
