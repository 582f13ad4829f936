package cluster

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
)

const (
	testTTL    = 2 * time.Second
	testSettle = 300 * time.Millisecond
	// converge bounds how long placement may take to settle after a change
	// that involves no lease expiry (settle period plus a few round trips on
	// a loaded test machine).
	converge = 10 * time.Second
)

func TestEveryClassHasExactlyOneOwnerAfterRandomJoinsLeavesAndRestarts(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(12))
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))

	live := []*node{h.start("r0", nodeOpts{}), h.start("r1", nodeOpts{})}
	h.requireAgreement(live, converge, "initial")
	next := 2
	killed := false
	crashStep := rng.IntN(7) // every sequence has exactly one crash
	for step := 0; step < 7; step++ {
		op := rng.IntN(3)
		if step == crashStep {
			op = 3
		}
		if len(live) == 1 {
			op = 0 // keep at least one replica alive
			if step == crashStep {
				crashStep++ // crash at the next step instead
			}
		}
		switch op {
		case 0: // join
			id := "r" + string(rune('0'+next))
			next++
			t.Logf("step %d: %s joins", step, id)
			live = append(live, h.start(id, nodeOpts{}))
		case 1: // graceful leave
			i := rng.IntN(len(live))
			t.Logf("step %d: %s leaves", step, live[i].id)
			live[i].leave()
			live = append(live[:i], live[i+1:]...)
		case 2: // graceful restart under the same id
			i := rng.IntN(len(live))
			id := live[i].id
			t.Logf("step %d: %s restarts", step, id)
			live[i].leave()
			live[i] = h.start(id, nodeOpts{})
		case 3: // crash: once per sequence, it costs a lease TTL
			i := rng.IntN(len(live))
			killed = true
			id := live[i].id
			live[i].kill()
			if rng.IntN(2) == 0 {
				// Back at once under the same id, while its old lease (and the
				// class keys bound to it) still lives: it must not take those
				// keys for its own.
				t.Logf("step %d: %s crashes and restarts", step, id)
				live[i] = h.start(id, nodeOpts{})
				break
			}
			t.Logf("step %d: %s crashes", step, id)
			live = append(live[:i], live[i+1:]...)
		}
		h.requireAgreement(live, converge+testTTL, "after step")
		t.Logf("step %d: agreed, live %v", step, sortedIDs(live))
	}
	require.True(t, killed || crashStep >= 7, "the sequence included its crash")
	h.tl.requireNoOverlap(t)
}

func TestKilledOwnersClassesMoveWithinTTLPlusOneSecond(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(8))
	a, b := h.start("a", nodeOpts{}), h.start("b", nodeOpts{})
	h.requireAgreement([]*node{a, b}, converge, "initial")
	victim := a.heldClasses()
	require.NotEmpty(t, victim, "placement gives a some of 8 classes")

	a.kill()
	killedAt := time.Now()
	testenv.Eventually(t, testTTL+time.Second, func() bool {
		held := b.heldClasses()
		for c := range victim {
			if _, ok := held[c]; !ok {
				return false
			}
		}
		return true
	}, "b did not take over the dead owner's classes")
	t.Logf("classes of the killed owner moved after %v (ttl %v)", time.Since(killedAt), testTTL)
	for c, old := range victim {
		require.Greater(t, b.heldClasses()[c], old, "class %s: the new epoch must be newer", c)
	}
	h.requireAgreement([]*node{b}, converge, "after the crash")
	h.tl.requireNoOverlap(t)
}

func TestGracefulHandoffNeverLetsTwoReplicasOwnAClassAtOnce(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(16))
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "a alone")
	require.Len(t, a.heldClasses(), 16)

	b := h.start("b", nodeOpts{})
	c := h.start("c", nodeOpts{})
	h.requireAgreement([]*node{a, b, c}, converge, "after b and c joined")
	h.tl.requireNoOverlap(t)
	moved := 16 - len(a.heldClasses())
	require.Positive(t, moved, "placement over three replicas moves some classes away from a")
	require.Equal(t, float64(moved), testutil.ToFloat64(a.own.handoffs), "every class that left a was handed off once")
	require.Equal(t, float64(16-moved), testutil.ToFloat64(a.own.ownedGauge))
	require.Equal(t, float64(moved), testutil.ToFloat64(a.own.losses.WithLabelValues("handoff")))
	require.Equal(t, float64(len(b.heldClasses())), testutil.ToFloat64(b.own.acquisitions))

	// Draining: a turns not ready and hands everything to b and c.
	a.setReady(false)
	h.requireAgreement([]*node{b, c}, converge, "after a turned not ready")
	require.Empty(t, a.heldClasses())
	h.tl.requireNoOverlap(t)
}

