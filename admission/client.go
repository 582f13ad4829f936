package admission

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// ClientConfig tunes the entry side.
type ClientConfig struct {
	// RenewInterval is how often in-flight bookings are renewed; it must be
	// well below the owners' booking expiry (default 30 s).
	RenewInterval time.Duration
	// BackoffMin and BackoffMax bound the wait between attempts while a
	// class has no owner.
	BackoffMin, BackoffMax time.Duration
	// NoOwnerTimeout is how long a request without a deadline waits for its
	// class to get an owner before it is rejected with ownership_lost.
	NoOwnerTimeout time.Duration
	// AdoptTimeout bounds one adopt round trip.
	AdoptTimeout time.Duration
	// AbandonGrace is how long an admit request waiting on an owner that
	// lost the class may still receive that owner's answer before it is
	// resubmitted. A gracefully departing owner rejects its queue with
	// ownership_lost before it deletes its key, but the etcd watch can
	// overtake that NATS reply; without the grace the entry would resubmit
	// a request the old owner already counted as received, and the new
	// owner would count it again.
	AbandonGrace time.Duration
	// OwnerReplyTimeout bounds the wait for the owner's answer to one admit
	// request that has no deadline: when it passes (the reply was lost, the
	// owner hangs), the request is cancelled there and resubmitted as a
	// retry (counted as reply_timeout). A request with a deadline waits
	// until its deadline instead. It should exceed the longest expected
	// queue wait, since a resubmission queues again.
	OwnerReplyTimeout time.Duration
	// Clock is what the entry side reads and waits on (nil: wall time). It
	// must be the clock of the replica's scheduler.
	Clock scheduler.Clock
	// ClusterHealthy reports whether this replica's etcd session is healthy
	// (nil: always). While it is not, no class owner can be trusted to be
	// admitting (every owner that lost etcd has fenced itself, and the
	// ownership view may be stale), so a request that has waited
	// EtcdDegradedAfter for an owner is admitted by this replica's own
	// scheduler instead (degraded mode, counted like NATS's).
	ClusterHealthy func() bool
	// EtcdDegradedAfter is how long a request waits for an owner while the
	// etcd session is unhealthy before it is admitted locally.
	EtcdDegradedAfter time.Duration
}

// DefaultClientConfig returns the defaults.
func DefaultClientConfig() ClientConfig {
	return ClientConfig{
		RenewInterval:  10 * time.Second,
		BackoffMin:     5 * time.Millisecond,
		BackoffMax:     250 * time.Millisecond,
		NoOwnerTimeout: 30 * time.Second,
		AdoptTimeout:   2 * time.Second,
		AbandonGrace:   500 * time.Millisecond,

		OwnerReplyTimeout: time.Minute,
		EtcdDegradedAfter: 2 * time.Second,
	}
}

// Validate names the first bad field.
func (c ClientConfig) Validate() error {
	switch {
	case c.RenewInterval <= 0:
		return fmt.Errorf("admission: RenewInterval must be > 0")
	case c.BackoffMin <= 0 || c.BackoffMax < c.BackoffMin:
		return fmt.Errorf("admission: need 0 < BackoffMin <= BackoffMax")
	case c.NoOwnerTimeout <= 0:
		return fmt.Errorf("admission: NoOwnerTimeout must be > 0")
	case c.AdoptTimeout <= 0:
		return fmt.Errorf("admission: AdoptTimeout must be > 0")
	case c.AbandonGrace < 0:
		return fmt.Errorf("admission: AbandonGrace must be >= 0")
	case c.OwnerReplyTimeout <= 0:
		return fmt.Errorf("admission: OwnerReplyTimeout must be > 0")
	case c.EtcdDegradedAfter <= 0:
		return fmt.Errorf("admission: EtcdDegradedAfter must be > 0")
	}
	return nil
}

