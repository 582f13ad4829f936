package scheduler

// constraintLookahead bounds how many queued entries candidate examines.
const constraintLookahead = 16

// candidate is the class's next entry to dispatch and its worker, or nil when
// the class must wait. It walks the queue in order from the head: the first
// entry that has a worker right now wins, and an entry blocked with no worker
// constraint stops the walk (the class waits for capacity, in order). An
// entry blocked only because its pinned or allowed workers are full is
// stepped over, up to constraintLookahead entries, so one busy pinned worker
// does not hold up the whole class. Computed once per popNext.
func (c *Core) candidate(cls *class) (*entry, int) {
	if cls.selGen == c.gen {
		return cls.selEntry, cls.selIdx
	}
	cls.selGen, cls.selEntry, cls.selIdx = c.gen, nil, -1
	// A plain LoadView can change under us at any time: no memo then.
	memo := c.load == nil || c.vload != nil
	if memo && cls.blocked && c.stillBlocked(cls) {
		return nil, -1
	}
	cls.blockedOn, cls.blockedAll = cls.blockedOn[:0], false
	if cls.multiTenant() {
		cls.selEntry, cls.selIdx = c.tenantCandidate(cls)
	} else {
		cls.selEntry, cls.selIdx = c.walkQueue(cls, cls.q)
	}
	cls.blocked = cls.selEntry == nil && len(cls.q) > 0
	cls.blockedAt = c.capEpoch
	cls.blockedAll = cls.blockedAll || len(cls.blockedOn) > maxBlockedOn
	return cls.selEntry, cls.selIdx
}

// walkQueue is candidate's walk over one heap of cls's entries (the class
// queue, or one tenant's part of it): the first entry in order that has a
// worker, with the constrained look-ahead. A walk that finds none records
// what it waited on in cls.blockedOn and cls.blockedAll (every walk of one
// candidate adds to them), so the blocked-class memo knows which freed
// capacity can change the answer.
func (c *Core) walkQueue(cls *class, q []*entry) (*entry, int) {
	deps := cls.blockedOn
	// In-order walk of the heap: a frontier of heap positions, smallest first.
	front := append(c.front[:0], 0)
	for steps := 0; steps < constraintLookahead && len(front) > 0 && len(q) > 0; steps++ {
		j := 0
		for k := 1; k < len(front); k++ {
			if q[front[k]].before(q[front[j]]) {
				j = k
			}
		}
		qi := front[j]
		front[j] = front[len(front)-1]
		front = front[:len(front)-1]
		e := q[qi]
		if idx, ok := c.selectPlacement(e.req, &cls.cfg); ok {
			c.front, cls.blockedOn = front, deps
			return e, idx
		}
		if e.req.Pinned == "" && len(e.req.Allowed) == 0 {
			cls.blockedAll = true
			break
		}
		deps = c.appendConstraint(deps, e.req)
		for _, ch := range [2]int{2*qi + 1, 2*qi + 2} {
			if ch < len(q) {
				front = append(front, ch)
			}
		}
	}
	c.front, cls.blockedOn = front, deps
	return nil, -1
}

// maxBlockedOn bounds the workers a blocked class remembers; past it, any
// freed capacity re-evaluates the class.
const maxBlockedOn = 64

// appendConstraint appends the registered workers r may run on (r is
// pinned or allow-listed) to deps, up to just past maxBlockedOn.
func (c *Core) appendConstraint(deps []int32, r *Request) []int32 {
	if r.Pinned != "" {
		if i, ok := c.workerIdx[r.Pinned]; ok {
			deps = append(deps, int32(i))
		}
		return deps
	}
	for _, a := range r.Allowed {
		if len(deps) > maxBlockedOn {
			break
		}
		if i, ok := c.workerIdx[a]; ok {
			deps = append(deps, int32(i))
		}
	}
	return deps
}

// stillBlocked reports whether nothing that could unblock cls changed
// since it was found blocked: no capacity anywhere (capEpoch), or, when
// only constrained entries were blocked, none on their workers (capAt)
// and none everywhere (capAll). Selection is deterministic in these, so a
// re-walk would find the class blocked again.
func (c *Core) stillBlocked(cls *class) bool {
	at := cls.blockedAt
	if at == c.capEpoch {
		return true
	}
	if c.scanOnly || cls.blockedAll || c.capAll > at {
		return false
	}
	for _, i := range cls.blockedOn {
		if c.capAt[i] > at {
			return false
		}
	}
	return true
}

// capFreed records that capacity may have been freed on ledger l's worker.
func (c *Core) capFreed(l *workerLedger) {
	c.capEpoch++
	if l.slot >= 0 {
		c.capAt[l.slot] = c.capEpoch
	}
}