func TestFlappingReplicaIsHandedNothingUntilItStaysReadyForTheSettlePeriod(t *testing.T) {
	const settle = 3 * time.Second // far longer than one flap below takes
	h := newTestCluster(t, testTTL, settle, classNames(16))
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "a alone")

	b := h.start("b", nodeOpts{notReady: true})
	for i := 0; i < 5; i++ {
		ready := i%2 == 0
		b.setReady(ready)
		testenv.Eventually(t, 5*time.Second, func() bool {
			r, ok := a.reps.Snapshot().Items["b"]
			return ok && r.Info.Ready == ready
		}, "a did not see b's ready=%v", ready)
	}
	// b is ready now (last flap) and stays so: classes move once it settled.
	h.requireAgreement([]*node{a, b}, settle+converge, "after b settled")
	h.tl.requireNoOverlap(t)
	var toB, fromA int
	for _, e := range h.tl.snapshot() {
		switch {
		case e.replica == "b" && e.acquire:
			toB++
		case e.replica == "b":
			t.Errorf("b released %s (%v): nothing should move back", e.class, e.reason)
		case e.replica == "a" && !e.acquire:
			fromA++
			require.Equal(t, ReleaseHandoff, e.reason)
		}
	}
	require.Equal(t, len(b.heldClasses()), toB, "each class moved to b exactly once")
	require.Equal(t, toB, fromA)
}

func TestReplicaCutOffFromEtcdFencesWithinHalfTTLAndSuccessorHasNewerEpoch(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(8))
	a := h.start("a", nodeOpts{proxied: true})
	b := h.start("b", nodeOpts{})
	h.requireAgreement([]*node{a, b}, converge, "initial")
	victim := a.heldClasses()
	require.NotEmpty(t, victim)

	before := len(h.tl.snapshot())
	a.proxy.Cut()
	cutAt := time.Now()
	// The fence fires TTL/2 after the last renewal, which was before the cut;
	// the extra 500ms is scheduling slack on a shared test machine.
	testenv.Eventually(t, testTTL/2+500*time.Millisecond, func() bool { return len(a.heldClasses()) == 0 },
		"the cut-off replica still admits its classes")
	t.Logf("cut-off replica fenced after %v (ttl/2 = %v)", time.Since(cutAt), testTTL/2)
	require.False(t, a.sess.Healthy())
	require.NoError(t, testutil.GatherAndCompare(a.reg, strings.NewReader(`
# HELP switchyard_cluster_session_healthy 1 while the etcd session lease was renewed within half its TTL, else 0 (fenced).
# TYPE switchyard_cluster_session_healthy gauge
switchyard_cluster_session_healthy 0
`), "switchyard_cluster_session_healthy"))
	for _, e := range h.tl.snapshot()[before:] {
		if e.replica == "a" {
			require.False(t, e.acquire, "the cut-off replica acquired %s", e.class)
			require.Equal(t, ReleaseFenced, e.reason)
		}
	}

	testenv.Eventually(t, testTTL+2*time.Second, func() bool {
		held := b.heldClasses()
		for c := range victim {
			if _, ok := held[c]; !ok {
				return false
			}
		}
		return true
	}, "b did not take over the cut-off replica's classes")
	for c, old := range victim {
		require.Greater(t, b.heldClasses()[c], old, "class %s: the successor's epoch must be newer", c)
		// b learns its claim from the transaction; its watched owner view
		// catches up a moment later.
		testenv.Eventually(t, 5*time.Second, func() bool { return b.own.NewestEpoch(c) > old },
			"class %s: b's owner view shows the newer epoch", c)
	}
	h.tl.requireNoOverlap(t)
}

