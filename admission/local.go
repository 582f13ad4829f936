package admission

import (
	"context"
	"sync"

	"github.com/switchyard/switchyard/scheduler"
)

type localResult struct {
	g   scheduler.Grant
	err error
}

// admitLocal enqueues on this replica's actor and waits for its answer. A
// grant that races with ctx ending is rolled back. With owner set, the
// actor checks on its turn that this replica still owns the class
// (Actor.EnqueueIf): notOwned reports that it did not, and epoch is the
// epoch it was admitted under. As the owner it first waits out the class's
// adoption hold when r is held by it (Server.adoptionHold).
func (c *Client) admitLocal(ctx context.Context, r *scheduler.Request, owner bool) (g scheduler.Grant, epoch int64, notOwned bool, err error) {
	ch := make(chan localResult, 1)
	var mu sync.Mutex
	gone := false
	respond := func(g scheduler.Grant, err error) bool {
		mu.Lock()
		defer mu.Unlock()
		if gone {
			return false
		}
		ch <- localResult{g, err}
		return true
	}
	var gatedEpoch int64
	gatedOut := false
	if d, done := c.server.adoptionHold(r); owner && d > 0 {
		c.m.heldForAdoption.Inc()
		t := c.clock.NewTimer(d)
		select {
		case <-t.C():
		case <-done: // adoption complete
			t.Stop()
		case <-ctx.Done():
			t.Stop()
			return scheduler.Grant{}, 0, false, ctx.Err()
		}
	}
	var qt *quotaTicket
	if owner {
		// The tenant's cluster-wide quota (quota.go), before the actor.
		var err error
		if qt, err = c.server.quota.acquire(ctx, r); err != nil {
			if ctx.Err() != nil {
				return scheduler.Grant{}, 0, false, ctx.Err()
			}
			return scheduler.Grant{}, 0, false, err
		}
		respond = leasedResponder(qt, respond)
		c.actor.EnqueueIf(r, func() bool {
			e, ok := c.server.Owns(r.Class)
			mu.Lock()
			gatedEpoch, gatedOut = e, !ok
			mu.Unlock()
			return ok
		}, respond)
	} else {
		c.actor.Enqueue(r, respond)
	}
	select {
	case res := <-ch:
		mu.Lock()
		epoch, notOwned = gatedEpoch, gatedOut
		mu.Unlock()
		return res.g, epoch, notOwned, res.err
	case <-ctx.Done():
		mu.Lock()
		gone = true
		mu.Unlock()
		c.actor.CancelAttempt(r.ID, r.Attempt)
		select {
		case res := <-ch:
			if res.err == nil {
				c.actor.Finish(res.g.Booking)
			}
		default:
		}
		return scheduler.Grant{}, 0, false, ctx.Err()
	}
}

// leasedResponder settles qt with the actor's answer before respond.
func leasedResponder(qt *quotaTicket, respond scheduler.Responder) scheduler.Responder {
	if qt == nil {
		return respond
	}
	return func(g scheduler.Grant, err error) bool {
		qt.settle(g, err)
		return respond(g, err)
	}
}
