package admission

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Tests for admission's failure paths: fencing, lost replies, ownership
// moves and degraded modes, one or more per hole found.

// rawAdmit sends one admit request as an entry replica would, on its own
// connection, and returns the owner's reply.
func rawAdmit(t *testing.T, h *harness, in *wire.AdmitRequest) *wire.AdmitReply {
	t.Helper()
	nc := rawConn(t, h)
	b, err := wire.EncodeAdmission(in)
	require.NoError(t, err)
	msg, err := nc.Request(wire.NewSubjects(cluster).Admit(in.Class), b, 5*time.Second)
	require.NoError(t, err)
	out, err := wire.DecodeAdmitReply(msg.Data)
	require.NoError(t, err)
	return out
}

func rawConn(t *testing.T, h *harness) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(h.nats.URL)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc
}

func wireRequest(r *scheduler.Request) *wire.AdmitRequest { return RequestToWire(r, "entry") }

func TestAnOwnerRejectsAnAdmitRequestWhoseIngressLiesFarInItsFuture(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	a := h.start("a", nil)
	h.own("gold", "a", 1)
	in := wireRequest(request("gold", 0))
	in.IngressUnixNano = time.Now().Add(24 * time.Hour).UnixNano()

	out := rawAdmit(t, h, in)
	require.False(t, out.OK, "a request from a day ahead would sit at the head of an LCFS queue")
	require.Equal(t, scheduler.ReasonInvalidConstraint.String(), out.Reason)
	require.Equal(t, 1.0, testutil.ToFloat64(a.client.m.decodeErrors.WithLabelValues("admit")), "counted as bad input")
	require.Zero(t, a.counters(t, "gold").Admitted)
}

// actorOnly runs a scheduler actor with classes and workers behind the
// LocalActor port, without NATS.
func actorOnly(t *testing.T, classes []scheduler.ClassConfig, ws []scheduler.Worker) (*scheduler.Actor, Actor) {
	t.Helper()
	core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, nil)
	core.SetClasses(classes)
	core.SetWorkers(ws)
	a := scheduler.NewActor(core, clock.Real{}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return a, LocalActor(a, func() []scheduler.ClassConfig { return classes })
}

// outcomes records responder calls in order.
type outcomes struct {
	mu      sync.Mutex
	granted []string
	byID    map[string]error
	booking map[string]scheduler.BookingID
}

func newOutcomes() *outcomes {
	return &outcomes{byID: map[string]error{}, booking: map[string]scheduler.BookingID{}}
}

func (o *outcomes) responder(id string) scheduler.Responder {
	return func(g scheduler.Grant, err error) bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		o.byID[id] = err
		if err == nil {
			o.granted = append(o.granted, id)
			o.booking[id] = g.Booking
		}
		return true
	}
}

func (o *outcomes) grants() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return slices.Clone(o.granted)
}

func (o *outcomes) bookingOf(id string) scheduler.BookingID {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.booking[id]
}

func TestDisowningAClassKeepsTheRoundRobinPositionOfTheOthers(t *testing.T) {
	classes := []scheduler.ClassConfig{fcfs("a"), fcfs("b"), fcfs("c")} // quantum 512
	_, port := actorOnly(t, classes, workers(1, 1))
	o := newOutcomes()
	enq := func(id, class string) {
		r := request(class, 0)
		r.ID, r.PromptTokens, r.BlockHashes = id, 512, nil // one quantum each
		port.Enqueue(r, o.responder(id))
	}
	enq("busy", "a") // takes the only slot; class a has had its turn
	testenv.Eventually(t, 5*time.Second, func() bool { return len(o.grants()) == 1 }, "busy granted")
	for _, q := range [][2]string{{"a1", "a"}, {"b1", "b"}, {"b2", "b"}, {"c1", "c"}} {
		enq(q[0], q[1])
	}
	port.Finish(o.bookingOf("busy"))
	testenv.Eventually(t, 5*time.Second, func() bool { return len(o.grants()) == 2 }, "next grant")
	require.Equal(t, "b1", o.grants()[1], "after a's turn comes b's")

	port.RejectQueued("a", scheduler.ReasonOwnershipLost) // class a moves to another replica
	port.Finish(o.bookingOf("b1"))
	testenv.Eventually(t, 5*time.Second, func() bool { return len(o.grants()) == 3 }, "next grant")
	require.Equal(t, "c1", o.grants()[2], "after b's turn comes c's: a handoff must not restart the rotation at the first class")
	o.mu.Lock()
	require.ErrorIs(t, o.byID["a1"], scheduler.ErrOwnershipMoved)
	o.mu.Unlock()
}

