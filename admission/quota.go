package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Capacity leasing (design §16, docs/tenants.md "Quotas hold cluster-wide"):
// a tenant's quota is one budget across all its classes. Its quota owner is
// the current owner of its home class (exclusive through the class's etcd
// lease and fencing epoch, and known to every replica); the owners of the
// classes its requests are admitted in (holders) lease slices of its
// concurrency, requests and tokens from the quota owner before their actor
// sees a request, and release them when the booking ends.
//
// Holder side (this file): Acquire takes a slot, one request and the
// request's token estimate from the tenant's local lease under a mutex, with
// no I/O (fast path); when the lease is short it asks the quota owner for
// the difference plus a little slack (slow path: a NATS round trip, or a
// call when this replica is the quota owner). Idle slack goes back after
// QuotaConfig.Linger, and at once when the quota owner recalls it. The
// Core's TenantHook releases a slot when its booking ends and corrects the
// tokens with the engine's reported usage. The quota owner side is in
// quotaowner.go.
//
// The Core of every class owner still enforces the tenant's quota for what
// it admits (scheduler/tenants.go): with leasing that per-owner check never
// binds before the lease does, and it is what remains when the quota owner
// cannot be asked (fallback, counted).

// QuotaConfig tunes capacity leasing.
type QuotaConfig struct {
	// HomeOf returns a tenant's home class (its default class, else the
	// policy's default); "" leaves the tenant to per-owner enforcement.
	HomeOf func(tenant string) string
	// Linger is how long a holder keeps idle slack before it returns it.
	Linger time.Duration
	// Refresh is how often a holder re-reports a lease it keeps slots of;
	// a quota owner forgets a holder not heard from for three of them.
	Refresh time.Duration
	// LeaseTimeout bounds one lease round trip; past it (or on "no
	// responders") the request falls back to per-owner enforcement, and so
	// do the tenant's requests that find its lease short during the next
	// LeaseTimeout, without asking.
	LeaseTimeout time.Duration
	// RecallTimeout bounds a quota owner's recall of idle slack.
	RecallTimeout time.Duration
	// OwnerWait is how long a request waits for its tenant's home class to
	// have an owner before it falls back.
	OwnerWait time.Duration
}

// DefaultQuotaConfig returns the defaults.
func DefaultQuotaConfig() QuotaConfig {
	return QuotaConfig{
		Linger:        200 * time.Millisecond,
		Refresh:       10 * time.Second,
		LeaseTimeout:  500 * time.Millisecond,
		RecallTimeout: 200 * time.Millisecond,
		OwnerWait:     500 * time.Millisecond,
	}
}

// Validate names the first bad field.
func (c QuotaConfig) Validate() error {
	switch {
	case c.Linger <= 0:
		return errors.New("admission: quota Linger must be > 0")
	case c.Refresh <= 0:
		return errors.New("admission: quota Refresh must be > 0")
	case c.LeaseTimeout <= 0 || c.RecallTimeout <= 0:
		return errors.New("admission: quota LeaseTimeout and RecallTimeout must be > 0")
	case c.OwnerWait < 0:
		return errors.New("admission: quota OwnerWait must be >= 0")
	}
	return nil
}

// Quota is one replica's capacity leasing: the holder side for the classes
// it owns and the quota owner side for the tenants whose home class it
// owns. It implements scheduler.TenantHook (install it on the Core before
// the actor runs) and is safe for concurrent use.
type Quota struct {
	cfg     QuotaConfig
	replica string
	nc      *nats.Conn
	subj    wire.Subjects
	server  *Server
	client  *Client
	clock   clock.Clock
	log     *zap.Logger
	m       *Metrics

	mu     sync.Mutex
	leases map[string]*lease // holder side, by tenant
	booked map[scheduler.BookingID]bookedLease

	lmu     sync.Mutex
	ledger  map[string]*ledgerTenant          // quota owner side, by home class and tenant
	carried map[string]scheduler.TenantBucket // central levels loaded at Acquired, until a ledger starts

	store        BucketStore // nil: the central buckets start full at a new quota owner
	storeEvery   time.Duration
	storeTimeout time.Duration

	kick chan struct{} // size one: a lease needs reporting
}

