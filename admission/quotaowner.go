package admission

import (
	"context"
	"math"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The quota owner side of capacity leasing (see quota.go). The owner of a
// tenant's home class keeps the tenant's ledger: the slots each holder
// holds (the sum never exceeds the concurrency quota) and the central
// requests and tokens buckets the holders' credits are taken from. A grant
// is exactly what the holder needs when that leaves the tenant within half
// of a quota, plus the holder's slack when it stays under half: near the
// quota every slot and token is granted exactly. Before it refuses, the
// quota owner recalls the idle slack of the tenant's other holders, so one
// busy class can use the whole quota.
//
// A ledger is per home class and fencing epoch: a new owner of the home
// class starts an empty one, holds grants for the class's adoption hold
// while the holders re-report what they hold (they watch the owner map),
// and forgets a holder that has not reported for three QuotaConfig.Refresh.

// ledgerTenant is one tenant's quota at its quota owner.
type ledgerTenant struct {
	tenant   string
	home     string
	epoch    int64
	quota    scheduler.TenantQuota
	holders  map[string]*ledgerHolder
	slots    int // sum of the holders' slots
	rpm, tpm tokenBucket
	charged  bool      // the buckets changed since the last save (quotabuckets.go)
	lostAt   time.Time // when this replica was first seen not owning home at epoch
}

type ledgerHolder struct {
	slots    int
	credited bool // got requests or tokens since its last recall
	seen     time.Time
}

// tokenBucket is a bucket of capacity per minute refilled continuously (the
// Core's bucket). Its level may go below zero (a reported debt).
type tokenBucket struct {
	level float64
	at    int64 // Unix ns of the last refill; 0: never (full)
}

func (b *tokenBucket) refill(capacity int, now int64) {
	if b.at == 0 {
		b.level, b.at = float64(capacity), now
		return
	}
	if now > b.at {
		b.level += float64(capacity) * float64(now-b.at) / float64(time.Minute)
		b.at = now
	}
	b.level = min(b.level, float64(capacity))
}

// wait is how long until the bucket holds need.
func (b *tokenBucket) wait(capacity int, need float64) time.Duration {
	if b.level >= need || capacity <= 0 {
		return 0
	}
	return time.Duration(math.Ceil((need - b.level) / float64(capacity) * float64(time.Minute)))
}

func ledgerKey(home, tenant string) string { return home + "/" + tenant }

// onLease answers a holder's lease request.
func (q *Quota) onLease(m *nats.Msg) {
	in, err := wire.DecodeQuotaLease(m.Data)
	if err != nil {
		q.m.decodeErrors.WithLabelValues("quota_lease").Inc()
		return // the holder times out and falls back: never a false 429
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*q.cfg.RecallTimeout)
	defer cancel()
	b, err := wire.EncodeQuota(q.grant(ctx, in))
	if err == nil {
		_ = m.Respond(b)
	}
}

// grant applies a holder's report and grants what it wants, recalling
// other holders' idle slack first when the tenant is short.
func (q *Quota) grant(ctx context.Context, in *wire.QuotaLease) *wire.QuotaGrant {
	epoch, ok := q.server.Owns(in.Home)
	out := &wire.QuotaGrant{Owner: q.replica, Epoch: epoch}
	if !ok {
		out.NotOwner = true
		q.m.quotaGrants.WithLabelValues("not_owner").Inc()
		return out
	}
	now := q.clock.Now()
	wants := in.Want > 0 || in.WantRequests > 0 || in.WantTokens > 0
	q.lmu.Lock()
	t := q.ledgerForLocked(in.Home, in.Tenant, epoch)
	t.reportLocked(in, now)
	if !wants {
		q.lmu.Unlock()
		out.OK = true
		q.m.quotaGrants.WithLabelValues("report").Inc()
		return out
	}
	if hold := q.holdLeft(in.Home, now); hold > 0 {
		q.lmu.Unlock()
		out.HoldMs = max(1, hold.Milliseconds())
		q.m.quotaGrants.WithLabelValues("held").Inc()
		return out
	}
	limit, retry := t.fitsLocked(in, now.UnixNano())
	if limit != "" {
		targets := t.recallTargetsLocked(in.Holder)
		q.lmu.Unlock()
		rets := q.recall(ctx, in.Tenant, targets)
		now = q.clock.Now()
		q.lmu.Lock()
		t = q.ledgerForLocked(in.Home, in.Tenant, epoch)
		for _, r := range rets {
			t.returnLocked(r, now)
		}
		limit, retry = t.fitsLocked(in, now.UnixNano())
	}
	if limit != "" {
		q.lmu.Unlock()
		out.Limit, out.RetryAfterMs = limit, int64(math.Ceil(float64(retry)/float64(time.Millisecond)))
		q.m.quotaGrants.WithLabelValues("denied").Inc()
		return out
	}
	t.takeLocked(in, out, now.UnixNano())
	q.lmu.Unlock()
	out.OK = true
	q.m.quotaGrants.WithLabelValues("granted").Inc()
	return out
}

// holdLeft is the rest of home's adoption hold at this owner (Server).
func (q *Quota) holdLeft(home string, now time.Time) time.Duration {
	s := q.server
	s.mu.Lock()
	defer s.mu.Unlock()
	if oc, ok := s.owned[home]; ok {
		return max(0, oc.holdUntil.Sub(now))
	}
	return 0
}

func (q *Quota) ledgerForLocked(home, tenant string, epoch int64) *ledgerTenant {
	k := ledgerKey(home, tenant)
	t := q.ledger[k]
	if t == nil || t.epoch != epoch {
		t = &ledgerTenant{tenant: tenant, home: home, epoch: epoch, holders: map[string]*ledgerHolder{}}
		q.startCarried(t, q.clock.Now().UnixNano())
		q.ledger[k] = t
	}
	return t
}

func limitsOf(w wire.QuotaLimits) scheduler.TenantQuota {
	return scheduler.TenantQuota{Concurrent: w.Concurrent, RequestsPerMinute: w.RequestsPerMinute, TokensPerMinute: w.TokensPerMinute}
}

// reportLocked takes a holder's absolute slot count and its returns.
func (t *ledgerTenant) reportLocked(in *wire.QuotaLease, now time.Time) {
	if in.Quota != (wire.QuotaLimits{}) {
		t.quota = limitsOf(in.Quota)
	}
	h := t.holder(in.Holder)
	t.slots += in.Have - h.slots
	h.slots, h.seen = in.Have, now
	t.credit(in.ReturnRequests, in.ReturnTokens, now.UnixNano())
}

func (t *ledgerTenant) holder(id string) *ledgerHolder {
	h := t.holders[id]
	if h == nil {
		h = &ledgerHolder{}
		t.holders[id] = h
	}
	return h
}

// credit puts returned requests and tokens (a negative tokens return is a
// debt) back into the central buckets.
func (t *ledgerTenant) credit(reqs, toks int64, now int64) {
	if reqs != 0 || toks != 0 {
		t.charged = true
	}
	if c := t.quota.RequestsPerMinute; c > 0 && reqs != 0 {
		t.rpm.refill(c, now)
		t.rpm.level = min(float64(c), t.rpm.level+float64(reqs))
	}
	if c := t.quota.TokensPerMinute; c > 0 && toks != 0 {
		t.tpm.refill(c, now)
		t.tpm.level = min(float64(c), t.tpm.level+float64(toks))
	}
}

// returnLocked applies a holder's answer to a recall.
func (t *ledgerTenant) returnLocked(r *wire.QuotaReturn, now time.Time) {
	if r.Busy {
		return // its own lease request in flight reports it
	}
	h := t.holder(r.Holder)
	t.slots += r.Have - h.slots
	h.slots, h.seen, h.credited = r.Have, now, false
	t.credit(r.Requests, r.Tokens, now.UnixNano())
}

// fitsLocked reports the first quota the lease request would exceed and how
// long until it would not.
func (t *ledgerTenant) fitsLocked(in *wire.QuotaLease, now int64) (string, time.Duration) {
	q := t.quota
	if q.Concurrent > 0 && in.Want > 0 && t.slots+in.Want > q.Concurrent {
		return scheduler.LimitTenantConcurrent, 0
	}
	if c := q.RequestsPerMinute; c > 0 && in.WantRequests > 0 {
		t.rpm.refill(c, now)
		if d := t.rpm.wait(c, float64(in.WantRequests)); d > 0 {
			return scheduler.LimitTenantRequestsPerMinute, d
		}
	}
	if c := q.TokensPerMinute; c > 0 && in.WantTokens > 0 {
		t.tpm.refill(c, now)
		// More than the whole bucket (a debt to pay) passes when it is full.
		if d := t.tpm.wait(c, float64(min(in.WantTokens, int64(c)))); d > 0 {
			return scheduler.LimitTenantTokensPerMinute, d
		}
	}
	return "", 0
}

// takeLocked grants what fitsLocked accepted, with slack only while the
// tenant stays under half of each quota.
func (t *ledgerTenant) takeLocked(in *wire.QuotaLease, out *wire.QuotaGrant, now int64) {
	q := t.quota
	h := t.holder(in.Holder)
	t.charged = t.charged || in.WantRequests > 0 || in.WantTokens > 0
	if c := q.Concurrent; c > 0 && in.Want > 0 {
		g := in.Want + max(0, min(in.SlackSlots, c/2-(t.slots+in.Want)))
		h.slots += g
		t.slots += g
		out.Slots = g
	}
	if c := q.RequestsPerMinute; c > 0 && in.WantRequests > 0 {
		t.rpm.refill(c, now)
		left := t.rpm.level - float64(in.WantRequests)
		g := in.WantRequests + max(0, min(in.SlackRequests, int64(left-float64(c)/2)))
		t.rpm.level -= float64(g)
		out.Requests, h.credited = g, true
	}
	if c := q.TokensPerMinute; c > 0 && in.WantTokens > 0 {
		t.tpm.refill(c, now)
		left := t.tpm.level - float64(in.WantTokens)
		g := in.WantTokens + max(0, min(in.SlackTokens, int64(left-float64(c)/2)))
		t.tpm.level -= float64(g)
		out.Tokens, h.credited = g, true
	}
}

// recallTargetsLocked lists the holders other than requester that may hold
// idle slack.
func (t *ledgerTenant) recallTargetsLocked(requester string) []string {
	var out []string
	for id, h := range t.holders {
		if id != requester && (h.slots > 0 || h.credited) {
			out = append(out, id)
		}
	}
	return out
}

// recall asks holders for their idle slack of tenant, in parallel, each
// bounded by RecallTimeout. Holders that do not answer keep what they hold.
func (q *Quota) recall(ctx context.Context, tenant string, holders []string) []*wire.QuotaReturn {
	if len(holders) == 0 {
		return nil
	}
	b, err := wire.EncodeQuota(&wire.QuotaRecall{Tenant: tenant, Owner: q.replica})
	if err != nil {
		return nil
	}
	out := make([]*wire.QuotaReturn, len(holders))
	var wg sync.WaitGroup
	for i, h := range holders {
		if h == q.replica {
			out[i] = q.recallLocal(tenant)
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Wall time on purpose: a NATS round trip's timeout.
			rctx, cancel := context.WithTimeout(ctx, q.cfg.RecallTimeout)
			defer cancel()
			msg, err := q.nc.RequestWithContext(rctx, q.subj.QuotaRecall(h), b)
			if err != nil {
				q.m.quotaRecalls.WithLabelValues("error").Inc()
				return
			}
			r, err := wire.DecodeQuotaReturn(msg.Data)
			if err != nil || r.Holder != h {
				q.m.decodeErrors.WithLabelValues("quota_return").Inc()
				return
			}
			out[i] = r
		}()
	}
	wg.Wait()
	rets := out[:0]
	for _, r := range out {
		if r == nil {
			continue
		}
		if r.Busy {
			q.m.quotaRecalls.WithLabelValues("busy").Inc()
		} else {
			q.m.quotaRecalls.WithLabelValues("returned").Inc()
		}
		rets = append(rets, r)
	}
	return rets
}

// tidyLedger drops the ledgers of home classes this replica no longer owns
// (at their epoch), forgets holders silent for three Refresh, and drops
// tenants with no holder whose buckets are full again.
func (q *Quota) tidyLedger() {
	now := q.clock.Now()
	q.lmu.Lock()
	defer q.lmu.Unlock()
	for k, t := range q.ledger {
		if epoch, ok := q.server.Owns(t.home); !ok || epoch != t.epoch {
			// Kept a while for the final save of a release (Released
			// runs after Disown); a new ownership starts a new ledger.
			if t.lostAt.IsZero() {
				t.lostAt = now
			} else if now.Sub(t.lostAt) >= q.cfg.Refresh {
				delete(q.ledger, k)
			}
			continue
		}
		for id, h := range t.holders {
			if now.Sub(h.seen) >= 3*q.cfg.Refresh {
				t.slots -= h.slots
				delete(t.holders, id)
			}
		}
		if len(t.holders) == 0 && t.full(now.UnixNano()) {
			delete(q.ledger, k)
		}
	}
}

func (t *ledgerTenant) full(now int64) bool {
	if c := t.quota.RequestsPerMinute; c > 0 {
		t.rpm.refill(c, now)
		if t.rpm.level < float64(c) {
			return false
		}
	}
	if c := t.quota.TokensPerMinute; c > 0 {
		t.tpm.refill(c, now)
		if t.tpm.level < float64(c) {
			return false
		}
	}
	return true
}
