package adapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/wire"
)

// Overrides are values given by flags; each nonzero one wins over what the
// engine tells.
type Overrides struct {
	Model            string
	Models           []string
	BlockSize        int
	KVBlocks         int
	MaxModelLen      int
	MaxNumSeqs       int
	MaxBatchedTokens int
	// PrioritySchedules registers the engine as scheduling by priority
	// (vLLM's --scheduling-policy priority, which /v1/models and the
	// metrics do not reveal).
	PrioritySchedules bool
}

// Fallbacks for a generic OpenAI-compatible server, which tells neither its
// block size nor its pool: routers then hash its requests in 16-token
// blocks (their predictions) and assume a pool of this many blocks.
const (
	openAIBlockSize = 16
	openAIKVBlocks  = 1 << 16
)

// RegistrarConfig configures a Registrar.
type RegistrarConfig struct {
	Worker  string
	Cluster string
	// URL is the engine's base URL as routers reach it.
	URL    string
	Engine Engine
	Labels map[string]string
	// PublishesEvents is registered as is (true when KV events are mirrored).
	PublishesEvents bool
	// TierBlocks is each mirrored lower tier's capacity ("cpu", "disk"); 0
	// advertises 8 times the engine's KV blocks.
	TierBlocks map[string]int
	// DPRank and DPSize are registered as is (DPSize > 1: one rank of a
	// data-parallel engine).
	DPRank, DPSize int
	Tokenizer      *wire.TokenizerSource
	Overrides      Overrides

	// APIs are registered as is (Config.APIs).
	APIs []string
	// Role is the engine's disaggregation role (role.go).
	Role RoleConfig

	// LeaseTTL is the etcd session's TTL: a killed adapter's registration
	// disappears within it.
	LeaseTTL time.Duration
	// ProbeInterval and ProbeTimeout pace the engine's health probes;
	// FailureThreshold consecutive failures deregister.
	ProbeInterval    time.Duration
	ProbeTimeout     time.Duration
	FailureThreshold int
	// RediscoverInterval is how often a registered worker's record is
	// refreshed from the engine (LoRA adapters load and unload at run time).
	RediscoverInterval time.Duration
}

