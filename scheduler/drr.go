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
		// quantum and still cannot afford its candidate. Skip ahead k-1
		// rounds, where k is the fewest rounds any of them still needs; the
		// next cycle serves that class.
		k := int64(-1)
		for _, x := range c.ring {
			e, _ := c.candidate(x)
			if e == nil {
				continue
			}
			need := (e.cost - x.deficit + x.cfg.Quantum - 1) / x.cfg.Quantum
			if k < 0 || need < k {
				k = need
			}
		}
		if k < 0 {
			c.cursor, c.turn = cursor, turn
			return nil, -1
		}
		if k > 1 {
			for _, x := range c.ring {
				if e, _ := c.candidate(x); e != nil {
					x.deficit += (k - 1) * x.cfg.Quantum
				}
			}
		}
		idle = 0
	}
}