// NewQuota returns the capacity leasing of the replica whose owner and
// entry sides are server and client, and installs it on server: call it
// before server and client run. It subscribes nothing until Run.
func NewQuota(cfg QuotaConfig, server *Server, client *Client, log *zap.Logger) *Quota {
	q := &Quota{
		cfg: cfg, replica: server.replica, nc: server.nc, subj: server.subj, server: server, client: client,
		clock: server.clock, log: log.Named("quota"), m: server.m,
		leases: map[string]*lease{}, booked: map[scheduler.BookingID]bookedLease{},
		ledger: map[string]*ledgerTenant{}, carried: map[string]scheduler.TenantBucket{}, kick: make(chan struct{}, 1),
	}
	server.quota = q
	return q
}

// lease is a holder's share of one tenant's quota.
type lease struct {
	tenant, home string
	rpc          sync.Mutex // one lease round trip at a time (Have is then exact)

	mu         sync.Mutex
	quota      scheduler.TenantQuota
	slots      int   // concurrency slots granted
	used       int   // bookings (and requests on their way to the actor) holding one
	reqs, toks int64 // requests and tokens taken from the central buckets, not yet spent
	lastUse    time.Time
	reported   time.Time
	owner      string // the quota owner last reported to
	dirty      bool   // slots changed without the quota owner knowing (adoption)
	dead       bool   // dropped from Quota.leases: look it up again
	// unreachableUntil: the quota owner did not answer; until then the
	// slow path falls back at once instead of waiting LeaseTimeout again.
	unreachableUntil time.Time
}

// bookedLease is what a booking holds of its tenant's lease.
type bookedLease struct {
	l   *lease
	est int64 // tokens charged (0: none)
}

// quotaTicket is one request's hold on its lease between Acquire and the
// actor's answer (settle).
type quotaTicket struct {
	q    *Quota
	l    *lease
	est  int64
	reqs bool
	toks bool
}

// leased reports whether r's tenant quota is leased here.
func leased(r *scheduler.Request) bool {
	return r.Tenant.ID != "" && !r.Probe && r.Tenant.Quota != (scheduler.TenantQuota{})
}

func (q *Quota) leaseOf(tenant string) *lease {
	q.mu.Lock()
	defer q.mu.Unlock()
	l := q.leases[tenant]
	if l == nil {
		home := ""
		if q.cfg.HomeOf != nil {
			home = q.cfg.HomeOf(tenant)
		}
		l = &lease{tenant: tenant, home: home}
		q.leases[tenant] = l
	}
	return l
}

// tryTake is the fast path: a slot, a request and est tokens from the
// local lease, or nil when it is short of one of them.
func (l *lease) tryTake(q *Quota, quota scheduler.TenantQuota, est int64, now time.Time) *quotaTicket {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.dead {
		return nil
	}
	l.quota = quota
	if (quota.Concurrent > 0 && l.used >= l.slots) ||
		(quota.RequestsPerMinute > 0 && l.reqs < 1) ||
		(quota.TokensPerMinute > 0 && l.toks < est) {
		return nil
	}
	t := &quotaTicket{q: q, l: l, est: est}
	l.used++
	if quota.RequestsPerMinute > 0 {
		l.reqs--
		t.reqs = true
	}
	if quota.TokensPerMinute > 0 {
		l.toks -= est
		t.toks = true
	}
	l.lastUse = now
	return t
}