// Client is the entry side of admission. See the package doc.
type Client struct {
	cfg     ClientConfig
	replica string
	nc      *nats.Conn
	subj    wire.Subjects
	actor   Actor
	server  *Server
	log     *zap.Logger
	m       *Metrics

	mu          sync.Mutex
	rehomeRetry bool // a re-home was deferred: Run retries it
	owners      map[string]Owner
	epochs      map[string]int64 // newest epoch ever seen per class (fencing)
	changed     chan struct{}    // closed and replaced on every ownership change
	pending     map[*pendingAdmit]struct{}
	inflight    map[*Ticket]struct{}
	degraded    bool // NATS unreachable: every class is admitted locally
	etcdDown    bool // the etcd session is unhealthy: requests without a reachable owner fall back to local admission
	// leaving is closed by Leave: the replica is going away, and a request
	// that would wait for an owner is answered at once instead.
	leaving   chan struct{}
	leaveOnce sync.Once
	counts    map[string]*metrics.AdmissionCounts // per class, cumulative (see Counts)
	instance  uint64
	seq       uint64

	kick    chan struct{} // size one: wakes the re-home loop
	abandon chan struct{} // size one: an abandon grace started (Run arms its timer)
	clock   scheduler.Clock
}

type pendingAdmit struct {
	class      string
	owner      Owner
	cancel     context.CancelFunc
	abandoning bool      // the owner changed; abandoned after AbandonGrace
	abandonAt  time.Time // when abandoning: on the client's clock
	abandoned  bool      // given up on: the request is resubmitted
	// conn is the connection's reconnect count when the request was sent;
	// connLost is set (and the wait cancelled) once that connection is
	// gone: the owner's reply, addressed to an inbox of the lost
	// connection, can never arrive.
	conn     uint64
	connLost bool
}

// NewClient returns the entry side for replica. actor and server are this
// replica's own admission actor and owner side.
func NewClient(cfg ClientConfig, replica, cluster string, nc *nats.Conn, actor Actor, server *Server, log *zap.Logger, m *Metrics) *Client {
	return &Client{
		cfg: cfg, replica: replica, nc: nc, subj: wire.NewSubjects(cluster),
		actor: actor, server: server, log: log.Named("admission_client"), m: m,
		owners: map[string]Owner{}, epochs: map[string]int64{}, changed: make(chan struct{}),
		pending: map[*pendingAdmit]struct{}{}, inflight: map[*Ticket]struct{}{},
		counts: map[string]*metrics.AdmissionCounts{}, instance: rand.Uint64(),
		kick: make(chan struct{}, 1), abandon: make(chan struct{}, 1), clock: clockOr(cfg.Clock),
		leaving: make(chan struct{}),
	}
}

func clockOr(c scheduler.Clock) scheduler.Clock {
	if c == nil {
		return scheduler.RealClock{}
	}
	return c
}

// Counts returns the entry side's cumulative counters as an exporter
// snapshot: every request this replica received for admission, counted once
// here whatever happened to its attempts at owners (moved, died, fenced),
// and the rejections decided here before any owner answered. Owners count
// admissions, cancellations, retries and their own rejections; the app
// exports their received counts as zero, so received is counted once.
func (c *Client) Counts(model, workerType string) metrics.AdmissionSnapshot {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.seq++
	out := metrics.AdmissionSnapshot{Instance: c.instance, Seq: c.seq, Model: model, WorkerType: workerType,
		Classes: make(map[string]metrics.AdmissionCounts, len(c.counts))}
	for class, n := range c.counts {
		cp := *n
		cp.Rejected = maps.Clone(n.Rejected)
		out.Classes[class] = cp
	}
	return out
}

func (c *Client) countLocked(class string) *metrics.AdmissionCounts {
	n := c.counts[class]
	if n == nil {
		n = &metrics.AdmissionCounts{Rejected: map[string]uint64{}}
		c.counts[class] = n
	}
	return n
}