// asyncRawAdmit sends an admit request and delivers its reply (or nil on
// error) on the returned channel.
func asyncRawAdmit(t *testing.T, nc *nats.Conn, in *wire.AdmitRequest) <-chan *wire.AdmitReply {
	t.Helper()
	b, err := wire.EncodeAdmission(in)
	require.NoError(t, err)
	ch := make(chan *wire.AdmitReply, 1)
	go func() {
		msg, err := nc.Request(wire.NewSubjects(cluster).Admit(in.Class), b, 10*time.Second)
		if err != nil {
			ch <- nil
			return
		}
		out, _ := wire.DecodeAdmitReply(msg.Data)
		ch <- out
	}()
	return ch
}

func publishCancel(t *testing.T, nc *nats.Conn, class string, c *wire.CancelRequest) {
	t.Helper()
	b, err := wire.EncodeAdmission(c)
	require.NoError(t, err)
	require.NoError(t, nc.Publish(wire.NewSubjects(cluster).Cancel(class), b))
}

func TestAStaleCancelDoesNotWithdrawTheResubmissionOfTheSameRequest(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a := h.start("a", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	busy := occupy(t, ctx, a)
	defer busy.Finish(false)
	nc := rawConn(t, h)

	resub := wireRequest(request("gold", 0))
	resub.Attempt = 1 // the same request, resubmitted after its first owner lost the class
	other := wireRequest(request("gold", 0))
	resubReply := asyncRawAdmit(t, nc, resub)
	otherReply := asyncRawAdmit(t, nc, other)
	waitQueued(t, a, "gold", 2)

	// The cancel of attempt 0, sent when the entry gave up on it, arrives
	// late: this replica owns the class again. Then a current cancel.
	publishCancel(t, nc, "gold", &wire.CancelRequest{ID: resub.ID, Entry: "entry", Owner: "a"})
	publishCancel(t, nc, "gold", &wire.CancelRequest{ID: other.ID, Entry: "entry", Owner: "a"})
	select {
	case <-otherReply: // both cancels were handled, in order
	case <-ctx.Done():
		t.Fatal("the current cancel was not handled")
	}
	require.Equal(t, 1, a.snapshot(t).Classes["gold"].QueueDepth, "the resubmission must stay queued")
	require.Equal(t, uint64(1), a.counters(t, "gold").Cancelled)
	busy.Finish(false)
	select {
	case out := <-resubReply:
		require.NotNil(t, out)
		require.True(t, out.OK, "the resubmission is admitted once the slot frees: %+v", out)
	case <-ctx.Done():
		t.Fatal("no reply for the resubmission")
	}
}

// stallingActor holds every enqueue until release is closed, after telling
// entered: the owner's handler is then past its ownership check.
type stallingActor struct {
	Actor
	entered chan struct{}
	release chan struct{}
}

func (s stallingActor) Enqueue(r *scheduler.Request, respond scheduler.Responder) {
	s.entered <- struct{}{}
	<-s.release
	s.Actor.Enqueue(r, respond)
}

func TestADeposedOwnerCannotGrantARequestItsHandlerHadAlreadyAccepted(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	classes := h.classes
	_, port := actorOnly(t, classes, h.workers)
	stall := stallingActor{Actor: port, entered: make(chan struct{}, 1), release: make(chan struct{})}
	nc := rawConn(t, h)
	srv := NewServer("a", cluster, nc, stall, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.NoError(t, srv.Own("gold", 1))

	reply := asyncRawAdmit(t, rawConn(t, h), wireRequest(request("gold", 0)))
	<-stall.entered    // the handler checked ownership and is about to enqueue
	srv.Disown("gold") // the class moves away meanwhile
	close(stall.release)

	out := <-reply
	require.NotNil(t, out)
	require.False(t, out.OK, "a replica that no longer owns the class must not grant (epoch %d): class limits could be exceeded", out.Epoch)
	require.Equal(t, scheduler.ReasonOwnershipLost.String(), out.Reason)
	require.True(t, out.Uncounted, "the request never reached this owner's queue: its resubmission is still a first attempt")
}

func (s stallingActor) EnqueueIf(r *scheduler.Request, gate func() bool, respond scheduler.Responder) {
	s.entered <- struct{}{}
	<-s.release
	s.Actor.EnqueueIf(r, gate, respond)
}

// hasBooking reports whether r's Core still holds booking id.
func (r *replica) hasBooking(t *testing.T, id scheduler.BookingID) bool {
	t.Helper()
	ok := false
	require.NoError(t, r.actor.Do(context.Background(), func(c *scheduler.Core) { _, ok = c.Booking(id) }))
	return ok
}

func TestLifeMarksForAnOwnersPreviousLifeDoNotFreeBookingsOfItsRestartedSelf(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	old, b := h.start("a", nil), h.start("b", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	t1, err := b.client.Admit(ctx, request("gold", 0))
	require.NoError(t, err)
	t1.Dispatched()

	// a restarts under the same id (a StatefulSet) and claims the class again.
	old.stop()
	a := h.start("a", nil)
	h.own("gold", "a", 2)
	// b re-homes t1 to the new a (adopt), then frees t1's old booking with a
	// done mark to life.a, which the new a receives.
	testenv.Eventually(t, 5*time.Second, func() bool { return t1.Owner() == Owner{Replica: "a", Epoch: 2} }, "t1 re-homed")

	t2, err := b.client.Admit(ctx, request("gold", 0))
	require.NoError(t, err)
	t2.Dispatched()
	t2.Finish(false) // published after the re-home's done mark, on the same connection
	testenv.Eventually(t, 5*time.Second, func() bool { return !a.hasBooking(t, t2.Grant().Booking) }, "t2 freed")
	require.Equal(t, 1, a.snapshot(t).Bookings, "t1 still streams: its adopted booking must survive the done mark meant for a's previous life")
	t1.Finish(false)
	testenv.Eventually(t, 5*time.Second, func() bool { return a.snapshot(t).Bookings == 0 }, "t1 freed")
}

func TestAnEntryBacksOffOnItsClockWhileItsOwnStoppedActorAnswersOwnershipLost(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, nil)
	core.SetClasses(h.classes)
	core.SetWorkers(h.workers)
	actor := scheduler.NewActor(core, clock.Real{}, nil)
	actx, stopActor := context.WithCancel(context.Background())
	go func() { _ = actor.Run(actx) }()
	stopActor()
	<-actor.Done() // the local actor has stopped: it answers ownership_lost

	port := LocalActor(actor, func() []scheduler.ClassConfig { return h.classes })
	nc := rawConn(t, h)
	m := NewMetrics(prometheus.NewRegistry())
	srv := NewServer("a", cluster, nc, port, zap.NewNop(), m)
	require.NoError(t, srv.Own("gold", 1))
	defer srv.Disown("gold")
	clock := clock.NewFake(time.Now())
	cfg := DefaultClientConfig()
	cfg.Clock = clock
	cli := NewClient(cfg, "a", cluster, nc, port, srv, zap.NewNop(), m)

	ctx, cancel := context.WithCancel(context.Background())
	res := admitAsync(ctx, cli, request("gold", 0))
	retries := func() float64 { return testutil.ToFloat64(m.retries.WithLabelValues("ownership_moved")) }
	// Two timers: the admission's bound (Admit) and the backoff.
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() == 2 || retries() > 100 },
		"the entry to wait on a backoff timer of its clock")
	require.Equal(t, 2, clock.Timers(), "no backoff: %v attempts in a busy loop", retries())
	require.Equal(t, 1.0, retries())
	at, _ := clock.NextTimer()
	require.Equal(t, cfg.BackoffMin, at.Sub(clock.Now()), "the first wait is BackoffMin")

	clock.Advance(cfg.BackoffMin)
	testenv.Eventually(t, 5*time.Second, func() bool { return retries() == 2 && clock.Timers() == 2 }, "the second attempt and its wait")
	at, _ = clock.NextTimer()
	require.Equal(t, 2*cfg.BackoffMin, at.Sub(clock.Now()), "the wait doubles")
	cancel()
	require.ErrorIs(t, (<-res).err, context.Canceled)
}

