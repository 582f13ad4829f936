package scheduler

// popNext picks the next entry by deficit round robin across classes and
// removes it from the queue. Only dispatchable classes take part (see
// candidate); the others keep their deficit but do not grow it. When a whole
// cycle passes without service, the bulk-credit step skips the rounds in
// which nobody could afford their candidate. It returns nil when no class is
// dispatchable.
func (c *Core) popNext() (*entry, int) {
	n := len(c.ring)
	if n == 0 {
		return nil, -1
	}
	c.gen++
	if c.cursor >= n {
		c.cursor, c.turn = 0, false
	}
	// A scan that finds nothing dispatchable must leave the rotation as it
	// was: passing over blocked classes is not a turn.
	cursor, turn := c.cursor, c.turn
	idle := 0
	for {
		cls := c.ring[c.cursor]
		if e, idx := c.candidate(cls); e != nil {
			if !c.turn {
				cls.deficit += cls.cfg.Quantum
				c.turn = true
			}
			if cls.deficit >= e.cost {
				cls.deficit -= e.cost
				c.tenantServed(e)
				c.unqueue(e)
				return e, idx
			}
		}
		c.cursor = (c.cursor + 1) % n
		c.turn = false
		if idle++; idle < n {
			continue
		}
		// A full cycle without service: every dispatchable class got one
		// quantum and still cannot afford its candidate.
		if !drrSkipAhead(n, func(i int) (*int64, int64, int64, bool) {
			x := c.ring[i]
			e, _ := c.candidate(x)
			if e == nil {
				return nil, 0, 0, false
			}
			return &x.deficit, x.cfg.Quantum, e.cost, true
		}) {
			c.cursor, c.turn = cursor, turn
			return nil, -1
		}
		idle = 0
	}
}

// drrSkipAhead is the bulk-credit step of a deficit round robin ring after a
// full cycle in which nobody was served: every member with a head got its
// quantum and still cannot afford the head. It finds k, the fewest rounds any
// of them still needs, and credits each of them k-1 more quanta, so that the
// next cycle serves one instead of spinning k-1 empty cycles. member(i)
// gives member i's deficit, quantum and head cost, or ok false when it has
// no head. It reports false when no member has one.
func drrSkipAhead(n int, member func(i int) (deficit *int64, quantum, cost int64, ok bool)) bool {
	k := int64(-1)
	for i := range n {
		d, q, cost, ok := member(i)
		if !ok {
			continue
		}
		if need := (cost - *d + q - 1) / q; k < 0 || need < k {
			k = need
		}
	}
	if k < 0 {
		return false
	}
	if k > 1 {
		for i := range n {
			if d, q, _, ok := member(i); ok {
				*d += (k - 1) * q
			}
		}
	}
	return true
}
