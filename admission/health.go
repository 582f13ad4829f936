package admission

import (
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// Degraded reports whether the replica is in a degraded mode: it admits
// every class locally because NATS is unreachable, it admits requests
// that find no owner locally because its etcd session is unhealthy, or it
// admits some classes locally because their owner is unreachable.
func (c *Client) Degraded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.degraded || c.etcdDown || len(c.unreachableOwnersLocked(c.clock.Now())) > 0
}

// DegradedModes names the degraded modes in force: "nats", "etcd" and/or
// "owner_unreachable" (see UnreachableOwners).
func (c *Client) DegradedModes() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	if c.degraded {
		out = append(out, "nats")
	}
	if c.etcdDown {
		out = append(out, "etcd")
	}
	if len(c.unreachableOwnersLocked(c.clock.Now())) > 0 {
		out = append(out, "owner_unreachable")
	}
	return out
}

func (c *Client) clusterHealthy() bool {
	return c.cfg.ClusterHealthy == nil || c.cfg.ClusterHealthy()
}

// checkConnection enters and leaves degraded mode, and gives up on the
// remote admits whose connection dropped (see connectionLost). Leaving
// degraded mode rejects the local actor's queued entries of classes owned
// elsewhere (ownership_lost), so their entry replicas resubmit them to the
// owners.
func (c *Client) checkConnection() {
	c.sampleAlive() // the split divisor, before a degraded mode freezes it
	down := !c.nc.IsConnected()
	etcdDown := !c.clusterHealthy()
	gen := c.nc.Stats().Reconnects
	c.mu.Lock()
	c.connectionLostLocked(down, gen)
	readopt := false
	if !down && gen != c.connGen {
		// A new connection: the owners may have expired the bookings whose
		// renewals the old one could not carry (a cut longer than their
		// booking expiry), and nothing else would ever book them again
		// when the owner and epoch did not change.
		c.connGen = gen
		readopt = c.markReadoptLocked() > 0
	}
	was, etcdWas := c.degraded, c.etcdDown
	c.degraded, c.etcdDown = down, etcdDown
	var foreign []string
	if (was && !down && !etcdDown) || (etcdWas && !etcdDown && !down) {
		// Every class a degraded admission may have queued here: the
		// known owners' and every class this entry has received.
		seen := make(map[string]struct{}, len(c.owners)+len(c.counts))
		for class := range c.owners {
			seen[class] = struct{}{}
		}
		for class := range c.counts {
			seen[class] = struct{}{}
		}
		for class := range seen {
			if _, ok := c.server.Owns(class); !ok {
				foreign = append(foreign, class)
			}
		}
	}
	c.mu.Unlock()
	switch {
	case down && !was:
		c.m.degraded.Set(1)
		c.log.Warn("NATS unreachable: degraded mode, admitting every class locally")
	case was && !down:
		c.m.degraded.Set(0)
		c.log.Info("NATS reachable again: normal mode")
	}
	switch {
	case etcdDown && !etcdWas:
		c.m.etcdDegraded.Set(1)
		c.log.Warn("etcd session unhealthy: requests that find no owner are admitted locally after a bound",
			zap.Duration("after", c.cfg.EtcdDegradedAfter))
	case etcdWas && !etcdDown:
		c.m.etcdDegraded.Set(0)
		c.log.Info("etcd session healthy again: normal mode")
	}
	if readopt {
		c.wake()
	}
	if !down && !etcdDown && len(foreign) == 0 {
		foreign = c.strayQueues()
	}
	if len(foreign) > 0 {
		// Entries a degraded mode queued here for classes owned elsewhere
		// go back to their owners (as retries).
		for _, class := range foreign {
			c.actor.RejectQueued(class, scheduler.ReasonOwnershipLost)
		}
		c.wake()
	}
}

// strayQueues returns the classes this replica neither owns nor admits in
// a degraded mode but whose entries wait in its actor's queue. Leaving a
// degraded mode rejects them once, at the transition; a degraded admission
// that decided just before it (on the etcd session's health, read live)
// and reached the actor just after would otherwise wait there with no
// owner to grant or return it. Checked on every status tick, so such an
// entry goes back to its owner within one tick.
func (c *Client) strayQueues() []string {
	snap := c.actor.Snapshot()
	if snap == nil || !c.clusterHealthy() {
		return nil
	}
	var out []string
	for class, cs := range snap.Classes {
		if cs.QueueDepth == 0 {
			continue
		}
		if _, owned := c.server.Owns(class); owned {
			continue
		}
		c.mu.Lock()
		_, fallback := c.unreachable[class]
		c.mu.Unlock()
		if !fallback {
			out = append(out, class)
		}
	}
	return out
}
