package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// Session is this process's one etcd lease. Everything the process registers
// (its replica or worker record, the classes it owns) is bound to it, so all of
// it disappears together when the process dies or is cut off.
//
// Session renews the lease itself with one KeepAliveOnce at a time instead of
// using concurrency.Session or the client's KeepAlive stream: those hide when
// the last renewal succeeded (and the client's loop only wakes every 500 ms),
// and the fence needs exactly that time. A renewal counts from the moment its
// request was sent, which is never later than when the server extended the
// lease, so "now - last renewal < TTL/2" proves the lease has at least TTL/2
// to live and no other replica can have taken over anything bound to it.
type Session struct {
	cfg    SessionConfig
	client *clientv3.Client
	keys   wire.Keys
	log    *zap.Logger
	clock  clock.Clock

	status      atomic.Pointer[SessionStatus]
	lastRenewal atomic.Int64 // unix nanos of the newest successful renewal's send time
	leaseReady  chan struct{}
	started     atomic.Bool
	publishMu   sync.Mutex // makes load-compare-store-close of status one step

	healthy  prometheus.Gauge
	renewals *prometheus.CounterVec
	leases   prometheus.Counter
	lost     prometheus.Counter
}

// SessionStatus is an immutable view of the session's health. Changed is
// closed when a newer status replaces this one, so any number of goroutines
// can wait for the next change without the session ever blocking.
type SessionStatus struct {
	// Lease is 0 until Run has been granted a lease.
	Lease clientv3.LeaseID
	// Healthy is true while the last successful renewal is younger than TTL/2.
	// When false, nothing bound to the lease may be acted on (fenced).
	Healthy bool
	// Done is true once the session is over for good: the lease expired
	// (without SessionConfig.Regrant), the client closed, or Run returned.
	// Done implies !Healthy. With Regrant a lost lease is not Done: the
	// status stays unhealthy until a new Lease replaces it.
	Done    bool
	changed chan struct{}
}

// Changed is closed when the status changes.
func (s *SessionStatus) Changed() <-chan struct{} { return s.changed }

// NewSession builds a session; Run grants the lease and keeps it alive.
func NewSession(client *clientv3.Client, cfg SessionConfig, deps Deps) (*Session, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	f := promauto.With(deps.Registerer)
	s := &Session{
		cfg:        cfg,
		client:     client,
		keys:       wire.NewKeys(cfg.Cluster),
		log:        deps.Logger.Named("session"),
		clock:      deps.Clock,
		leaseReady: make(chan struct{}),
		healthy: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameClusterSessionHealthy,
			Help: "1 while the etcd session lease was renewed within half its TTL, else 0 (fenced).",
		}),
		renewals: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameClusterSessionRenewals,
			Help: "Lease renewals by result (ok, failed).",
		}, []string{"result"}),
		leases: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterSessionLeases,
			Help: "Leases granted to this session: the first, and one for each lost lease it replaced.",
		}),
		lost: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterSessionLeasesLost,
			Help: "Session leases lost (expired while etcd or the network was away, or revoked) and replaced by a new one.",
		}),
	}
	s.status.Store(&SessionStatus{changed: make(chan struct{})})
	return s, nil
}

// Status returns the current status.
func (s *Session) Status() *SessionStatus { return s.status.Load() }

// Healthy reports whether the lease is known to have at least TTL/2 to live.
func (s *Session) Healthy() bool { return s.status.Load().Healthy }

// Lease returns the lease id, or 0 before Run was granted one.
func (s *Session) Lease() clientv3.LeaseID { return s.status.Load().Lease }

// TTL is the lease TTL.
func (s *Session) TTL() time.Duration { return s.cfg.TTL }

// LastRenewal is the send time of the newest successful renewal (or grant).
func (s *Session) LastRenewal() time.Time { return time.Unix(0, s.lastRenewal.Load()) }

// WaitLease blocks until Run has been granted its first lease, Run failed, or
// ctx ends. The lease it returns may since have been replaced (Regrant):
// read Status for the current one.
func (s *Session) WaitLease(ctx context.Context) (clientv3.LeaseID, error) {
	select {
	case <-s.leaseReady:
	case <-ctx.Done():
		return 0, ctx.Err()
	}
	st := s.status.Load()
	if st.Lease == 0 || st.Done {
		return 0, ErrSessionExpired
	}
	return st.Lease, nil
}

