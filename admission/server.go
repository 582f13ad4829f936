package admission

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Server is the owner side of remote admission. See the package doc.
type Server struct {
	replica string
	nc      *nats.Conn
	subj    wire.Subjects
	actor   Actor
	log     *zap.Logger
	m       *Metrics
	clock   clock.Clock
	// instance names this life of the owner side: grants carry it and
	// lifecycle marks must name it (booking ids are per Core).
	instance uint64

	// runCtx ends when Run returns (or was never needed): handlers that
	// wait on the actor (adopt) give up then.
	runCtx  context.Context
	stopRun context.CancelFunc
	// respond publishes one reply (m.Respond; tests stall it).
	respond func(m *nats.Msg, data []byte) error
	// Admit replies leave the actor's turn through replies, published by
	// Run's replier goroutine. replying (under rmu) says the replier takes
	// them; otherwise, or when the queue is full, the turn replies itself.
	rmu      sync.Mutex
	replying bool
	replies  chan outgoingReply

	mu    sync.Mutex
	owned map[string]*ownedClass

	// adoptHold is how long after acquiring a class its tenants' requests
	// with a concurrency quota wait before they are admitted (see
	// adoptionHold); holds tracks the handlers' goroutines that wait it.
	adoptHold time.Duration
	holds     sync.WaitGroup
	// entries lists the live entry replicas (WithEntries; nil: the hold
	// always runs to its bound). See adopthold.go.
	entries func() []string

	// quota leases tenants' quotas across the class owners (NewQuota
	// installs it before Run; nil: each owner enforces them alone).
	quota *Quota

	// cancelled are the attempts entries cancelled here, so that a grant
	// of one whose admit arrived after its cancel is withdrawn
	// (cancelled.go).
	cancelled cancelledAttempts

	// inbound and sent answer entries' status probes (status.go): the
	// admits not yet handed to the actor, and the replies of the grants
	// not yet acknowledged.
	inbound inboundAttempts
	sent    sentGrants
}

type ownedClass struct {
	epoch int64
	subs  []*nats.Subscription
	// holdUntil ends the class's adoption hold (design §16): until then a
	// tenant's request with a concurrency quota waits, so that it is
	// checked against the bookings the entries re-home here (adopt), not
	// against the empty count a new owner starts with.
	holdUntil time.Time
	// hold is the adoption hold's end (adopthold.go).
	hold holdState
}

// DefaultAdoptHold is the adoption hold of a new owner. Entries re-home
// their bookings as soon as their etcd watch shows the new owner, one adopt
// round trip each: milliseconds normally, far under the hold.
const DefaultAdoptHold = time.Second

// WithAdoptHold sets the adoption hold (default DefaultAdoptHold); 0 turns
// it off: a new owner admits at once against what it has adopted so far.
func WithAdoptHold(d time.Duration) ServerOption {
	return func(s *Server) {
		if d >= 0 {
			s.adoptHold = d
		}
	}
}

// ServerOption adjusts a Server at construction.
type ServerOption func(*Server)

// WithServerClock sets the clock the owner side reads (default wall time);
// it must be the clock of the replica's scheduler.
func WithServerClock(c clock.Clock) ServerOption {
	return func(s *Server) {
		if c != nil {
			s.clock = c
		}
	}
}

// NewServer returns the owner side for replica. It subscribes nothing until
// Run (life marks) and Own (per-class subjects).
func NewServer(replica, cluster string, nc *nats.Conn, actor Actor, log *zap.Logger, m *Metrics, opts ...ServerOption) *Server {
	s := &Server{
		replica:  replica,
		nc:       nc,
		subj:     wire.NewSubjects(cluster),
		actor:    actor,
		log:      log.Named("admission_server"),
		m:        m,
		clock:    clock.Real{},
		respond:  func(m *nats.Msg, data []byte) error { return m.Respond(data) },
		replies:  make(chan outgoingReply, replyQueue),
		instance: rand.Uint64() | 1,
		owned:    map[string]*ownedClass{},

		adoptHold: DefaultAdoptHold,
	}
	for _, o := range opts {
		o(s)
	}
	s.runCtx, s.stopRun = context.WithCancel(context.Background())
	return s
}

