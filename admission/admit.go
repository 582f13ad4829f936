package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// Admit admits r through its class's owner and returns a ticket for the
// granted booking, or the owner's typed rejection. It returns ctx.Err() when
// ctx ends first; a queued request is then cancelled at its owner.
//
// Every wait of an admission is bounded (docs/architecture.md, "Failures"):
// a request with a deadline by its deadline, one without by AdmitBound of
// its arrival here, however its waits chain (for an owner, for an owner's
// reply, for an adoption hold, for a quota lease, in a queue). Past the
// bound it gets ownership_lost (HTTP 503, retry), counted like any entry
// rejection, and its attempt is cancelled where it waits.
func (c *Client) Admit(ctx context.Context, r *scheduler.Request) (*Ticket, error) {
	if !r.Due.IsZero() {
		return c.admit(ctx, r)
	}
	bound := c.cfg.AdmitBound()
	bctx, cancel := c.withDeadline(ctx, c.clock.Now().Add(bound))
	defer cancel()
	t, err := c.admit(bctx, r)
	if err != nil && ctx.Err() == nil && bctx.Err() != nil &&
		(errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
		c.entryReject(r.Class, scheduler.ReasonOwnershipLost)
		c.log.Warn("request not admitted within the admission bound", zap.String("class", r.Class),
			zap.String("request_id", r.ID), zap.Int("attempt", r.Attempt), zap.Duration("bound", bound))
		return nil, scheduler.Reject(scheduler.ReasonOwnershipLost, "",
			fmt.Sprintf("class %s: not admitted within %v (no owner answered, or its answer was lost); retry", r.Class, bound))
	}
	return t, err
}

// admit is Admit without its bound: ctx carries it.
func (c *Client) admit(ctx context.Context, r *scheduler.Request) (*Ticket, error) {
	if r.Attempt == 0 && !r.Probe { // the frontend's own retries (worker failed) come with Attempt > 0
		c.mu.Lock()
		c.countLocked(r.Class).Received++
		c.mu.Unlock()
	}
	backoff := c.cfg.BackoffMin
	waitSince := time.Time{}
	// unreachableAt is when the owner this request last got "no responders"
	// from counts as unreachable (zero: none did): from then on the
	// request is admitted here instead (ClientConfig.OwnerUnreachableAfter).
	var unreachableAt time.Time
	var unreachableOwner Owner
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !r.Due.IsZero() && !c.clock.Now().Before(r.Due) && waitSince != (time.Time{}) {
			c.entryReject(r.Class, scheduler.ReasonDueTimePassed)
			return nil, scheduler.Reject(scheduler.ReasonDueTimePassed, "", "no owner admitted the request before its deadline")
		}
		c.mu.Lock()
		owner, ok := c.owners[r.Class]
		degraded := c.degraded || !c.nc.IsConnected()
		changed := c.changed
		c.mu.Unlock()
		// etcd unavailable: no owner can be trusted to admit, so a request
		// that has waited long enough for one is admitted here.
		if !degraded && !waitSince.IsZero() && c.clock.Now().Sub(waitSince) >= c.cfg.EtcdDegradedAfter && !c.clusterHealthy() {
			degraded = true
		}

		// The owner this request found unreachable is still the owner, and
		// has been unreachable long enough: admit here (degraded).
		fallback := !unreachableAt.IsZero() && ok && owner == unreachableOwner && !c.clock.Now().Before(unreachableAt)

		epoch, ownLocal := c.server.Owns(r.Class)
		if ownLocal {
			fallback = false
		}
		switch {
		case ownLocal || degraded || fallback:
			// This replica's own actor admits: it owns the class, or NATS
			// is down and every class is admitted locally (degraded mode).
			// As an owner it checks ownership again on the actor's turn
			// (see Server.onAdmit), and takes the epoch from there.
			gated := !degraded && !fallback
			// A degraded admission enforces the degraded quota policy:
			// split quotas and limits, whole, or closed (degraded.go).
			lr, policy := r, QuotasWhole
			if !ownLocal {
				var err error
				if lr, policy, err = c.degradedRequest(r); err != nil {
					c.countDegraded(policy, err)
					c.entryReject(r.Class, scheduler.ReasonOf(err))
					return nil, err
				}
			}
			g, gatedEpoch, notOwned, err := c.admitLocal(ctx, lr, gated)
			if !ownLocal && !notOwned {
				c.countDegraded(policy, err)
			}
			if gated {
				epoch = gatedEpoch
			}
			if notOwned { // the class moved before the actor saw r: not counted there
				c.m.retries.WithLabelValues("ownership_moved").Inc()
				continue
			}
			if err == nil {
				if !ownLocal {
					c.m.degradedAdmits.Inc()
					if c.m.DegradedByClass != nil {
						c.m.DegradedByClass.WithLabelValues(r.Class).Inc()
					}
					if fallback && !degraded {
						c.fellBack(r.Class)
					}
				}
				return c.track(r, g, Owner{Replica: c.replica, Epoch: epoch}, c.server.Instance(), true), nil
			}
			if scheduler.ReasonOf(err) == scheduler.ReasonOwnershipLost {
				// The class moved, degraded mode ended, or the local actor
				// has stopped (it answers at once, every time): wait for an
				// ownership change or a backoff before the next attempt.
				r.Attempt++
				c.m.retries.WithLabelValues("ownership_moved").Inc()
				unreachableAt = time.Time{} // a fallback ended: ask the owner again
				if waitSince.IsZero() {
					waitSince = c.clock.Now()
				}
				if err := c.waitForOwner(ctx, r, waitSince, changed, &backoff); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		case !ok || owner.Replica == "" || owner.Replica == c.replica:
			// No owner yet, or this replica is named owner but has not
			// started admitting: wait for the next change or a backoff.
			if waitSince.IsZero() {
				waitSince = c.clock.Now()
			}
			if err := c.waitForOwner(ctx, r, waitSince, changed, &backoff); err != nil {
				return nil, err
			}
			c.m.retries.WithLabelValues("no_owner").Inc()
			continue
		}

		t, retry, err := c.admitRemote(ctx, r, owner)
		unreachableAt = time.Time{}
		if errors.Is(err, errNoResponders) {
			unreachableAt, unreachableOwner, err = c.unreachableUntil(r.Class, owner), owner, nil
		}
		resubmit := errors.Is(err, errResubmitNow)
		if resubmit {
			err = nil
		}
		if err != nil || !retry {
			return t, err
		}
		if waitSince.IsZero() {
			waitSince = c.clock.Now()
		}
		if resubmit {
			continue // the status probe found the attempt lost at a live owner
		}
		if !unreachableAt.IsZero() && !c.clock.Now().Before(unreachableAt) {
			continue // the owner is unreachable: admit here at once
		}
		if err := c.waitForOwnerUntil(ctx, r, waitSince, unreachableAt, changed, &backoff); err != nil {
			return nil, err
		}
	}
}