// entryReject counts a rejection decided at the entry (no owner answered).
func (c *Client) entryReject(class string, reason scheduler.Reason) {
	c.m.entryRejected.WithLabelValues(reason.String()).Inc()
	c.mu.Lock()
	c.countLocked(class).Rejected[reason.String()]++
	c.mu.Unlock()
}

// OwnersChanged installs the cluster's current view of class owners. It
// abandons admit requests waiting on an owner that is no longer the owner
// (they are resubmitted) and wakes the re-home loop.
func (c *Client) OwnersChanged(owners map[string]Owner) {
	c.mu.Lock()
	c.owners = make(map[string]Owner, len(owners))
	for class, o := range owners {
		c.owners[class] = o
		if o.Epoch > c.epochs[class] {
			c.epochs[class] = o.Epoch
		}
	}
	graced := false
	now := c.clock.Now()
	for p := range c.pending {
		if cur, ok := c.owners[p.class]; (!ok || cur != p.owner) && !p.abandoning {
			p.abandoning, p.abandonAt = true, now.Add(c.cfg.AbandonGrace)
			graced = true
		}
	}
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
	if graced {
		select { // Run's timer abandons them when the grace has passed
		case c.abandon <- struct{}{}:
		default:
		}
	}
	c.wake()
}

// connectionLostLocked gives up on every remote admit sent on a connection
// that has dropped since (down now, or reconnected: gen moved on). NATS
// restores the reply subscription on reconnect but not the replies published
// meanwhile, so without this such a request waits the whole
// OwnerReplyTimeout (the nemesis saw 61 s). Its owner counted the attempt
// and may still queue it or have granted it: admitRemote cancels it there
// (the cancel is buffered until the connection is back) and resubmits it as
// a retry, which supersedes the attempt if the cancel is late (Core.Enqueue);
// if the owner had granted it, the cancel frees that unacknowledged grant
// (Core.CancelAttempt), as for any grant the entry knows it lost. The request is admitted
// once where it runs; nothing already granted to the entry is touched (its
// ticket holds the booking and its life marks resume on reconnect). c.mu
// is held.
func (c *Client) connectionLostLocked(down bool, gen uint64) {
	for p := range c.pending {
		if p.connLost || p.abandoned || (!down && gen == p.conn) {
			continue
		}
		p.connLost = true
		p.cancel()
	}
}

// abandonDue gives up on the admit requests whose abandon grace has passed
// and returns when the next grace ends (zero: none pending).
func (c *Client) abandonDue() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	var next time.Time
	for p := range c.pending {
		switch {
		case !p.abandoning || p.abandoned:
		case !now.Before(p.abandonAt):
			p.abandoned = true
			p.cancel()
		case next.IsZero() || p.abandonAt.Before(next):
			next = p.abandonAt
		}
	}
	return next
}

func (c *Client) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// Degraded reports whether the replica is in a degraded mode: it admits
// every class locally because NATS is unreachable, or it admits requests
// that find no owner locally because its etcd session is unhealthy.
func (c *Client) Degraded() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.degraded || c.etcdDown
}

// DegradedModes names the degraded modes in force: "nats" and/or "etcd".
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
	return out
}

// Leave tells the client that its replica is going away for good (its
// ownership watch is about to stop): from now on a request that has no
// owner to go to is answered at once with ownership_moved (HTTP 503 with
// Retry-After) instead of waiting for one, since this replica may never
// learn of the next owner. Requests already on their way to an owner, or
// queued at one, are not affected. Leave is idempotent.
func (c *Client) Leave() {
	c.leaveOnce.Do(func() { close(c.leaving) })
}

func (c *Client) clusterHealthy() bool {
	return c.cfg.ClusterHealthy == nil || c.cfg.ClusterHealthy()
}

