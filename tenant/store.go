package tenant

import (
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
)

// Config configures the keys file of a router replica.
type Config struct {
	// KeysFile is the YAML keys file (docs/configuration.md). "": no keys,
	// the API is open to anyone who can reach it.
	KeysFile string
	// ReloadInterval is how often the file is checked for changes; a
	// changed file is reloaded without a restart.
	ReloadInterval time.Duration
}

// DefaultConfig returns the defaults: no keys file, checked every 5 s.
func DefaultConfig() Config { return Config{ReloadInterval: 5 * time.Second} }

// Validate names the bad field.
func (c Config) Validate() error {
	if c.ReloadInterval <= 0 {
		return fmt.Errorf("tenant.ReloadInterval: %v, must be > 0", c.ReloadInterval)
	}
	return nil
}

// RegisterFlags binds c's fields to fs under prefix (e.g. "auth.").
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.KeysFile, prefix+"keys-file", c.KeysFile, "API keys file (YAML, key hashes only; docs/configuration.md); empty: the API is open")
	fs.DurationVar(&c.ReloadInterval, prefix+"keys-reload-interval", c.ReloadInterval, "how often the keys file is checked for changes")
}

// Metrics of the keys file.
type Metrics struct {
	reloads *prometheus.CounterVec
	keys    prometheus.Gauge
	tenants prometheus.Gauge
}

// NewMetrics registers the keys file's metrics on reg (nil: unregistered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		reloads: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_keys_reloads_total",
			Help: "Loads of the API keys file, by result (ok, error: the last good keys stay in use)."}, []string{"result"}),
		keys: f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_router_keys",
			Help: "API key hashes in use."}),
		tenants: f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_router_tenants",
			Help: "Tenants in use."}),
	}
	m.reloads.WithLabelValues("ok")
	m.reloads.WithLabelValues("error")
	return m
}

// Store holds the current keys file: lookups read an immutable Set through
// an atomic pointer; Run (one goroutine) reloads it when the file changes.
// An invalid file is reported and counted, and the last good Set stays.
type Store struct {
	cfg   Config
	log   *zap.Logger
	m     *Metrics
	clock clock.Clock

	set atomic.Pointer[Set]

	mu  sync.Mutex // serializes Reload
	sum [sha256.Size]byte
}

// NewStore loads cfg.KeysFile. A missing or invalid file at startup is an
// error: the replica must not start open when it was meant to be closed.
// clk may be nil (wall time).
func NewStore(cfg Config, log *zap.Logger, m *Metrics, clk clock.Clock) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.KeysFile == "" {
		return nil, errors.New("tenant: no keys file configured")
	}
	if clk == nil {
		clk = clock.Real{}
	}
	if m == nil {
		m = NewMetrics(nil)
	}
	s := &Store{cfg: cfg, log: log.Named("keys"), m: m, clock: clk}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Set returns the keys in use.
func (s *Store) Set() *Set { return s.set.Load() }

// Lookup returns the tenant of an API key (Set.Lookup on the keys in use).
func (s *Store) Lookup(key string) (*Tenant, bool) { return s.set.Load().Lookup(key) }

// LookupAdmin returns the admin of an admin key (Set.LookupAdmin on the
// keys in use).
func (s *Store) LookupAdmin(key string) (string, bool) { return s.set.Load().LookupAdmin(key) }

// Reload reads the keys file and, when its content changed and is valid,
// puts it in use. It reports whether the keys changed. On error the keys in
// use stay.
func (s *Store) Reload() (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	raw, err := os.ReadFile(s.cfg.KeysFile)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return false, fmt.Errorf("tenant: read keys file: %w", err)
	}
	sum := sha256.Sum256(raw)
	if s.set.Load() != nil && sum == s.sum {
		return false, nil
	}
	set, err := Parse(raw)
	if err != nil {
		s.m.reloads.WithLabelValues("error").Inc()
		return false, fmt.Errorf("%s: %w", s.cfg.KeysFile, err)
	}
	s.sum = sum
	s.set.Store(set)
	s.m.reloads.WithLabelValues("ok").Inc()
	s.m.keys.Set(float64(set.Keys()))
	s.m.tenants.Set(float64(len(set.Tenants())))
	s.log.Info("API keys loaded", zap.String("file", s.cfg.KeysFile),
		zap.Int("tenants", len(set.Tenants())), zap.Int("keys", set.Keys()), zap.Int("admins", len(set.Admins())))
	return true, nil
}

// Run checks the keys file every ReloadInterval until ctx ends. A file that
// fails to load is logged once per distinct error and the last good keys
// stay in use.
func (s *Store) Run(ctx context.Context) error {
	t := s.clock.NewTicker(s.cfg.ReloadInterval)
	defer t.Stop()
	lastErr := ""
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		_, err := s.Reload()
		switch {
		case err != nil && err.Error() != lastErr:
			lastErr = err.Error()
			s.log.Error("keys file not reloaded; the last good keys stay in use", zap.Error(err))
		case err == nil && lastErr != "":
			lastErr = ""
		}
	}
}
