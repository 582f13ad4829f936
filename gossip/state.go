package gossip

import (
	"sort"
	"time"
)

// WorkerLoad is one origin's booked load on one worker. It has the same
// fields as scheduler.WorkerLoad; the app converts (gossip does not import
// the scheduler).
type WorkerLoad struct {
	ActiveRequests int
	PrefillTokens  int
	DecodeBlocks   int
}

func (l WorkerLoad) add(o WorkerLoad) WorkerLoad {
	return WorkerLoad{
		ActiveRequests: l.ActiveRequests + o.ActiveRequests,
		PrefillTokens:  l.PrefillTokens + o.PrefillTokens,
		DecodeBlocks:   l.DecodeBlocks + o.DecodeBlocks,
	}
}

// Digest summarises one replica's KV index for one worker: the last applied
// KV event id, the block count, and the engine instance the ids belong to.
// Comparing digests of the same instance across replicas shows a replica
// that lags behind.
type Digest struct {
	LastEventID uint64
	Blocks      int
	Instance    uint64
}

// Health is what one origin last concluded about a worker's engine from
// the requests it sent there: SuspectSince is when it last marked the worker
// suspect (consecutive first-byte timeouts), RecoveredAt when it last saw a
// request to a suspect worker succeed. Both are Unix nanoseconds of the
// origin's clock, 0 for never. A worker is suspect while the newest
// SuspectSince of any origin is younger than the suspicion TTL and newer
// than every origin's RecoveredAt (Suspicion).
type Health struct {
	SuspectSince int64
	RecoveredAt  int64
}

// Join is the newest of both records' stamps.
func (h Health) Join(o Health) Health {
	return Health{SuspectSince: max(h.SuspectSince, o.SuspectSince), RecoveredAt: max(h.RecoveredAt, o.RecoveredAt)}
}

// Suspected reports whether a (joined) record suspects its worker at now: a
// suspicion younger than ttl that no recovery followed. Stamps from
// different origins are compared across their clocks, so a recovery within
// the replicas' clock skew of a suspicion may lose to it; the suspicion
// then lasts its ttl.
func (h Health) Suspected(now time.Time, ttl time.Duration) bool {
	return h.SuspectSince > h.RecoveredAt && now.UnixNano() < h.SuspectSince+int64(ttl)
}

// Entry is what one origin says about one worker, stamped with the origin's
// version at the time the value last changed. Version 0 means never written:
// every floor covers it, so such entries are dropped.
type Entry struct {
	Version uint64
	Load    WorkerLoad
	Digest  Digest
	Health  Health
}

// sameValue reports whether e and o carry the same value, ignoring versions.
func (e Entry) sameValue(o Entry) bool {
	return e.Load == o.Load && e.Digest == o.Digest && e.Health == o.Health
}

// wins reports whether e replaces o under last-writer-wins: the higher
// version wins; equal versions with different values (which a correct origin
// never produces) are ordered by value, so the merge stays commutative even
// then.
func (e Entry) wins(o Entry) bool {
	if e.Version != o.Version {
		return e.Version > o.Version
	}
	return valueLess(o, e)
}

func valueLess(a, b Entry) bool {
	av := [8]int64{int64(a.Load.ActiveRequests), int64(a.Load.PrefillTokens), int64(a.Load.DecodeBlocks), int64(a.Digest.LastEventID), int64(a.Digest.Blocks), int64(a.Digest.Instance), a.Health.SuspectSince, a.Health.RecoveredAt}
	bv := [8]int64{int64(b.Load.ActiveRequests), int64(b.Load.PrefillTokens), int64(b.Load.DecodeBlocks), int64(b.Digest.LastEventID), int64(b.Digest.Blocks), int64(b.Digest.Instance), b.Health.SuspectSince, b.Health.RecoveredAt}
	for i := range av {
		if av[i] != bv[i] {
			return av[i] < bv[i]
		}
	}
	return false
}

