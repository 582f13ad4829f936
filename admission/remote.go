package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// admitRemote sends one admit request to owner. retry is true when the
// caller should try again (owner gone, changed or fenced); err is then nil,
// or errNoResponders when the owner has no subscription for the class.
func (c *Client) admitRemote(ctx context.Context, r *scheduler.Request, owner Owner) (t *Ticket, retry bool, err error) {
	data, err := wire.EncodeAdmission(RequestToWire(r, c.replica))
	if err != nil {
		return nil, false, fmt.Errorf("encode admit request: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	// waitUntil is when this attempt's own wait ends (see below): a status
	// probe that would come later is not armed.
	waitUntil := c.clock.Now().Add(c.cfg.OwnerReplyTimeout)
	if !r.Due.IsZero() {
		waitUntil = r.Due.Add(time.Second)
	}
	if !r.Due.IsZero() {
		// The owner rejects at the due time itself; the grace lets its
		// typed rejection arrive before the entry gives up on its own.
		var cancelDue context.CancelFunc
		rctx, cancelDue = c.withDeadline(rctx, r.Due.Add(time.Second))
		defer cancelDue()
	} else {
		// No deadline: still bounded, or a lost reply would hold the
		// request until its client gives up.
		var cancelTimeout context.CancelFunc
		rctx, cancelTimeout = c.withDeadline(rctx, c.clock.Now().Add(c.cfg.OwnerReplyTimeout))
		defer cancelTimeout()
	}
	p := &pendingAdmit{class: r.Class, owner: owner, cancel: cancel, conn: c.nc.Stats().Reconnects}
	c.mu.Lock()
	c.pending[p] = struct{}{}
	epochAtSend := c.epochs[r.Class]
	c.mu.Unlock()
	start := c.clock.Now()
	msg, st, err := c.awaitAdmit(ctx, rctx, cancel, data, r, owner, waitUntil)
	cancel()
	c.mu.Lock()
	delete(c.pending, p)
	abandoned, connLost := p.abandoned, p.connLost
	c.mu.Unlock()

	var reply *wire.AdmitReply
	switch st.result {
	case probeGranted:
		// The owner's status answer carries the grant its lost reply
		// had; the original reply, if it arrives now, names the same
		// booking and is dropped with the request's inbox.
		reply, err = st.grant, nil
	case probeUnknown:
		// The owner does not hold the attempt: it never saw it (lost on
		// the way, or on a subscription nobody reads) or it is finished
		// and its reply was lost. Withdraw it there (a grant made after
		// the answer is withdrawn, cancelled.go) and resubmit at once.
		c.m.retries.WithLabelValues("status_unknown").Inc()
		c.cancelAt(r, owner.Replica)
		r.Attempt++
		return nil, true, errResubmitNow
	case probeNoResponders:
		// The owner has no status subscription: cut from NATS, or gone.
		// As for an admit answered "no responders" (unreachable.go),
		// except that the owner may have counted this attempt.
		c.m.retries.WithLabelValues("status_unreachable").Inc()
		c.cancelAt(r, owner.Replica)
		c.noteNoResponders(r.Class, owner)
		r.Attempt++
		return nil, true, errNoResponders
	}

	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			c.m.remoteSeconds.WithLabelValues("no_responders").Observe(c.clock.Now().Sub(start).Seconds())
			// The registered owner does not admit the class right now
			// (cut from NATS, or between its claim and its subscription).
			c.noteNoResponders(r.Class, owner)
			return nil, true, errNoResponders
		case abandoned:
			c.m.retries.WithLabelValues("owner_changed").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++ // the old owner may have counted it as received
			return nil, true, nil
		case ctx.Err() != nil:
			c.cancelAt(r, owner.Replica)
			return nil, false, ctx.Err()
		case connLost:
			// The reply cannot arrive (connectionLostLocked): withdraw the
			// attempt at its owner, which counted it, and resubmit at once
			// (on this replica's own actor while NATS is down).
			c.m.retries.WithLabelValues("connection_lost").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++
			return nil, true, nil
		case !r.Due.IsZero() && !c.clock.Now().Before(r.Due):
			// The request reached the owner (a request with no owner
			// fails with no responders), so the owner counted it and
			// counts its outcome too: its own due_time_passed, the
			// cancellation below, or a grant whose booking then expires
			// unacknowledged. Counting a rejection here as well would
			// give the request two outcomes.
			c.cancelAt(r, owner.Replica)
			c.m.entryRejected.WithLabelValues(scheduler.ReasonDueTimePassed.String()).Inc()
			return nil, false, scheduler.Reject(scheduler.ReasonDueTimePassed, "", "owner did not answer before the deadline")
		case r.Due.IsZero() && !c.clock.Now().Before(start.Add(c.cfg.OwnerReplyTimeout)):
			// The owner counted the attempt (it was delivered); the
			// resubmission is a retry, and supersedes the attempt if
			// it is still queued there (Core.Enqueue).
			c.m.retries.WithLabelValues("reply_timeout").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++
			return nil, true, nil
		default: // connection trouble: the loop re-evaluates (maybe degraded)
			c.m.retries.WithLabelValues("nats_error").Inc()
			c.log.Debug("admit request failed", zap.String("class", r.Class), zap.Error(err))
			r.Attempt++
			return nil, true, nil
		}
	}
	c.ownerAnswered(r.Class)
	if reply == nil {
		reply, err = wire.DecodeAdmitReply(msg.Data)
		if err != nil {
			c.m.decodeErrors.WithLabelValues("admit_reply").Inc()
			c.m.retries.WithLabelValues("nats_error").Inc()
			r.Attempt++
			return nil, true, nil
		}
	}
	g, rerr := grantFromReply(reply, r.ID)
	if rerr != nil {
		c.m.remoteSeconds.WithLabelValues("rejected").Observe(c.clock.Now().Sub(start).Seconds())
		if scheduler.ReasonOf(rerr) == scheduler.ReasonOwnershipLost {
			c.m.retries.WithLabelValues("ownership_moved").Inc()
			if !reply.Uncounted {
				r.Attempt++ // the old owner counted it as received
			}
			return nil, true, nil
		}
		return nil, false, rerr
	}
	c.m.remoteSeconds.WithLabelValues("granted").Observe(c.clock.Now().Sub(start).Seconds())
	c.mu.Lock()
	if reply.Epoch > c.epochs[r.Class] {
		c.epochs[r.Class] = reply.Epoch
	}
	c.mu.Unlock()
	// Fencing: a grant is stale when its epoch is older than the newest one
	// this replica knew when it sent the request: the request was addressed
	// after a newer owner existed, and a deposed owner answered it. A grant
	// from the owner that was current at sending time stays valid even if a
	// newer epoch became known while it travelled: that owner admitted it
	// while it owned the class, and the entry accepts exactly one grant per
	// attempt either way; its booking is re-homed to the new owner.
	if reply.Epoch < epochAtSend {
		// This grant is never used: the cancel frees its booking at the
		// deposed owner (an unacknowledged grant of the cancelled attempt,
		// Core.CancelAttempt), and the request goes to the current one.
		c.cancelAt(r, reply.Owner)
		c.m.staleGrants.Inc()
		c.m.retries.WithLabelValues("stale_grant").Inc()
		r.Attempt++
		return nil, true, nil
	}
	return c.track(r, g, Owner{Replica: reply.Owner, Epoch: reply.Epoch}, reply.Instance, false), false, nil
}