// fakeClockEntry is the entry replica "b", on its own connection and a fake
// clock, with a local actor that owns nothing: the tests that use it point
// its owners elsewhere and watch the timers its admits arm.
func fakeClockEntry(t *testing.T, h *harness) (*Client, *Metrics, *clock.Fake, ClientConfig) {
	t.Helper()
	_, port := actorOnly(t, h.classes, h.workers)
	m := NewMetrics(prometheus.NewRegistry())
	entryNC := rawConn(t, h)
	srv := NewServer("b", cluster, entryNC, port, zap.NewNop(), m)
	clock := clock.NewFake(time.Now())
	cfg := DefaultClientConfig()
	cfg.Clock = clock
	// These tests are about the paths behind the status probe (their owner
	// x is a bare subscription, with no status subject): it is set past
	// every bound, so it is never armed.
	cfg.StatusAfter = 10 * cfg.AdmitBound()
	return NewClient(cfg, "b", cluster, entryNC, port, srv, zap.NewNop(), m), m, clock, cfg
}

func TestAnAdmitWithoutADeadlineWhoseReplyIsLostIsResubmittedAfterTheReplyTimeout(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	nc := rawConn(t, h)
	subj := wire.NewSubjects(cluster)
	// The owner x loses its reply to attempt 0 and answers attempt 1.
	seen := make(chan int, 4)
	_, err := nc.Subscribe(subj.Admit("gold"), func(msg *nats.Msg) {
		in, err := wire.DecodeAdmitRequest(msg.Data)
		if err != nil {
			return
		}
		seen <- in.Attempt
		if in.Attempt == 0 {
			return
		}
		b, _ := wire.EncodeAdmission(&wire.AdmitReply{OK: true, Owner: "x", Epoch: 1, Worker: "w0", Booking: 5})
		_ = msg.Respond(b)
	})
	require.NoError(t, err)
	cancels := make(chan *wire.CancelRequest, 4)
	_, err = nc.Subscribe(subj.Cancel("gold"), func(msg *nats.Msg) {
		if c, err := wire.DecodeCancelRequest(msg.Data); err == nil {
			cancels <- c
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cli, m, clock, cfg := fakeClockEntry(t, h)
	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "x", Epoch: 1}})

	ctx := testenv.Context(t)
	res := admitAsync(ctx, cli, request("gold", 0))
	require.Equal(t, 0, <-seen)
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() >= 1 }, "the reply timer to be armed")
	clock.Advance(cfg.OwnerReplyTimeout)
	var r admitResult
	testenv.Eventually(t, 5*time.Second, func() bool {
		select {
		case r = <-res:
			return true
		default:
			clock.Advance(cfg.BackoffMin) // the backoff before the resubmission
			return false
		}
	}, "the entry to give up on the lost reply and resubmit")
	require.NoError(t, r.err)
	require.Equal(t, scheduler.BookingID(5), r.t.Grant().Booking)
	require.Equal(t, 1, <-seen, "resubmitted as a retry")
	c := <-cancels
	require.Equal(t, 0, c.Attempt, "the lost attempt is cancelled at its owner")
	require.Equal(t, "x", c.Owner)
	require.Equal(t, 1.0, testutil.ToFloat64(m.retries.WithLabelValues("reply_timeout")))
}