// waitForOwner sleeps until the ownership view changes or a backoff passes,
// bounded by the request's deadline and NoOwnerTimeout.
func (c *Client) waitForOwner(ctx context.Context, r *scheduler.Request, since time.Time, changed <-chan struct{}, backoff *time.Duration) error {
	return c.waitForOwnerUntil(ctx, r, since, time.Time{}, changed, backoff)
}

// waitForOwnerUntil is waitForOwner that also wakes at wakeAt (if not zero):
// when the owner that answered "no responders" counts as unreachable.
func (c *Client) waitForOwnerUntil(ctx context.Context, r *scheduler.Request, since, wakeAt time.Time, changed <-chan struct{}, backoff *time.Duration) error {
	limit := since.Add(c.cfg.NoOwnerTimeout)
	if !r.Due.IsZero() && r.Due.Before(limit) {
		limit = r.Due
	}
	now := c.clock.Now()
	if !now.Before(limit) {
		if !r.Due.IsZero() && !limit.Before(r.Due) {
			c.entryReject(r.Class, scheduler.ReasonDueTimePassed)
			return scheduler.Reject(scheduler.ReasonDueTimePassed, "", "no owner admitted the request before its deadline")
		}
		c.entryReject(r.Class, scheduler.ReasonOwnershipLost)
		return scheduler.Reject(scheduler.ReasonOwnershipLost, "", fmt.Sprintf("class %s had no owner for %v", r.Class, c.cfg.NoOwnerTimeout))
	}
	select {
	case <-c.leaving:
		c.entryReject(r.Class, scheduler.ReasonOwnershipLost)
		return scheduler.Reject(scheduler.ReasonOwnershipLost, "", "the router is shutting down and the class has no owner it can reach; retry")
	default:
	}
	d := min(*backoff, limit.Sub(now))
	if !c.clusterHealthy() {
		// Wake when the etcd fallback becomes due.
		if left := since.Add(c.cfg.EtcdDegradedAfter).Sub(now); left > 0 {
			d = min(d, left)
		} else {
			d = 0
		}
	}
	if !wakeAt.IsZero() {
		d = max(0, min(d, wakeAt.Sub(now)))
	}
	*backoff = min(2**backoff, c.cfg.BackoffMax)
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.leaving:
	case <-changed:
	case <-t.C():
	}
	return nil
}