// replyQueue bounds the admit replies waiting for the replier; beyond it
// the actor's turn publishes itself rather than wait.
const replyQueue = 1024

// outgoingReply is one admit reply handed off the actor's turn. booking is
// the grant's, freed if the reply cannot be published.
type outgoingReply struct {
	m       *nats.Msg
	out     *wire.AdmitReply
	booking scheduler.BookingID
}

// Run listens for lifecycle marks addressed to this replica and publishes
// admit replies until ctx ends, then drops every owned class's
// subscriptions.
func (s *Server) Run(ctx context.Context) error {
	defer s.stopRun()
	sub, err := s.nc.Subscribe(s.subj.Life(s.replica), s.onLife)
	if err != nil {
		return fmt.Errorf("subscribe life marks: %w", err)
	}
	statusSub, err := s.nc.Subscribe(s.subj.Status(s.replica), s.onStatus)
	if err != nil {
		_ = sub.Unsubscribe()
		return fmt.Errorf("subscribe status probes: %w", err)
	}
	s.rmu.Lock()
	s.replying = true
	s.rmu.Unlock()
	replierDone := make(chan struct{})
	go func() {
		defer close(replierDone)
		for {
			select {
			case r := <-s.replies:
				s.publish(r)
			case <-ctx.Done():
				return
			}
		}
	}()
	<-ctx.Done()
	s.mu.Lock()
	s.stopRun() // requests held for adoption give up (see onAdmit)
	s.mu.Unlock()
	s.holds.Wait()
	<-replierDone
	s.rmu.Lock()
	s.replying = false // from now on every turn replies itself
	s.rmu.Unlock()
	for len(s.replies) > 0 { // handed off before that: publish them too
		s.publish(<-s.replies)
	}
	_ = sub.Unsubscribe()
	_ = statusSub.Unsubscribe()
	s.mu.Lock()
	for class, oc := range s.owned {
		for _, sub := range oc.subs {
			_ = sub.Unsubscribe()
		}
		delete(s.owned, class)
	}
	s.mu.Unlock()
	return nil
}

// Own starts admitting class for the cluster with fencing epoch. Owning a
// class twice only updates its epoch.
func (s *Server) Own(class string, epoch int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if oc, ok := s.owned[class]; ok {
		oc.epoch = epoch
		return nil
	}
	oc := &ownedClass{epoch: epoch, holdUntil: s.clock.Now().Add(s.adoptHold), hold: newHoldState()}
	handlers := []struct {
		subject string
		h       nats.MsgHandler
	}{
		{s.subj.Admit(class), func(m *nats.Msg) { s.onAdmit(class, m) }},
		{s.subj.Cancel(class), s.onCancel},
		{s.subj.Adopt(class), func(m *nats.Msg) { s.onAdopt(class, m) }},
	}
	for _, h := range handlers {
		sub, err := s.nc.Subscribe(h.subject, h.h)
		if err != nil {
			for _, sub := range oc.subs {
				_ = sub.Unsubscribe()
			}
			return fmt.Errorf("own class %s: subscribe %s: %w", class, h.subject, err)
		}
		oc.subs = append(oc.subs, sub)
	}
	// Flush so that "no responders" stops before Own returns: the cluster
	// layer announces ownership right after this. Not while the connection
	// is down: the flush cannot succeed (the client sends the subscriptions
	// when it reconnects), and its timeout would hold the ownership loop,
	// delaying the hand-off of every class a replica cut from NATS gives up.
	if s.nc.IsConnected() {
		if err := s.nc.FlushTimeout(2 * time.Second); err != nil {
			s.log.Warn("flush after own", zap.String("class", class), zap.Error(err))
		}
	}
	s.owned[class] = oc
	s.startHoldLocked(class, oc)
	s.log.Info("owning class", zap.String("class", class), zap.Int64("epoch", epoch))
	return nil
}

