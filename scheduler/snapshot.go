package scheduler

// Snapshot returns an immutable copy of the counters, queue depths and local
// ledger. O(classes + workers): not for every turn.
func (c *Core) Snapshot() *Snapshot {
	c.snapSeq++
	s := &Snapshot{
		Instance: c.instance, Seq: c.snapSeq, At: c.clock.Now(),
		Classes:  make(map[string]ClassSnapshot, len(c.classes)),
		Workers:  make(map[string]WorkerLoad, len(c.ledgers)),
		Bookings: len(c.bookings), UnknownClass: c.unknownClass, InvalidConfigs: c.invalidConfigs,
	}
	for name, cls := range c.classes {
		cs := ClassSnapshot{QueueDepth: len(cls.q), PendingTokens: cls.pendingISL, Counters: cls.counters}
		cs.Counters.Rejected = make(map[Reason]uint64, len(Reasons))
		for _, r := range Reasons {
			cs.Counters.Rejected[r] = cls.counters.Rejected[r]
		}
		s.Classes[name] = cs
	}
	for id, l := range c.ledgers {
		s.Workers[id] = l.load()
	}
	c.sweepTenants(s.At.UnixNano())
	return s
}
