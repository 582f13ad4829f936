package scheduler

import "math"

// projectLoad is the one place load is projected: this Core's ledger plus
// what other replicas booked (LoadView).
func (c *Core) projectLoad(i int) WorkerLoad {
	w := &c.workers[i]
	l := w.ledger.load()
	if c.load != nil {
		l = l.Add(c.load.RemoteLoad(w.ID))
	}
	return l
}

// selectWorker picks a worker for r under class cfg, or reports that none is
// eligible right now (the request waits). It is side-effect free apart from
// its scratch space and the random source: no booking, no queue change.
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
	c.touched = c.touched[:0]
	for _, o := range r.Overlaps {
		if i, ok := c.workerIdx[o.Worker]; ok {
			c.ovl[i] = int32(r.effectiveOverlap(o.Blocks))
			c.touched = append(c.touched, i)
		}
	}
	defer func() {
		for _, i := range c.touched {
			c.ovl[i] = 0
		}
	}()

	lo, hi := 0, n
	restricted := false
	if r.Pinned != "" {
		i, ok := c.workerIdx[r.Pinned]
		if !ok {
			return -1, false
		}
		lo, hi = i, i+1
	} else if len(r.Allowed) > 0 {
		restricted = true
		c.stamp++
		for _, a := range r.Allowed {
			if i, ok := c.workerIdx[a]; ok {
				c.allow[i] = c.stamp
			}
		}
	}

	sample := c.cfg.Temperature > 0
	best := math.Inf(1)
	c.ties = c.ties[:0]
	c.costs = c.costs[:0]
	for i := lo; i < hi; i++ {
		if restricted && c.allow[i] != c.stamp {
			continue
		}
		cost, ok := c.workerCost(r, cfg, i)
		if !ok {
			continue
		}
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
	switch {
	case len(c.ties) == 0:
		return -1, false
	case len(c.ties) == 1:
		return c.ties[0], true
	case !sample:
		return c.ties[c.rng.IntN(len(c.ties))], true
	}
	return c.sample(), true
}

// workerCost is the selector cost of r on worker i, or false when i is full or
// busy for this class.
func (c *Core) workerCost(r *Request, cfg *ClassConfig, i int) (float64, bool) {
	w := &c.workers[i]
	load := c.projectLoad(i)
	if w.MaxRunning > 0 && load.ActiveRequests >= w.MaxRunning {
		return 0, false
	}
	ovl := int(c.ovl[i])
	B := w.BlockSize
	newBlocks := len(r.BlockHashes) - w.ledger.activeDepth(r.BlockHashes) + r.privateBlocks(B)
	decode := load.DecodeBlocks + newBlocks
	if load.ActiveRequests > 0 {
		if cfg.BusyPrefillTokens > 0 &&
			load.PrefillTokens+r.PromptTokens-r.cachedFromOverlap(ovl, B) > cfg.BusyPrefillTokens {
			return 0, false
		}
		if cfg.BusyDecodeFraction > 0 && w.KVBlocks > 0 &&
			float64(decode)/float64(w.KVBlocks) > cfg.BusyDecodeFraction {
			return 0, false
		}
	}
	prefillBlocks := float64(load.PrefillTokens+r.PromptTokens) / float64(B)
	adjusted := max(0, prefillBlocks-c.cfg.OverlapCredit*float64(ovl))
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
