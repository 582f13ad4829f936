package admission

import (
	"sync"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Ticket is one granted request as its entry replica streams it. Its
// methods are safe for concurrent use; Finish is idempotent.
type Ticket struct {
	c     *Client
	class string
	grant scheduler.Grant

	mu         sync.Mutex
	owner      Owner
	instance   uint64 // the owner's instance (wire.LifeMark.Instance)
	local      bool
	booking    scheduler.BookingID
	rec        scheduler.BookingRecord
	firstToken bool
	finished   bool
	// readopt: the entry's NATS connection was replaced since this remote
	// booking was made or last re-homed, so its owner may have expired it
	// (no renewals reached it): rehome books it again at the class's owner
	// whatever the owner and epoch, and frees the old id.
	readopt bool
	used    int // reported token usage (SetUsage); -1 unknown
}

// SetUsage records the tokens (prompt plus output) the engine reported for
// the request; Finish then sends them with the done mark.
func (t *Ticket) SetUsage(tokens int) {
	t.mu.Lock()
	t.used = max(tokens, 0)
	t.mu.Unlock()
}

// Grant is the placement the owner granted.
func (t *Ticket) Grant() scheduler.Grant { return t.grant }

// Owner is the replica whose ledger currently carries the booking.
func (t *Ticket) Owner() Owner {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.owner
}

// Dispatched acknowledges the grant: the booking is final at its owner.
func (t *Ticket) Dispatched() {
	t.mu.Lock()
	owner, instance, local, id, done := t.owner, t.instance, t.local, t.booking, t.finished
	t.mu.Unlock()
	if done {
		return
	}
	if local {
		t.c.actor.Ack(id)
		return
	}
	t.c.publishLife(owner.Replica, instance, wire.LifeDispatched, owner.Epoch, id)
}

// FirstToken reports that the worker produced the first token: the prompt's
// prefill load leaves the ledger.
func (t *Ticket) FirstToken() {
	t.mu.Lock()
	if t.finished || t.firstToken {
		t.mu.Unlock()
		return
	}
	t.firstToken = true
	owner, instance, local, id := t.owner, t.instance, t.local, t.booking
	t.mu.Unlock()
	if local {
		t.c.actor.FirstToken(id)
		return
	}
	t.c.publishLife(owner.Replica, instance, wire.LifeFirstToken, owner.Epoch, id)
}

// Finish frees the booking (done, or aborted when the stream failed or the
// client went away). Only the first call has an effect.
func (t *Ticket) Finish(aborted bool) {
	t.mu.Lock()
	if t.finished {
		t.mu.Unlock()
		return
	}
	t.finished = true
	owner, instance, local, id, used := t.owner, t.instance, t.local, t.booking, t.used
	t.mu.Unlock()
	t.c.release(owner, instance, local, id, aborted, used)
	t.c.untrack(t)
}
