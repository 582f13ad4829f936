package admission

import (
	"context"
	"fmt"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// markReadoptLocked marks every live remote booking for re-adoption: the
// entry's NATS connection is new, and an entry cut for longer than the
// booking expiry has lost them at their owner (no renewal reached it). It
// returns how many it marked. c.mu is held.
func (c *Client) markReadoptLocked() int {
	n := 0
	for t := range c.inflight {
		t.mu.Lock()
		if !t.finished && !t.local {
			t.readopt = true
			n++
		}
		t.mu.Unlock()
	}
	return n
}

// rehome moves in-flight bookings whose class has a new owner to that owner
// (adopt), then frees them at the old one, so the ledger that admits the
// class keeps carrying their load. It also books again, at the class's
// current owner whatever its epoch, the bookings marked for re-adoption
// (markReadoptLocked), so the owner's ledger counts the entry's live
// streams again after a long cut; one that the owner still held is swapped
// for the new id and the old freed, so each stream is counted once.
func (c *Client) rehome(ctx context.Context) {
	type move struct {
		t   *Ticket
		rec scheduler.BookingRecord
		old Owner
		ins uint64 // the old owner's instance
		loc bool
		id  scheduler.BookingID
	}
	byClass := map[string][]move{}
	c.mu.Lock()
	degraded := c.degraded
	// The classes whose current owner has not had this entry's done
	// report yet: the round below ends with one for each.
	report := map[string]Owner{}
	for class := range c.rehomeDone {
		if _, ok := c.owners[class]; !ok {
			delete(c.rehomeDone, class) // the class left the policy, or has no owner now
		}
	}
	if !degraded {
		for class, o := range c.owners {
			if o.Replica != "" && o.Epoch > 0 && c.rehomeDone[class] != (rehomeReport{owner: o}) {
				report[class] = o
			}
		}
	}
	for t := range c.inflight {
		cur, ok := c.owners[t.class]
		if !ok || cur.Replica == "" || degraded {
			continue
		}
		t.mu.Lock()
		moved := t.owner.Replica != cur.Replica || (cur.Epoch != 0 && t.owner.Epoch != cur.Epoch && !t.local)
		if !t.finished && (moved || (t.readopt && !t.local)) {
			rec := t.rec
			rec.FirstTokenSeen = t.firstToken
			byClass[t.class] = append(byClass[t.class], move{t: t, rec: rec, old: t.owner, ins: t.instance, loc: t.local, id: t.booking})
		}
		t.mu.Unlock()
	}
	c.mu.Unlock()
	for class := range report {
		if _, ok := byClass[class]; !ok {
			byClass[class] = nil // a done report without bookings
		}
	}

	for class, moves := range byClass {
		recs := make([]scheduler.BookingRecord, len(moves))
		for i, mv := range moves {
			recs[i] = mv.rec
		}
		doneFor, reporting := report[class]
		ids, owner, instance, err := c.adopt(ctx, class, recs, doneFor.Epoch)
		if err != nil {
			c.log.Debug("re-home deferred", zap.String("class", class), zap.Error(err))
			c.mu.Lock()
			c.rehomeRetry = true
			c.mu.Unlock()
			continue
		}
		if reporting {
			c.mu.Lock()
			c.rehomeDone[class] = rehomeReport{owner: doneFor}
			c.mu.Unlock()
		}
		for i, mv := range moves {
			if ids[i] == 0 {
				continue
			}
			mv.t.mu.Lock()
			finished := mv.t.finished
			if !finished {
				mv.t.owner, mv.t.instance, mv.t.local, mv.t.booking = owner, instance, owner.Replica == c.replica, ids[i]
				mv.t.readopt = false
			}
			mv.t.mu.Unlock()
			if finished { // it ended while moving: free the new booking too
				c.release(owner, instance, owner.Replica == c.replica, ids[i], false, -1)
			}
			// Freeing the old id is a no-op at an owner that expired it.
			c.release(mv.old, mv.ins, mv.loc, mv.id, false, -1)
			c.m.rehomed.Inc()
		}
	}
}

// rehomeReport is the owner an entry last sent its done report for a
// class to (Client.rehomeDone).
type rehomeReport struct {
	owner Owner
}

// adopt books recs at the current owner of class (in-process when that is
// this replica). With doneEpoch > 0 it also reports this entry's re-home
// round for the class complete at that epoch (wire.AdoptRequest.Done), so
// that the owner can end its adoption hold.
func (c *Client) adopt(ctx context.Context, class string, recs []scheduler.BookingRecord, doneEpoch int64) ([]scheduler.BookingID, Owner, uint64, error) {
	if epoch, ok := c.server.Owns(class); ok {
		ids := make([]scheduler.BookingID, len(recs))
		for i := range recs {
			id, err := c.actor.Adopt(ctx, recs[i])
			if err != nil {
				return nil, Owner{}, 0, fmt.Errorf("adopt locally: %w", err)
			}
			ids[i] = id
		}
		if doneEpoch > 0 {
			c.server.noteRehomed(class, doneEpoch, c.replica)
		}
		return ids, Owner{Replica: c.replica, Epoch: epoch}, c.server.Instance(), nil
	}
	req := &wire.AdoptRequest{Entry: c.replica, Class: class, Bookings: make([]wire.AdoptedBooking, len(recs)),
		Epoch: doneEpoch, Done: doneEpoch > 0}
	for i := range recs {
		req.Bookings[i] = recordToWire(&recs[i])
	}
	b, err := wire.EncodeAdmission(req)
	if err != nil {
		return nil, Owner{}, 0, err
	}
	actx, cancel := context.WithTimeout(ctx, c.cfg.AdoptTimeout)
	defer cancel()
	msg, err := c.nc.RequestWithContext(actx, c.subj.Adopt(class), b)
	if err != nil {
		return nil, Owner{}, 0, fmt.Errorf("adopt %d bookings of class %s: %w", len(recs), class, err)
	}
	reply, err := wire.DecodeAdoptReply(msg.Data)
	if err != nil {
		c.m.decodeErrors.WithLabelValues("adopt_reply").Inc()
		return nil, Owner{}, 0, err
	}
	if reply.Error != "" || len(reply.Bookings) != len(recs) {
		return nil, Owner{}, 0, fmt.Errorf("adopt refused by %s: %s", reply.Owner, reply.Error)
	}
	ids := make([]scheduler.BookingID, len(reply.Bookings))
	for i, id := range reply.Bookings {
		ids[i] = scheduler.BookingID(id)
	}
	return ids, Owner{Replica: reply.Owner, Epoch: reply.Epoch}, reply.Instance, nil
}