// acquire checks r against its tenant's cluster-wide quota before the actor
// sees it. It returns nil, nil when r's quota is not leased (no tenant or
// quota, or the quota owner could not be asked: the Core's per-owner check
// applies), a ticket to settle with the actor's answer, or the quota's
// rejection.
func (q *Quota) acquire(ctx context.Context, r *scheduler.Request) (*quotaTicket, error) {
	if q == nil || !leased(r) {
		return nil, nil
	}
	quota := r.Tenant.Quota
	est := r.TenantEstimate()
	if tpm := int64(quota.TokensPerMinute); tpm > 0 {
		// One request larger than the whole bucket passes when it is full.
		est = min(est, tpm)
	}
	for {
		l := q.leaseOf(r.Tenant.ID)
		if t := l.tryTake(q, quota, est, q.clock.Now()); t != nil {
			q.m.quotaFast.Inc()
			return t, nil
		}
		q.m.quotaSlow.Inc()
		t, retry, err := q.acquireSlow(ctx, l, r.Tenant.ID, quota, est)
		if !retry {
			if scheduler.ReasonOf(err) == scheduler.ReasonQuotaExceeded && !r.Probe {
				// Counted like the Core's own rejections, at this owner.
				q.client.mu.Lock()
				q.client.countLocked(r.Class).Rejected[scheduler.ReasonQuotaExceeded.String()]++
				q.client.mu.Unlock()
			}
			return t, err
		}
	}
}

// tryFast is acquire's fast path alone: ok is false when the slow path is
// needed.
func (q *Quota) tryFast(r *scheduler.Request) (t *quotaTicket, ok bool) {
	if q == nil || !leased(r) {
		return nil, true
	}
	est := r.TenantEstimate()
	if tpm := int64(r.Tenant.Quota.TokensPerMinute); tpm > 0 {
		est = min(est, tpm)
	}
	if t := q.leaseOf(r.Tenant.ID).tryTake(q, r.Tenant.Quota, est, q.clock.Now()); t != nil {
		q.m.quotaFast.Inc()
		return t, true
	}
	return nil, false
}

// acquireSlow asks the quota owner for what l lacks, then takes it. retry
// is true when l was dropped meanwhile (look the lease up again).
func (q *Quota) acquireSlow(ctx context.Context, l *lease, tenant string, quota scheduler.TenantQuota, est int64) (*quotaTicket, bool, error) {
	l.rpc.Lock()
	defer l.rpc.Unlock()
	// waitForOwner waits a little for the home class to have an owner (or
	// for the one asked to become it); after OwnerWait it reports that the
	// caller falls back to the per-owner check (counted).
	waitedOwner := time.Duration(0)
	waitForOwner := func() (fallBack bool, err error) {
		if waitedOwner >= q.cfg.OwnerWait {
			q.m.quotaFallbacks.WithLabelValues("no_owner").Inc()
			return true, nil
		}
		d := 20 * time.Millisecond
		waitedOwner += d
		return false, q.sleep(ctx, d)
	}
	for {
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
		now := q.clock.Now()
		if t := l.tryTake(q, quota, est, now); t != nil {
			return t, false, nil
		}
		l.mu.Lock()
		dead, cut := l.dead, now.Before(l.unreachableUntil)
		in := l.requestLocked(q.replica, quota, est)
		l.mu.Unlock()
		if dead {
			return nil, true, nil
		}
		if cut {
			q.m.quotaFallbacks.WithLabelValues("unreachable").Inc()
			return nil, false, nil
		}
		if in.Home == "" {
			q.m.quotaFallbacks.WithLabelValues("no_owner").Inc()
			return nil, false, nil
		}
		owner, ok := q.quotaOwner(in.Home)
		if !ok {
			if fallBack, err := waitForOwner(); fallBack || err != nil {
				return nil, false, err
			}
			continue
		}
		out, err := q.call(ctx, owner, in)
		if err != nil {
			if ctx.Err() != nil {
				return nil, false, ctx.Err()
			}
			q.m.quotaLeaseRequests.WithLabelValues("error").Inc()
			q.m.quotaFallbacks.WithLabelValues("unreachable").Inc()
			l.mu.Lock()
			l.unreachableUntil = q.clock.Now().Add(q.cfg.LeaseTimeout)
			l.mu.Unlock()
			q.log.Debug("quota owner not reached: per-owner quota applies", zap.String("tenant", tenant),
				zap.String("owner", owner), zap.Error(err))
			return nil, false, nil
		}
		switch {
		case out.OK:
			q.m.quotaLeaseRequests.WithLabelValues("granted").Inc()
			l.mu.Lock()
			l.slots += out.Slots // adoption may have added some meanwhile
			l.reqs += out.Requests
			l.toks += out.Tokens
			l.owner, l.reported = out.Owner, now
			l.mu.Unlock()
		case out.HoldMs > 0:
			q.m.quotaLeaseRequests.WithLabelValues("held").Inc()
			l.mu.Lock()
			l.owner, l.reported = out.Owner, now
			l.mu.Unlock()
			if err := q.sleep(ctx, time.Duration(out.HoldMs)*time.Millisecond); err != nil {
				return nil, false, err
			}
		case out.NotOwner:
			q.m.quotaLeaseRequests.WithLabelValues("not_owner").Inc()
			if fallBack, err := waitForOwner(); fallBack || err != nil {
				return nil, false, err
			}
		default:
			q.m.quotaLeaseRequests.WithLabelValues("denied").Inc()
			l.mu.Lock()
			l.owner, l.reported = out.Owner, now
			l.mu.Unlock()
			return nil, false, &scheduler.RejectError{Reason: scheduler.ReasonQuotaExceeded, Limit: out.Limit,
				RetryAfter: time.Duration(out.RetryAfterMs) * time.Millisecond,
				Detail:     fmt.Sprintf("tenant %s is over its %s quota (across its classes)", tenant, out.Limit)}
		}
	}
}