// State is the gossiped soft state: per origin (the replica that authored
// it), per worker, one Entry; and per origin a floor: entries at or below an
// origin's floor are gone (the origin departed and its contributions were
// removed), and stay gone when an old message about them arrives late.
//
// State is a join-semilattice under Merge: each (origin, worker) is a
// last-writer-wins register by version, floors join by max, and an entry is
// present iff its version is above its origin's floor. Merge is therefore
// idempotent, commutative and associative, so replicas converge whatever
// order, duplication or grouping gossip delivers states in.
//
// A State is a value: Merge never modifies its arguments. The zero State is
// empty and valid.
type State struct {
	Origins map[string]map[string]Entry
	Floors  map[string]uint64
}

// Merge returns the join of a and b. It does not modify a or b.
func Merge(a, b State) State {
	out := a.clone()
	out.join(b, nil)
	return out
}

func (s State) clone() State {
	var out State
	if len(s.Origins) > 0 {
		out.Origins = make(map[string]map[string]Entry, len(s.Origins))
		for o, es := range s.Origins {
			cp := make(map[string]Entry, len(es))
			for w, e := range es {
				cp[w] = e
			}
			out.Origins[o] = cp
		}
	}
	if len(s.Floors) > 0 {
		out.Floors = make(map[string]uint64, len(s.Floors))
		for o, f := range s.Floors {
			out.Floors[o] = f
		}
	}
	// Normalise: a clone of an un-normalised state (entries at or below the
	// floor, empty maps) is the state those entries denote.
	for o := range out.Origins {
		out.dropAtOrBelow(o, out.Floors[o])
	}
	return out
}

func (s *State) setFloor(origin string, floor uint64) {
	if floor == 0 {
		return
	}
	if s.Floors == nil {
		s.Floors = make(map[string]uint64)
	}
	s.Floors[origin] = floor
}

func (s *State) dropAtOrBelow(origin string, floor uint64) {
	es := s.Origins[origin]
	for w, e := range es {
		if e.Version <= floor {
			delete(es, w)
		}
	}
	if es != nil && len(es) == 0 {
		delete(s.Origins, origin)
	}
}

// join merges src into s in place and calls changed (when non-nil) for every
// (origin, worker) whose entry src replaced or added. Removals caused by a
// raised floor are reported with ok=false.
func (s *State) join(src State, changed func(origin, worker string, e Entry, ok bool)) {
	for o, f := range src.Floors {
		if f <= s.Floors[o] {
			continue
		}
		s.setFloor(o, f)
		if changed != nil {
			for w, e := range s.Origins[o] {
				if e.Version <= f {
					changed(o, w, e, false)
				}
			}
		}
		s.dropAtOrBelow(o, f)
	}
	for o, es := range src.Origins {
		floor := s.Floors[o]
		for w, e := range es {
			if e.Version <= floor {
				continue
			}
			cur, ok := s.Origins[o][w]
			if ok && !e.wins(cur) {
				continue
			}
			if s.Origins == nil {
				s.Origins = make(map[string]map[string]Entry)
			}
			if s.Origins[o] == nil {
				s.Origins[o] = make(map[string]Entry)
			}
			s.Origins[o][w] = e
			if changed != nil {
				changed(o, w, e, true)
			}
		}
	}
}

// origins lists every origin with entries or a floor, sorted.
func (s State) origins() []string {
	set := make(map[string]struct{}, len(s.Origins)+len(s.Floors))
	for o := range s.Origins {
		set[o] = struct{}{}
	}
	for o := range s.Floors {
		set[o] = struct{}{}
	}
	out := make([]string, 0, len(set))
	for o := range set {
		out = append(out, o)
	}
	sort.Strings(out)
	return out
}

// maxVersion is the highest entry version of origin, or its floor.
func (s State) maxVersion(origin string) uint64 {
	v := s.Floors[origin]
	for _, e := range s.Origins[origin] {
		v = max(v, e.Version)
	}
	return v
}

// Equal reports whether s and o denote the same state.
func (s State) Equal(o State) bool {
	a, b := s.clone(), o.clone()
	if len(a.Origins) != len(b.Origins) || len(a.Floors) != len(b.Floors) {
		return false
	}
	for k, f := range a.Floors {
		if g, ok := b.Floors[k]; !ok || g != f {
			return false
		}
	}
	for k, es := range a.Origins {
		os, ok := b.Origins[k]
		if !ok || len(os) != len(es) {
			return false
		}
		for w, e := range es {
			if oe, ok := os[w]; !ok || oe != e {
				return false
			}
		}
	}
	return true
}
