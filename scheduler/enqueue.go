package scheduler

import (
	"fmt"
	"math"
	"time"
)

// Enqueue validates r, queues it and drains whatever is dispatchable in the
// same turn, r included if it is at the head. respond is called exactly once,
// possibly before Enqueue returns (see Responder). The checks, in order:
// unknown class; counted received (or retried); malformed request or
// duplicate queued ID (invalid_constraint); zero registered workers
// (no_endpoints); pinned/allowed validation; already past due
// (due_time_passed); the zero-limit carve-out (admit now or reject, never
// queue); queue limits (queue_full naming the limit).
func (c *Core) Enqueue(r *Request, respond Responder) {
	if respond == nil {
		respond = func(Grant, error) bool { return false }
	}
	if r == nil {
		c.unknownClass++
		respond(Grant{}, &RejectError{Reason: ReasonUnknownClass, Detail: "nil request"})
		return
	}
	cls := c.classes[r.Class]
	if cls == nil || !cls.active {
		if !r.Probe {
			c.unknownClass++
		}
		respond(Grant{}, &RejectError{Reason: ReasonUnknownClass, Detail: fmt.Sprintf("class %q is not served here", r.Class)})
		return
	}
	if !r.Probe {
		if r.Attempt > 0 {
			cls.counters.Retried++
		} else {
			cls.counters.Received++
		}
	}
	now := c.clock.Now()
	if old := c.entries[r.ID]; old != nil && old.req.Attempt < r.Attempt {
		// A resubmission supersedes its earlier attempt, still queued here
		// because the entry gave up waiting for the answer (lost reply) or
		// its cancel has not arrived yet: withdraw the old one first.
		c.Cancel(r.ID)
	}
	if reason, detail := c.validate(r); reason != 0 {
		c.reject(cls, r, respond, reason, "", detail)
		return
	}
	if !r.Due.IsZero() && !now.Before(r.Due) {
		c.reject(cls, r, respond, ReasonDueTimePassed, "", "due time passed before admission")
		return
	}
	e := c.newEntry(r, respond, cls, now)
	if lim := cls.cfg.Limits.zero(); lim != "" {
		// Zero-limit carve-out: such a class can never hold a queued entry.
		idx, ok := c.selectPlacement(r, &cls.cfg)
		if !ok {
			c.release(e)
			c.reject(cls, r, respond, ReasonQueueFull, lim, "zero-limit class and no worker is free")
			return
		}
		if lim, retry := c.tenantCheck(r, now); lim != "" {
			c.release(e)
			c.rejectQuota(cls, r, respond, lim, retry)
			return
		}
		c.admit(e, idx, now)
		return
	}
	if lim := c.overLimit(cls, e); lim != "" {
		c.release(e)
		c.reject(cls, r, respond, ReasonQueueFull, lim, fmt.Sprintf("class %s queue limit %s reached", cls.cfg.Name, lim))
		return
	}
	if lim, retry := c.tenantCheck(r, now); lim != "" {
		c.release(e)
		c.rejectQuota(cls, r, respond, lim, retry)
		return
	}
	c.push(e)
	c.drain()
}

