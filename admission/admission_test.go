package admission

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

func waitQueued(t *testing.T, owner *replica, class string, n int) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, func() bool {
		return owner.snapshot(t).Classes[class].QueueDepth == n
	}, "queue depth of %s at %s to reach %d", class, owner.id, n)
}

func TestARemoteRequestIsAdmittedByTheOwnerAndFreedWhenDone(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 7)

	tk, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	require.Equal(t, Owner{Replica: "a", Epoch: 7}, tk.Owner(), "the grant comes from the owner")
	tk.Dispatched()
	tk.FirstToken()
	require.Equal(t, 1, a.snapshot(t).Bookings, "the owner's ledger carries the booking")
	require.Zero(t, b.snapshot(t).Bookings, "the entry replica books nothing itself")

	tk.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.snapshot(t).Bookings == 0 }, "booking freed at the owner")
	c := a.counters(t, "gold")
	require.Equal(t, uint64(1), c.Received)
	require.Equal(t, uint64(1), c.Admitted)
}

func TestStrictPriorityHoldsAcrossReplicas(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)

	busy := occupy(t, ctx, a) // the only slot

	low1 := admitAsync(ctx, a.client, request("gold", 0))
	low2 := admitAsync(ctx, c.client, request("gold", 0))
	waitQueued(t, a, "gold", 2)
	high := admitAsync(ctx, b.client, request("gold", 1))
	waitQueued(t, a, "gold", 3)

	busy.Finish(false)
	first := <-high
	require.NoError(t, first.err, "the tier-1 request arriving at b is admitted first")
	select {
	case r := <-low1:
		t.Fatalf("a tier-0 request was admitted before the tier-1 one finished: %v", r.err)
	case r := <-low2:
		t.Fatalf("a tier-0 request was admitted before the tier-1 one finished: %v", r.err)
	default:
	}
	first.t.Dispatched()
	first.t.Finish(false)
	for _, ch := range []<-chan admitResult{low1, low2} {
		r := <-ch
		require.NoError(t, r.err)
		r.t.Dispatched()
		r.t.Finish(false)
	}
}

func TestTheClassQueueLimitHoldsClusterWide(t *testing.T) {
	const perWorker = 4
	gold := fcfs("gold")
	gold.Limits.Requests = perWorker
	h := newHarness(t, []scheduler.ClassConfig{gold}, workers(1, 1))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "b", 1)
	ctx := testenv.Context(t)

	busy := occupy(t, ctx, a)

	var pending []<-chan admitResult
	for i := 0; i < 5; i++ { // 15 requests spread evenly over three entry replicas
		for _, r := range []*replica{a, b, c} {
			pending = append(pending, admitAsync(ctx, r.client, request("gold", 0)))
		}
	}
	full := 0
	testenv.Eventually(t, 10*time.Second, func() bool {
		snap := b.snapshot(t).Classes["gold"]
		require.LessOrEqual(t, snap.QueueDepth, perWorker, "the cluster-wide queue never exceeds the limit")
		return snap.Counters.Rejected[scheduler.ReasonQueueFull]+uint64(snap.QueueDepth) == 15
	}, "every request queued or rejected")
	busy.Finish(false)
	for _, ch := range pending {
		r := <-ch
		if errors.Is(r.err, scheduler.ErrQueueFull) {
			full++
			continue
		}
		require.NoError(t, r.err)
		r.t.Dispatched()
		r.t.Finish(false)
	}
	require.Equal(t, 15-perWorker, full, "exactly the requests beyond the limit were rejected")
}

func TestQueuedRequestsMoveToTheNewOwnerAsRetries(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)

	busy := occupy(t, ctx, a)
	pending := admitMany(ctx, b.client, 3)
	waitQueued(t, a, "gold", 3)

	busy.Finish(false)                                 // the slot frees at a...
	testenv.Eventually(t, 5*time.Second, func() bool { // ...and one queued request takes it
		return a.snapshot(t).Classes["gold"].QueueDepth == 2
	}, "one request admitted at a")
	h.own("gold", "c", 2) // graceful move: a rejects its queue with ownership_lost

	require.Equal(t, 3, finishAll(t, pending), "nothing is lost in the move")
	ac, cc := a.counters(t, "gold"), c.counters(t, "gold")
	require.Equal(t, uint64(4), ac.Received, "the old owner received every request once")
	require.Zero(t, cc.Received, "the new owner counts no new arrivals")
	require.Equal(t, uint64(2), cc.Retried, "the moved requests are retries")
	require.Equal(t, uint64(2), ac.Rejected[scheduler.ReasonOwnershipLost])
	require.Equal(t, ac.Admitted+cc.Admitted, uint64(4), "every request admitted exactly once")
}