// withDeadline is context.WithDeadline on the client's clock.
func (c *Client) withDeadline(parent context.Context, at time.Time) (context.Context, context.CancelFunc) {
	if _, wall := c.clock.(clock.Real); wall {
		return context.WithDeadline(parent, at)
	}
	ctx, cancel := context.WithCancel(parent)
	t := c.clock.NewTimer(max(0, at.Sub(c.clock.Now())))
	go func() {
		defer t.Stop()
		select {
		case <-t.C():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// cancelAt tells owner, the replica r was sent to, to drop r from its
// queue. Other replicas that own the class by now ignore it.
func (c *Client) cancelAt(r *scheduler.Request, owner string) {
	b, err := wire.EncodeAdmission(&wire.CancelRequest{ID: r.ID, Attempt: r.Attempt, Entry: c.replica, Owner: owner})
	if err == nil {
		_ = c.nc.Publish(c.subj.Cancel(r.Class), b)
	}
}

// errResubmitNow is admitRemote's answer when the attempt is to be sent
// again at once, without a backoff: the owner answered, it just does not
// hold the attempt. Every such round costs a StatusAfter, so it cannot spin.
var errResubmitNow = errors.New("admission: resubmit at once")

// probeResult is what a status probe learned (status.go).
type probeResult int

const (
	probeNone         probeResult = iota // no probe decided the attempt: the admit's own answer did
	probeQueued                          // the owner holds it: keep waiting
	probeGranted                         // its grant, again: use it
	probeUnknown                         // the owner does not hold it: cancel and resubmit
	probeNoResponders                    // the owner has no status subscription
	probeTimeout                         // no answer: keep waiting, probe again
	probeError                           // connection trouble or a bad answer: keep waiting
)

var probeLabels = [...]string{probeNone: "none", probeQueued: "queued", probeGranted: "granted", probeUnknown: "unknown",
	probeNoResponders: "no_responders", probeTimeout: "timeout", probeError: "error"}

type probeOutcome struct {
	result probeResult
	grant  *wire.AdmitReply // probeGranted
}

// statusTimeout bounds one status probe's round trip.
func (c *Client) statusTimeout() time.Duration { return min(c.cfg.StatusAfter, 2*time.Second) }

// awaitAdmit sends the admit request on rctx and waits for its answer
// (until is when rctx ends on the client's clock). An attempt with no
// answer after StatusAfter, and every StatusAfter after
// that, is probed at owner (status.go); a probe that decides the attempt
// (granted, unknown, no responders) ends the wait: the request is
// cancelled (its inbox dropped) and the probe's outcome returned. Otherwise
// the admit's own reply or error is returned, as RequestWithContext gave it.
func (c *Client) awaitAdmit(ctx, rctx context.Context, cancel context.CancelFunc, data []byte, r *scheduler.Request, owner Owner, until time.Time) (*nats.Msg, probeOutcome, error) {
	type answer struct {
		msg *nats.Msg
		err error
	}
	done := make(chan answer, 1)
	go func() { // waited for on every path below
		msg, err := c.nc.RequestWithContext(rctx, c.subj.Admit(r.Class), data)
		done <- answer{msg, err}
	}()
	if !c.clock.Now().Add(c.cfg.StatusAfter).Before(until) {
		a := <-done // the attempt's own bound comes first: no probe
		return a.msg, probeOutcome{}, a.err
	}
	probe := c.clock.NewTimer(c.cfg.StatusAfter)
	defer probe.Stop()
	for {
		select {
		case a := <-done:
			return a.msg, probeOutcome{}, a.err
		case <-probe.C():
		}
		st := c.probeStatus(ctx, r, owner)
		c.m.statusProbes.WithLabelValues(probeLabels[st.result]).Inc()
		switch st.result {
		case probeGranted, probeUnknown, probeNoResponders:
			cancel()
			<-done // its reply, if it came meanwhile, is this attempt's: superseded
			return nil, st, nil
		}
		probe.Reset(c.cfg.StatusAfter)
	}
}

// probeStatus asks owner what became of r's current attempt.
func (c *Client) probeStatus(ctx context.Context, r *scheduler.Request, owner Owner) probeOutcome {
	b, err := wire.EncodeStatus(&wire.StatusRequest{Class: r.Class, ID: r.ID, Attempt: r.Attempt, Entry: c.replica, Owner: owner.Replica})
	if err != nil {
		return probeOutcome{result: probeError}
	}
	// A network round trip's bound: wall time, like the NATS request's
	// own timeout (the client's clock may be a test's, held still).
	pctx, cancel := context.WithTimeout(ctx, c.statusTimeout())
	defer cancel()
	msg, err := c.nc.RequestWithContext(pctx, c.subj.Status(owner.Replica), b)
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		return probeOutcome{result: probeNoResponders}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
		return probeOutcome{result: probeTimeout}
	case err != nil:
		return probeOutcome{result: probeError}
	}
	rep, err := wire.DecodeStatusReply(msg.Data)
	if err != nil {
		c.m.decodeErrors.WithLabelValues("status_reply").Inc()
		return probeOutcome{result: probeError}
	}
	if rep.Owner != owner.Replica {
		return probeOutcome{result: probeError}
	}
	switch rep.Status {
	case wire.StatusQueued:
		return probeOutcome{result: probeQueued}
	case wire.StatusGranted:
		return probeOutcome{result: probeGranted, grant: rep.Grant}
	default:
		return probeOutcome{result: probeUnknown}
	}
}
