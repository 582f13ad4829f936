package scheduler

import "math"

// refreshRemote brings the cached remote loads and engine reports up to
// date. With a VersionedLoadView that is a no-op until the version changes
// or a report in use goes stale; with a plain LoadView every selection asks
// it afresh.
func (c *Core) refreshRemote() {
	if c.load == nil {
		return
	}
	now := c.clock.Now().UnixNano()
	stale := c.eng.next != 0 && now >= c.eng.next
	if c.vload != nil {
		v := c.vload.LoadVersion()
		if c.remoteValid && v == c.remoteVer && !stale {
			return
		}
		c.remoteVer, c.remoteValid = v, true
		c.capEpoch++
	}
	herd := c.herdOn()
	if herd {
		c.herdClose(now)
	}
	ev, _ := c.load.(EngineLoadView)
	var maxAge int64
	if ev != nil {
		maxAge = int64(ev.EngineMaxAge())
	}
	c.eng.next = 0
	for i := range c.workers {
		s := &c.workers[i]
		changed := false
		if l := c.load.RemoteLoad(s.ID); l != s.remote {
			if herd && l.ActiveRequests > s.remote.ActiveRequests {
				c.herd.seen += uint64(l.ActiveRequests - s.remote.ActiveRequests)
			}
			s.remote = l
			changed = true
		}
		if ev != nil || s.engine.on {
			var e engineSlot
			var exp int64
			if ev != nil {
				l, ok := ev.EngineLoad(s.ID)
				e, exp = c.engineFor(s, l, ok, now, maxAge)
			}
			if exp != 0 && (c.eng.next == 0 || exp < c.eng.next) {
				c.eng.next = exp
			}
			if e != s.engine {
				s.engine = e
				changed = true
			}
		}
		if changed {
			c.capAt[i] = c.capEpoch
			if c.ix.built {
				c.reindex(i)
			}
		}
	}
}

// projectLoad is the one place load is projected: this Core's ledger plus
// what other replicas booked (LoadView, refreshed by refreshRemote).
func (s *workerSlot) projectLoad() WorkerLoad {
	return s.ledger.load().Add(s.remote)
}

// selectWorker picks a worker for r under class cfg, or reports that none is
// eligible right now (the request waits). It is side-effect free apart from
// its scratch space, the remote-load cache and the random source: no booking,
// no queue change.
//
// Eligible: allowed by r's constraints, below MaxRunning (local + remote
// active), and not busy by the class thresholds. A worker with nothing active
// is never busy, so a request larger than a threshold can still run somewhere.
// Cost (design §5), with B the worker's block size:
//
//	prefill_blocks = (active_prefill_tokens + isl) / B
//	adjusted       = max(0, prefill_blocks − overlap_credit × overlap_blocks)
//	cost           = prefill_scale × adjusted + potential_decode_blocks
func (c *Core) selectWorker(r *Request, cfg *ClassConfig) (int, bool) {
	n := len(c.workers)
	if n == 0 {
		return -1, false
	}
	c.refreshRemote()
	c.ensureIndex()
	c.ttft.begin()
	c.touched = c.touched[:0]
	r.eachOverlap(func(w string, blocks int) {
		if i, ok := c.workerIdx[w]; ok {
			c.ovl[i] = max(c.ovl[i], int32(blocks)) // the deepest report wins (Request.OverlapBlocks)
			c.touched = append(c.touched, i)
		}
	})
	c.noteTiers(r)
	c.herdBegin(r)
	sess := c.sessionWorker(r)
	if !c.scanOnly && c.indexable(r) {
		if sess >= 0 {
			c.touched = append(c.touched, sess) // evaluated exactly, like a prefix holder
		}
		idx, ok := c.selectIndexed(r, cfg, sess)
		c.resetOverlaps()
		return idx, ok
	}

	// Constrained requests iterate their own workers only (deduplicated),
	// the rest iterate every worker.
	lo, hi := 0, n
	cands := c.cands[:0]
	restricted := false
	if sess >= 0 && r.Session.Hard {
		lo, hi = sess, sess+1
	} else if r.Pinned != "" {
		i, ok := c.workerIdx[r.Pinned]
		if !ok {
			c.resetOverlaps()
			return -1, false
		}
		lo, hi = i, i+1
	} else if len(r.Allowed) > 0 {
		restricted = true
		c.stamp++
		for _, a := range r.Allowed {
			if i, ok := c.workerIdx[a]; ok && c.allow[i] != c.stamp {
				c.allow[i] = c.stamp
				cands = append(cands, i)
			}
		}
		c.cands = cands
		lo, hi = 0, len(cands)
	}

	sample := c.cfg.Temperature > 0
	best := math.Inf(1)
	least, sessCost, sessOK := math.Inf(1), 0.0, false
	c.ties = c.ties[:0]
	c.costs = c.costs[:0]
	// Private blocks depend only on the block size, which is nearly always
	// uniform across a fleet: compute once per distinct size in a row.
	lastB, priv := -1, 0
	for k := lo; k < hi; k++ {
		i := k
		if restricted {
			i = cands[k]
		}
		s := &c.workers[i]
		if b := int(s.blockSize); b != lastB {
			lastB, priv = b, r.privateBlocks(b)
		}
		var cost float64
		var ok bool
		if c.cfg.Selector == SelectorTTFT {
			cost, ok = c.ttftCost(r, cfg, s, int(c.ovl[i]), priv)
		} else {
			cost, ok = c.workerCost(r, cfg, s, int(c.ovl[i]), priv)
		}
		if !ok {
			continue
		}
		if i == sess {
			sessCost, sessOK = cost, true
		}
		least = min(least, cost)
		if sample {
			c.ties = append(c.ties, i)
			c.costs = append(c.costs, cost)
			continue
		}
		switch {
		case cost < best:
			best = cost
			c.ties = append(c.ties[:0], i)
		case cost == best:
			c.ties = append(c.ties, i)
		}
	}
	c.resetOverlaps()
	switch {
	case len(c.ties) == 0:
		return -1, false
	case sessOK && r.Session.sticks(sessCost, least):
		return sess, true
	case len(c.ties) == 1:
		return c.ties[0], true
	case !sample:
		return c.ties[c.rng.IntN(len(c.ties))], true
	}
	return c.sample(), true
}