// requestLocked is the lease request for what one more request of est
// tokens needs, with slack. l.mu is held.
func (l *lease) requestLocked(holder string, quota scheduler.TenantQuota, est int64) *wire.QuotaLease {
	in := &wire.QuotaLease{Tenant: l.tenant, Home: l.home, Holder: holder, Have: l.slots,
		Quota: wire.QuotaLimits{Concurrent: quota.Concurrent, RequestsPerMinute: quota.RequestsPerMinute, TokensPerMinute: quota.TokensPerMinute}}
	if c := quota.Concurrent; c > 0 && l.used+1 > l.slots {
		in.Want = l.used + 1 - l.slots
		in.SlackSlots = max(1, c/16)
	}
	if rpm := quota.RequestsPerMinute; rpm > 0 && l.reqs < 1 {
		in.WantRequests = 1 - l.reqs
		in.SlackRequests = max(1, int64(rpm)/32)
	}
	if tpm := quota.TokensPerMinute; tpm > 0 && l.toks < est {
		in.WantTokens = est - l.toks
		in.SlackTokens = max(est, int64(tpm)/32)
	}
	return in
}

// quotaOwner returns the replica owning home now.
func (q *Quota) quotaOwner(home string) (string, bool) {
	if _, ok := q.server.Owns(home); ok {
		return q.replica, true
	}
	q.client.mu.Lock()
	o, ok := q.client.owners[home]
	q.client.mu.Unlock()
	if !ok || o.Replica == "" || o.Replica == q.replica {
		return "", false
	}
	return o.Replica, true
}

// call sends one lease request to owner (in-process when it is this
// replica).
func (q *Quota) call(ctx context.Context, owner string, in *wire.QuotaLease) (*wire.QuotaGrant, error) {
	if owner == q.replica {
		return q.grant(ctx, in), nil
	}
	b, err := wire.EncodeQuota(in)
	if err != nil {
		return nil, err
	}
	// Wall time on purpose: a NATS round trip's timeout, not a quota's.
	cctx, cancel := context.WithTimeout(ctx, q.cfg.LeaseTimeout)
	defer cancel()
	msg, err := q.nc.RequestWithContext(cctx, q.subj.Quota(owner), b)
	if err != nil {
		return nil, fmt.Errorf("lease of tenant %s from %s: %w", in.Tenant, owner, err)
	}
	out, err := wire.DecodeQuotaGrant(msg.Data)
	if err != nil {
		q.m.decodeErrors.WithLabelValues("quota_grant").Inc()
		return nil, err
	}
	return out, nil
}