// Run renews in-flight bookings, re-homes them when their class moves, and
// tracks degraded mode, until ctx ends.
func (c *Client) Run(ctx context.Context) error {
	renew := time.NewTicker(c.cfg.RenewInterval)
	defer renew.Stop()
	status := time.NewTicker(100 * time.Millisecond)
	defer status.Stop()
	// Abandon graces run on the client's clock, armed for the earliest one.
	grace := c.clock.NewTimer(time.Hour)
	grace.Stop()
	defer grace.Stop()
	rearm := func() {
		if next := c.abandonDue(); next.IsZero() {
			grace.Stop()
		} else {
			grace.Reset(max(0, next.Sub(c.clock.Now())))
		}
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.abandon:
			rearm()
		case <-grace.C():
			rearm()
		case <-renew.C:
			c.renew()
		case <-c.kick:
			c.rehome(ctx)
		case <-status.C:
			c.checkConnection()
			// A re-home deferred because the new owner did not answer yet
			// (it is announced before it subscribes) is retried here rather
			// than at the next ownership change.
			c.mu.Lock()
			retry := c.rehomeRetry
			c.rehomeRetry = false
			c.mu.Unlock()
			if retry {
				c.rehome(ctx)
			}
		}
	}
}

// checkConnection enters and leaves degraded mode, and gives up on the
// remote admits whose connection dropped (see connectionLost). Leaving
// degraded mode rejects the local actor's queued entries of classes owned
// elsewhere (ownership_lost), so their entry replicas resubmit them to the
// owners.
func (c *Client) checkConnection() {
	down := !c.nc.IsConnected()
	etcdDown := !c.clusterHealthy()
	gen := c.nc.Stats().Reconnects
	c.mu.Lock()
	c.connectionLostLocked(down, gen)
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
	if len(foreign) > 0 {
		// Entries a degraded mode queued here for classes owned elsewhere
		// go back to their owners (as retries).
		for _, class := range foreign {
			c.actor.RejectQueued(class, scheduler.ReasonOwnershipLost)
		}
		c.wake()
	}
}

// Admit admits r through its class's owner and returns a ticket for the
// granted booking, or the owner's typed rejection. It returns ctx.Err() when
// ctx ends first; a queued request is then cancelled at its owner.
func (c *Client) Admit(ctx context.Context, r *scheduler.Request) (*Ticket, error) {
	if r.Attempt == 0 && !r.Probe { // the frontend's own retries (worker failed) come with Attempt > 0
		c.mu.Lock()
		c.countLocked(r.Class).Received++
		c.mu.Unlock()
	}
	backoff := c.cfg.BackoffMin
	waitSince := time.Time{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if !r.Due.IsZero() && !c.clock.Now().Before(r.Due) && waitSince != (time.Time{}) {
			c.entryReject(r.Class, scheduler.ReasonDueTimePassed)
			return nil, scheduler.Reject(scheduler.ReasonDueTimePassed, "", "no owner admitted the request before its deadline")
		}
		c.mu.Lock()
		owner, ok := c.owners[r.Class]
		degraded := c.degraded || !c.nc.IsConnected()
		changed := c.changed
		c.mu.Unlock()
		// etcd unavailable: no owner can be trusted to admit, so a request
		// that has waited long enough for one is admitted here.
		if !degraded && !waitSince.IsZero() && c.clock.Now().Sub(waitSince) >= c.cfg.EtcdDegradedAfter && !c.clusterHealthy() {
			degraded = true
		}

		epoch, ownLocal := c.server.Owns(r.Class)
		switch {
		case ownLocal || degraded:
			// This replica's own actor admits: it owns the class, or NATS
			// is down and every class is admitted locally (degraded mode).
			// As an owner it checks ownership again on the actor's turn
			// (see Server.onAdmit), and takes the epoch from there.
			g, gatedEpoch, notOwned, err := c.admitLocal(ctx, r, !degraded)
			if !degraded {
				epoch = gatedEpoch
			}
			if notOwned { // the class moved before the actor saw r: not counted there
				c.m.retries.WithLabelValues("ownership_moved").Inc()
				continue
			}
			if err == nil {
				if !ownLocal {
					c.m.degradedAdmits.Inc()
					if c.m.DegradedByClass != nil {
						c.m.DegradedByClass.WithLabelValues(r.Class).Inc()
					}
				}
				return c.track(r, g, Owner{Replica: c.replica, Epoch: epoch}, c.server.Instance(), true), nil
			}
			if scheduler.ReasonOf(err) == scheduler.ReasonOwnershipLost {
				// The class moved, degraded mode ended, or the local actor
				// has stopped (it answers at once, every time): wait for an
				// ownership change or a backoff before the next attempt.
				r.Attempt++
				c.m.retries.WithLabelValues("ownership_moved").Inc()
				if waitSince.IsZero() {
					waitSince = c.clock.Now()
				}
				if err := c.waitForOwner(ctx, r, waitSince, changed, &backoff); err != nil {
					return nil, err
				}
				continue
			}
			return nil, err
		case !ok || owner.Replica == "" || owner.Replica == c.replica:
			// No owner yet, or this replica is named owner but has not
			// started admitting: wait for the next change or a backoff.
			if waitSince.IsZero() {
				waitSince = c.clock.Now()
			}
			if err := c.waitForOwner(ctx, r, waitSince, changed, &backoff); err != nil {
				return nil, err
			}
			c.m.retries.WithLabelValues("no_owner").Inc()
			continue
		}

		t, retry, err := c.admitRemote(ctx, r, owner)
		if err != nil || !retry {
			return t, err
		}
		if waitSince.IsZero() {
			waitSince = c.clock.Now()
		}
		if err := c.waitForOwner(ctx, r, waitSince, changed, &backoff); err != nil {
			return nil, err
		}
	}
}

