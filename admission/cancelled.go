package admission

import (
	"sync"
	"time"
)

// A cancel can overtake its admit request. The entry publishes both on the
// owner's class subjects (admit.<class>, cancel.<class>), which the owner
// handles on two subscriptions, each on its own goroutine, so nothing orders
// them at the owner; after a NATS cut the client's reconnect buffer delivers
// an admit and the cancel the entry sent when it gave up on it back to back.
// A cancel handled first finds nothing to withdraw (Core.CancelAttempt
// knows neither the queued attempt nor a grant yet); the admit is then
// queued and granted, its reply goes to an inbox nobody waits on, and its
// booking holds a worker slot for the owner's whole AckTimeout (30 s by
// default) with nothing running on it. The owner therefore remembers each
// attempt it was told to cancel for cancelMemory, and a grant of a
// remembered attempt is withdrawn on the actor's turn (the Responder
// returns false: rolled back, counted cancelled), as if the cancel had
// arrived while it was queued.
//
// cancelMemory outlasts any admission an entry still waits for: the
// admission bound is NoOwnerTimeout + OwnerReplyTimeout (90 s by default).
const cancelMemory = 2 * time.Minute

type cancelKey struct {
	id      string
	attempt int
}

// cancelledAttempts remembers the attempts this owner was told to cancel.
// It is written by the cancel subscription and read on the actor's turn.
type cancelledAttempts struct {
	mu    sync.Mutex
	at    map[cancelKey]time.Time
	order []cancelKey // insertion order, for pruning
}

// add remembers (id, attempt) as cancelled at now and forgets the entries
// older than cancelMemory. Pruning walks from the oldest, so it costs the
// entries it forgets.
func (c *cancelledAttempts) add(id string, attempt int, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at == nil {
		c.at = map[cancelKey]time.Time{}
	}
	// A second cancel of the same attempt keeps the first one's time, so
	// that the order below stays the order of the times.
	k := cancelKey{id, attempt}
	if _, ok := c.at[k]; !ok {
		c.order = append(c.order, k)
		c.at[k] = now
	}
	n := 0
	for n < len(c.order) {
		if t, ok := c.at[c.order[n]]; ok && now.Sub(t) < cancelMemory {
			break
		}
		delete(c.at, c.order[n])
		n++
	}
	if n > 0 {
		c.order = append(c.order[:0], c.order[n:]...)
	}
}

// has reports whether (id, attempt) was cancelled.
func (c *cancelledAttempts) has(id string, attempt int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, ok := c.at[cancelKey{id, attempt}]
	return ok
}

// len is how many attempts are remembered.
func (c *cancelledAttempts) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.at)
}