// Validate names the first bad field.
func (c RegistrarConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Worker):
		return fmt.Errorf("%w: registrar Worker %q", ErrInvalidConfig, c.Worker)
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: registrar Cluster %q", ErrInvalidConfig, c.Cluster)
	case c.URL == "":
		return fmt.Errorf("%w: registrar URL is empty", ErrInvalidConfig)
	case c.Engine < EngineVLLM || c.Engine > EngineOpenAI:
		return fmt.Errorf("%w: registrar Engine %v", ErrInvalidConfig, c.Engine)
	case c.LeaseTTL < time.Second || c.LeaseTTL%time.Second != 0:
		return fmt.Errorf("%w: registrar LeaseTTL %v must be whole seconds, at least 1s", ErrInvalidConfig, c.LeaseTTL)
	case c.ProbeInterval <= 0:
		return fmt.Errorf("%w: registrar ProbeInterval %v must be positive", ErrInvalidConfig, c.ProbeInterval)
	case c.ProbeTimeout <= 0:
		return fmt.Errorf("%w: registrar ProbeTimeout %v must be positive", ErrInvalidConfig, c.ProbeTimeout)
	case c.FailureThreshold < 1:
		return fmt.Errorf("%w: registrar FailureThreshold %d must be at least 1", ErrInvalidConfig, c.FailureThreshold)
	case c.RediscoverInterval <= 0:
		return fmt.Errorf("%w: registrar RediscoverInterval %v must be positive", ErrInvalidConfig, c.RediscoverInterval)
	case c.Overrides.BlockSize < 0 || c.Overrides.KVBlocks < 0 || c.Overrides.MaxModelLen < 0 ||
		c.Overrides.MaxNumSeqs < 0 || c.Overrides.MaxBatchedTokens < 0:
		return fmt.Errorf("%w: registrar overrides must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Registrar keeps the worker's record in etcd, bound to the adapter's own
// session lease, exactly while the engine's health endpoint answers: it
// registers after a healthy probe (and a successful discovery), deregisters
// after FailureThreshold failed probes in a row, and registers again when
// the engine recovers. A lost session (etcd partition beyond the TTL) is
// replaced by a new one.
//
// Run owns the session's goroutine and does the probing itself; the
// OnInfo callback runs on it, before each registration is written.
type Registrar struct {
	cfg    RegistrarConfig
	cli    *clientv3.Client
	eng    *engineClient
	log    *zap.Logger
	reg    prometheus.Registerer
	onInfo func(wire.WorkerInfo) error
	keys   wire.Keys

	registered atomic.Bool
	info       atomic.Pointer[wire.WorkerInfo]

	probes        *prometheus.CounterVec
	discoveries   *prometheus.CounterVec
	registrations *prometheus.CounterVec
	registeredG   prometheus.Gauge
	sessions      prometheus.Counter
}

// NewRegistrar builds a registrar. onInfo (may be nil) sees each record
// before it is written; an error from it keeps the record out of etcd.
func NewRegistrar(cfg RegistrarConfig, cli *clientv3.Client, eng *engineClient, onInfo func(wire.WorkerInfo) error,
	log *zap.Logger, reg prometheus.Registerer) (*Registrar, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cli == nil || eng == nil {
		return nil, fmt.Errorf("%w: registrar needs an etcd client and an engine client", ErrInvalidConfig)
	}
	if log == nil {
		log = zap.NewNop()
	}
	f := promauto.With(reg)
	return &Registrar{
		cfg: cfg, cli: cli, eng: eng, log: log.Named("registrar"), reg: reg, onInfo: onInfo,
		keys: wire.NewKeys(cfg.Cluster),
		probes: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_health_probes_total",
			Help: "Engine health probes, by result (ok, failed)."}, []string{"result"}),
		discoveries: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_discoveries_total",
			Help: "Engine discoveries (models, cache shape), by result (ok, partial, failed). Partial: some answers were unusable and flags or earlier values filled in."}, []string{"result"}),
		registrations: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_registrations_total",
			Help: "Changes of the worker's etcd record, by action (registered, updated, deregistered, failed)."}, []string{"action"}),
		registeredG: f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_adapter_registered",
			Help: "1 while the worker's record is in etcd, else 0."}),
		sessions: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_sessions_lost_total",
			Help: "etcd sessions lost (lease expired) and replaced."}),
	}, nil
}

// Registered reports whether the worker's record is in etcd now.
func (r *Registrar) Registered() bool { return r.registered.Load() }

// Info is the last record written, or nil.
func (r *Registrar) Info() *wire.WorkerInfo { return r.info.Load() }

func (r *Registrar) setRegistered(v bool) {
	r.registered.Store(v)
	if v {
		r.registeredG.Set(1)
	} else {
		r.registeredG.Set(0)
	}
}

// Run keeps the registration right until ctx ends, then deletes it (revoking
// the lease) and returns nil. Each lost session is replaced after a short
// wait.
func (r *Registrar) Run(ctx context.Context) error {
	for {
		err := r.runSession(ctx)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the session ended because ctx did: a normal stop
		}
		r.sessions.Inc()
		r.log.Warn("etcd session lost; starting a new one", zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(time.Second):
		}
	}
}

func (r *Registrar) runSession(ctx context.Context) error {
	sess, err := cluster.NewSession(r.cli, cluster.SessionConfig{Cluster: r.cfg.Cluster, TTL: r.cfg.LeaseTTL},
		cluster.Deps{Logger: r.log, Registerer: prometheus.NewRegistry()}) // sessions come and go; their gauges would clash on reg
	if err != nil {
		return err
	}
	// The session outlives ctx until the record is deleted at shutdown.
	sctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1) // size 1: the session goroutine never blocks on exit
	go func() { done <- sess.Run(sctx) }()
	ended := false
	defer func() {
		stop()
		if !ended {
			if err := <-done; err != nil {
				r.log.Debug("session ended", zap.Error(err))
			}
		}
	}()
	if _, err := sess.WaitLease(ctx); err != nil {
		return err
	}
	ended, err = r.serve(ctx, sess, done)
	r.setRegistered(false)
	if ended || ctx.Err() == nil {
		return err
	}
	// Orderly stop: the record goes now, not when the lease expires.
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, derr := r.cli.Delete(rctx, r.keys.Worker(r.cfg.Worker)); derr != nil {
		r.log.Warn("delete registration at shutdown", zap.Error(derr))
	}
	if rerr := sess.Revoke(rctx); rerr != nil && !errors.Is(rerr, cluster.ErrNoLease) {
		r.log.Debug("revoke lease at shutdown", zap.Error(rerr))
	}
	return nil
}

