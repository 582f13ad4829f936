package admission

import (
	"errors"
	"maps"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// An owner registered in etcd that answers "no responders" on its class's
// admit subject cannot admit: it is cut from NATS while its etcd session
// lives (it keeps its key until it withdraws from placement), or it stopped
// admitting and has not let go yet. Its entries do not wait NoOwnerTimeout
// for it: past OwnerUnreachableAfter they admit the class locally, as in
// degraded mode, until the owner answers again or the class moves
// (docs/architecture.md, "Failures").

// errNoResponders is admitRemote's answer when the owner has no
// subscription on the class's admit subject.
var errNoResponders = errors.New("admission: the class owner has no responders")

// unreachableOwner is a class's registered owner that answered "no
// responders", since when, and whether requests were admitted locally
// because of it.
type unreachableOwner struct {
	owner    Owner
	since    time.Time
	fellBack bool
}

// noteNoResponders records that owner of class answered "no responders".
// The bound runs from the first such answer of this owner. An answer from
// an owner that is no longer the class's owner is not recorded: the class
// moved while the request was in flight (an owner that has released a
// class unsubscribes from it), and nothing would ever forget the record,
// since forgetMovedLocked runs only when the owners change again (e2e: a
// replica stayed degraded for a class it had come to own itself).
func (c *Client) noteNoResponders(class string, owner Owner) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.owners[class]; !ok || cur != owner {
		return
	}
	if u, ok := c.unreachable[class]; !ok || u.owner != owner {
		c.unreachable[class] = &unreachableOwner{owner: owner, since: c.clock.Now()}
	}
}

// unreachableUntil returns when owner of class will have been unreachable
// for OwnerUnreachableAfter (zero: it is not known to be unreachable).
func (c *Client) unreachableUntil(class string, owner Owner) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if u, ok := c.unreachable[class]; ok && u.owner == owner {
		return u.since.Add(c.cfg.OwnerUnreachableAfter)
	}
	return time.Time{}
}

// fellBack marks class as admitted locally because its owner is
// unreachable, and counts the admission.
func (c *Client) fellBack(class string) {
	c.mu.Lock()
	if u, ok := c.unreachable[class]; ok {
		u.fellBack = true
	}
	c.mu.Unlock()
	c.m.ownerUnreachableAdmits.WithLabelValues(class).Inc()
}

// ownerAnswered forgets class's unreachable owner: it answered over NATS.
func (c *Client) ownerAnswered(class string) {
	c.mu.Lock()
	u, ok := c.unreachable[class]
	delete(c.unreachable, class)
	natsDown := c.degraded
	c.mu.Unlock()
	if ok && u.fellBack && !natsDown {
		c.returnFallbacks([]string{class})
	}
}

// forgetMovedLocked drops the unreachable owners that are no longer their
// class's owner and returns the classes that had requests admitted locally
// because of them. c.mu is held.
func (c *Client) forgetMovedLocked() []string {
	var out []string
	for class, u := range c.unreachable {
		if cur, ok := c.owners[class]; ok && cur == u.owner {
			continue
		}
		delete(c.unreachable, class)
		if u.fellBack && !c.degraded {
			out = append(out, class)
		}
	}
	return out
}

// returnFallbacks rejects the entries this replica's actor still queues
// for classes it admitted locally only because their owner was unreachable
// (ownership_lost: their requests resubmit to the owner that answers now),
// unless this replica owns the class by now.
func (c *Client) returnFallbacks(classes []string) {
	for _, class := range classes {
		if _, owned := c.server.Owns(class); owned {
			continue
		}
		c.log.Info("class owner reachable again or replaced: local fallback ends", zap.String("class", class))
		c.actor.RejectQueued(class, scheduler.ReasonOwnershipLost)
	}
}

// UnreachableOwners lists the classes admitted locally because their
// registered owner has answered "no responders" for at least
// OwnerUnreachableAfter, with that owner.
func (c *Client) UnreachableOwners() map[string]string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unreachableOwnersLocked(c.clock.Now())
}

func (c *Client) unreachableOwnersLocked(now time.Time) map[string]string {
	out := map[string]string{}
	for class, u := range c.unreachable {
		if !now.Before(u.since.Add(c.cfg.OwnerUnreachableAfter)) {
			out[class] = u.owner.Replica
		}
	}
	return out
}

// exportUnreachable sets the gauge of classes whose owner is unreachable
// and logs when the set changes; checkConnection calls it.
func (c *Client) exportUnreachable(prev map[string]string) map[string]string {
	cur := c.UnreachableOwners()
	c.m.unreachableOwners.Set(float64(len(cur)))
	if !maps.Equal(cur, prev) && len(cur) > 0 {
		c.log.Warn("class owners unreachable over NATS (no responders): admitting their classes locally",
			zap.Any("classes", cur), zap.Duration("after", c.cfg.OwnerUnreachableAfter))
	}
	return cur
}
