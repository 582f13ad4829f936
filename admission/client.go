package admission

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
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
	//
	// The whole admission of a request without a deadline is bounded too,
	// by AdmitBound: NoOwnerTimeout + OwnerReplyTimeout of its arrival.
	OwnerReplyTimeout time.Duration
	// StatusAfter is how long an admit request sent to a remote owner
	// waits for its answer before the entry asks that owner what became
	// of the attempt (a status probe, status.go), and how often it asks
	// again while the answer is "queued". NATS core is at-most-once: a
	// lost reply, or an admit delivered to a subscription nobody reads,
	// then costs about StatusAfter instead of OwnerReplyTimeout. Each
	// probe is one small round trip to the owner and one actor turn
	// there, so it should exceed the usual queue wait.
	StatusAfter time.Duration
	// Clock is what the entry side reads and waits on (nil: wall time). It
	// must be the clock of the replica's scheduler.
	Clock clock.Clock
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
	// OwnerUnreachableAfter bounds how long a class whose registered owner
	// answers NATS "no responders" (it is cut from NATS, or has stopped
	// admitting without letting go of its key) keeps its requests waiting:
	// past it, a request that got "no responders" itself is admitted by
	// this replica's own scheduler (degraded, counted per class) until the
	// owner answers again or the class moves. An owner cut from NATS this
	// long withdraws from placement (internal/app), so the move normally
	// comes first.
	OwnerUnreachableAfter time.Duration
	// AdoptHold is the owner side's adoption hold (WithAdoptHold): how long
	// a new owner of a class holds its tenants' requests that have a
	// concurrency quota, so that they count the bookings the entries
	// re-home to it. 0 turns it off.
	AdoptHold time.Duration
	// ReplicasAlive returns how many router replicas are alive (this one
	// included), as the replica sees them (nil: one). Sampled while no
	// degraded mode is in force, it is the divisor of the split degraded
	// quota policy (SetDegradedPolicy): the count last seen before a
	// degraded mode began.
	ReplicasAlive func() int
	// BucketSyncInterval is how often an owner saves the tenant bucket
	// levels of its classes to etcd (BucketSync): a crashed owner's
	// successor misses at most this much of its charges.
	BucketSyncInterval time.Duration
}

// AdmitBound is the longest an admission without a deadline waits, all
// its waits together: NoOwnerTimeout for an owner, then OwnerReplyTimeout
// queued at it. Each wait has its own bound, but they chain (a lost reply
// is resubmitted, the resubmission waits for an owner again), so without
// this one a request could wait several of them; past it Admit answers
// ownership_lost.
func (c ClientConfig) AdmitBound() time.Duration { return c.NoOwnerTimeout + c.OwnerReplyTimeout }

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
		StatusAfter:       3 * time.Second,
		EtcdDegradedAfter: 2 * time.Second,

		OwnerUnreachableAfter: 2 * time.Second,
		AdoptHold:             DefaultAdoptHold,

		BucketSyncInterval: time.Second,
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
	case c.StatusAfter <= 0:
		return fmt.Errorf("admission: StatusAfter must be > 0")
	case c.EtcdDegradedAfter <= 0:
		return fmt.Errorf("admission: EtcdDegradedAfter must be > 0")
	case c.OwnerUnreachableAfter <= 0:
		return fmt.Errorf("admission: OwnerUnreachableAfter must be > 0")
	case c.AdoptHold < 0:
		return fmt.Errorf("admission: AdoptHold must be >= 0")
	case c.BucketSyncInterval <= 0:
		return fmt.Errorf("admission: BucketSyncInterval must be > 0")
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
	// quotaPolicy and classLimits are the degraded quota policy and the
	// classes' queue limits (SetDegradedPolicy); alive is the replicas
	// last seen alive (sampleAlive), the split divisor.
	quotaPolicy QuotaPolicy
	classLimits map[string]scheduler.Limits
	alive       int
	// rehomeDone is, per class, the owner this entry last told that its
	// re-home round for the class is complete (see reportRehomed).
	rehomeDone map[string]rehomeReport
	// unreachable holds the classes whose registered owner answered "no
	// responders", since when (see ClientConfig.OwnerUnreachableAfter).
	unreachable map[string]*unreachableOwner
	// connGen is the NATS connection's reconnect count as checkConnection
	// last saw it; a new connection marks every remote booking for
	// re-adoption (Ticket.readopt).
	connGen uint64
	// leaving is closed by Leave: the replica is going away, and a request
	// that would wait for an owner is answered at once instead.
	leaving   chan struct{}
	leaveOnce sync.Once
	counts    map[string]*metrics.AdmissionCounts // per class, cumulative (see Counts)
	instance  uint64
	seq       uint64

	kick    chan struct{} // size one: wakes the re-home loop
	abandon chan struct{} // size one: an abandon grace started (Run arms its timer)
	clock   clock.Clock
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
		unreachable: map[string]*unreachableOwner{}, rehomeDone: map[string]rehomeReport{},
		counts: map[string]*metrics.AdmissionCounts{}, instance: rand.Uint64(),
		kick: make(chan struct{}, 1), abandon: make(chan struct{}, 1), clock: clockOr(cfg.Clock),
		leaving: make(chan struct{}),
	}
}

func clockOr(c clock.Clock) clock.Clock {
	if c == nil {
		return clock.Real{}
	}
	return c
}