func (s *Session) publish(lease clientv3.LeaseID, healthy, done bool) {
	s.publishMu.Lock()
	defer s.publishMu.Unlock()
	old := s.status.Load()
	if old.Lease == lease && old.Healthy == healthy && old.Done == done {
		return
	}
	s.status.Store(&SessionStatus{Lease: lease, Healthy: healthy, Done: done, changed: make(chan struct{})})
	close(old.changed)
	if healthy {
		s.healthy.Set(1)
	} else {
		s.healthy.Set(0)
	}
}

type renewResult struct {
	sentAt time.Time
	err    error
}

// Run grants the lease and renews it until ctx ends or the lease is lost. It
// returns nil when ctx ends and ErrSessionExpired (wrapped) when the lease
// expired or the client was closed. With SessionConfig.Regrant a lost lease
// (and a failed first grant) is replaced by a new one instead, retried with
// backoff until ctx ends; only a closed client ends the session then. In
// every case the status is Done when Run returns. Run does not revoke the
// lease: call Revoke once everything using the session has stopped, so no
// owned class is deleted before its owner has let go of it (otherwise the
// lease simply expires after TTL).
func (s *Session) Run(ctx context.Context) error {
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("cluster: Session.Run called twice")
	}
	var lease clientv3.LeaseID
	defer func() {
		s.publish(lease, false, true)
		select {
		case <-s.leaseReady:
		default:
			close(s.leaseReady)
		}
	}()
	lo, hi := s.cfg.regrantBackoff()
	backoff := lo
	var next clientv3.LeaseID // a replacement keep already obtained
	for {
		granted, err := next, error(nil)
		if next == 0 {
			granted, err = s.grant(ctx)
		}
		next = 0
		switch {
		case err == nil:
			backoff = lo
			lease = granted
			next, err = s.keep(ctx, lease)
			if ctx.Err() != nil {
				return nil
			}
			if next != 0 {
				continue // keep replaced the fenced lease: see keep
			}
			if !s.cfg.Regrant || s.client.Ctx().Err() != nil {
				return err
			}
			// The lease is gone, and with it everything bound to it; the
			// status stays fenced (not Done) until a new lease is granted.
			s.lost.Inc()
			s.log.Warn("session lease lost; granting a new one", zap.Int64("lease", int64(lease)), zap.Error(err))
			continue
		case ctx.Err() != nil:
			return nil
		case !s.cfg.Regrant || s.client.Ctx().Err() != nil:
			return err
		}
		s.log.Warn("granting a session lease failed; retrying", zap.Duration("backoff", backoff), zap.Error(err))
		t := s.clock.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C():
		}
		backoff = min(2*backoff, hi)
	}
}

// grant asks etcd for a new lease and, on success, publishes it healthy.
func (s *Session) grant(ctx context.Context) (clientv3.LeaseID, error) {
	sent := s.clock.Now()
	lease, err := s.grantRaw(ctx, s.cfg.TTL)
	if err != nil {
		return 0, err
	}
	s.adopt(lease, sent)
	return lease, nil
}

// grantRaw asks etcd for a new lease within timeout.
func (s *Session) grantRaw(ctx context.Context, timeout time.Duration) (clientv3.LeaseID, error) {
	gctx, cancel := context.WithTimeout(ctx, timeout)
	resp, err := s.client.Grant(gctx, int64(s.cfg.TTL/time.Second))
	cancel()
	if err != nil {
		return 0, fmt.Errorf("grant session lease: %w", err)
	}
	if granted := time.Duration(resp.TTL) * time.Second; granted != s.cfg.TTL {
		// etcd raises TTLs below its minimum; fencing on the configured,
		// shorter TTL stays on the safe side.
		s.log.Warn("etcd granted a different lease ttl", zap.Duration("requested", s.cfg.TTL), zap.Duration("granted", granted))
	}
	return resp.ID, nil
}

// adopt makes lease, granted by a request sent at sent, the session's
// healthy lease.
func (s *Session) adopt(lease clientv3.LeaseID, sent time.Time) {
	s.lastRenewal.Store(sent.UnixNano())
	s.publish(lease, true, false)
	s.leases.Inc()
	select {
	case <-s.leaseReady:
	default:
		close(s.leaseReady)
	}
	s.log.Info("session started", zap.Int64("lease", int64(lease)), zap.Duration("ttl", s.cfg.TTL))
}

