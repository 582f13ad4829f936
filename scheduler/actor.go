package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
)

// ErrAlreadyRunning is returned by a second call to Actor.Run.
var ErrAlreadyRunning = errors.New("scheduler: actor already running")

// Actor runs one Core on one goroutine (its Run). Everything that touches the
// Core goes through the actor's unbuffered input channels, so admission is
// serialized without locks; readers get immutable snapshots.
//
// Who completes a request, exactly once:
//   - Admit: the Core calls the waiter's responder once (grant, rejection, or
//     ErrCancelled after Cancel). If Admit's ctx ends first, Admit marks the
//     waiter abandoned and sends Cancel; whichever of the two reaches the
//     Core first settles the request as cancelled: Cancel removes the queued
//     entry, or the responder refuses the grant and the Core rolls the
//     booking back. If the grant was already delivered when ctx ended, Admit
//     rolls the booking back itself (the request stays counted admitted).
//     If the actor stops, Run rejects queued requests with ownership_lost.
//   - Enqueue: the caller's Responder is called exactly once on the actor
//     goroutine, or with ownership_lost when the actor has stopped.
type Actor struct {
	core  *Core
	clock clock.Clock
	log   *zap.Logger

	in      chan message     // unbuffered: senders wait for the actor's turn
	queries chan func(*Core) // unbuffered
	done    chan struct{}    // closed when Run returns
	started atomic.Bool
	snap    atomic.Pointer[Snapshot]

	// owned by the Run goroutine
	dirty   bool
	lastPub time.Time
}

type msgKind int

const (
	msgEnqueue msgKind = iota + 1
	msgCancel
	msgAck
	msgFirstToken
	msgFinish
	msgRollback
	msgRenew
	msgDrain
	msgFinishUsage
)

type message struct {
	kind     msgKind
	req      *Request
	respond  Responder
	gate     func() bool // msgEnqueue: checked on the actor's turn; false = not admitted here
	id       string
	attempt  int // msgCancel: the attempt to withdraw; anyAttempt for all
	booking  BookingID
	bookings []BookingID
	used     int // msgFinishUsage: tokens the engine reported
}

// NewActor wraps core, which must not be used by anything else afterwards.
// It starts nothing: call Run.
func NewActor(core *Core, clock clock.Clock, logger *zap.Logger) *Actor {
	if clock == nil {
		clock = core.clock
	}
	if logger == nil {
		logger = zap.NewNop()
	}
	a := &Actor{
		core:    core,
		clock:   clock,
		log:     logger.Named("scheduler"),
		in:      make(chan message),
		queries: make(chan func(*Core)),
		done:    make(chan struct{}),
	}
	a.snap.Store(core.Snapshot())
	return a
}

// Run serves the Core until ctx ends. On the way out it rejects every queued
// request with ownership_lost and publishes a final snapshot. It returns nil
// after a normal stop.
func (a *Actor) Run(ctx context.Context) error {
	if !a.started.CompareAndSwap(false, true) {
		return ErrAlreadyRunning
	}
	defer close(a.done)
	timer := a.clock.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	a.publish()
	a.log.Info("scheduler actor started")
	for {
		a.arm(timer)
		select {
		case <-ctx.Done():
			a.core.Shutdown(ReasonOwnershipLost)
			a.publish()
			a.log.Info("scheduler actor stopped", zap.Int("bookings", a.core.Bookings()))
			return nil
		case m := <-a.in:
			a.handle(m)
		case fn := <-a.queries:
			fn(a.core)
		case <-timer.C():
			a.core.Tick()
		}
		a.dirty = true
		if !a.clock.Now().Before(a.lastPub.Add(a.core.cfg.SnapshotInterval)) {
			a.publish()
		}
	}
}

// arm sets the timer for the Core's next wake or the next snapshot due.
func (a *Actor) arm(t clock.Timer) {
	wake, ok := a.core.NextWake()
	if a.dirty {
		if at := a.lastPub.Add(a.core.cfg.SnapshotInterval); !ok || at.Before(wake) {
			wake, ok = at, true
		}
	}
	if !ok {
		t.Stop()
		return
	}
	t.Reset(max(0, wake.Sub(a.clock.Now())))
}

func (a *Actor) publish() {
	a.snap.Store(a.core.Snapshot())
	a.lastPub = a.clock.Now()
	a.dirty = false
}