func TestAnEntryDoesNotCountASecondOutcomeForARequestItsOwnerAlreadyCounted(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	nc := rawConn(t, h)
	// The owner x received the request (and counted it), but its answer
	// (its own due_time_passed rejection) is lost.
	seen := make(chan struct{}, 1)
	_, err := nc.Subscribe(wire.NewSubjects(cluster).Admit("gold"), func(*nats.Msg) { seen <- struct{}{} })
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cli, _, clock, _ := fakeClockEntry(t, h)
	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "x", Epoch: 1}})

	r := request("gold", 0)
	r.Due = clock.Now().Add(100 * time.Millisecond)
	res := admitAsync(testenv.Context(t), cli, r)
	<-seen
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() >= 1 }, "the deadline timer to be armed")
	clock.Advance(2 * time.Second)
	out := <-res
	require.ErrorIs(t, out.err, scheduler.ErrDeadlineExceeded, "the client is told its deadline passed")

	n := cli.Counts("w").Classes["gold"]
	require.Equal(t, uint64(1), n.Received)
	require.Zero(t, n.Rejected[scheduler.ReasonDueTimePassed.String()],
		"the owner counts this request's outcome; the entry counting one too makes two outcomes for one request")
}

func TestTheAbandonGraceRunsOnTheClientsClockAndStopsWithRun(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	nc := rawConn(t, h)
	seen := make(chan int, 8)
	_, err := nc.Subscribe(wire.NewSubjects(cluster).Admit("gold"), func(msg *nats.Msg) {
		if in, err := wire.DecodeAdmitRequest(msg.Data); err == nil {
			seen <- in.Attempt // and never answers
		}
	})
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cli, _, clock, cfg := fakeClockEntry(t, h)
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan struct{})
	go func() { defer close(runDone); _ = cli.Run(runCtx) }()
	defer func() { stopRun(); <-runDone }()
	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "x", Epoch: 1}})

	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	res := admitAsync(ctx, cli, request("gold", 0))
	require.Equal(t, 0, <-seen)
	// The admission's bound (Admit) and the reply timer.
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() == 2 }, "the reply timer")

	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "y", Epoch: 2}})
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() == 3 }, "the abandon grace on the client's clock")
	clock.Advance(cfg.AbandonGrace)
	testenv.Eventually(t, 5*time.Second, func() bool {
		select {
		case a := <-seen:
			require.Equal(t, 1, a, "resubmitted to the new owner as a retry")
			return true
		default:
			clock.Advance(cfg.BackoffMin)
			return false
		}
	}, "the request abandoned at x to be resubmitted")

	cli.OwnersChanged(map[string]Owner{"gold": {Replica: "z", Epoch: 3}})
	testenv.Eventually(t, 5*time.Second, func() bool { return clock.Timers() == 3 }, "a new abandon grace")
	stopRun()
	<-runDone
	require.Equal(t, 2, clock.Timers(), "Run stopped its abandon timer on the way out; only the admit's own reply timer and bound are left")
	cancel()
	<-res
}