func (q *Quota) sleep(ctx context.Context, d time.Duration) error {
	t := q.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C():
		return nil
	}
}

// settle ends a ticket with the actor's answer, on the actor's turn: a
// rejected request gives back what it took; a granted one holds its slot
// until its booking ends (BookingFreed).
func (t *quotaTicket) settle(g scheduler.Grant, err error) {
	if t == nil {
		return
	}
	if err != nil || g.Booking == 0 {
		t.cancel()
		return
	}
	q := t.q
	bl := bookedLease{l: t.l}
	if t.toks {
		bl.est = t.est
	}
	q.mu.Lock()
	q.booked[g.Booking] = bl
	q.mu.Unlock()
}

// cancel gives back everything the ticket took.
func (t *quotaTicket) cancel() {
	if t == nil {
		return
	}
	l := t.l
	l.mu.Lock()
	l.used--
	if t.reqs {
		l.reqs++
	}
	if t.toks {
		l.toks += t.est
	}
	l.mu.Unlock()
}

// BookingFreed implements scheduler.TenantHook: the booking's slot is free
// again, and its tokens are corrected with the reported usage.
func (q *Quota) BookingFreed(id scheduler.BookingID, _ string, used int) {
	q.mu.Lock()
	bl, ok := q.booked[id]
	delete(q.booked, id)
	q.mu.Unlock()
	if !ok {
		return
	}
	l := bl.l
	l.mu.Lock()
	l.used--
	if used >= 0 && bl.est > 0 {
		l.toks += bl.est - int64(used)
	}
	l.lastUse = q.clock.Now()
	l.mu.Unlock()
}

// BookingAdopted implements scheduler.TenantHook: a stream re-homed here
// holds a slot of its tenant's lease at once (it cannot be refused); the
// quota owner learns of it at the next report, which Run sends now.
func (q *Quota) BookingAdopted(id scheduler.BookingID, tenant string) {
	for {
		l := q.leaseOf(tenant)
		l.mu.Lock()
		if l.dead {
			l.mu.Unlock()
			continue
		}
		l.used++
		if l.used > l.slots {
			l.slots = l.used
			l.dirty = true
		}
		l.lastUse = q.clock.Now()
		l.mu.Unlock()
		q.mu.Lock()
		q.booked[id] = bookedLease{l: l}
		q.mu.Unlock()
		select {
		case q.kick <- struct{}{}:
		default:
		}
		return
	}
}

// Run serves lease and recall requests and keeps the leases tidy (returns
// idle slack after Linger, reports adopted slots and a moved quota owner,
// forgets silent holders) until ctx ends.
func (q *Quota) Run(ctx context.Context) error {
	var subs []*nats.Subscription
	for subject, h := range map[string]nats.MsgHandler{
		q.subj.Quota(q.replica):       q.onLease,
		q.subj.QuotaRecall(q.replica): q.onRecall,
	} {
		sub, err := q.nc.Subscribe(subject, h)
		if err != nil {
			for _, s := range subs {
				_ = s.Unsubscribe()
			}
			return fmt.Errorf("subscribe %s: %w", subject, err)
		}
		subs = append(subs, sub)
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()
	tick := q.clock.NewTicker(q.cfg.Linger / 2)
	defer tick.Stop()
	var save <-chan time.Time
	if q.store != nil {
		st := q.clock.NewTicker(q.storeEvery)
		defer st.Stop()
		save = st.C()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		case <-q.kick:
		case <-save:
			q.saveBuckets(ctx)
			continue
		}
		q.tidy(ctx)
		q.tidyLedger()
	}
}

