package admission

import (
	"context"
	"time"
)

// Leave tells the client that its replica is going away for good (its
// ownership watch is about to stop): from now on a request that has no
// owner to go to is answered at once with ownership_moved (HTTP 503 with
// Retry-After) instead of waiting for one, since this replica may never
// learn of the next owner. Requests already on their way to an owner, or
// queued at one, are not affected. Leave is idempotent.
func (c *Client) Leave() {
	c.leaveOnce.Do(func() { close(c.leaving) })
}

// Run renews in-flight bookings, re-homes them when their class moves, and
// tracks degraded mode, until ctx ends.
//
// The renewal and connection-status tickers run on wall time, not on the
// client's clock: they pace messages to owners and poll the NATS
// connection, and a test that holds its fake clock still must not stop
// either.
func (c *Client) Run(ctx context.Context) error {
	renew := time.NewTicker(c.cfg.RenewInterval)
	defer renew.Stop()
	status := time.NewTicker(100 * time.Millisecond)
	defer status.Stop()
	// Abandon graces run on the client's clock, armed for the earliest one.
	grace := c.clock.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	rearm := func() {
		if next := c.abandonDue(); next.IsZero() {
			grace.Stop()
		} else {
			grace.Reset(max(0, next.Sub(c.clock.Now())))
		}
	}
	var unreachable map[string]string // as last exported
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.abandon:
			rearm()
		case <-grace.C():
			rearm()
		case <-renew.C:
			c.renew()
		case <-c.kick:
			c.rehome(ctx)
		case <-status.C:
			c.checkConnection()
			unreachable = c.exportUnreachable(unreachable)
			// A re-home deferred because the new owner did not answer yet
			// (it is announced before it subscribes) is retried here rather
			// than at the next ownership change.
			c.mu.Lock()
			retry := c.rehomeRetry
			c.rehomeRetry = false
			c.mu.Unlock()
			if retry {
				c.rehome(ctx)
			}
		}
	}
}