// Disown stops admitting class: it stops owning it (from then on no request
// passes the ownership gate on the actor's turn), drains the class's
// subscriptions over a live connection (no new request arrives, and the ones already delivered to
// this replica but not yet handled are answered "class moved", uncounted, so
// their entries resubmit; a plain unsubscribe would drop them and leave their
// entries waiting forever when the owner does not change, as after a brief
// fence), then rejects what is queued with ownership_lost so that entry
// replicas resubmit to the next owner.
func (s *Server) Disown(class string) {
	s.mu.Lock()
	oc, ok := s.owned[class]
	delete(s.owned, class)
	if ok {
		oc.hold.end("") // held requests go on to the gate, which answers "moved"
	}
	s.mu.Unlock()
	if !ok {
		return
	}
	// Drain only over a live connection. While it is down, nats.go keeps a
	// draining subscription until the drain's flush returns, resends it on
	// reconnect, then forgets it without an UNSUB: the server would go on
	// delivering this class's admits to a subscription nobody reads, and
	// entries would wait OwnerReplyTimeout instead of getting "no
	// responders" (TestADisownWhileCutLeavesNoSubscriptionAtTheServer).
	// Unsubscribing drops it from the client's table at once, so it is not
	// resent; what was delivered but not yet handled is dropped with it (the
	// replies could not leave a cut connection before it reconnects anyway),
	// and its entries resubmit on their connection-lost or reply timeouts.
	connected := s.nc.IsConnected()
	for _, sub := range oc.subs {
		if !connected {
			if n, _, _ := sub.Pending(); n > 0 {
				s.log.Warn("disowned while cut from NATS: dropping undelivered admits",
					zap.String("class", class), zap.Int("pending", n))
			}
			_ = sub.Unsubscribe()
			continue
		}
		if err := sub.Drain(); err != nil {
			_ = sub.Unsubscribe() // the connection is closed: nothing is pending
		}
	}
	s.actor.RejectQueued(class, scheduler.ReasonOwnershipLost)
	s.log.Info("disowned class", zap.String("class", class), zap.Int64("epoch", oc.epoch))
}

// OwnedClasses returns the classes this replica currently admits.
func (s *Server) OwnedClasses() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.owned))
	for class := range s.owned {
		out = append(out, class)
	}
	return out
}

// Instance names this life of the owner side (see wire.LifeMark.Instance).
func (s *Server) Instance() uint64 { return s.instance }

// Owns reports whether this replica currently admits class, and its epoch.
func (s *Server) Owns(class string) (int64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	oc, ok := s.owned[class]
	if !ok {
		return 0, false
	}
	return oc.epoch, true
}

func (s *Server) onAdmit(class string, m *nats.Msg) {
	in, err := wire.DecodeAdmitRequest(m.Data)
	if err == nil {
		err = in.CheckIngress(s.clock.Now())
	}
	if err != nil {
		s.m.decodeErrors.WithLabelValues("admit").Inc()
		s.log.Warn("bad admit request", zap.Error(err))
		s.reply(m, &wire.AdmitReply{Reason: scheduler.ReasonInvalidConstraint.String(), Detail: err.Error()})
		return
	}
	if in.Class != class {
		s.m.decodeErrors.WithLabelValues("admit").Inc()
		s.reply(m, &wire.AdmitReply{Reason: scheduler.ReasonUnknownClass.String(),
			Detail: fmt.Sprintf("request for class %q sent on the subject of class %q", in.Class, class)})
		return
	}
	// From here until the actor has it (enqueueLeased) or it is answered
	// without it (answer), a status probe reads it queued.
	key := statusKey{in.ID, in.Attempt}
	s.inbound.add(key)
	if _, ok := s.Owns(class); !ok { // raced with Disown: the entry resubmits
		s.answer(m, key, movedReply())
		return
	}
	req := RequestFromWire(in)
	if d, done := s.adoptionHold(req); d > 0 {
		// Wait off the subscription's goroutine: the class's other
		// requests are not held behind this one.
		if !s.beginHold(m, req) {
			return
		}
		s.m.heldForAdoption.Inc()
		go func() {
			defer s.holds.Done()
			t := s.clock.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C():
				s.enqueueAdmit(class, m, req)
			case <-done: // adoption complete: every live entry re-homed
				s.enqueueAdmit(class, m, req)
			case <-s.runCtx.Done(): // stopping: the entry resubmits
				s.answer(m, key, movedReply())
			}
		}()
		return
	}
	s.enqueueAdmit(class, m, req)
}