func TestTheOwnersSchedulingTurnDoesNotWaitForTheReplyToBePublished(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	actor, port := actorOnly(t, h.classes, h.workers)
	nc := rawConn(t, h)
	srv := NewServer("a", cluster, nc, port, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	publishing := make(chan struct{}, 1)
	unstall := make(chan struct{})
	srv.respond = func(m *nats.Msg, data []byte) error {
		publishing <- struct{}{}
		<-unstall // a slow publish: the connection's write lock is contended
		return m.Respond(data)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.NoError(t, srv.Own("gold", 1))
	defer srv.Disown("gold")

	reply := asyncRawAdmit(t, rawConn(t, h), wireRequest(request("gold", 0)))
	<-publishing
	fctx, fcancel := context.WithTimeout(context.Background(), 2*time.Second) // bounds the failure, not the pass
	_, err := actor.Flush(fctx)
	fcancel()
	close(unstall)
	require.NoError(t, err, "the scheduler's next turn must not wait for the reply of the previous one")
	out := <-reply
	require.NotNil(t, out)
	require.True(t, out.OK)
}

func TestAnAdoptWaitingOnABusyActorEndsWhenTheServerStops(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(2, 0))
	core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, nil)
	core.SetClasses(h.classes)
	core.SetWorkers(h.workers)
	actor := scheduler.NewActor(core, clock.Real{}, nil) // never runs: every turn waits
	port := LocalActor(actor, func() []scheduler.ClassConfig { return h.classes })
	nc := rawConn(t, h)
	srv := NewServer("a", cluster, nc, port, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = srv.Run(ctx) }()
	require.NoError(t, srv.Own("gold", 1))

	b, err := wire.EncodeAdmission(&wire.AdoptRequest{Entry: "b", Class: "gold",
		Bookings: []wire.AdoptedBooking{{RequestID: "r", Worker: "w0", PromptTokens: 10}}})
	require.NoError(t, err)
	reply := make(chan *nats.Msg, 1)
	entry := rawConn(t, h)
	go func() {
		m, _ := entry.Request(wire.NewSubjects(cluster).Adopt("gold"), b, 10*time.Second)
		reply <- m
	}()
	adoptSub := srv.subscriptions("gold")[2]
	testenv.Eventually(t, 5*time.Second, func() bool {
		d, _ := adoptSub.Delivered()
		return d == 1
	}, "the adopt handler to be waiting on the actor")
	cancel()
	<-done
	m := <-reply
	require.NotNil(t, m, "the handler must give up when the server stops, not hold its NATS goroutine forever")
	out, err := wire.DecodeAdoptReply(m.Data)
	require.NoError(t, err)
	require.NotEmpty(t, out.Error)
	srv.Disown("gold")
}

