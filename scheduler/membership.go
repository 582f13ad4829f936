package scheduler

import "slices"

// SetWorkers replaces the registered workers. Invalid registrations are
// skipped (counted in Snapshot.InvalidConfigs). Bookings on departed workers
// stay until they finish or expire. Queued requests that can no longer run
// anywhere (zero workers, pinned worker gone, allow-list all gone) are
// rejected with no_endpoints; the rest are drained against the new set.
func (c *Core) SetWorkers(ws []Worker) {
	c.workers = c.workers[:0]
	clear(c.workerIdx)
	for _, w := range ws {
		if w.Validate() != nil {
			c.invalidConfigs++
			continue
		}
		if i, dup := c.workerIdx[w.ID]; dup {
			c.workers[i] = newWorkerSlot(w, c.workers[i].ledger) // last registration wins
			continue
		}
		c.workerIdx[w.ID] = len(c.workers)
		c.workers = append(c.workers, newWorkerSlot(w, c.ledgerFor(w.ID)))
	}
	for id, l := range c.ledgers {
		l.slot = -1
		if i, ok := c.workerIdx[id]; ok {
			l.slot = int32(i)
		} else if l.empty() {
			delete(c.ledgers, id)
		}
	}
	c.noteRoles()
	c.remoteValid = false
	c.ix.built = false
	c.capEpoch++
	c.capAll = c.capEpoch
	c.capAt = slices.Grow(c.capAt[:0], len(c.workers))[:len(c.workers)]
	clear(c.capAt)
	n := len(c.workers)
	if cap(c.ovl) < n {
		c.ovl = make([]int32, n)
		c.allow = make([]uint64, n)
	}
	c.ovl, c.allow = c.ovl[:n], c.allow[:n]
	clear(c.ovl)
	clear(c.allow)
	c.stamp = 0

	var stranded []*entry
	for _, e := range c.entries {
		if !c.anyAllowed(e.req) {
			stranded = append(stranded, e)
		}
	}
	sortBySeq(stranded)
	for _, e := range stranded {
		c.unqueue(e)
		c.rejectEntry(e, ReasonNoEndpoints, "no registered worker may serve the request")
	}
	c.drain()
}

// Workers returns a copy of the registered workers.
func (c *Core) Workers() []Worker {
	out := make([]Worker, len(c.workers))
	for i := range c.workers {
		out[i] = c.workers[i].Worker
	}
	return out
}

func sortBySeq(es []*entry) {
	// insertion sort: stranded sets are small and this keeps rejection order
	// deterministic for the simulator
	for i := 1; i < len(es); i++ {
		for j := i; j > 0 && es[j].seq < es[j-1].seq; j-- {
			es[j], es[j-1] = es[j-1], es[j]
		}
	}
}