// answer replies to an admit request that does not reach the actor, and
// ends its inbound record.
func (s *Server) answer(m *nats.Msg, key statusKey, out *wire.AdmitReply) {
	s.inbound.remove(key)
	s.reply(m, out)
}

// adoptionHold returns how long r must still wait before its owner admits
// it: the rest of its class's adoption hold when r is a tenant's request
// with a concurrency quota, else 0; and a channel closed when the hold
// ends early (every live entry reported its re-home round, adopthold.go).
// Only the concurrency quota depends on the adopted bookings; the buckets
// travel with the class (BucketSync).
func (s *Server) adoptionHold(r *scheduler.Request) (time.Duration, <-chan struct{}) {
	if r.Tenant.ID == "" || r.Tenant.Quota.Concurrent <= 0 {
		return 0, nil
	}
	s.mu.Lock()
	oc, ok := s.owned[r.Class]
	var until time.Time
	var done <-chan struct{}
	if ok {
		until, done = oc.holdUntil, oc.hold.done
		if oc.hold.ended() {
			until = time.Time{}
		}
	}
	s.mu.Unlock()
	if !ok {
		return 0, nil
	}
	return max(0, until.Sub(s.clock.Now())), done
}

// beginHold counts one admit about to wait off its subscription's
// goroutine (Run's stop waits for it: call s.holds.Done when it ends). Once
// Run is stopping it answers "moved" instead (the entry resubmits) and
// reports false.
func (s *Server) beginHold(m *nats.Msg, req *scheduler.Request) bool {
	s.mu.Lock() // ordered with Run's stop: no Add after its Wait began
	stopping := s.runCtx.Err() != nil
	if !stopping {
		s.holds.Add(1)
	}
	s.mu.Unlock()
	if stopping {
		s.answer(m, statusKey{req.ID, req.Attempt}, movedReply())
	}
	return !stopping
}

// enqueueAdmit checks req's tenant quota lease (quota.go), then hands req
// to the actor and replies. A lease that needs a round trip to the quota
// owner is taken off the subscription's goroutine, like the adoption hold.
func (s *Server) enqueueAdmit(class string, m *nats.Msg, req *scheduler.Request) {
	qt, ok := s.quota.tryFast(req)
	if ok {
		s.enqueueLeased(class, m, req, qt)
		return
	}
	if !s.beginHold(m, req) {
		return
	}
	go func() {
		defer s.holds.Done()
		qt, err := s.quota.acquire(s.runCtx, req)
		switch {
		case s.runCtx.Err() != nil: // stopping: the entry resubmits
			qt.cancel()
			s.answer(m, statusKey{req.ID, req.Attempt}, movedReply())
		case err != nil:
			out := &wire.AdmitReply{Owner: s.replica}
			if e, ok := s.Owns(class); ok {
				out.Epoch = e
			}
			fillRejection(out, err)
			s.answer(m, statusKey{req.ID, req.Attempt}, out)
		default:
			s.enqueueLeased(class, m, req, qt)
		}
	}()
}