func TestFencedOwnerReacquiresItsClassesWithTheSameEpochWhenTheLeaseSurvived(t *testing.T) {
	// The session runs on a fake clock so the fence can be forced while the
	// real lease (10 s) is nowhere near expiry.
	clock := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	h := newTestCluster(t, 10*time.Second, 0, classNames(4))
	a := h.start("a", nodeOpts{proxied: true, sessionDeps: Deps{Clock: clock}})
	h.requireAgreement([]*node{a}, converge, "a alone")
	before := a.heldClasses()

	a.proxy.Cut()
	clock.Advance(5 * time.Second) // TTL/2 without a successful renewal
	testenv.Eventually(t, 5*time.Second, func() bool { return len(a.heldClasses()) == 0 }, "a did not fence")

	a.proxy.Restore()
	testenv.Eventually(t, 20*time.Second, func() bool {
		clock.Advance(time.Second) // lets the renewal ticker fire
		return a.sess.Healthy()
	}, "renewals did not resume after the proxy was restored")
	h.requireAgreement([]*node{a}, converge, "after the fence ended")
	require.Equal(t, before, a.heldClasses(), "same classes, same epochs: the keys never changed")
	h.tl.requireNoOverlap(t)
}

func TestOwnershipFollowsThePolicyConfigClassSet(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, []string{"alpha", "beta"})
	a, b := h.start("a", nodeOpts{}), h.start("b", nodeOpts{})
	h.requireAgreement([]*node{a, b}, converge, "initial")

	ctx := testenv.Context(t)
	_, err := SeedConfig(ctx, h.admin, testCluster, []byte("classes: [unterminated"), true)
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(a.own.configErrors) == 1 && testutil.ToFloat64(b.own.configErrors) == 1
	}, "a config without a usable class list is counted")
	kept, _ := a.own.ClassesView()
	require.Equal(t, []string{"alpha", "beta"}, kept, "a bad config keeps the previous classes")

	_, err = SeedConfig(ctx, h.admin, testCluster, policyYAML("beta", "gamma", "bad.name"), true)
	require.NoError(t, err)
	h.classes = []string{"beta", "gamma"}
	h.requireAgreement([]*node{a, b}, converge, "after the class set changed")
	_, alphaOwned := h.etcdOwners()["alpha"]
	require.False(t, alphaOwned, "a class removed from the config loses its owner key")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(a.own.configErrors) == 2 && testutil.ToFloat64(b.own.configErrors) == 2
	}, "the invalid class name is counted by each replica")
	var removed int
	for _, e := range h.tl.snapshot() {
		if !e.acquire && e.class == "alpha" {
			require.Equal(t, ReleaseRemoved, e.reason)
			removed++
		}
	}
	require.Equal(t, 1, removed)
	h.tl.requireNoOverlap(t)
}

// The app exports a class_owned series per policy class, so it follows the
// class set as well as the owners; ClassesView's channel must close on every
// new class set (and only then), or a class removed from the policy keeps a
// stale series on a replica that saw the owner's key go before the policy.
func TestClassesViewSignalsEachNewClassSetAndNothingElse(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, []string{"alpha", "beta"})
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "initial")
	names, changed := a.own.ClassesView()
	require.Equal(t, []string{"alpha", "beta"}, names)

	ctx := testenv.Context(t)
	_, err := SeedConfig(ctx, h.admin, testCluster, []byte("classes: [unterminated"), true)
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool { return testutil.ToFloat64(a.own.configErrors) == 1 },
		"the unusable config is counted")
	select {
	case <-changed:
		t.Fatal("a config without a usable class list must not supersede the class set")
	default:
	}

	_, err = SeedConfig(ctx, h.admin, testCluster, policyYAML("beta", "gamma"), true)
	require.NoError(t, err)
	select {
	case <-changed:
	case <-time.After(10 * time.Second):
		t.Fatal("a new class set did not close the previous view's channel")
	}
	names, changed = a.own.ClassesView()
	require.Equal(t, []string{"beta", "gamma"}, names)
	select {
	case <-changed:
		t.Fatal("the newest view's channel is closed")
	default:
	}
}

func TestOwnershipReturnsSessionExpiredWhenTheLeaseIsRevokedBehindItsBack(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(3))
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "a alone")

	_, err := h.admin.Revoke(testenv.Context(t), a.sess.Lease())
	require.NoError(t, err)
	var ownErr error
	select {
	case ownErr = <-a.ownDone:
	case <-time.After(10 * time.Second):
		t.Fatal("ownership did not stop after its lease was revoked")
	}
	require.ErrorIs(t, ownErr, ErrSessionExpired)
	require.ErrorIs(t, <-a.sessErr, ErrSessionExpired)
	require.Empty(t, a.heldClasses())
	require.True(t, a.sess.Status().Done)
	h.tl.requireNoOverlap(t)
}