// serve probes the engine and writes or deletes the record until ctx ends or
// the session does.
func (r *Registrar) serve(ctx context.Context, sess *cluster.Session, sessionDone <-chan error) (sessionEnded bool, err error) {
	tick := time.NewTicker(r.cfg.ProbeInterval)
	defer tick.Stop()
	fails := 0
	var discovered time.Time
	var current *wire.WorkerInfo
	for {
		pctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
		err := r.eng.Health(pctx)
		cancel()
		if ctx.Err() != nil {
			return false, nil
		}
		if err == nil {
			r.probes.WithLabelValues("ok").Inc()
			fails = 0
			if !r.registered.Load() || time.Since(discovered) >= r.cfg.RediscoverInterval {
				info, derr := r.discover(ctx, current)
				switch {
				case derr != nil:
					r.log.Warn("engine healthy but its shape is unknown; not registering", zap.Error(derr))
				case !r.registered.Load() || !sameInfo(info, current):
					if werr := r.write(ctx, sess, info); werr == nil {
						current = info
					}
				}
				if derr == nil {
					discovered = time.Now()
				}
			}
		} else {
			r.probes.WithLabelValues("failed").Inc()
			fails++
			if fails == 1 || fails == r.cfg.FailureThreshold {
				r.log.Warn("engine health probe failed", zap.Int("consecutive", fails), zap.Error(err))
			}
			if r.registered.Load() && fails >= r.cfg.FailureThreshold {
				r.deregister(ctx)
			}
		}
		select {
		case <-ctx.Done():
			return false, nil
		case err := <-sessionDone:
			if err == nil {
				err = cluster.ErrSessionExpired
			}
			return true, err
		case <-tick.C:
		}
	}
}

