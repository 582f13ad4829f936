package scheduler

import (
	"fmt"
	"slices"
)

// SetClasses replaces the class configurations. Queued entries of classes
// still present stay queued with the order keys they were given at enqueue;
// classes absent from cfgs are removed as by RemoveClass(name,
// ReasonUnknownClass). Invalid configs are skipped (counted in
// Snapshot.InvalidConfigs); the last of duplicate names wins.
func (c *Core) SetClasses(cfgs []ClassConfig) {
	c.capEpoch++ // thresholds may have changed
	c.capAll = c.capEpoch
	keep := make(map[string]bool, len(cfgs))
	c.ring = c.ring[:0]
	for _, cfg := range cfgs {
		if cfg.Validate() != nil {
			c.invalidConfigs++
			continue
		}
		cls := c.classes[cfg.Name]
		if cls == nil {
			cls = &class{}
			c.classes[cfg.Name] = cls
		}
		cls.cfg = cfg
		if !keep[cfg.Name] {
			keep[cfg.Name] = true
			cls.active = true
			c.ring = append(c.ring, cls)
		}
	}
	var gone []string
	for name, cls := range c.classes {
		if cls.active && !keep[name] {
			gone = append(gone, name)
		}
	}
	slices.Sort(gone) // deterministic rejection order for the simulator
	for _, name := range gone {
		c.removeClass(c.classes[name], ReasonUnknownClass, "class was removed from the configuration")
	}
	c.cursor, c.turn = 0, false
	c.drain()
}

// RemoveClass stops serving a class: its queued entries are rejected with
// reason (ReasonOwnershipLost when ownership moves) in queue order, and later
// arrivals get unknown_class. Its counters are kept.
func (c *Core) RemoveClass(name string, reason Reason) {
	cls := c.classes[name]
	if cls == nil || !cls.active {
		return
	}
	c.removeClass(cls, reason, fmt.Sprintf("class %s is no longer served here", name))
	for i, x := range c.ring {
		if x == cls {
			c.ring = append(c.ring[:i], c.ring[i+1:]...)
			break
		}
	}
	c.cursor, c.turn = 0, false
	c.drain()
}

// RejectQueued rejects the class's queued entries with reason, in queue
// order, and keeps the class configured, in its place in the DRR ring: the
// rotation of the other classes goes on where it was (ownership moved away;
// the class may come back). It reports how many were rejected.
func (c *Core) RejectQueued(name string, reason Reason) int {
	cls := c.classes[name]
	if cls == nil || !cls.active {
		return 0
	}
	n := len(cls.q)
	for len(cls.q) > 0 {
		e := cls.q[0]
		c.unqueue(e)
		c.rejectEntry(e, reason, fmt.Sprintf("class %s is no longer admitted here", name))
	}
	if n > 0 {
		c.drain()
	}
	return n
}

func (c *Core) removeClass(cls *class, reason Reason, detail string) {
	cls.active = false
	for len(cls.q) > 0 {
		e := cls.q[0]
		c.unqueue(e)
		c.rejectEntry(e, reason, detail)
	}
	cls.deficit = 0
}

// Shutdown rejects every queued request with reason, leaving classes
// configured. The Actor calls it when it stops.
func (c *Core) Shutdown(reason Reason) {
	for _, cls := range c.ring {
		for len(cls.q) > 0 {
			e := cls.q[0]
			c.unqueue(e)
			c.rejectEntry(e, reason, "scheduler stopped")
		}
	}
}
