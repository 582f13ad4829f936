package admission

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The 30-minute nemesis soak saw two gold requests (no deadline) get no
// answer in the client's 90 s at the end of a whole-etcd outage. Each of an
// admission's waits had a bound, but they chained: an owner's reply that
// never came cost OwnerReplyTimeout, its resubmission waited for an owner
// again and then for a second reply. The admission as a whole is bounded
// now (ClientConfig.AdmitBound).

// boundedResult is an admission's outcome and the fake time it took.
type boundedResult struct {
	err     error
	elapsed time.Duration
}

// admitOnFakeClock admits r through c and steps clk a second at a time
// while anything waits on it, until the admission ends; it returns the
// fake time the admission took.
func admitOnFakeClock(t *testing.T, c *Client, clk *clock.Fake, r *scheduler.Request, limit time.Duration) boundedResult {
	t.Helper()
	start := clk.Now()
	res := make(chan boundedResult, 1)
	ctx := testenv.Context(t)
	go func() {
		tk, err := c.Admit(ctx, r)
		if tk != nil {
			tk.Finish(false)
		}
		res <- boundedResult{err: err, elapsed: clk.Now().Sub(start)}
	}()
	var out boundedResult
	testenv.Eventually(t, 60*time.Second, func() bool {
		select {
		case out = <-res:
			return true
		default:
		}
		// Step only while the admission waits on a timer of the clock:
		// a wait that has just ended is given the time to settle.
		if clk.Timers() > 0 && clk.Now().Sub(start) < limit {
			clk.Advance(time.Second)
		}
		return false
	}, "the admission to end")
	return out
}

func TestAnAdmissionWhoseOwnerNeverAnswersEndsWithinTheAdmissionBound(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	nc := rawConn(t, h)
	// The registered owner x receives every attempt and answers none (a
	// subscription nobody reads, or a queue that never moves).
	seen := make(chan int, 8)
	_, err := nc.Subscribe(wire.NewSubjects(cluster).Admit("gold"), func(msg *nats.Msg) {
		if in, err := wire.DecodeAdmitRequest(msg.Data); err == nil {
			seen <- in.Attempt
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cli, _, clk, cfg := fakeClockEntry(t, h)
	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "x", Epoch: 1}})

	out := admitOnFakeClock(t, cli, clk, request("gold", 0), 10*cfg.AdmitBound())
	require.ErrorIs(t, out.err, scheduler.ErrOwnershipMoved, "a typed 503 the client may retry")
	require.LessOrEqual(t, out.elapsed, cfg.AdmitBound()+5*time.Second,
		"NoOwnerTimeout + OwnerReplyTimeout (%v) bound the whole admission, however its waits chain", cfg.AdmitBound())
	require.Equal(t, 0, <-seen, "the first attempt reached the owner")
	n := cli.Counts("b").Classes["gold"]
	require.Equal(t, uint64(1), n.Rejected[scheduler.ReasonOwnershipLost.String()], "counted as the entry's rejection")
}

func TestARequestQueuedAtItsOwnReplicaEndsWithinTheAdmissionBound(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	clk := clock.NewFake(time.Now())
	h.clock = clk
	h.sched = func(c *scheduler.Config) { c.AckTimeout, c.BookingExpiry = time.Hour, time.Hour } // the slot stays taken
	a := h.start("a", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	hold := occupy(t, ctx, a) // a's only slot: the next request queues on a's own actor
	defer hold.Finish(false)

	cfg := DefaultClientConfig()
	out := admitOnFakeClock(t, a.client, clk, request("gold", 0), 10*cfg.AdmitBound())
	require.ErrorIs(t, out.err, scheduler.ErrOwnershipMoved, "a typed 503 the client may retry")
	require.LessOrEqual(t, out.elapsed, cfg.AdmitBound()+5*time.Second, "the admission bound is %v", cfg.AdmitBound())
	testenv.Eventually(t, 5*time.Second, func() bool { return a.snapshot(t).Classes["gold"].QueueDepth == 0 },
		"the request withdrawn from the queue it waited in")
}

// A degraded admission decides on the etcd session's health read live,
// and leaving the etcd fallback rejects the entries it queued once, at the
// transition: an entry that reached the actor just after that pass stayed
// queued on a replica that neither owns its class nor admits it degraded
// any more, with nobody to grant or return it (a candidate for the soak's
// two requests left without an answer as a whole-etcd outage ended).
func TestAnEntryLeftQueuedForAClassThisReplicaNoLongerAdmitsGoesBackToItsOwner(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a := h.start("a", nil) // NATS up, etcd healthy: no degraded mode; owns nothing
	results := make(chan error, 2)
	respond := func(_ scheduler.Grant, err error) bool { results <- err; return true }
	a.actor.Enqueue(request("gold", 0), respond) // takes the only slot
	require.NoError(t, <-results)
	a.actor.Enqueue(request("gold", 0), respond) // as a degraded admission would, too late
	select {
	case err := <-results:
		require.ErrorIs(t, err, scheduler.ErrOwnershipMoved, "its entry resubmits it to the class's owner")
	case <-time.After(10 * time.Second):
		t.Fatal("the entry still waits in the queue of a class this replica does not admit")
	}
}
