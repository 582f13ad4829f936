package admission

import "time"

// OwnersChanged installs the cluster's current view of class owners. It
// abandons admit requests waiting on an owner that is no longer the owner
// (they are resubmitted) and wakes the re-home loop.
func (c *Client) OwnersChanged(owners map[string]Owner) {
	c.mu.Lock()
	c.owners = make(map[string]Owner, len(owners))
	for class, o := range owners {
		c.owners[class] = o
		if o.Epoch > c.epochs[class] {
			c.epochs[class] = o.Epoch
		}
	}
	graced := false
	now := c.clock.Now()
	for p := range c.pending {
		if cur, ok := c.owners[p.class]; (!ok || cur != p.owner) && !p.abandoning {
			p.abandoning, p.abandonAt = true, now.Add(c.cfg.AbandonGrace)
			graced = true
		}
	}
	moved := c.forgetMovedLocked()
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	c.returnFallbacks(moved)
	if graced {
		select { // Run's timer abandons them when the grace has passed
		case c.abandon <- struct{}{}:
		default:
		}
	}
	c.wake()
}

// connectionLostLocked gives up on every remote admit sent on a connection
// that has dropped since (down now, or reconnected: gen moved on). NATS
// restores the reply subscription on reconnect but not the replies published
// meanwhile, so without this such a request waits the whole
// OwnerReplyTimeout (the nemesis saw 61 s). Its owner counted the attempt
// and may still queue it or have granted it: admitRemote cancels it there
// (the cancel is buffered until the connection is back) and resubmits it as
// a retry, which supersedes the attempt if the cancel is late (Core.Enqueue);
// if the owner had granted it, the cancel frees that unacknowledged grant
// (Core.CancelAttempt), as for any grant the entry knows it lost. The request is admitted
// once where it runs; nothing already granted to the entry is touched (its
// ticket holds the booking and its life marks resume on reconnect). c.mu
// is held.
func (c *Client) connectionLostLocked(down bool, gen uint64) {
	for p := range c.pending {
		if p.connLost || p.abandoned || (!down && gen == p.conn) {
			continue
		}
		p.connLost = true
		p.cancel()
	}
}

// abandonDue gives up on the admit requests whose abandon grace has passed
// and returns when the next grace ends (zero: none pending).
func (c *Client) abandonDue() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	var next time.Time
	for p := range c.pending {
		switch {
		case !p.abandoning || p.abandoned:
		case !now.Before(p.abandonAt):
			p.abandoned = true
			p.cancel()
		case next.IsZero() || p.abandonAt.Before(next):
			next = p.abandonAt
		}
	}
	return next
}

func (c *Client) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}