// The owner handles cancels and admit requests on two subscriptions, so a
// cancel can be handled before its admit (after a NATS cut the client's
// reconnect buffer delivers them back to back). Such a grant would go to an
// inbox nobody waits on and hold its worker slot for the whole AckTimeout
// with nothing running there; it is withdrawn instead, counted cancelled.
func TestAGrantWhoseCancelArrivedFirstIsWithdrawnAtOnce(t *testing.T) {
	h := newHarness(t, []scheduler.ClassConfig{fcfs("gold")}, workers(1, 1))
	a := h.start("a", nil)
	h.own("gold", "a", 1)
	ctx := testenv.Context(t)
	busy := occupy(t, ctx, a)
	nc := rawConn(t, h)

	// A queued probe: its cancel, published after the late request's on
	// the same subject, is handled after it, which the probe's reply shows.
	probe := wireRequest(request("gold", 0))
	probeReply := asyncRawAdmit(t, nc, probe)
	waitQueued(t, a, "gold", 1)
	late := wireRequest(request("gold", 0))
	late.Attempt = 1
	publishCancel(t, nc, "gold", &wire.CancelRequest{ID: late.ID, Attempt: 1, Entry: "entry", Owner: "a"})
	publishCancel(t, nc, "gold", &wire.CancelRequest{ID: probe.ID, Entry: "entry", Owner: "a"})
	select {
	case <-probeReply:
	case <-ctx.Done():
		t.Fatal("the probe's cancel was not handled")
	}
	require.Equal(t, uint64(1), a.counters(t, "gold").Cancelled)

	// The admit request whose cancel was handled above arrives now, and
	// the worker is free: it must not hold the worker.
	busy.Finish(false)
	b, err := wire.EncodeAdmission(late)
	require.NoError(t, err)
	require.NoError(t, nc.Publish(wire.NewSubjects(cluster).Admit("gold"), b)) // no reply wanted: the entry gave up on it
	testenv.Eventually(t, 5*time.Second, func() bool {
		c := a.counters(t, "gold")
		return c.Retried == 1 && c.Cancelled+c.Admitted >= 3
	}, "the late attempt was not decided")
	c := a.counters(t, "gold")
	require.Equal(t, uint64(2), c.Cancelled, "the late attempt's grant must be withdrawn: %+v", c)
	require.Equal(t, 0, a.snapshot(t).Workers["w0"].ActiveRequests, "a grant nobody will use holds the worker until the ack timeout")
	require.InDelta(t, 1, testutil.ToFloat64(a.server.m.cancelledGrants), 0)
}