func (a *Actor) handle(m message) {
	c := a.core
	switch m.kind {
	case msgEnqueue:
		if m.gate != nil && !m.gate() {
			id := ""
			if m.req != nil {
				id = m.req.ID
			}
			if m.respond != nil {
				m.respond(Grant{}, &RejectError{Reason: ReasonOwnershipLost, Detail: fmt.Sprintf("request %s: not admitted here", id)})
			}
			return
		}
		c.Enqueue(m.req, m.respond)
	case msgCancel:
		if m.attempt == anyAttempt {
			c.Cancel(m.id)
		} else {
			c.CancelAttempt(m.id, m.attempt)
		}
	case msgAck:
		c.Ack(m.booking)
	case msgFirstToken:
		c.FirstToken(m.booking)
	case msgFinish:
		c.Finish(m.booking)
	case msgRollback:
		c.Rollback(m.booking)
	case msgRenew:
		c.Renew(m.bookings)
	case msgDrain:
		c.Drain()
	case msgFinishUsage:
		c.FinishUsage(m.booking, m.used)
	}
}

// send hands m to the actor; false when the actor has stopped.
func (a *Actor) send(m message) bool {
	select {
	case a.in <- m:
		return true
	case <-a.done:
		return false
	}
}

func stoppedError(id string) error {
	return &RejectError{Reason: ReasonOwnershipLost, Detail: fmt.Sprintf("request %s: scheduler stopped", id)}
}

// Admit queues r and blocks until it is admitted or rejected, or ctx ends.
// On ctx end it returns an error wrapping both ErrCancelled and ctx.Err();
// see the Actor doc for how the request is then settled.
func (a *Actor) Admit(ctx context.Context, r *Request) (Grant, error) {
	if r == nil {
		return Grant{}, &RejectError{Reason: ReasonInvalidConstraint, Detail: "nil request"}
	}
	w := &waiter{reply: make(chan admitResult, 1)}
	select {
	case a.in <- message{kind: msgEnqueue, req: r, respond: w.respond}:
	case <-ctx.Done():
		return Grant{}, fmt.Errorf("admit %s: %w (%w)", r.ID, ErrCancelled, ctx.Err())
	case <-a.done:
		return Grant{}, stoppedError(r.ID)
	}
	select {
	case res := <-w.reply:
		return res.grant, res.err
	case <-ctx.Done():
	}
	if w.state.CompareAndSwap(waiting, abandoned) {
		a.send(message{kind: msgCancel, id: r.ID, attempt: r.Attempt})
		return Grant{}, fmt.Errorf("admit %s: %w (%w)", r.ID, ErrCancelled, ctx.Err())
	}
	res := <-w.reply // delivered just as ctx ended
	if res.err == nil {
		a.send(message{kind: msgRollback, booking: res.grant.Booking})
		return Grant{}, fmt.Errorf("admit %s: granted after the caller left, rolled back: %w (%w)", r.ID, ErrCancelled, ctx.Err())
	}
	return Grant{}, res.err
}

const (
	waiting int32 = iota
	delivered
	abandoned
)

type admitResult struct {
	grant Grant
	err   error
}

// waiter is one blocked Admit. Its state decides, once, whether the Core's
// answer is delivered or refused.
type waiter struct {
	state atomic.Int32
	reply chan admitResult // size one: the responder never blocks
}

func (w *waiter) respond(g Grant, err error) bool {
	if !w.state.CompareAndSwap(waiting, delivered) {
		return false
	}
	w.reply <- admitResult{grant: g, err: err}
	return true
}

// Enqueue hands r to the actor without waiting for the outcome (the remote
// admission path). respond is called exactly once on the actor goroutine
// (see Responder), or right here with ownership_lost if the actor stopped.
func (a *Actor) Enqueue(r *Request, respond Responder) {
	if !a.send(message{kind: msgEnqueue, req: r, respond: respond}) {
		id := ""
		if r != nil {
			id = r.ID
		}
		if respond != nil {
			respond(Grant{}, stoppedError(id))
		}
	}
}

const anyAttempt = -1

// EnqueueIf is Enqueue with a gate that runs on the actor's turn, right
// before the Core sees r: when it returns false, respond gets ownership_lost
// and no counter moves. Because the gate and the Core's turn are one, a
// caller that withdraws the gate's condition and then runs a turn of its own
// (Disown, then RejectQueued) knows that no request passes the gate after
// it: the check and the enqueue cannot be split by that turn.
func (a *Actor) EnqueueIf(r *Request, gate func() bool, respond Responder) {
	if !a.send(message{kind: msgEnqueue, req: r, respond: respond, gate: gate}) {
		id := ""
		if r != nil {
			id = r.ID
		}
		if respond != nil {
			respond(Grant{}, stoppedError(id))
		}
	}
}