// waitForOwner sleeps until the ownership view changes or a backoff passes,
// bounded by the request's deadline and NoOwnerTimeout.
func (c *Client) waitForOwner(ctx context.Context, r *scheduler.Request, since time.Time, changed <-chan struct{}, backoff *time.Duration) error {
	limit := since.Add(c.cfg.NoOwnerTimeout)
	if !r.Due.IsZero() && r.Due.Before(limit) {
		limit = r.Due
	}
	now := c.clock.Now()
	if !now.Before(limit) {
		if !r.Due.IsZero() && !limit.Before(r.Due) {
			c.entryReject(r.Class, scheduler.ReasonDueTimePassed)
			return scheduler.Reject(scheduler.ReasonDueTimePassed, "", "no owner admitted the request before its deadline")
		}
		c.entryReject(r.Class, scheduler.ReasonOwnershipLost)
		return scheduler.Reject(scheduler.ReasonOwnershipLost, "", fmt.Sprintf("class %s had no owner for %v", r.Class, c.cfg.NoOwnerTimeout))
	}
	select {
	case <-c.leaving:
		c.entryReject(r.Class, scheduler.ReasonOwnershipLost)
		return scheduler.Reject(scheduler.ReasonOwnershipLost, "", "the router is shutting down and the class has no owner it can reach; retry")
	default:
	}
	d := min(*backoff, limit.Sub(now))
	if !c.clusterHealthy() {
		// Wake when the etcd fallback becomes due.
		if left := since.Add(c.cfg.EtcdDegradedAfter).Sub(now); left > 0 {
			d = min(d, left)
		} else {
			d = 0
		}
	}
	*backoff = min(2**backoff, c.cfg.BackoffMax)
	t := c.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-c.leaving:
	case <-changed:
	case <-t.C():
	}
	return nil
}