func TestGrantsCarryingAnOlderEpochAreIgnored(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	// a still believes it owns the class at epoch 3 (it was cut off), while
	// b already knows the newest epoch is 5, owned by a replica that is not
	// answering yet.
	require.NoError(t, a.server.Own("gold", 3))
	b.client.OwnersChanged(map[string]Owner{"gold": {Replica: "zz", Epoch: 5}})
	b.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 3}})

	ctx, cancel := context.WithTimeout(testenv.Context(t), 300*time.Millisecond)
	defer cancel()
	_, err := b.client.Admit(ctx, request("gold", 0))
	require.ErrorIs(t, err, context.DeadlineExceeded, "no grant from the fenced owner is used")
	require.GreaterOrEqual(t, testutil.ToFloat64(b.client.m.staleGrants), 1.0)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.snapshot(t).Bookings == 0 },
		"the entry's cancel frees the fenced owner's unacknowledged grants")
}

func TestAClientGoneWhileQueuedIsCancelledAtTheOwner(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 1)
	busy := occupy(t, testenv.Context(t), a)

	ctx, cancel := context.WithCancel(testenv.Context(t))
	ch := admitAsync(ctx, b.client, request("gold", 0))
	waitQueued(t, a, "gold", 1)
	cancel()
	require.ErrorIs(t, (<-ch).err, context.Canceled)
	waitQueued(t, a, "gold", 0)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.counters(t, "gold").Cancelled == 1 }, "cancel counted")
	busy.Finish(false)
}

func TestInflightBookingsAreRehomedWhenTheClassMoves(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "a", 1)
	tk, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	tk.Dispatched()
	require.Equal(t, 1, a.snapshot(t).Bookings)

	h.own("gold", "c", 2)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return c.snapshot(t).Bookings == 1 && a.snapshot(t).Bookings == 0
	}, "the booking moves from a to c")
	require.Equal(t, "c", tk.Owner().Replica)
	tk.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return c.snapshot(t).Bookings == 0 }, "freed at the new owner")
}

func TestWithNoOwnerARequestWaitsUntilItsDeadline(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	b := h.start("b", nil)
	r := request("gold", 0)
	r.Due = time.Now().Add(150 * time.Millisecond)
	_, err := b.client.Admit(testenv.Context(t), r)
	require.ErrorIs(t, err, scheduler.ErrDeadlineExceeded)
}

func TestARequestWaitingForAnOwnerIsAdmittedOnceOneAppears(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	ch := admitAsync(testenv.Context(t), b.client, request("gold", 0))
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(b.client.m.retries.WithLabelValues("no_owner")) >= 1
	}, "the entry waits for an owner")
	h.own("gold", "a", 1)
	r := <-ch
	require.NoError(t, r.err)
	r.t.Dispatched()
	r.t.Finish(false)
	require.Equal(t, uint64(1), a.counters(t, "gold").Received)
}

func TestWithoutNATSAReplicaAdmitsLocallyInDegradedModeAndRecovers(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 1)
	port := h.nats.Server.Addr().(interface{ String() string }).String()
	h.nats.Server.Shutdown()
	h.nats.Server.WaitForShutdown()
	testenv.Eventually(t, 5*time.Second, b.client.Degraded, "b notices NATS is gone")
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.degraded))

	tk, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err, "b admits a class owned by a on its own scheduler")
	require.Equal(t, "b", tk.Owner().Replica)
	require.Equal(t, 1.0, testutil.ToFloat64(b.client.m.degradedAdmits))
	tk.Dispatched()
	tk.Finish(false)

	restarted := testenv.StartNATSAt(t, port)
	_ = restarted
	testenv.Eventually(t, 10*time.Second, func() bool { return !b.client.Degraded() }, "normal mode resumes by itself")
	require.Equal(t, 0.0, testutil.ToFloat64(b.client.m.degraded))
	tk2, err := b.client.Admit(testenv.Context(t), request("gold", 0))
	require.NoError(t, err)
	require.Equal(t, "a", tk2.Owner().Replica, "the owner admits again")
	tk2.Dispatched()
	tk2.Finish(false)
	_ = a
}