// tidy reports the leases that need it: idle slack past Linger goes back,
// adopted slots and a moved quota owner are reported, and a lease with
// slots is refreshed; an empty idle lease is dropped.
func (q *Quota) tidy(ctx context.Context) {
	now := q.clock.Now()
	q.mu.Lock()
	leases := make([]*lease, 0, len(q.leases))
	for _, l := range q.leases {
		leases = append(leases, l)
	}
	q.mu.Unlock()
	for _, l := range leases {
		if l.home == "" {
			continue
		}
		owner, ok := q.quotaOwner(l.home)
		l.mu.Lock()
		idle := now.Sub(l.lastUse) >= q.cfg.Linger
		slack := l.slots > max(0, l.used) || l.reqs != 0 || l.toks != 0
		moved := ok && l.owner != "" && l.owner != owner && (l.slots > 0 || l.used > 0)
		stale := l.slots > 0 && now.Sub(l.reported) >= q.cfg.Refresh
		need := l.dirty || moved || stale || (idle && slack)
		empty := idle && !slack && l.used == 0 && l.slots == 0
		if empty && now.Sub(l.lastUse) >= 10*q.cfg.Linger {
			l.dead = true
		}
		dead := l.dead
		l.mu.Unlock()
		if dead {
			q.mu.Lock()
			if q.leases[l.tenant] == l {
				delete(q.leases, l.tenant)
			}
			q.mu.Unlock()
			continue
		}
		if need && ok {
			q.report(ctx, l, owner, idle)
		}
	}
}

// report tells owner what l holds, giving back its idle slack when
// giveBack. Skipped while a lease round trip of l is on its way.
func (q *Quota) report(ctx context.Context, l *lease, owner string, giveBack bool) {
	if !l.rpc.TryLock() {
		return
	}
	defer l.rpc.Unlock()
	l.mu.Lock()
	in := &wire.QuotaLease{Tenant: l.tenant, Home: l.home, Holder: q.replica,
		Quota: wire.QuotaLimits{Concurrent: l.quota.Concurrent, RequestsPerMinute: l.quota.RequestsPerMinute, TokensPerMinute: l.quota.TokensPerMinute}}
	if giveBack {
		l.slots = max(0, l.used)
		in.ReturnRequests, in.ReturnTokens = max(0, l.reqs), l.toks
		l.reqs -= in.ReturnRequests
		l.toks = 0
	}
	in.Have = l.slots
	l.dirty = false
	l.mu.Unlock()
	// Returned credits are not restored when the report fails: a lost
	// return can only make the quota stricter, never looser.
	out, err := q.call(ctx, owner, in)
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil || out.NotOwner {
		l.dirty = true
		q.m.quotaLeaseRequests.WithLabelValues("error").Inc()
		return
	}
	q.m.quotaLeaseRequests.WithLabelValues("report").Inc()
	l.owner, l.reported = owner, q.clock.Now()
}

// onRecall answers a quota owner's recall of a tenant's idle slack.
func (q *Quota) onRecall(m *nats.Msg) {
	in, err := wire.DecodeQuotaRecall(m.Data)
	if err != nil {
		q.m.decodeErrors.WithLabelValues("quota_recall").Inc()
		return
	}
	out := q.recallLocal(in.Tenant)
	b, err := wire.EncodeQuota(out)
	if err == nil {
		_ = m.Respond(b)
	}
}

// recallLocal gives back this holder's idle slack of tenant: slots not in
// use, and all request and token credit (a token debt too).
func (q *Quota) recallLocal(tenant string) *wire.QuotaReturn {
	out := &wire.QuotaReturn{Holder: q.replica}
	q.mu.Lock()
	l := q.leases[tenant]
	q.mu.Unlock()
	if l == nil {
		return out
	}
	if !l.rpc.TryLock() {
		l.mu.Lock()
		out.Have, out.Busy = l.slots, true
		l.mu.Unlock()
		return out
	}
	defer l.rpc.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.slots = min(l.slots, max(0, l.used))
	out.Have = l.slots
	out.Requests, out.Tokens = max(0, l.reqs), l.toks
	l.reqs -= out.Requests
	l.toks = 0
	return out
}