// Cancel withdraws a queued request, whatever its attempt (no effect once
// it left the queue).
func (a *Actor) Cancel(requestID string) {
	a.send(message{kind: msgCancel, id: requestID, attempt: anyAttempt})
}

// CancelAttempt withdraws a queued request only if it is that attempt (see
// Core.CancelAttempt).
func (a *Actor) CancelAttempt(requestID string, attempt int) {
	a.send(message{kind: msgCancel, id: requestID, attempt: attempt})
}

// Ack makes a grant final.
func (a *Actor) Ack(id BookingID) { a.send(message{kind: msgAck, booking: id}) }

// FirstToken removes a booking's prefill load.
func (a *Actor) FirstToken(id BookingID) { a.send(message{kind: msgFirstToken, booking: id}) }

// Finish frees a booking.
func (a *Actor) Finish(id BookingID) { a.send(message{kind: msgFinish, booking: id}) }

// FinishUsage frees a booking and corrects its tenant's tokens bucket with
// the tokens used (Core.FinishUsage).
func (a *Actor) FinishUsage(id BookingID, used int) {
	a.send(message{kind: msgFinishUsage, booking: id, used: used})
}

// Rollback frees a booking whose hand-off failed.
func (a *Actor) Rollback(id BookingID) { a.send(message{kind: msgRollback, booking: id}) }

// Renew restarts the renewal window of in-flight bookings. ids is owned by
// the actor afterwards.
func (a *Actor) Renew(ids []BookingID) { a.send(message{kind: msgRenew, bookings: ids}) }

// Drain asks the actor to re-evaluate its queues (remote load changed).
func (a *Actor) Drain() { a.send(message{kind: msgDrain}) }

// Do runs fn on the actor goroutine with exclusive access to the Core and
// waits for it. fn must not block or retain the Core.
func (a *Actor) Do(ctx context.Context, fn func(*Core)) error {
	done := make(chan struct{})
	wrapped := func(c *Core) { fn(c); close(done) }
	select {
	case a.queries <- wrapped:
	case <-ctx.Done():
		return ctx.Err()
	case <-a.done:
		return stoppedError("")
	}
	<-done // fn runs on the actor's turn, which always completes
	return nil
}

// exec runs fn on the actor without a caller context (configuration
// changes); a stopped actor ignores it.
func (a *Actor) exec(fn func(*Core)) {
	select {
	case a.queries <- fn:
	case <-a.done:
	}
}

// SetWorkers replaces the registered workers (see Core.SetWorkers).
func (a *Actor) SetWorkers(ws []Worker) {
	ws = append([]Worker(nil), ws...)
	a.exec(func(c *Core) { c.SetWorkers(ws) })
}

// SetClasses replaces the class configurations (see Core.SetClasses).
func (a *Actor) SetClasses(cfgs []ClassConfig) {
	for _, cfg := range cfgs {
		if err := cfg.Validate(); err != nil {
			a.log.Warn("skipping invalid class config", zap.String("class", cfg.Name), zap.Error(err))
		}
	}
	cfgs = append([]ClassConfig(nil), cfgs...)
	a.exec(func(c *Core) { c.SetClasses(cfgs) })
}

// RemoveClass stops serving a class (see Core.RemoveClass).
func (a *Actor) RemoveClass(name string, reason Reason) {
	a.exec(func(c *Core) { c.RemoveClass(name, reason) })
}

// Adopt re-homes an in-flight booking (see Core.Adopt).
func (a *Actor) Adopt(ctx context.Context, rec BookingRecord) (BookingID, error) {
	var id BookingID
	err := a.Do(ctx, func(c *Core) { id = c.Adopt(rec) })
	return id, err
}

// Snapshot returns the latest published snapshot (at most
// Config.SnapshotInterval old while the actor is busy). Never nil.
func (a *Actor) Snapshot() *Snapshot { return a.snap.Load() }

// Flush publishes a fresh snapshot now and returns it.
func (a *Actor) Flush(ctx context.Context) (*Snapshot, error) {
	err := a.Do(ctx, func(*Core) { a.publish() })
	if err != nil {
		return a.snap.Load(), err
	}
	return a.snap.Load(), nil
}

// Done is closed when Run has returned.
func (a *Actor) Done() <-chan struct{} { return a.done }
