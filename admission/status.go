package admission

import (
	"container/list"
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The status probe (docs/architecture.md, "The status probe"). NATS core
// is at-most-once: an admit reply the owner published can be lost with
// both connections up, and an admit can reach a subscription nobody reads.
// Either way the entry used to wait OwnerReplyTimeout (a minute). Now an
// entry whose attempt has had no answer for ClientConfig.StatusAfter asks
// the replica it sent the attempt to, on that replica's own status
// subject, and again every StatusAfter:
//
//   - queued: the owner still holds the attempt (in its actor's queue, or
//     on its way there: an adoption hold, a quota lease, the admit
//     subscription's backlog); the entry keeps waiting.
//   - granted: the attempt holds a grant not yet acknowledged; the answer
//     carries the grant's admit reply again, and the entry uses it in
//     place of the lost reply, with the same fencing checks. One attempt
//     has one grant at one owner, so a late original reply names the same
//     booking and is dropped with the request's inbox.
//   - unknown: the owner never saw the attempt or it is finished; the
//     entry cancels it there (a grant made after the answer is withdrawn,
//     cancelled.go) and resubmits at once (retries{cause="status_unknown"}).
//
// The owner answers from its actor's state, read on the actor's turn
// (Core.Attempt), so the answer never races a grant: an attempt whose
// EnqueueIf has returned is seen by the next turn. The attempts between
// their arrival and that hand-off are in inbound; the admit reply of each
// unacknowledged grant is in sent, written on the grant's own turn.

// statusKey names one attempt of a request.
type statusKey struct {
	id      string
	attempt int
}

// inboundAttempts are the admit requests this owner has received and not
// yet handed to its actor (or answered without it).
type inboundAttempts struct {
	mu sync.Mutex
	n  map[statusKey]int // a count: a duplicate delivery of one attempt
}

func (a *inboundAttempts) add(k statusKey) {
	a.mu.Lock()
	if a.n == nil {
		a.n = map[statusKey]int{}
	}
	a.n[k]++
	a.mu.Unlock()
}

func (a *inboundAttempts) remove(k statusKey) {
	a.mu.Lock()
	if a.n[k] <= 1 {
		delete(a.n, k)
	} else {
		a.n[k]--
	}
	a.mu.Unlock()
}

func (a *inboundAttempts) has(k statusKey) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.n[k] > 0
}

// sentGrantMemory bounds how long an unacknowledged grant's reply is kept
// for a status answer: past the owner's AckTimeout (30 s by default) the
// grant itself has expired. A grant still unacknowledged after it (a longer
// AckTimeout) reads unknown: the entry cancels it and resubmits, which is
// safe, only slower.
const sentGrantMemory = 2 * time.Minute

type sentGrant struct {
	key     statusKey
	booking scheduler.BookingID
	reply   wire.AdmitReply
	at      time.Time
	elem    *list.Element
}

// sentGrants keeps the admit reply of every grant until its entry
// acknowledges it (a life mark names the booking) or sentGrantMemory
// passes. It is written on the actor's turn (the grant's responder) and
// read by the status handler after its own actor turn.
type sentGrants struct {
	mu        sync.Mutex
	byKey     map[statusKey]*sentGrant
	byBooking map[scheduler.BookingID]*sentGrant
	order     list.List // oldest first
}

// save remembers out, the reply of grant booking of k, at now.
func (s *sentGrants) save(k statusKey, booking scheduler.BookingID, out *wire.AdmitReply, now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.byKey == nil {
		s.byKey, s.byBooking = map[statusKey]*sentGrant{}, map[scheduler.BookingID]*sentGrant{}
	}
	if old := s.byKey[k]; old != nil {
		s.dropLocked(old)
	}
	g := &sentGrant{key: k, booking: booking, reply: *out, at: now}
	g.elem = s.order.PushBack(g)
	s.byKey[k], s.byBooking[booking] = g, g
	for e := s.order.Front(); e != nil; e = s.order.Front() {
		if old := e.Value.(*sentGrant); now.Sub(old.at) >= sentGrantMemory {
			s.dropLocked(old)
			continue
		}
		break
	}
}