func TestAnOwnershipNoticeOvertakingTheOldOwnersReplyStillCountsEachRequestReceivedOnce(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a, b, c := h.start("a", nil), h.start("b", nil), h.start("c", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	busy := occupy(t, ctx, a)
	pending := admitMany(ctx, b.client, 3)
	waitQueued(t, a, "gold", 3)

	// The etcd watch reports the new owner before a's ownership_lost
	// replies arrive: c claims, the entry replicas learn it, and only then
	// does a let go of its queue. (a's own client learns last: its notice
	// re-homes busy to c, and if that freed a's slot before a let go, a
	// could still grant one queued request, legitimately, as the owner it
	// was when the request was sent; this test is about the retries.)
	require.NoError(t, c.server.Own("gold", 2))
	moved := map[string]Owner{"gold": {Replica: "c", Epoch: 2}}
	b.client.OwnersChanged(moved)
	c.client.OwnersChanged(moved)
	a.server.Disown("gold")
	a.client.OwnersChanged(moved)
	// The in-flight booking moves to c with the class (it holds c's only
	// slot); it ends, and c has one slot for the three moved requests.
	busy.Finish(false)
	finishAll(t, pending)
	ac, cc := a.counters(t, "gold"), c.counters(t, "gold")
	require.Equal(t, uint64(4), ac.Received, "the old owner received every request")
	require.Zero(t, cc.Received, "the new owner counts none of them as new arrivals")
	require.Equal(t, uint64(3), cc.Retried)
}

func TestTheEntryCountsEachRequestReceivedOnceEvenWhenItsOwnerDiesWithIt(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	b, c := h.start("b", nil), h.start("c", nil)
	// "a" owns the class but has died: its admit subscription still swallows
	// requests (as a stuck process would) and never answers.
	dead := h.nats.Conn(t)
	_, err := dead.Subscribe(wire.NewSubjects(cluster).Admit("gold"), func(*nats.Msg) {})
	require.NoError(t, err)
	require.NoError(t, dead.Flush())
	for _, r := range h.replicas {
		r.client.OwnersChanged(map[string]Owner{"gold": {Replica: "a", Epoch: 1}})
	}
	ch := admitAsync(testenv.Context(t), b.client, request("gold", 0))
	testenv.Eventually(t, 5*time.Second, func() bool {
		b.client.mu.Lock()
		defer b.client.mu.Unlock()
		return len(b.client.pending) == 1
	}, "the request waits on the dead owner")

	require.NoError(t, dead.Drain())
	h.own("gold", "c", 2)
	r := <-ch
	require.NoError(t, r.err, "the request is resubmitted to the new owner")
	r.t.Dispatched()
	r.t.Finish(false)

	require.Equal(t, uint64(1), b.client.Counts("w").Classes["gold"].Received, "received once, at the entry")
	cc := c.counters(t, "gold")
	require.Zero(t, cc.Received, "the new owner saw a retry")
	require.Equal(t, uint64(1), cc.Retried)
	require.Equal(t, uint64(1), cc.Admitted)
}

func TestTheEntryCountsTheRejectionsItDecidesItself(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 0))
	b := h.start("b", nil)
	r := request("gold", 0)
	r.Due = time.Now().Add(100 * time.Millisecond)
	_, err := b.client.Admit(testenv.Context(t), r)
	require.ErrorIs(t, err, scheduler.ErrDeadlineExceeded)
	got := b.client.Counts("w").Classes["gold"]
	require.Equal(t, uint64(1), got.Received)
	require.Equal(t, uint64(1), got.Rejected[scheduler.ReasonDueTimePassed.String()])
}

// An owner fenced for a moment (its etcd lease not renewed within TTL/2)
// lets go of its class and takes it back with the same epoch; nobody else
// ever owned it, so the entry replicas see no owner change. Admit requests
// that had reached the owner's subscription but not its handler must still
// get an answer: dropped on the floor, they would wait forever.
func TestAnOwnerFencedForAMomentAnswersEveryRequestItHadReceived(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 1)

	// Hold a's actor so the admit handler blocks and the rest pile up in
	// the subscription.
	release := make(chan struct{})
	held := make(chan struct{})
	go func() {
		_ = a.actor.Do(context.Background(), func(*scheduler.Core) { close(held); <-release })
	}()
	<-held
	ctx, cancel := context.WithTimeout(testenv.Context(t), 20*time.Second)
	defer cancel()
	pending := admitMany(ctx, b.client, 5)
	testenv.Eventually(t, 5*time.Second, func() bool {
		subs := a.server.subscriptions("gold")
		delivered := 0
		for _, s := range subs {
			n, _, _ := s.Pending()
			delivered += n
		}
		return len(subs) > 0 && delivered >= 4 // the fifth is in the handler
	}, "the requests reach a's subscription")

	fenced := make(chan struct{})
	go func() { a.server.Disown("gold"); close(fenced) }() // its queue rejection waits for the actor
	time.Sleep(50 * time.Millisecond)
	close(release)
	<-fenced
	require.NoError(t, a.server.Own("gold", 1), "the lease survived: same epoch")

	finishAll(t, pending)
}