// enqueueLeased hands req, its quota lease taken (qt; nil: none), to the
// actor and replies.
func (s *Server) enqueueLeased(class string, m *nats.Msg, req *scheduler.Request, qt *quotaTicket) {
	// The ownership check that counts runs on the actor's turn, where
	// Disown's RejectQueued is ordered with it: a handler that passed the
	// check in onAdmit while Disown ran cannot enqueue after the queue was
	// emptied. The epoch the request is admitted under travels with it.
	var epoch int64
	moved := false
	gate := func() bool {
		e, ok := s.Owns(class)
		epoch, moved = e, !ok
		return ok
	}
	s.actor.EnqueueIf(req, gate, func(g scheduler.Grant, err error) bool {
		qt.settle(g, err)
		if moved {
			return s.handOff(outgoingReply{m: m, out: movedReply()})
		}
		if err == nil && s.cancelled.has(req.ID, req.Attempt) {
			// Its cancel overtook it (cancelled.go): the entry will never
			// use this grant. Rolled back and counted cancelled; no reply.
			s.m.cancelledGrants.Inc()
			s.log.Info("grant withdrawn: its cancel arrived before the admit request",
				zap.String("request_id", req.ID), zap.Int("attempt", req.Attempt), zap.String("worker", g.Worker))
			return false
		}
		out := &wire.AdmitReply{Owner: s.replica, Epoch: epoch}
		if err != nil {
			fillRejection(out, err)
		} else {
			out.OK = true
			out.Worker, out.WorkerURL = g.Worker, g.WorkerURL
			out.Booking = uint64(g.Booking)
			out.CachedTokens, out.OverlapBlocks, out.BlockSize = g.CachedTokens, g.OverlapBlocks, g.BlockSize
			out.TierCredit = g.TierCreditTokens
			out.QueueWaitNano = int64(g.QueueWait)
			out.Reachable, out.Shortfall = g.ReachableTokens, g.Shortfall.String()
			out.PredictedTTFTNano = int64(g.PredictedTTFT)
			for _, c := range g.CandidateList() {
				out.Candidates = append(out.Candidates, wire.Candidate{Worker: c.Worker, CachedTokens: c.CachedTokens, PredictedTTFTNano: int64(c.PredictedTTFT)})
			}
			out.Decode, out.Decision = decodeToWire(g)
			// Kept for a status probe until the entry acknowledges it
			// (status.go), on this turn: a probe's turn comes after it.
			out.Owner, out.Instance = s.replica, s.instance
			s.sent.save(statusKey{req.ID, req.Attempt}, g.Booking, out, s.clock.Now())
		}
		return s.handOff(outgoingReply{m: m, out: out, booking: g.Booking})
	})
	// The actor has it: the next turn, a status probe's, sees it.
	s.inbound.remove(statusKey{req.ID, req.Attempt})
}

// handOff runs on the actor's turn (where nothing may block or wait): it
// queues the reply for Run's replier and reports the grant delivered. If
// the reply then cannot be published, the replier frees the booking (the
// request stays counted admitted; its booking ends at once). Without a
// running replier, or with its queue full, it publishes right here.
func (s *Server) handOff(r outgoingReply) bool {
	s.rmu.Lock()
	if s.replying {
		select {
		case s.replies <- r:
			s.rmu.Unlock()
			return true
		default:
		}
	}
	s.rmu.Unlock()
	return s.reply(r.m, r.out)
}

// publish sends one handed-off reply; a grant that cannot be delivered is
// freed at once instead of waiting for its ack timeout.
func (s *Server) publish(r outgoingReply) {
	if !s.reply(r.m, r.out) && r.out.OK {
		s.sent.forgetBookings([]scheduler.BookingID{r.booking})
		s.actor.Finish(r.booking)
	}
}

func (s *Server) reply(m *nats.Msg, out *wire.AdmitReply) bool {
	out.Owner, out.Instance = s.replica, s.instance
	b, err := wire.EncodeAdmission(out)
	if err != nil {
		s.log.Error("encode admit reply", zap.Error(err))
		return false
	}
	if err := s.respond(m, b); err != nil {
		s.log.Warn("admit reply not delivered", zap.Error(err))
		return false
	}
	return true
}

func (s *Server) onCancel(m *nats.Msg) {
	in, err := wire.DecodeCancelRequest(m.Data)
	if err != nil {
		s.m.decodeErrors.WithLabelValues("cancel").Inc()
		s.log.Warn("bad cancel", zap.Error(err))
		return
	}
	if in.Owner != s.replica {
		return // meant for the class's previous owner
	}
	// Remembered before the actor's turn: a grant of this attempt made
	// before the mark is freed by CancelAttempt (an unacknowledged
	// grant), one made after it sees the mark (enqueueLeased).
	s.cancelled.add(in.ID, in.Attempt, s.clock.Now())
	s.actor.CancelAttempt(in.ID, in.Attempt)
}