// get returns the saved reply of k's grant if it is booking.
func (s *sentGrants) get(k statusKey, booking scheduler.BookingID) (wire.AdmitReply, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := s.byKey[k]
	if g == nil || g.booking != booking {
		return wire.AdmitReply{}, false
	}
	return g.reply, true
}

// forget drops the saved replies of k (when the actor no longer holds its
// grant).
func (s *sentGrants) forget(k statusKey) {
	s.mu.Lock()
	if g := s.byKey[k]; g != nil {
		s.dropLocked(g)
	}
	s.mu.Unlock()
}

// forgetBookings drops the saved replies of bookings (a life mark named
// them: the entry has the grant).
func (s *sentGrants) forgetBookings(ids []scheduler.BookingID) {
	s.mu.Lock()
	for _, id := range ids {
		if g := s.byBooking[id]; g != nil {
			s.dropLocked(g)
		}
	}
	s.mu.Unlock()
}

func (s *sentGrants) dropLocked(g *sentGrant) {
	s.order.Remove(g.elem)
	if s.byKey[g.key] == g {
		delete(s.byKey, g.key)
	}
	if s.byBooking[g.booking] == g {
		delete(s.byBooking, g.booking)
	}
}

func (s *sentGrants) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byKey)
}

// onStatus answers an entry's status probe (see above).
func (s *Server) onStatus(m *nats.Msg) {
	in, err := wire.DecodeStatusRequest(m.Data)
	if err != nil {
		s.m.decodeErrors.WithLabelValues("status").Inc()
		s.log.Warn("bad status request", zap.Error(err))
		return // the entry's probe times out and is treated as one that did
	}
	out := s.status(in)
	s.m.statusAnswers.WithLabelValues(string(out.Status)).Inc()
	b, err := wire.EncodeStatus(out)
	if err != nil {
		s.log.Error("encode status reply", zap.Error(err))
		return
	}
	_ = m.Respond(b)
}

// status decides the answer about in's attempt.
func (s *Server) status(in *wire.StatusRequest) *wire.StatusReply {
	out := &wire.StatusReply{Owner: s.replica, Instance: s.instance, Status: wire.StatusUnknown}
	if in.Owner != s.replica {
		return out // meant for another replica: it cannot have this attempt here
	}
	k := statusKey{in.ID, in.Attempt}
	// Checked before the actor's turn, in the order an admit passes
	// them: the admit subscription's backlog, then the hand-off. An admit
	// that has left both is on the actor by the turn below.
	if s.admitBacklog(in.Class) || s.inbound.has(k) {
		out.Status = wire.StatusQueued
		return out
	}
	ctx, cancel := context.WithTimeout(s.runCtx, statusActorWait)
	defer cancel()
	st, booking, err := s.actor.Attempt(ctx, in.ID, in.Attempt)
	switch {
	case err != nil: // stopping: nothing here will answer the attempt
	case st == scheduler.AttemptQueued:
		out.Status = wire.StatusQueued
	case st == scheduler.AttemptGranted:
		if g, ok := s.sent.get(k, booking); ok {
			out.Status, out.Grant = wire.StatusGranted, &g
		}
		// else: its reply is forgotten (an AckTimeout past
		// sentGrantMemory): unknown, and the entry's cancel frees it.
	default:
		s.sent.forget(k)
	}
	return out
}

// statusActorWait bounds a status answer's wait for the actor's turn: an
// entry's probe gives up on its own after statusTimeout.
const statusActorWait = time.Second

// admitBacklog reports whether class's admit subscription has messages
// not yet handed to onAdmit: the probed attempt may be among them.
func (s *Server) admitBacklog(class string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	oc, ok := s.owned[class]
	if !ok || len(oc.subs) == 0 {
		return false
	}
	n, _, err := oc.subs[0].Pending()
	return err == nil && n > 0
}
