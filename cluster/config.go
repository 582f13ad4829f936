package cluster

import (
	"flag"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

// Deps are the injected collaborators every constructor of this package takes.
// Zero values are replaced by harmless defaults: a no-op logger, no metric
// registration, the wall clock.
type Deps struct {
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	Clock      clock.Clock
}

func (d Deps) withDefaults() Deps {
	if d.Logger == nil {
		d.Logger = zap.NewNop()
	}
	if d.Clock == nil {
		d.Clock = clock.Real{}
	}
	return d
}

// SessionConfig configures a Session.
type SessionConfig struct {
	// Cluster names the etcd key prefix (/switchyard/<cluster>/).
	Cluster string
	// TTL of the session lease. etcd grants whole seconds. Everything bound to
	// the lease disappears at most TTL after the last successful renewal.
	TTL time.Duration
	// RenewInterval is how often the lease is renewed. 0 means TTL/6, which
	// leaves room for two failed renewals before the TTL/2 fence.
	RenewInterval time.Duration
	// Regrant keeps the session going when its lease is lost (it expired
	// while etcd or the network was away, or it was revoked): Run grants a
	// new lease, retrying with backoff, instead of returning
	// ErrSessionExpired, and so it does for the first grant too. Status
	// then names the new lease; everything bound to the old one is gone and
	// must be registered and claimed again (Ownership does its part).
	Regrant bool
}

// DefaultSessionConfig is the one place session defaults are spelled.
func DefaultSessionConfig() SessionConfig {
	return SessionConfig{Cluster: "default", TTL: 5 * time.Second}
}

// RegisterFlags binds the fields to flags named prefix+"session-ttl" etc.
func (c *SessionConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "cluster name (etcd prefix /switchyard/<cluster>/)")
	fs.DurationVar(&c.TTL, prefix+"session-ttl", c.TTL, "etcd session lease TTL (whole seconds)")
	fs.DurationVar(&c.RenewInterval, prefix+"session-renew-interval", c.RenewInterval, "lease renewal interval (0: TTL/6)")
}

// Validate names the first bad field.
func (c SessionConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: Cluster %q", ErrInvalidConfig, c.Cluster)
	case c.TTL < time.Second || c.TTL%time.Second != 0:
		return fmt.Errorf("%w: TTL %v must be a whole number of seconds, at least 1s", ErrInvalidConfig, c.TTL)
	case c.RenewInterval < 0 || c.RenewInterval >= c.TTL/2:
		return fmt.Errorf("%w: RenewInterval %v must be in [0, TTL/2)", ErrInvalidConfig, c.RenewInterval)
	}
	return nil
}

// regrantBackoff bounds the wait between failed grants of a regranting
// session: from a tenth of the TTL, doubling, up to the TTL.
func (c SessionConfig) regrantBackoff() (lo, hi time.Duration) { return c.TTL / 10, c.TTL }

func (c SessionConfig) renewInterval() time.Duration {
	if c.RenewInterval > 0 {
		return c.RenewInterval
	}
	return c.TTL / 6
}

// RegistryConfig configures the watched caches (Replicas, Workers, the class
// owner view and the policy config watcher).
type RegistryConfig struct {
	Cluster string
	// RetryInterval is the pause before re-listing after a watch ends with an
	// error, so a flapping etcd is not hammered.
	RetryInterval time.Duration
}

// DefaultRegistryConfig is the one place registry defaults are spelled.
func DefaultRegistryConfig() RegistryConfig {
	return RegistryConfig{Cluster: "default", RetryInterval: 500 * time.Millisecond}
}

// RegisterFlags binds the fields to flags.
func (c *RegistryConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.RetryInterval, prefix+"registry-retry-interval", c.RetryInterval, "pause before re-listing an etcd prefix after a watch error")
}

// Validate names the first bad field.
func (c RegistryConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: Cluster %q", ErrInvalidConfig, c.Cluster)
	case c.RetryInterval <= 0:
		return fmt.Errorf("%w: RetryInterval %v must be positive", ErrInvalidConfig, c.RetryInterval)
	}
	return nil
}

// OwnershipConfig configures the class Ownership manager.
type OwnershipConfig struct {
	Cluster string
	// ReplicaID is this replica's id, as registered with RegisterReplica.
	ReplicaID string
	// SettlePeriod is how long a replica must have been continuously ready
	// (as observed by this replica) before an owner hands a class over to it.
	// It keeps a flapping replica from pulling classes back and forth.
	SettlePeriod time.Duration
	// RetryInterval paces retries of failed etcd operations and re-lists.
	RetryInterval time.Duration
	// OpTimeout bounds each claim or release transaction.
	OpTimeout time.Duration
}

// DefaultOwnershipConfig is the one place ownership defaults are spelled.
func DefaultOwnershipConfig() OwnershipConfig {
	return OwnershipConfig{
		Cluster:       "default",
		SettlePeriod:  5 * time.Second,
		RetryInterval: 500 * time.Millisecond,
		OpTimeout:     2 * time.Second,
	}
}

// RegisterFlags binds the fields to flags.
func (c *OwnershipConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.SettlePeriod, prefix+"ownership-settle", c.SettlePeriod, "how long a replica must be ready before classes are handed to it")
	fs.DurationVar(&c.RetryInterval, prefix+"ownership-retry-interval", c.RetryInterval, "pause before retrying a failed ownership operation")
	fs.DurationVar(&c.OpTimeout, prefix+"ownership-op-timeout", c.OpTimeout, "timeout of one claim or release transaction")
}

// Validate names the first bad field.
func (c OwnershipConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: Cluster %q", ErrInvalidConfig, c.Cluster)
	case !wire.ValidName(c.ReplicaID):
		return fmt.Errorf("%w: ReplicaID %q", ErrInvalidConfig, c.ReplicaID)
	case c.SettlePeriod < 0:
		return fmt.Errorf("%w: SettlePeriod %v is negative", ErrInvalidConfig, c.SettlePeriod)
	case c.RetryInterval <= 0:
		return fmt.Errorf("%w: RetryInterval %v must be positive", ErrInvalidConfig, c.RetryInterval)
	case c.OpTimeout <= 0:
		return fmt.Errorf("%w: OpTimeout %v must be positive", ErrInvalidConfig, c.OpTimeout)
	}
	return nil
}