func (s *Server) onLife(m *nats.Msg) {
	in, err := wire.DecodeLifeMark(m.Data)
	if err != nil {
		s.m.decodeErrors.WithLabelValues("life").Inc()
		s.log.Warn("bad life mark", zap.Error(err))
		return
	}
	if in.Instance != 0 && in.Instance != s.instance {
		// Meant for this replica's previous life: its booking ids name
		// nothing here, or something unrelated.
		s.m.staleLifeMarks.Inc()
		return
	}
	ids := make([]scheduler.BookingID, len(in.Bookings))
	for i, b := range in.Bookings {
		ids[i] = scheduler.BookingID(b)
	}
	// The entry has these grants: no status probe will ask for them.
	s.sent.forgetBookings(ids)
	switch in.Kind {
	case wire.LifeDispatched:
		for _, id := range ids {
			s.actor.Ack(id)
		}
	case wire.LifeFirstToken:
		for _, id := range ids {
			s.actor.FirstToken(id)
		}
	case wire.LifeDone, wire.LifeAborted:
		used := usageOf(in)
		uf, _ := s.actor.(UsageFinisher)
		for _, id := range ids {
			if n, ok := used[id]; ok && uf != nil {
				uf.FinishUsage(id, n)
				continue
			}
			s.actor.Finish(id)
		}
	case wire.LifeRenew:
		s.actor.Renew(ids)
	}
}

func (s *Server) onAdopt(class string, m *nats.Msg) {
	in, err := wire.DecodeAdoptRequest(m.Data)
	out := &wire.AdoptReply{Owner: s.replica, Instance: s.instance}
	if err != nil {
		s.m.decodeErrors.WithLabelValues("adopt").Inc()
		out.Error = err.Error()
	} else if epoch, ok := s.Owns(class); !ok {
		out.Error = "not the owner of class " + class
	} else {
		out.Epoch = epoch
		out.Bookings = make([]uint64, len(in.Bookings))
		for i, b := range in.Bookings {
			id, err := s.actor.Adopt(s.runCtx, recordFromWire(class, &b))
			if err != nil {
				out.Error, out.Bookings = err.Error(), nil
				break
			}
			out.Bookings[i] = uint64(id)
		}
		if out.Error == "" {
			s.m.adopted.Add(float64(len(in.Bookings)))
			if in.Done { // the entry's re-home round is complete
				s.noteRehomed(class, in.Epoch, in.Entry)
			}
		}
	}
	b, _ := wire.EncodeAdmission(out)
	_ = m.Respond(b)
}

// movedReply answers a request this replica did not take into its queue
// because it does not own the class (any more): uncounted, so the entry's
// resubmission is still a first attempt.
func movedReply() *wire.AdmitReply {
	return &wire.AdmitReply{Reason: scheduler.ReasonOwnershipLost.String(), Detail: "class moved", Uncounted: true}
}

// fillRejection copies a scheduler error into a reply.
func fillRejection(out *wire.AdmitReply, err error) {
	var rej *scheduler.RejectError
	if errors.As(err, &rej) {
		out.Reason, out.Limit, out.Detail = rej.Reason.String(), rej.Limit, rej.Detail
		out.RetryAfterMs = rej.RetryAfter.Milliseconds()
		return
	}
	// Not a rejection (the actor stopped): the entry treats it like a moved class.
	out.Reason, out.Detail = scheduler.ReasonOwnershipLost.String(), err.Error()
}

// UsageFinisher is the optional part of an Actor that takes a done mark's
// reported token usage (tenants' tokens-per-minute quota); an Actor
// without it has the booking freed with Finish.
type UsageFinisher interface {
	FinishUsage(id scheduler.BookingID, used int)
}

// usageOf indexes a done mark's reported usage by booking.
func usageOf(in *wire.LifeMark) map[scheduler.BookingID]int {
	if len(in.Used) == 0 {
		return nil
	}
	m := make(map[scheduler.BookingID]int, len(in.Used))
	for _, u := range in.Used {
		m[scheduler.BookingID(u.Booking)] = u.Tokens
	}
	return m
}