type grantResult struct {
	sentAt time.Time
	lease  clientv3.LeaseID
	err    error
}

// replaceFenced decides what a regranting session does with a lease that
// etcd granted while the current one was fenced and unrenewed for a TTL:
// one last renewal of the old lease, and if etcd does not renew it at once
// the new lease replaces it and the old one is revoked, deleting what was
// bound to it so that claims can start again at once instead of when it
// expires. It reports whether the new lease replaced the old one (else the
// old one was renewed and stays, and the new one was revoked).
func (s *Session) replaceFenced(ctx context.Context, old clientv3.LeaseID, g grantResult) bool {
	rctx, cancel := context.WithTimeout(ctx, s.cfg.renewInterval())
	sent := s.clock.Now()
	_, err := s.client.KeepAliveOnce(rctx, old)
	cancel()
	drop := old
	if err == nil {
		// The old lease lives (etcd kept it, e.g. extended on a restart):
		// keep it, so the claims bound to it keep their epochs.
		s.renewals.WithLabelValues("ok").Inc()
		if sent.UnixNano() > s.lastRenewal.Load() {
			s.lastRenewal.Store(sent.UnixNano())
		}
		drop = g.lease
	}
	rctx, cancel = context.WithTimeout(ctx, s.cfg.TTL/3)
	if _, rerr := s.client.Revoke(rctx, drop); rerr != nil && !errors.Is(rerr, rpctypes.ErrLeaseNotFound) {
		s.log.Debug("revoking a superseded lease failed; it expires", zap.Int64("lease", int64(drop)), zap.Error(rerr))
	}
	cancel()
	return err != nil
}

// keep renews lease until ctx ends (nil) or the lease is lost
// (ErrSessionExpired, wrapped). It returns with the status unhealthy when
// the lease was lost.
//
// A regranting session does not wait for a fenced lease to be renewed or
// declared lost: while fenced it also asks etcd for a new lease at every
// renewal tick (one request at a time), and the first grant etcd answers
// ends the wait (replaceFenced): the old lease is tried once more and kept
// if etcd renews it at once (a short outage: the claims keep their epochs),
// else the new lease replaces it, healthy, and the old one is revoked so
// that what was bound to it is deleted now rather than when it expires.
// So the session's recovery never depends on the old lease answering: e2e
// scenario 7 (etcd stopped for three TTLs) saw an owner recover only about
// 6 s after etcd's return, when its old lease ran out; a grant does not
// depend on that lease, so the session recovers as soon as etcd answers.
func (s *Session) keep(ctx context.Context, lease clientv3.LeaseID) (clientv3.LeaseID, error) {
	runCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stop()

	results := make(chan renewResult, 1) // at most one renewal in flight
	inflight := false
	grants := make(chan grantResult, 1) // at most one replacement grant in flight
	granting := false
	probe := func() {
		granting = true
		wg.Add(1)
		go func(sentAt time.Time) {
			defer wg.Done()
			l, err := s.grantRaw(runCtx, s.cfg.TTL/3)
			grants <- grantResult{sentAt: sentAt, lease: l, err: err}
		}(s.clock.Now())
	}
	renew := func() {
		inflight = true
		wg.Add(1)
		go func(sentAt time.Time) {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(runCtx, s.cfg.TTL/3)
			defer cancel()
			_, err := s.client.KeepAliveOnce(rctx, lease)
			results <- renewResult{sentAt: sentAt, err: err}
		}(s.clock.Now())
	}

	half := s.cfg.TTL / 2
	fence := s.clock.NewTimer(half - s.clock.Now().Sub(s.LastRenewal()))
	defer fence.Stop()
	ticker := s.clock.NewTicker(s.cfg.renewInterval())
	defer ticker.Stop()
	healthy := true
	for {
		select {
		case <-ctx.Done():
			s.log.Info("session stopped", zap.Int64("lease", int64(lease)))
			return 0, nil
		case <-ticker.C():
			if !inflight {
				renew()
			}
			if s.cfg.Regrant && !healthy && !granting {
				probe()
			}
		case g := <-grants:
			granting = false
			switch {
			case g.err != nil:
				s.log.Debug("replacement lease not granted yet", zap.Error(g.err))
			case healthy:
				// The old lease was renewed meanwhile: it stays.
				rctx, cancel := context.WithTimeout(runCtx, s.cfg.TTL/3)
				_, _ = s.client.Revoke(rctx, g.lease) // else it expires unused
				cancel()
			case s.replaceFenced(runCtx, lease, g):
				s.lost.Inc()
				s.log.Warn("session fenced for a ttl and etcd answers again: replaced its lease",
					zap.Int64("old_lease", int64(lease)), zap.Int64("lease", int64(g.lease)))
				s.adopt(g.lease, g.sentAt)
				return g.lease, nil
			default:
				healthy = true
				fence.Reset(half - s.clock.Now().Sub(s.LastRenewal()))
				s.publish(lease, true, false)
				s.log.Info("session healthy again", zap.Int64("lease", int64(lease)))
			}
		case <-fence.C():
			if left := half - s.clock.Now().Sub(s.LastRenewal()); left > 0 {
				// A renewal landed after the timer was armed: re-arm for it.
				fence.Reset(left)
			} else if healthy {
				healthy = false
				s.publish(lease, false, false)
				s.log.Warn("session fenced: lease not renewed within half its ttl",
					zap.Int64("lease", int64(lease)), zap.Time("last_renewal", s.LastRenewal()))
			}
		case r := <-results:
			inflight = false
			switch {
			case r.err == nil:
				s.renewals.WithLabelValues("ok").Inc()
				if r.sentAt.UnixNano() > s.lastRenewal.Load() {
					s.lastRenewal.Store(r.sentAt.UnixNano())
				}
				left := half - s.clock.Now().Sub(s.LastRenewal())
				fence.Reset(left)
				if !healthy && left > 0 {
					healthy = true
					s.publish(lease, true, false)
					s.log.Info("session healthy again", zap.Int64("lease", int64(lease)))
				}
			case errors.Is(r.err, rpctypes.ErrLeaseNotFound):
				s.renewals.WithLabelValues("failed").Inc()
				s.publish(lease, false, false)
				s.log.Warn("session lease expired", zap.Int64("lease", int64(lease)))
				return 0, fmt.Errorf("lease %x: %w", int64(lease), ErrSessionExpired)
			case s.client.Ctx().Err() != nil:
				s.renewals.WithLabelValues("failed").Inc()
				return 0, fmt.Errorf("etcd client closed: %w", ErrSessionExpired)
			default:
				s.renewals.WithLabelValues("failed").Inc()
				if ctx.Err() == nil {
					s.log.Debug("lease renewal failed", zap.Error(r.err))
				}
			}
		}
	}
}