func (r *Registrar) write(ctx context.Context, sess *cluster.Session, info *wire.WorkerInfo) error {
	if r.onInfo != nil {
		if err := r.onInfo(*info); err != nil {
			r.registrations.WithLabelValues("failed").Inc()
			r.log.Warn("registration refused by the adapter", zap.Error(err))
			return err
		}
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sess.RegisterWorker(wctx, *info); err != nil {
		r.registrations.WithLabelValues("failed").Inc()
		r.log.Warn("register worker", zap.Error(err))
		return err
	}
	action := "registered"
	if r.registered.Load() {
		action = "updated"
	}
	r.registrations.WithLabelValues(action).Inc()
	r.info.Store(info)
	r.setRegistered(true)
	r.log.Info("worker "+action, zap.String("model", info.Model), zap.Strings("models", info.Models),
		zap.Int("block_size", info.BlockSize), zap.Int("kv_blocks", info.KVBlocks), zap.Bool("publishes_events", info.PublishesEvents))
	return nil
}

func (r *Registrar) deregister(ctx context.Context) {
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := r.cli.Delete(dctx, r.keys.Worker(r.cfg.Worker)); err != nil {
		// Still registered; the next failed probe tries again.
		r.registrations.WithLabelValues("failed").Inc()
		r.log.Warn("deregister worker", zap.Error(err))
		return
	}
	r.registrations.WithLabelValues("deregistered").Inc()
	r.setRegistered(false)
	r.log.Warn("engine unhealthy; worker deregistered", zap.Int("failed_probes", r.cfg.FailureThreshold))
}

// discover builds the record from what the engine tells, the overrides and,
// for parts the engine failed to answer this time, the previous record.
func (r *Registrar) discover(ctx context.Context, prev *wire.WorkerInfo) (*wire.WorkerInfo, error) {
	dctx, cancel := context.WithTimeout(ctx, r.cfg.ProbeTimeout)
	defer cancel()
	d, derr := r.eng.Discover(dctx)
	if derr != nil && prev != nil {
		// Keep what the engine told before rather than unregister a
		// healthy engine over one bad answer.
		if d.Model == "" {
			d.Model, d.Others, d.MaxModelLen = prev.Model, prev.Models, prev.MaxModelLen
			d.Root, d.Cards = prev.Salt, prev.Cards
		}
		if d.BlockSize == 0 {
			d.BlockSize = prev.BlockSize
		}
		if d.KVBlocks == 0 {
			d.KVBlocks = prev.KVBlocks
		}
	}
	o := r.cfg.Overrides
	info := &wire.WorkerInfo{
		Version: wire.RegistryVersion, ID: r.cfg.Worker, URL: r.cfg.URL,
		Model: pick(o.Model, d.Model), BlockSize: pickInt(o.BlockSize, d.BlockSize), KVBlocks: pickInt(o.KVBlocks, d.KVBlocks),
		MaxNumSeqs: pickInt(o.MaxNumSeqs, d.MaxNumSeqs), MaxBatchedTokens: pickInt(o.MaxBatchedTokens, d.MaxBatchedTokens),
		MaxModelLen: pickInt(o.MaxModelLen, d.MaxModelLen), Labels: r.cfg.Labels,
		PublishesEvents: r.cfg.PublishesEvents, Tokenizer: r.cfg.Tokenizer,
		Cards: d.Cards, PrioritySchedules: o.PrioritySchedules, APIs: r.cfg.APIs,
	}
	if o.Model == "" || o.Model == d.Model {
		// Blocks are salted by the engine's root, so every alias of it
		// (and every engine of the same weights) hashes a prompt alike.
		// A -model that renames the base keeps its own name as the salt.
		info.Salt = d.Root
	}
	if r.cfg.DPSize > 1 {
		info.DPRank, info.DPSize = r.cfg.DPRank, r.cfg.DPSize
	}
	r.cfg.Role.apply(info, d, r.cfg.Engine)
	for tier, n := range r.cfg.TierBlocks {
		if info.TierBlocks == nil {
			info.TierBlocks = make(map[string]int, len(r.cfg.TierBlocks))
		}
		if n == 0 {
			n = 8 * max(1, info.KVBlocks)
		}
		info.TierBlocks[tier] = n
	}
	if r.cfg.Engine == EngineOpenAI {
		info.BlockSize = pickInt(info.BlockSize, openAIBlockSize)
		info.KVBlocks = pickInt(info.KVBlocks, openAIKVBlocks)
	}
	// The engine's names, then the flag's, without the base or repeats.
	for _, n := range slices.Concat(d.Others, o.Models) {
		if n != info.Model && !slices.Contains(info.Models, n) {
			info.Models = append(info.Models, n)
		}
	}
	if d.Model != "" && d.Model != info.Model && !slices.Contains(info.Models, d.Model) {
		// --model renamed the base: the engine's own name still routes.
		info.Models = append(info.Models, d.Model)
	}
	if err := info.Validate(); err != nil || info.Model == "" {
		r.discoveries.WithLabelValues("failed").Inc()
		if err == nil {
			err = fmt.Errorf("%w: no model name", wire.ErrMalformed)
		}
		return nil, fmt.Errorf("%w: %w (engine said: %v)", ErrDiscovery, err, derr)
	}
	if derr != nil {
		r.discoveries.WithLabelValues("partial").Inc()
		r.log.Debug("engine discovery partly failed; flags or earlier values filled in", zap.Error(derr))
	} else {
		r.discoveries.WithLabelValues("ok").Inc()
	}
	return info, nil
}

func pick(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func pickInt(a, b int) int {
	if a != 0 {
		return a
	}
	return b
}

func sameInfo(a, b *wire.WorkerInfo) bool {
	if a == nil || b == nil {
		return a == b
	}
	ea, _ := wire.EncodeWorkerInfo(a)
	eb, _ := wire.EncodeWorkerInfo(b)
	return string(ea) == string(eb)
}