// admitRemote sends one admit request to owner. retry is true when the
// caller should try again (owner gone, changed or fenced).
func (c *Client) admitRemote(ctx context.Context, r *scheduler.Request, owner Owner) (t *Ticket, retry bool, err error) {
	data, err := wire.EncodeAdmission(RequestToWire(r, c.replica))
	if err != nil {
		return nil, false, fmt.Errorf("encode admit request: %w", err)
	}
	rctx, cancel := context.WithCancel(ctx)
	if !r.Due.IsZero() {
		// The owner rejects at the due time itself; the grace lets its
		// typed rejection arrive before the entry gives up on its own.
		var cancelDue context.CancelFunc
		rctx, cancelDue = c.withDeadline(rctx, r.Due.Add(time.Second))
		defer cancelDue()
	} else {
		// No deadline: still bounded, or a lost reply would hold the
		// request until its client gives up.
		var cancelTimeout context.CancelFunc
		rctx, cancelTimeout = c.withDeadline(rctx, c.clock.Now().Add(c.cfg.OwnerReplyTimeout))
		defer cancelTimeout()
	}
	p := &pendingAdmit{class: r.Class, owner: owner, cancel: cancel, conn: c.nc.Stats().Reconnects}
	c.mu.Lock()
	c.pending[p] = struct{}{}
	epochAtSend := c.epochs[r.Class]
	c.mu.Unlock()
	start := c.clock.Now()
	msg, err := c.nc.RequestWithContext(rctx, c.subj.Admit(r.Class), data)
	cancel()
	c.mu.Lock()
	delete(c.pending, p)
	abandoned, connLost := p.abandoned, p.connLost
	c.mu.Unlock()

	if err != nil {
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			c.m.remoteSeconds.WithLabelValues("no_responders").Observe(c.clock.Now().Sub(start).Seconds())
			return nil, true, nil // no owner admits the class right now
		case abandoned:
			c.m.retries.WithLabelValues("owner_changed").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++ // the old owner may have counted it as received
			return nil, true, nil
		case ctx.Err() != nil:
			c.cancelAt(r, owner.Replica)
			return nil, false, ctx.Err()
		case connLost:
			// The reply cannot arrive (connectionLostLocked): withdraw the
			// attempt at its owner, which counted it, and resubmit at once
			// (on this replica's own actor while NATS is down).
			c.m.retries.WithLabelValues("connection_lost").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++
			return nil, true, nil
		case !r.Due.IsZero() && !c.clock.Now().Before(r.Due):
			// The request reached the owner (a request with no owner
			// fails with no responders), so the owner counted it and
			// counts its outcome too: its own due_time_passed, the
			// cancellation below, or a grant whose booking then expires
			// unacknowledged. Counting a rejection here as well would
			// give the request two outcomes.
			c.cancelAt(r, owner.Replica)
			c.m.entryRejected.WithLabelValues(scheduler.ReasonDueTimePassed.String()).Inc()
			return nil, false, scheduler.Reject(scheduler.ReasonDueTimePassed, "", "owner did not answer before the deadline")
		case r.Due.IsZero() && !c.clock.Now().Before(start.Add(c.cfg.OwnerReplyTimeout)):
			// The owner counted the attempt (it was delivered); the
			// resubmission is a retry, and supersedes the attempt if
			// it is still queued there (Core.Enqueue).
			c.m.retries.WithLabelValues("reply_timeout").Inc()
			c.cancelAt(r, owner.Replica)
			r.Attempt++
			return nil, true, nil
		default: // connection trouble: the loop re-evaluates (maybe degraded)
			c.m.retries.WithLabelValues("nats_error").Inc()
			c.log.Debug("admit request failed", zap.String("class", r.Class), zap.Error(err))
			r.Attempt++
			return nil, true, nil
		}
	}
	reply, err := wire.DecodeAdmitReply(msg.Data)
	if err != nil {
		c.m.decodeErrors.WithLabelValues("admit_reply").Inc()
		c.m.retries.WithLabelValues("nats_error").Inc()
		r.Attempt++
		return nil, true, nil
	}
	g, rerr := grantFromReply(reply, r.ID)
	if rerr != nil {
		c.m.remoteSeconds.WithLabelValues("rejected").Observe(c.clock.Now().Sub(start).Seconds())
		if scheduler.ReasonOf(rerr) == scheduler.ReasonOwnershipLost {
			c.m.retries.WithLabelValues("ownership_moved").Inc()
			if !reply.Uncounted {
				r.Attempt++ // the old owner counted it as received
			}
			return nil, true, nil
		}
		return nil, false, rerr
	}
	c.m.remoteSeconds.WithLabelValues("granted").Observe(c.clock.Now().Sub(start).Seconds())
	c.mu.Lock()
	if reply.Epoch > c.epochs[r.Class] {
		c.epochs[r.Class] = reply.Epoch
	}
	c.mu.Unlock()
	// Fencing: a grant is stale when its epoch is older than the newest one
	// this replica knew when it sent the request: the request was addressed
	// after a newer owner existed, and a deposed owner answered it. A grant
	// from the owner that was current at sending time stays valid even if a
	// newer epoch became known while it travelled: that owner admitted it
	// while it owned the class, and the entry accepts exactly one grant per
	// attempt either way; its booking is re-homed to the new owner.
	if reply.Epoch < epochAtSend {
		// This grant is never used: the cancel frees its booking at the
		// deposed owner (an unacknowledged grant of the cancelled attempt,
		// Core.CancelAttempt), and the request goes to the current one.
		c.cancelAt(r, reply.Owner)
		c.m.staleGrants.Inc()
		c.m.retries.WithLabelValues("stale_grant").Inc()
		r.Attempt++
		return nil, true, nil
	}
	return c.track(r, g, Owner{Replica: reply.Owner, Epoch: reply.Epoch}, reply.Instance, false), false, nil
}

