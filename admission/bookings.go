package admission

import (
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

func (c *Client) track(r *scheduler.Request, g scheduler.Grant, owner Owner, instance uint64, local bool) *Ticket {
	t := &Ticket{
		c: c, class: r.Class, grant: g, owner: owner, instance: instance, local: local, booking: g.Booking,
		rec: scheduler.BookingRecord{
			RequestID: r.ID, Class: r.Class, Worker: g.Worker, BlockHashes: r.HashesFor(g.BlockSize),
			PromptTokens: r.PromptTokens, CachedTokens: g.CachedTokens, TierCreditTokens: g.TierCreditTokens,
			ExpectedOutputTokens: r.ExpectedOutputTokens, Sequences: r.Sequences, Tenant: r.Tenant.ID,
			Decode: decodeRecord(r, g),
		},
		used: -1,
	}
	c.mu.Lock()
	c.inflight[t] = struct{}{}
	n := len(c.inflight)
	c.mu.Unlock()
	c.m.inflightBookings.Set(float64(n))
	return t
}

func (c *Client) untrack(t *Ticket) {
	c.mu.Lock()
	delete(c.inflight, t)
	n := len(c.inflight)
	c.mu.Unlock()
	c.m.inflightBookings.Set(float64(n))
}

// publishLife sends one lifecycle mark to a remote owner: the owner's
// instance and epoch that granted (or adopted) the bookings travel with it,
// so the owner's next life ignores it.
func (c *Client) publishLife(owner string, instance uint64, kind wire.LifeKind, epoch int64, ids ...scheduler.BookingID) {
	m := &wire.LifeMark{Entry: c.replica, Kind: kind, Epoch: epoch, Instance: instance, Bookings: make([]uint64, len(ids))}
	for i, id := range ids {
		m.Bookings[i] = uint64(id)
	}
	b, err := wire.EncodeAdmission(m)
	if err != nil {
		return
	}
	if err := c.nc.Publish(c.subj.Life(owner), b); err != nil {
		c.log.Debug("life mark not sent", zap.String("owner", owner), zap.String("kind", string(kind)), zap.Error(err))
	}
}

// renew tells every owner which of its bookings are still streaming.
func (c *Client) renew() {
	type ownerKey struct {
		replica  string
		instance uint64
		epoch    int64
	}
	byOwner := map[ownerKey][]scheduler.BookingID{}
	var local []scheduler.BookingID
	c.mu.Lock()
	for t := range c.inflight {
		t.mu.Lock()
		if !t.finished {
			if t.local {
				local = append(local, t.booking)
			} else {
				k := ownerKey{t.owner.Replica, t.instance, t.owner.Epoch}
				byOwner[k] = append(byOwner[k], t.booking)
			}
		}
		t.mu.Unlock()
	}
	c.mu.Unlock()
	if len(local) > 0 {
		c.actor.Renew(local)
	}
	for k, ids := range byOwner {
		c.publishLife(k.replica, k.instance, wire.LifeRenew, k.epoch, ids...)
		c.m.renewalsPublished.Inc()
	}
}

// release frees one booking at its owner. used >= 0 is the request's
// reported token usage, sent with a done mark (tenants.go in scheduler).
func (c *Client) release(owner Owner, instance uint64, local bool, id scheduler.BookingID, aborted bool, used int) {
	if local {
		if uf, ok := c.actor.(UsageFinisher); ok && used >= 0 && !aborted {
			uf.FinishUsage(id, used)
			return
		}
		c.actor.Finish(id)
		return
	}
	if used >= 0 && !aborted {
		c.publishDone(owner, instance, id, used)
		return
	}
	kind := wire.LifeDone
	if aborted {
		kind = wire.LifeAborted
	}
	c.publishLife(owner.Replica, instance, kind, owner.Epoch, id)
}

// publishDone sends a done mark with the booking's token usage.
func (c *Client) publishDone(owner Owner, instance uint64, id scheduler.BookingID, used int) {
	m := &wire.LifeMark{Entry: c.replica, Kind: wire.LifeDone, Epoch: owner.Epoch, Instance: instance,
		Bookings: []uint64{uint64(id)}, Used: []wire.LifeUsage{{Booking: uint64(id), Tokens: used}}}
	b, err := wire.EncodeAdmission(m)
	if err != nil {
		return
	}
	if err := c.nc.Publish(c.subj.Life(owner.Replica), b); err != nil {
		c.log.Debug("life mark not sent", zap.String("owner", owner.Replica), zap.String("kind", string(m.Kind)), zap.Error(err))
	}
}