// validate checks the request's shape and its worker constraints against the
// registered workers. It returns 0 when the request may be queued.
func (c *Core) validate(r *Request) (Reason, string) {
	switch {
	case r.ID == "":
		return ReasonInvalidConstraint, "request ID is empty"
	case r.PromptTokens < 0 || r.ExpectedOutputTokens < 0 || r.OutputBound < 0 || r.Sequences < 0:
		return ReasonInvalidConstraint, "negative token count"
	case math.IsNaN(r.PriorityJump) || math.IsInf(r.PriorityJump, 0):
		return ReasonInvalidConstraint, "priority jump is not finite"
	case c.entries[r.ID] != nil:
		return ReasonInvalidConstraint, fmt.Sprintf("request %s is already queued", r.ID)
	case len(c.workers) == 0:
		return ReasonNoEndpoints, "no workers are registered"
	}
	if r.Pinned != "" {
		if _, ok := c.workerIdx[r.Pinned]; !ok {
			return ReasonInvalidConstraint, fmt.Sprintf("pinned worker %s is not registered", r.Pinned)
		}
		if len(r.Allowed) > 0 && !contains(r.Allowed, r.Pinned) {
			return ReasonInvalidConstraint, fmt.Sprintf("pinned worker %s is not in the allowed list", r.Pinned)
		}
		return 0, ""
	}
	if len(r.Allowed) > 0 && !c.anyAllowed(r) {
		return ReasonInvalidConstraint, "none of the allowed workers is registered"
	}
	return 0, ""
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func (c *Core) anyAllowed(r *Request) bool {
	if r.Pinned != "" {
		_, ok := c.workerIdx[r.Pinned]
		return ok
	}
	if len(r.Allowed) == 0 {
		return len(c.workers) > 0
	}
	for _, a := range r.Allowed {
		if _, ok := c.workerIdx[a]; ok {
			return true
		}
	}
	return false
}

// usableWorkers is how many registered workers r may run on: one when
// pinned, the distinct registered workers of its allow-list, else all.
func (c *Core) usableWorkers(r *Request) int {
	switch {
	case r.Pinned != "":
		if _, ok := c.workerIdx[r.Pinned]; ok {
			return 1
		}
		return 0
	case len(r.Allowed) == 0:
		return len(c.workers)
	}
	c.stamp++
	n := 0
	for _, a := range r.Allowed {
		if i, ok := c.workerIdx[a]; ok && c.allow[i] != c.stamp {
			c.allow[i] = c.stamp
			n++
		}
	}
	return n
}

func (c *Core) newEntry(r *Request, respond Responder, cls *class, now time.Time) *entry {
	var e *entry
	if n := len(c.freeEnt); n > 0 {
		e = c.freeEnt[n-1]
		c.freeEnt = c.freeEnt[:n-1]
	} else {
		e = &entry{cold: new(entryCold)}
	}
	c.seq++
	cached := c.bestCached(r)
	cost := int64(max(1, r.PromptTokens-cached))
	ingress := r.Ingress
	if ingress.IsZero() {
		ingress = now
	}
	*e = entry{
		req: r, cold: e.cold,
		seq: c.seq, strict: r.StrictPriority,
		score: policyScore(cls.cfg.Policy, r.PriorityJump, ingress.Sub(c.epoch).Seconds(), cost),
		cost:  cost, qi: -1, di: -1,
	}
	*e.cold = entryCold{respond: respond, cls: cls, cached: cached, enqueuedAt: now}
	if !r.Due.IsZero() {
		e.hasDue, e.due = true, r.Due.UnixNano()
	}
	return e
}

// bestCached is Request.BestCachedTokens over the registered workers.
func (c *Core) bestCached(r *Request) int { return bestCachedTokens(r, c) }

func (c *Core) blockSizeOf(worker string) (int, bool) {
	if i, ok := c.workerIdx[worker]; ok {
		return c.workers[i].BlockSize, true
	}
	return 0, false
}

// overLimit checks the class limits, scaled by the number of workers e may
// run on (a pinned or allow-listed request counts only its own workers), as
// if e were added. It returns the name of the first limit e would exceed.
func (c *Core) overLimit(cls *class, e *entry) string {
	n := int64(c.usableWorkers(e.req))
	l := cls.cfg.Limits.Split(e.req.LimitDivisor)
	if l.Requests != Unlimited && int64(cls.q.len()+1) > int64(l.Requests)*n {
		return LimitRequests
	}
	if l.ISLTokens != Unlimited && cls.pendingISL+int64(e.req.PromptTokens) > int64(l.ISLTokens)*n {
		return LimitISLTokens
	}
	if l.CachedTokens != Unlimited && cls.pendingCached+int64(e.cold.cached) > int64(l.CachedTokens)*n {
		return LimitCachedTokens
	}
	return ""
}

func (c *Core) push(e *entry) {
	cls := e.cold.cls
	cls.q.push(e)
	cls.blocked = false
	if e.hasDue {
		c.due.push(e)
	}
	c.entries[e.req.ID] = e
	cls.pendingISL += int64(e.req.PromptTokens)
	cls.pendingCached += int64(e.cold.cached)
	c.queued++
	c.tenantQueued(e)
}

// unqueue removes e from every index and releases its queue accounting.
func (c *Core) unqueue(e *entry) {
	cls := e.cold.cls
	cls.blocked = false
	if e.qi >= 0 {
		cls.q.remove(int(e.qi))
	}
	if e.di >= 0 {
		c.due.remove(int(e.di))
	}
	delete(c.entries, e.req.ID)
	cls.pendingISL -= int64(e.req.PromptTokens)
	cls.pendingCached -= int64(e.cold.cached)
	c.queued--
	c.tenantUnqueued(e)
	if len(cls.q) == 0 {
		// An idle class must not bank credit for later (standard DRR).
		cls.deficit = 0
		cls.untenanted()
	}
}

func (c *Core) release(e *entry) {
	cold := e.cold
	*cold = entryCold{}
	*e = entry{cold: cold}
	c.freeEnt = append(c.freeEnt, e)
}

func (c *Core) reject(cls *class, r *Request, respond Responder, reason Reason, limit, detail string) {
	if cls != nil && !r.Probe {
		if cls.counters.Rejected == nil {
			cls.counters.Rejected = make(map[Reason]uint64, len(Reasons))
		}
		cls.counters.Rejected[reason]++
	}
	respond(Grant{}, &RejectError{Reason: reason, Limit: limit, Detail: detail})
}

// rejectEntry completes a queued (already unqueued) entry with a rejection.
func (c *Core) rejectEntry(e *entry, reason Reason, detail string) {
	cls, r, respond := e.cold.cls, e.req, e.cold.respond
	c.release(e)
	c.reject(cls, r, respond, reason, "", detail)
}