// withDeadline is context.WithDeadline on the client's clock.
func (c *Client) withDeadline(parent context.Context, at time.Time) (context.Context, context.CancelFunc) {
	if _, wall := c.clock.(scheduler.RealClock); wall {
		return context.WithDeadline(parent, at)
	}
	ctx, cancel := context.WithCancel(parent)
	t := c.clock.NewTimer(max(0, at.Sub(c.clock.Now())))
	go func() {
		defer t.Stop()
		select {
		case <-t.C():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// cancelAt tells owner, the replica r was sent to, to drop r from its
// queue. Other replicas that own the class by now ignore it.
func (c *Client) cancelAt(r *scheduler.Request, owner string) {
	b, err := wire.EncodeAdmission(&wire.CancelRequest{ID: r.ID, Attempt: r.Attempt, Entry: c.replica, Owner: owner})
	if err == nil {
		_ = c.nc.Publish(c.subj.Cancel(r.Class), b)
	}
}

type localResult struct {
	g   scheduler.Grant
	err error
}

// admitLocal enqueues on this replica's actor and waits for its answer. A
// grant that races with ctx ending is rolled back. With owner set, the
// actor checks on its turn that this replica still owns the class
// (Actor.EnqueueIf): notOwned reports that it did not, and epoch is the
// epoch it was admitted under.
func (c *Client) admitLocal(ctx context.Context, r *scheduler.Request, owner bool) (g scheduler.Grant, epoch int64, notOwned bool, err error) {
	ch := make(chan localResult, 1)
	var mu sync.Mutex
	gone := false
	respond := func(g scheduler.Grant, err error) bool {
		mu.Lock()
		defer mu.Unlock()
		if gone {
			return false
		}
		ch <- localResult{g, err}
		return true
	}
	var gatedEpoch int64
	gatedOut := false
	if owner {
		c.actor.EnqueueIf(r, func() bool {
			e, ok := c.server.Owns(r.Class)
			mu.Lock()
			gatedEpoch, gatedOut = e, !ok
			mu.Unlock()
			return ok
		}, respond)
	} else {
		c.actor.Enqueue(r, respond)
	}
	select {
	case res := <-ch:
		mu.Lock()
		epoch, notOwned = gatedEpoch, gatedOut
		mu.Unlock()
		return res.g, epoch, notOwned, res.err
	case <-ctx.Done():
		mu.Lock()
		gone = true
		mu.Unlock()
		c.actor.CancelAttempt(r.ID, r.Attempt)
		select {
		case res := <-ch:
			if res.err == nil {
				c.actor.Finish(res.g.Booking)
			}
		default:
		}
		return scheduler.Grant{}, 0, false, ctx.Err()
	}
}

func (c *Client) track(r *scheduler.Request, g scheduler.Grant, owner Owner, instance uint64, local bool) *Ticket {
	t := &Ticket{
		c: c, class: r.Class, grant: g, owner: owner, instance: instance, local: local, booking: g.Booking,
		rec: scheduler.BookingRecord{
			RequestID: r.ID, Class: r.Class, Worker: g.Worker, BlockHashes: r.BlockHashes,
			PromptTokens: r.PromptTokens, CachedTokens: g.CachedTokens,
			ExpectedOutputTokens: r.ExpectedOutputTokens, Tenant: r.Tenant.ID,
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

// rehome moves in-flight bookings whose class has a new owner to that owner
// (adopt), then frees them at the old one, so the ledger that admits the
// class keeps carrying their load.
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
	for t := range c.inflight {
		cur, ok := c.owners[t.class]
		if !ok || cur.Replica == "" || degraded {
			continue
		}
		t.mu.Lock()
		if !t.finished && (t.owner.Replica != cur.Replica || (cur.Epoch != 0 && t.owner.Epoch != cur.Epoch && !t.local)) {
			rec := t.rec
			rec.FirstTokenSeen = t.firstToken
			byClass[t.class] = append(byClass[t.class], move{t: t, rec: rec, old: t.owner, ins: t.instance, loc: t.local, id: t.booking})
		}
		t.mu.Unlock()
	}
	c.mu.Unlock()

	for class, moves := range byClass {
		recs := make([]scheduler.BookingRecord, len(moves))
		for i, mv := range moves {
			recs[i] = mv.rec
		}
		ids, owner, instance, err := c.adopt(ctx, class, recs)
		if err != nil {
			c.log.Debug("re-home deferred", zap.String("class", class), zap.Error(err))
			c.mu.Lock()
			c.rehomeRetry = true
			c.mu.Unlock()
			continue
		}
		for i, mv := range moves {
			if ids[i] == 0 {
				continue
			}
			mv.t.mu.Lock()
			finished := mv.t.finished
			if !finished {
				mv.t.owner, mv.t.instance, mv.t.local, mv.t.booking = owner, instance, owner.Replica == c.replica, ids[i]
			}
			mv.t.mu.Unlock()
			if finished { // it ended while moving: free the new booking too
				c.release(owner, instance, owner.Replica == c.replica, ids[i], false, -1)
			}
			c.release(mv.old, mv.ins, mv.loc, mv.id, false, -1)
			c.m.rehomed.Inc()
		}
	}
}

// adopt books recs at the current owner of class (in-process when that is
// this replica).
func (c *Client) adopt(ctx context.Context, class string, recs []scheduler.BookingRecord) ([]scheduler.BookingID, Owner, uint64, error) {
	if epoch, ok := c.server.Owns(class); ok {
		ids := make([]scheduler.BookingID, len(recs))
		for i := range recs {
			id, err := c.actor.Adopt(ctx, recs[i])
			if err != nil {
				return nil, Owner{}, 0, fmt.Errorf("adopt locally: %w", err)
			}
			ids[i] = id
		}
		return ids, Owner{Replica: c.replica, Epoch: epoch}, c.server.Instance(), nil
	}
	req := &wire.AdoptRequest{Entry: c.replica, Class: class, Bookings: make([]wire.AdoptedBooking, len(recs))}
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
	used       int // reported token usage (SetUsage); -1 unknown
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