// With a regranting session a lost lease ends nothing: the session grants a
// new one, and once the replica's record is back under it (the app's part)
// ownership claims its classes again, under new epochs, never overlapping
// with anyone.
func TestOwnershipClaimsAgainUnderANewLeaseWhenARegrantingSessionLosesItsLease(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(3))
	a := h.start("a", nodeOpts{regrant: true})
	h.requireAgreement([]*node{a}, converge, "a alone")
	before := a.heldClasses()
	old := a.sess.Lease()

	_, err := h.admin.Revoke(testenv.Context(t), old)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool {
		st := a.sess.Status()
		return st.Lease != old && st.Healthy
	}, "the session is granted a new lease")
	select {
	case err := <-a.ownDone:
		t.Fatalf("ownership stopped when the lease was replaced: %v", err)
	case err := <-a.sessErr:
		t.Fatalf("the session ended when its lease was lost: %v", err)
	default:
	}
	require.False(t, a.sess.Status().Done)
	a.setReady(true) // the app registers again under the new lease
	h.requireAgreement([]*node{a}, converge, "a again, under its new lease")
	after := a.heldClasses()
	require.Len(t, after, len(before))
	for class, epoch := range after {
		require.Greater(t, epoch, before[class], "class %s is claimed anew: a newer epoch", class)
	}
	require.Equal(t, 2.0, testutil.ToFloat64(a.sess.leases), "one lease granted at start, one after the loss")
	require.Equal(t, 1.0, testutil.ToFloat64(a.sess.lost))
	h.tl.requireNoOverlap(t)
}

// A follower that applies OwnersView and waits on the channel that came with
// it (as the replica's main loop does) ends on etcd's final view after a
// burst of handoffs: no change that lands while it applies one is lost.
func TestOwnersViewFollowerEndsOnTheFinalViewAfterAHandoffBurst(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, classNames(16))
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "a alone")

	var mu sync.Mutex
	var applied map[string]Owner
	updates := 0
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		view, changed := a.own.OwnersView()
		for {
			mu.Lock()
			applied, updates = view, updates+1
			mu.Unlock()
			time.Sleep(time.Millisecond) // applying takes time; changes keep landing
			select {
			case <-ctx.Done():
				return
			case <-changed:
				view, changed = a.own.OwnersView()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })

	b := h.start("b", nodeOpts{})
	c := h.start("c", nodeOpts{})
	h.requireAgreement([]*node{a, b, c}, converge, "after b and c joined")
	want := h.etcdOwners()
	testenv.Eventually(t, 5*time.Second, func() bool {
		mu.Lock()
		defer mu.Unlock()
		if len(applied) != len(want) {
			return false
		}
		for class, o := range want {
			if applied[class].Replica != o.Replica || applied[class].Epoch != o.Epoch {
				return false
			}
		}
		return true
	}, "the follower applies etcd's final owner view")
	mu.Lock()
	defer mu.Unlock()
	require.Greater(t, updates, 2, "the burst reached the follower as several updates")
}

func TestOwnershipForgetsClassesRemovedFromThePolicyOnceTheirKeysAreGone(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, []string{"alpha", "beta"})
	a := h.start("a", nodeOpts{})
	h.requireAgreement([]*node{a}, converge, "initial")
	ctx := testenv.Context(t)
	for i, set := range [][]string{{"beta", "gamma"}, {"gamma", "delta"}, {"delta"}} {
		_, err := SeedConfig(ctx, h.admin, testCluster, policyYAML(set...), true)
		require.NoError(t, err)
		h.classes = set
		h.requireAgreement([]*node{a}, converge, fmt.Sprintf("class set %d", i))
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		tracked := a.own.trackedClasses()
		return len(tracked) == 0 || slices.Equal(tracked, []string{"delta"})
	}, "no class removed from the policy to stay in the claim bookkeeping (tracked: %v)", lazyTracked{a.own})
}

type lazyTracked struct{ o *Ownership }

func (l lazyTracked) String() string { return fmt.Sprint(l.o.trackedClasses()) }

func TestAClassWhoseAcquireFailedIsReleasedAndClaimedAgainLater(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, []string{"alpha"})
	var mu sync.Mutex
	calls := 0
	a := h.start("a", nodeOpts{acquireErr: func(string) error {
		mu.Lock()
		defer mu.Unlock()
		calls++
		if calls == 1 {
			return errors.New("subscribe admit.alpha: connection closed")
		}
		return nil
	}})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(a.heldClasses()) == 1 },
		"alpha to be served after the failed acquire (OnAcquire calls: %v)", lazyCalls{&mu, &calls})
	mu.Lock()
	require.Equal(t, 2, calls, "one failure, one success")
	mu.Unlock()
	events := h.tl.snapshot()
	require.Len(t, events, 1)
	owner := h.etcdOwners()["alpha"]
	require.Equal(t, "a", owner.Replica)
	require.Equal(t, events[0].epoch, owner.Epoch, "the key of the failed acquire was released and a new one claimed")
	h.tl.requireNoOverlap(t)
}

