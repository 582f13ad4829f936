package scheduler

import (
	"slices"
	"strings"
	"time"
)

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
		if len(cls.q) > 0 {
			cs.QueueByPriority = make(map[int32]int, 1)
			for _, e := range cls.q {
				cs.QueueByPriority[e.strict]++
			}
		}
		cs.Counters.Rejected = make(map[Reason]uint64, len(Reasons))
		for _, r := range Reasons {
			cs.Counters.Rejected[r] = cls.counters.Rejected[r]
		}
		s.Classes[name] = cs
	}
	s.Calibration = make(map[string]Calibration, len(c.ledgers))
	for id, l := range c.ledgers {
		s.Workers[id] = l.load()
		s.Calibration[id] = Calibration{Scale: 1 + l.ttftSlow,
			Overhead: time.Duration(l.ttftOverhead * float64(time.Millisecond)), Marks: l.cal.n}
	}
	now := s.At.UnixNano()
	c.sweepTenants(now)
	s.Tenants = c.tenantSnapshots(now)
	return s
}

// tenantSnapshots is every accounted tenant's use of its quota at now,
// sorted by ID.
func (c *Core) tenantSnapshots(now int64) []TenantSnapshot {
	if len(c.tenants) == 0 {
		return nil
	}
	out := make([]TenantSnapshot, 0, len(c.tenants))
	for id, t := range c.tenants {
		ts := TenantSnapshot{ID: id, Quota: t.quota, InFlight: t.inflight, Queued: t.queued}
		if q := t.quota.RequestsPerMinute; q > 0 {
			t.rpm.refill(q, now)
			ts.Requests = t.rpm.level
		}
		if q := t.quota.TokensPerMinute; q > 0 {
			t.tpm.refill(q, now)
			ts.Tokens = t.tpm.level
		}
		for class := range t.classes {
			ts.Classes = append(ts.Classes, class)
		}
		slices.Sort(ts.Classes)
		out = append(out, ts)
	}
	slices.SortFunc(out, func(a, b TenantSnapshot) int { return strings.Compare(a.ID, b.ID) })
	return out
}
