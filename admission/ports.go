package admission

import (
	"context"

	"github.com/switchyard/switchyard/scheduler"
)

// Actor is what admission needs from this replica's admission actor.
// LocalActor adapts a *scheduler.Actor. Every method must be safe to call
// from any goroutine and must not block for long.
type Actor interface {
	Enqueue(r *scheduler.Request, respond scheduler.Responder)
	// EnqueueIf runs gate on the actor's turn before the Core sees r; false
	// answers ownership_lost without counting (scheduler.Actor.EnqueueIf).
	EnqueueIf(r *scheduler.Request, gate func() bool, respond scheduler.Responder)
	// CancelAttempt withdraws the queued request only if it is that
	// attempt: a late cancel of an earlier attempt must not withdraw a
	// resubmission that reached this same owner.
	CancelAttempt(requestID string, attempt int)
	Ack(scheduler.BookingID)
	FirstToken(scheduler.BookingID)
	Finish(scheduler.BookingID)
	Renew([]scheduler.BookingID)
	// Adopt books an in-flight request that another owner granted and
	// returns its new booking id.
	Adopt(ctx context.Context, rec scheduler.BookingRecord) (scheduler.BookingID, error)
	// RejectQueued rejects every queued entry of class with reason, keeping
	// the class configured (ownership moved away from this replica).
	RejectQueued(class string, reason scheduler.Reason)
	// Snapshot is the actor's latest published snapshot (its queues).
	Snapshot() *scheduler.Snapshot
	// Attempt reports, on the actor's turn, what it knows of one attempt
	// of a request (Core.Attempt): an owner's answer to a status probe.
	Attempt(ctx context.Context, requestID string, attempt int) (scheduler.AttemptState, scheduler.BookingID, error)
}

// Owner is a class's owner as the cluster layer knows it.
type Owner struct {
	Replica string
	Epoch   int64 // fencing epoch: the ownership key's create revision
}

// LocalActor adapts a scheduler actor that is configured with every policy
// class (ownership decides which requests reach it, not its configuration).
// classes returns the current class configurations; RejectQueued no longer
// needs them (the Core keeps a disowned class configured), but callers keep
// passing the policy's source.
func LocalActor(a *scheduler.Actor, classes func() []scheduler.ClassConfig) Actor {
	return localActor{Actor: a, classes: classes}
}

type localActor struct {
	*scheduler.Actor
	classes func() []scheduler.ClassConfig
}

// RejectQueued empties the class's queue with reason in one actor turn. The
// class stays configured and keeps its place in the round robin, so a
// handoff does not restart the rotation at the first class.
func (l localActor) RejectQueued(class string, reason scheduler.Reason) {
	_ = l.Do(context.Background(), func(c *scheduler.Core) { c.RejectQueued(class, reason) })
}

// Attempt reads Core.Attempt on the actor's turn.
func (l localActor) Attempt(ctx context.Context, requestID string, attempt int) (scheduler.AttemptState, scheduler.BookingID, error) {
	var st scheduler.AttemptState
	var id scheduler.BookingID
	err := l.Do(ctx, func(c *scheduler.Core) { st, id = c.Attempt(requestID, attempt) })
	return st, id, err
}
