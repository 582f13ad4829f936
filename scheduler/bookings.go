package scheduler

import "time"

func (c *Core) ledgerFor(worker string) *workerLedger {
	l := c.ledgers[worker]
	if l == nil {
		l = &workerLedger{slot: -1}
		c.ledgers[worker] = l
	}
	return l
}

func (c *Core) book(reqID, cls, worker string, blockSize int, hashes []uint64, prompt, cached, output, seqs int, firstToken bool, now time.Time) *booking {
	return c.bookTier(reqID, cls, worker, blockSize, hashes, prompt, cached, 0, output, seqs, firstToken, now)
}

// bookTier is book for a request whose prompt also has tierCredit tokens
// on a lower tier beyond the cached ones that it does not book as prefill
// (TTFTModel.tierCredit: loaded back, less their load cost).
func (c *Core) bookTier(reqID, cls, worker string, blockSize int, hashes []uint64, prompt, cached, tierCredit, output, seqs int, firstToken bool, now time.Time) *booking {
	var b *booking
	if n := len(c.freeBook); n > 0 {
		b = c.freeBook[n-1]
		c.freeBook = c.freeBook[:n-1]
	} else {
		b = new(booking)
	}
	c.nextBooking++
	*b = booking{
		id: c.nextBooking, requestID: reqID, class: cls, worker: worker,
		ledger: c.ledgerFor(worker), hashes: hashes,
		prompt: prompt, cached: cached, tierCredit: max(0, tierCredit), output: output, seqs: max(1, seqs),
		private:  privateBlocks(len(hashes), prompt, output, blockSize),
		deadline: now.Add(c.cfg.AckTimeout).UnixNano(),
	}
	if !firstToken {
		b.prefill = max(0, prompt-cached-b.tierCredit)
	}
	b.ledger.add(b)
	c.ledgerChanged(b.ledger)
	c.bookings[b.id] = b
	c.expiry.push(b)
	return b
}

func (c *Core) free(b *booking) {
	if p := b.pair; p != nil { // a pair is one grant: free both (disagg.go)
		b.pair, p.pair = nil, nil
		c.free(p)
	}
	c.forgetUnacked(b)
	c.capFreed(b.ledger)
	c.tenantFreed(b)
	b.ledger.remove(b)
	c.ledgerChanged(b.ledger)
	c.expiry.remove(b.ei)
	delete(c.bookings, b.id)
	if b.ledger.empty() {
		if _, registered := c.workerIdx[b.worker]; !registered {
			delete(c.ledgers, b.worker)
		}
	}
	*b = booking{}
	c.freeBook = append(c.freeBook, b)
}

// acknowledge makes a booking final and restarts its renewal window.
func (c *Core) acknowledge(b *booking) {
	if p := b.pair; p != nil {
		c.acknowledgeOne(p)
	}
	c.acknowledgeOne(b)
}

func (c *Core) acknowledgeOne(b *booking) {
	c.forgetUnacked(b)
	b.acked = true
	b.deadline = c.clock.Now().Add(c.cfg.BookingExpiry).UnixNano()
	c.expiry.fix(b.ei)
}

// forgetUnacked drops b from the unacknowledged grants (adopted bookings
// and acknowledged ones are not there).
func (c *Core) forgetUnacked(b *booking) {
	if b.acked {
		return
	}
	k := grantKey{b.requestID, b.attempt}
	if c.unacked[k] == b {
		delete(c.unacked, k)
	}
}

// Ack makes a grant final (the entry replica took it). Unknown IDs (already
// finished, rolled back or expired) are ignored.
func (c *Core) Ack(id BookingID) {
	if b := c.bookings[id]; b != nil {
		c.acknowledge(b)
	}
}

// FirstToken removes the booking's prefill load (and acknowledges it: marks
// may arrive out of order). Freed prefill capacity drains the queues.
func (c *Core) FirstToken(id BookingID) {
	b := c.bookings[id]
	if b == nil {
		return
	}
	c.acknowledge(b)
	c.calibrate(b, c.clock.Now().UnixNano())
	if b.prefill > 0 {
		c.capFreed(b.ledger)
		b.ledger.prefill -= b.prefill
		b.prefill = 0
	}
	c.ledgerChanged(b.ledger)
	c.drain()
}

// Finish frees a booking (done or aborted) and drains.
func (c *Core) Finish(id BookingID) {
	if b := c.bookings[id]; b != nil {
		c.free(b)
		c.drain()
	}
}

// Rollback frees a booking whose hand-off failed. Counters are unchanged: the
// request was admitted; its booking just ends early.
func (c *Core) Rollback(id BookingID) { c.Finish(id) }

// Renew restarts the renewal window of in-flight bookings (and acknowledges
// them). Unknown IDs are ignored.
func (c *Core) Renew(ids []BookingID) {
	for _, id := range ids {
		if b := c.bookings[id]; b != nil {
			c.acknowledge(b)
		}
	}
}

// Adopt books an in-flight request granted by another owner, so this
// ledger carries its load (ownership moved, design §4 step 7). The booking
// counts as acknowledged; it expires unless renewed. No counter changes: the
// request was counted by the owner that admitted it.
func (c *Core) Adopt(rec BookingRecord) BookingID {
	blockSize := 0
	if i, ok := c.workerIdx[rec.Worker]; ok {
		blockSize = c.workers[i].BlockSize
	}
	output := max(0, rec.ExpectedOutputTokens)
	if rec.Decode.Worker != "" {
		output = 0 // a pair's output runs on its decode worker (adoptPair)
	}
	b := c.bookTier(rec.RequestID, rec.Class, rec.Worker, blockSize, rec.BlockHashes,
		max(0, rec.PromptTokens), max(0, rec.CachedTokens), rec.TierCreditTokens, output, rec.Sequences, rec.FirstTokenSeen, c.clock.Now())
	c.tenantAdopted(b, rec.Tenant)
	c.adoptPair(rec, b)
	c.acknowledge(b)
	return b.id
}

// Booking returns the record of an in-flight booking.
func (c *Core) Booking(id BookingID) (BookingRecord, bool) {
	b := c.bookings[id]
	if b == nil {
		return BookingRecord{}, false
	}
	return BookingRecord{
		RequestID: b.requestID, Class: b.class, Worker: b.worker, BlockHashes: b.hashes,
		PromptTokens: b.prompt, CachedTokens: b.cached, TierCreditTokens: b.tierCredit, ExpectedOutputTokens: pairOutput(b), Sequences: b.seqs,
		FirstTokenSeen: b.prefill == 0, Tenant: b.tenantID(), Decode: pairRecord(b),
	}, true
}

// Load returns the local ledger's load on worker.
func (c *Core) Load(worker string) WorkerLoad {
	if l := c.ledgers[worker]; l != nil {
		return l.load()
	}
	return WorkerLoad{}
}

// Queued returns how many requests are queued across all classes.
func (c *Core) Queued() int { return c.queued }

// Bookings returns how many bookings are in flight.
func (c *Core) Bookings() int { return len(c.bookings) }