type lazyCalls struct {
	mu *sync.Mutex
	n  *int
}

func (l lazyCalls) String() string { l.mu.Lock(); defer l.mu.Unlock(); return fmt.Sprint(*l.n) }

func TestTheAppLearnsAClassBeforeItIsClaimedAndLosesItOnlyAfterItIsReleased(t *testing.T) {
	h := newTestCluster(t, testTTL, testSettle, []string{"alpha"})
	log := &eventLog{}
	a := h.start("a", nodeOpts{policyLog: log})
	testenv.Eventually(t, 10*time.Second, func() bool { return len(a.heldClasses()) == 1 }, "alpha held")
	ctx := testenv.Context(t)
	_, err := SeedConfig(ctx, h.admin, testCluster, policyYAML("alpha", "beta"), true)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool { return len(a.heldClasses()) == 2 }, "beta held")
	_, err = SeedConfig(ctx, h.admin, testCluster, policyYAML("beta"), true)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return slices.Contains(log.snapshot(), "policy:beta") && slices.Contains(log.snapshot(), "release:alpha")
	}, "alpha released and the policy without it applied")

	events := log.snapshot()
	at := func(e string) int {
		i := slices.Index(events, e)
		require.GreaterOrEqual(t, i, 0, "%s in %v", e, events)
		return i
	}
	require.Less(t, at("policy:alpha,beta"), at("acquire:beta"), "the Core must know beta before the replica claims it (else 400 unknown_class): %v", events)
	require.Less(t, at("release:alpha"), at("policy:beta"), "ownership of alpha must be released before the Core drops alpha: %v", events)
}

// A class whose owner crashed waits for its rendezvous successor while that
// successor is registered ready, even when the successor is cut from etcd
// and will never claim: its registration (and readiness) lasts until its
// own lease expires, and only then does the next replica claim. Claimant
// names the replica the class waits for, from the same list reconcile
// claims from, so a checker can tell this second fault from a stall.
func TestAClassWaitsForItsRegisteredSuccessorUntilTheSuccessorsLeaseExpires(t *testing.T) {
	const ttl = 3 * time.Second
	// A class that a wins among a, b, c, and b among b, c.
	var class string
	for _, c := range classNames(64) {
		if Place(c, []string{"a", "b", "c"}) == "a" && Place(c, []string{"b", "c"}) == "b" {
			class = c
			break
		}
	}
	require.NotEmpty(t, class, "no class of 64 is a's with b as its successor")
	h := newTestCluster(t, ttl, testSettle, []string{class})
	a := h.start("a", nodeOpts{})
	b := h.start("b", nodeOpts{proxied: true})
	c := h.start("c", nodeOpts{})
	testenv.Eventually(t, converge, func() bool {
		o, ok := c.own.Owner(class)
		_, held := a.heldClasses()[class]
		return ok && o.Replica == "a" && held
	}, "a never owned %s", class)
	require.Equal(t, "a", c.own.Claimant(class))

	a.kill()
	// b is cut after a's crash, before a's lease runs out: b fences and
	// never claims, but stays registered ready until its own lease expires,
	// about 1.5 s after a's.
	time.Sleep(ttl / 2)
	b.proxy.Cut()
	cutAt := time.Now()

	waitedOnB := false
	testenv.Eventually(t, 2*ttl+converge, func() bool {
		if _, held := c.heldClasses()[class]; held {
			return true
		}
		if _, owned := c.own.Owner(class); !owned && c.own.Claimant(class) == "b" {
			waitedOnB = true
		}
		return false
	}, "c never claimed %s", class)
	claimedAfter := time.Since(cutAt)
	require.True(t, waitedOnB, "with a's key gone and b still registered, %s was not seen waiting on b", class)
	_, bRegistered := c.reps.Snapshot().Items["b"]
	require.False(t, bRegistered, "c claimed %s while b, the rendezvous successor, was still registered", class)
	require.Equal(t, "c", c.own.Claimant(class))
	t.Logf("%s claimed by c %v after b's cut (ttl %v)", class, claimedAfter, ttl)
	require.Empty(t, b.heldClasses())
	h.tl.requireNoOverlap(t)
}
