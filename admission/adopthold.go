package admission

import (
	"time"

	"go.uber.org/zap"
)

// The adoption hold ends when adoption completes. A new owner holds a
// tenant's requests that have a concurrency quota for the hold's bound
// (WithAdoptHold) after it acquired a class, so that they are checked
// against the streams the entries re-home to it. Each entry ends its
// re-home round for a class and owner epoch with a done report (an adopt
// request with Done set, sent even with no bookings; the owner's own entry
// reports in-process). Once every live entry replica (WithEntries) has
// reported for the class's epoch, the hold ends at once: normally a few
// milliseconds after the move instead of the whole bound. An entry that
// stays silent (cut from NATS, an older version) leaves the hold to its
// bound. Either end is counted (switchyard_admission_adopt_holds_total).

// Ends of an adoption hold, as counted.
const (
	holdComplete = "complete"
	holdBound    = "bound"
)

// holdState is one owned class's adoption hold: who has reported, and how
// it ended. The Server's mu guards it.
type holdState struct {
	done     chan struct{} // closed when the hold ends
	how      string        // "" while holding; holdComplete, holdBound, or "released" (disowned)
	reported map[string]struct{}
	// lasted is how long the hold lasted, set when it ended (logged).
	lasted time.Duration
}

func newHoldState() holdState {
	return holdState{done: make(chan struct{}), reported: map[string]struct{}{}}
}

func (h *holdState) ended() bool { return h.how != "" }

// end ends the hold (once) and reports whether this call did. how "" is a
// release (the class was disowned), not counted.
func (h *holdState) end(how string) bool {
	if h.ended() {
		return false
	}
	h.how = how
	if how == "" {
		h.how = "released"
	}
	close(h.done)
	return true
}

// WithEntries sets how the owner side lists the live entry replicas (every
// registered router replica, this one included). Without it an adoption
// hold always lasts its whole bound.
func WithEntries(entries func() []string) ServerOption {
	return func(s *Server) { s.entries = entries }
}

// startHoldLocked arms the bound of oc's adoption hold: when it passes,
// the hold ends as "bound" unless it ended before. Without a hold it ends
// at once, uncounted. s.mu is held.
func (s *Server) startHoldLocked(class string, oc *ownedClass) {
	if s.adoptHold <= 0 || s.runCtx.Err() != nil {
		oc.hold.end("")
		return
	}
	s.holds.Add(1) // under s.mu, ordered with Run's stop (see onAdmit)
	t := s.clock.NewTimer(s.adoptHold)
	go func() {
		defer s.holds.Done()
		defer t.Stop()
		select {
		case <-t.C():
			s.mu.Lock()
			if s.owned[class] == oc && oc.hold.end(holdBound) {
				s.m.adoptHolds.WithLabelValues(holdBound).Inc()
				s.log.Debug("adoption hold ended at its bound", zap.String("class", class),
					zap.Int64("epoch", oc.epoch), zap.Int("reported", len(oc.hold.reported)))
			}
			s.mu.Unlock()
		case <-oc.hold.done:
		case <-s.runCtx.Done():
		}
	}()
}

// noteRehomed records that entry completed its re-home round for class at
// epoch, and ends the class's adoption hold when every live entry has.
func (s *Server) noteRehomed(class string, epoch int64, entry string) {
	var live []string
	if s.entries != nil {
		live = s.entries()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	oc, ok := s.owned[class]
	if !ok || oc.epoch != epoch || oc.hold.ended() {
		return
	}
	oc.hold.reported[entry] = struct{}{}
	if len(live) == 0 {
		return // nobody to wait for is known: the bound ends it
	}
	for _, e := range live {
		if _, ok := oc.hold.reported[e]; !ok {
			return
		}
	}
	now := s.clock.Now()
	oc.hold.lasted = s.adoptHold - oc.holdUntil.Sub(now)
	oc.holdUntil = now
	oc.hold.end(holdComplete)
	s.m.adoptHolds.WithLabelValues(holdComplete).Inc()
	s.log.Debug("adoption complete: hold ended", zap.String("class", class), zap.Int64("epoch", epoch),
		zap.Int("entries", len(live)), zap.Duration("after", oc.hold.lasted))
}

// AdoptHold reports how class's adoption hold stands: "" while it holds,
// "complete", "bound" or "released"; ok is false when this replica does
// not own class.
func (s *Server) AdoptHold(class string) (state string, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	oc, ok := s.owned[class]
	if !ok {
		return "", false
	}
	return oc.hold.how, true
}