func (c *Core) resetOverlaps() {
	for _, i := range c.touched {
		c.ovl[i] = 0
		c.workers[i].tierDepth = [NumTiers]int32{}
	}
}

// workerCost is the selector cost of r on worker s given its effective
// overlap and r's private block count there, or false when s is full or busy
// for this class.
func (c *Core) workerCost(r *Request, cfg *ClassConfig, s *workerSlot, ovl, priv int) (float64, bool) {
	booked := s.projectLoad()
	if s.maxRunning > 0 && booked.ActiveRequests >= int(s.maxRunning) {
		return 0, false
	}
	load := s.costLoad()
	// The request adds the prompt blocks not already active on the worker.
	// This ledger knows which of its own bookings' blocks are active. Other
	// replicas' bookings arrive as a block count without the blocks, so
	// when the worker runs requests booked elsewhere, its cached prefix of
	// this prompt (ovl: index and predictions) counts as active: otherwise
	// a prefix another replica's booking keeps active is counted twice, and
	// the worker holding a conversation looks busier than an idle one.
	held := 0
	hashes := r.HashesFor(int(s.blockSize))
	if s.ledger.refs.n > 0 || s.ledger.refs.zero > 0 { // most workers hold none of anyone's blocks: skip the call
		held = s.ledger.activeDepth(hashes)
	}
	if s.remote.ActiveRequests > 0 {
		held = max(held, ovl)
	}
	if booked.ActiveRequests > 0 { // eligibility on the booked load (engineSlot)
		if cfg.BusyPrefillTokens > 0 &&
			booked.PrefillTokens+r.PromptTokens-r.cachedFromOverlap(ovl, int(s.blockSize)) > cfg.BusyPrefillTokens {
			return 0, false
		}
		if cfg.BusyDecodeFraction > 0 && s.kvBlocks > 0 &&
			float64(booked.DecodeBlocks+len(hashes)-held+priv)/float64(s.kvBlocks) > cfg.BusyDecodeFraction {
			return 0, false
		}
	}
	if s.engineRaises() {
		held = max(held, ovl) // as for remote bookings: the engine's KV may hold the prefix
	}
	decode := load.DecodeBlocks + len(hashes) - held + priv
	credit := c.cfg.OverlapCredit * float64(ovl)
	if s.inLowerTier() {
		credit += c.cfg.TTFT.tierCreditBlocks(r, s, r.cachedFromOverlap(ovl, int(s.blockSize)))
	}
	adjusted := max(0, float64(load.PrefillTokens+r.PromptTokens)*s.invB-credit)
	return c.cfg.PrefillScale*adjusted + float64(decode), true
}

// sample draws one candidate from c.ties with p ∝ exp(−(c − c_min) /
// ((c_max − c_min)·T)); equal costs draw uniformly.
func (c *Core) sample() int {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, x := range c.costs {
		lo, hi = min(lo, x), max(hi, x)
	}
	if hi == lo {
		return c.ties[c.rng.IntN(len(c.ties))]
	}
	scale := (hi - lo) * c.cfg.Temperature
	sum := 0.0
	for j, x := range c.costs {
		wgt := math.Exp(-(x - lo) / scale)
		c.costs[j] = wgt
		sum += wgt
	}
	u := c.rng.Float64() * sum
	for j, wgt := range c.costs {
		if u < wgt {
			return c.ties[j]
		}
		u -= wgt
	}
	return c.ties[len(c.ties)-1]
}
