package scheduler

import (
	"fmt"
	"time"
)

// Cancel withdraws a queued request: it is counted cancelled and its
// responder gets ErrCancelled. It reports whether the request was queued.
func (c *Core) Cancel(requestID string) bool {
	e := c.entries[requestID]
	if e == nil {
		return false
	}
	c.unqueue(e)
	cls, r, respond := e.cold.cls, e.req, e.cold.respond
	c.release(e)
	if !r.Probe {
		cls.counters.Cancelled++
	}
	respond(Grant{}, fmt.Errorf("request %s: %w", requestID, ErrCancelled))
	// The withdrawn entry may have been a blocked head.
	c.drain()
	return true
}

// CancelAttempt is Cancel for one attempt of the request: a cancel sent for
// an earlier attempt (delivered late, after the request was resubmitted to
// this same Core) must not withdraw the resubmission. An entry cancels an
// attempt only once it will never use that attempt's grant (its reply was
// lost, came too late, or was fenced), so if the attempt was granted and is
// not yet acknowledged, its booking is freed at once: counters unchanged,
// as for Rollback. An acknowledged booking is never freed by a cancel (its
// request runs). It reports whether the attempt was queued.
func (c *Core) CancelAttempt(requestID string, attempt int) bool {
	if e := c.entries[requestID]; e != nil && e.req.Attempt == attempt {
		return c.Cancel(requestID)
	}
	if b := c.unacked[grantKey{requestID, attempt}]; b != nil {
		c.free(b)
		c.drain()
	}
	return false
}

// Tick rejects queued requests whose due time has passed, frees grants not
// acknowledged within AckTimeout and bookings not renewed within
// BookingExpiry, then drains.
func (c *Core) Tick() {
	now := c.clock.Now().UnixNano()
	for len(c.due) > 0 && c.due[0].due <= now {
		e := c.due[0]
		c.unqueue(e)
		c.rejectEntry(e, ReasonDueTimePassed, "due time passed while queued")
	}
	for len(c.expiry) > 0 && c.expiry[0].deadline <= now {
		c.free(c.expiry[0])
	}
	c.drain()
}

// NextWake returns when Tick next has work: the earliest due time or booking
// deadline.
func (c *Core) NextWake() (time.Time, bool) {
	var at int64
	ok := false
	if len(c.due) > 0 {
		at, ok = c.due[0].due, true
	}
	if len(c.expiry) > 0 && (!ok || c.expiry[0].deadline < at) {
		at, ok = c.expiry[0].deadline, true
	}
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, at), true
}
