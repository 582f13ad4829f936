package scheduler

import "time"

// drain admits queued requests until nothing is dispatchable.
func (c *Core) drain() {
	if c.queued > 0 {
		c.refreshRemote()
	}
	for c.queued > 0 {
		e, idx := c.popNext()
		if e == nil {
			return
		}
		now := c.clock.Now()
		if e.hasDue && now.UnixNano() >= e.due {
			// Expiry right before booking. The DRR charge is not refunded:
			// the class had its turn.
			c.rejectEntry(e, ReasonDueTimePassed, "due time passed before booking")
			continue
		}
		c.admit(e, idx, now)
	}
}

// Drain re-evaluates the queues. Call it when capacity may have changed
// outside the Core's knowledge (other replicas' load through the LoadView).
func (c *Core) Drain() {
	c.capEpoch++
	c.capAll = c.capEpoch
	if c.queued == 0 && c.herdOn() {
		// Nothing to admit, but the herd count needs the time the view
		// changed.
		c.refreshRemote()
	}
	c.drain()
}

// admit is the canonical admission path after selection: book, respond, and
// roll back when the requester is gone. e is released.
func (c *Core) admit(e *entry, idx int, now time.Time) {
	r, cls, respond, enqueuedAt := e.req, e.cold.cls, e.cold.respond, e.cold.enqueuedAt
	idx, decode, decision := unplace(idx)
	w := &c.workers[idx]
	output := r.ExpectedOutputTokens
	if decode >= 0 {
		output = 0 // the output runs on the decode worker (admitPair)
	}
	ovl := r.OverlapBlocks(w.ID)
	cached := r.cachedFromOverlap(ovl, w.BlockSize)
	pred := c.ttftPredict(r, idx)
	c.herdDecided(now.UnixNano())
	credit := c.cfg.TTFT.bookedTierCredit(r, w.ID, w.BlockSize, cached)
	b := c.bookTier(r.ID, cls.cfg.Name, w.ID, w.BlockSize, r.HashesFor(w.BlockSize), r.PromptTokens, cached, credit, output, r.Sequences, false, now)
	b.grantedAt, b.predMs = now.UnixNano(), pred
	c.tenantBooked(b, r, now)
	b.attempt = r.Attempt
	c.unacked[grantKey{r.ID, r.Attempt}] = b
	g := Grant{
		RequestID: r.ID, Worker: w.ID, WorkerURL: w.URL, Booking: b.id, BlockSize: w.BlockSize,
		CachedTokens: cached, TierCreditTokens: b.tierCredit, OverlapBlocks: ovl, QueueWait: now.Sub(enqueuedAt),
		PredictedTTFT: b.ledger.calibrated(pred),
	}
	g.Decision = decision
	if decode >= 0 {
		c.admitPair(r, b, decode, &g, now)
	}
	g.ReachableTokens, g.Shortfall = c.routingQuality(r, cached)
	c.grantCandidates(r, idx, &g)
	c.release(e)
	if !respond(g, nil) {
		c.free(b)
		if !r.Probe {
			cls.counters.Cancelled++
		}
		return
	}
	if !r.Probe {
		cls.counters.Admitted++
		c.disagg.counts[decision]++
	}
}