// Revoke deletes the lease and with it every key bound to it. Call it after
// every user of the session (Ownership in particular) has stopped.
func (s *Session) Revoke(ctx context.Context) error {
	lease := s.Lease()
	if lease == 0 {
		return ErrNoLease
	}
	if _, err := s.client.Revoke(ctx, lease); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		return fmt.Errorf("revoke lease %x: %w", int64(lease), err)
	}
	return nil
}

// RegisterReplica puts the replica's record under its key, bound to the
// session lease. Call it again to change the record (e.g. to set Ready).
func (s *Session) RegisterReplica(ctx context.Context, info wire.ReplicaInfo) error {
	b, err := wire.EncodeReplicaInfo(&info)
	if err != nil {
		return fmt.Errorf("encode replica %s: %w", info.ID, err)
	}
	if err := info.Validate(); err != nil {
		return fmt.Errorf("register replica: %w", err)
	}
	return s.putLeased(ctx, s.keys.Replica(info.ID), b)
}

// RegisterWorker puts a worker's record under its key, bound to the session
// lease; a worker process uses its own Session for this.
func (s *Session) RegisterWorker(ctx context.Context, info wire.WorkerInfo) error {
	b, err := wire.EncodeWorkerInfo(&info)
	if err != nil {
		return fmt.Errorf("encode worker %s: %w", info.ID, err)
	}
	if err := info.Validate(); err != nil {
		return fmt.Errorf("register worker: %w", err)
	}
	return s.putLeased(ctx, s.keys.Worker(info.ID), b)
}

func (s *Session) putLeased(ctx context.Context, key string, val []byte) error {
	st := s.status.Load()
	if st.Done {
		return ErrSessionExpired
	}
	if st.Lease == 0 {
		return ErrNoLease
	}
	if _, err := s.client.Put(ctx, key, string(val), clientv3.WithLease(st.Lease)); err != nil {
		return fmt.Errorf("put %s: %w", key, err)
	}
	return nil
}
