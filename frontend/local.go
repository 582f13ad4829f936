package frontend

import (
	"context"
	"sync/atomic"

	"github.com/switchyard/switchyard/scheduler"
)

// AdmissionActor is the part of scheduler.Actor the local admitter uses.
// Its lifecycle methods must not block for long (the actor takes them on
// its input channel).
type AdmissionActor interface {
	Admit(ctx context.Context, r *scheduler.Request) (scheduler.Grant, error)
	Ack(scheduler.BookingID)
	FirstToken(scheduler.BookingID)
	Finish(scheduler.BookingID)
}

// LocalAdmitter admits requests through an in-process admission actor: the
// path of a replica that owns the request's class.
type LocalAdmitter struct {
	actor AdmissionActor
}

// NewLocalAdmitter returns an Admitter over actor.
func NewLocalAdmitter(actor AdmissionActor) *LocalAdmitter { return &LocalAdmitter{actor: actor} }

// Admit blocks until the actor grants or rejects r, or ctx ends (the actor
// then removes the queued entry and counts it cancelled).
func (l *LocalAdmitter) Admit(ctx context.Context, r *scheduler.Request) (Ticket, error) {
	g, err := l.actor.Admit(ctx, r)
	if err != nil {
		return nil, err
	}
	return &localTicket{actor: l.actor, grant: g}, nil
}

// localTicket forwards lifecycle marks to the actor. Each mark is sent at most
// once, so a double Finish cannot free a booking twice.
type localTicket struct {
	actor                  AdmissionActor
	grant                  scheduler.Grant
	acked, first, finished atomic.Bool
	used                   atomic.Int64 // reported usage + 1; 0 = unknown
}

// SetUsage records the engine's reported token usage; Finish hands it to
// an actor that takes it (scheduler.Actor.FinishUsage).
func (t *localTicket) SetUsage(tokens int) { t.used.Store(int64(max(tokens, 0)) + 1) }

func (t *localTicket) Grant() scheduler.Grant { return t.grant }

func (t *localTicket) Dispatched() {
	if t.acked.CompareAndSwap(false, true) {
		t.actor.Ack(t.grant.Booking)
	}
}

func (t *localTicket) FirstToken() {
	if t.first.CompareAndSwap(false, true) {
		t.actor.FirstToken(t.grant.Booking)
	}
}

// Finish frees the booking. aborted does not change what the ledger does (the
// load leaves either way); it matters to remote owners' lifecycle counters.
func (t *localTicket) Finish(aborted bool) {
	if t.finished.CompareAndSwap(false, true) {
		type usageFinisher interface {
			FinishUsage(scheduler.BookingID, int)
		}
		if uf, ok := t.actor.(usageFinisher); ok && !aborted && t.used.Load() > 0 {
			uf.FinishUsage(t.grant.Booking, int(t.used.Load()-1))
			return
		}
		t.actor.Finish(t.grant.Booking)
	}
}
