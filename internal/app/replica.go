package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/kvingest"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
	"github.com/switchyard/switchyard/wire"
)

// ReplicaConfig is everything one router replica needs.
type ReplicaConfig struct {
	ID            string
	Cluster       string
	HTTPAddr      string // listen address of the OpenAI API, e.g. 127.0.0.1:8080 (port 0: any)
	AdvertiseHTTP string // what other replicas and /debug/cluster show; default the bound address
	EtcdEndpoints []string
	NATSURL       string
	// PolicyYAML seeds the cluster's policy config in etcd when it has none
	// (empty: the default policy).
	PolicyYAML []byte
	// Model and WorkerType label the admission counters.
	Model, WorkerType string
	// PredictTTL is how long a routing decision's predicted prefix lives on
	// a worker that publishes KV events (they soon confirm or correct it).
	PredictTTL time.Duration
	// PredictTTLNoEvents is the lifetime on a worker registered without KV
	// events (WorkerInfo.PublishesEvents false): predictions are all the
	// index will ever know about it (design §6).
	PredictTTLNoEvents time.Duration
	// DrainDelay is the lame duck's first phase: when the replica is told
	// to stop it fails /readyz, marks itself not ready in etcd (its classes
	// move to the other replicas) and keeps serving the API this long, so
	// load balancers stop sending before it stops accepting
	// (docs/operations.md, "Stopping a router").
	DrainDelay time.Duration
	// ShutdownLinger keeps /metrics (and the API) up this long after the
	// replica has handed its classes off and exported its final counters,
	// so a scraper sees the last values before the process goes away.
	ShutdownLinger time.Duration

	Session   cluster.SessionConfig
	Ownership cluster.OwnershipConfig
	Gossip    gossip.Config
	Scheduler scheduler.Config
	Index     kvindex.Config
	Ingest    kvingest.Config
	Frontend  frontend.Config
	Admission admission.ClientConfig
	Exporter  metrics.ExporterConfig
	// Prompt maps served model names to tokenizers (-tokenizer NAME=SPEC)
	// and tunes the fallbacks for models without one.
	Prompt prompt.Config
	// Links secure the connections to etcd and NATS (-etcd.*, -nats.*).
	Links Links
	// Clock is what admission reads and waits on: the scheduler, the owner
	// side and the entry side (nil: wall time). Tests skew it.
	Clock scheduler.Clock
	// Tenants is the API keys file (-auth.keys-file); without one the API
	// is open.
	Tenants tenant.Config
}

// DefaultReplicaConfig returns the defaults of every part.
func DefaultReplicaConfig() ReplicaConfig {
	return ReplicaConfig{
		ID:                 "router-1",
		Cluster:            "default",
		HTTPAddr:           "127.0.0.1:8080",
		EtcdEndpoints:      []string{"http://127.0.0.1:2379"},
		NATSURL:            nats.DefaultURL,
		Model:              "any",
		WorkerType:         "simulated",
		PredictTTL:         5 * time.Second,
		PredictTTLNoEvents: 120 * time.Second,
		DrainDelay:         5 * time.Second,
		Session:            cluster.DefaultSessionConfig(),
		Ownership:          cluster.DefaultOwnershipConfig(),
		Gossip:             gossip.DefaultConfig(),
		Scheduler:          scheduler.DefaultConfig(),
		Index:              kvindex.DefaultConfig(),
		Ingest:             kvingest.DefaultConfig(),
		Frontend:           frontend.DefaultConfig(),
		Admission:          admission.DefaultClientConfig(),
		Exporter:           metrics.DefaultExporterConfig(),
		Prompt:             defaultPromptConfig(),
		Tenants:            tenant.DefaultConfig(),
	}
}

// defaultPromptConfig gives the simulated engine's model its real
// tokenizer on every router, as the workers have it (DefaultSimTokenizer).
func defaultPromptConfig() prompt.Config {
	c := prompt.DefaultConfig()
	c.Tokenizers = map[string]string{DefaultWorkerConfig().Model: DefaultSimTokenizer}
	return c
}

// normalize copies the shared fields (id, cluster) into every part.
func (c *ReplicaConfig) normalize() {
	c.Session.Cluster = c.Cluster
	// A router never exits because its lease was lost (etcd outage,
	// partition): it takes a new one and registers and claims again.
	c.Session.Regrant = true
	c.Ownership.Cluster, c.Ownership.ReplicaID = c.Cluster, c.ID
	c.Ingest.Cluster = c.Cluster
	c.Gossip.NodeName = c.ID
	if c.Gossip.ClusterLabel == "" || c.Gossip.ClusterLabel == gossip.DefaultConfig().ClusterLabel {
		// Two clusters on one network must not gossip with each other.
		c.Gossip.ClusterLabel = "switchyard-" + c.Cluster
	}
}

// Validate names the first bad field.
func (c ReplicaConfig) Validate() error {
	switch {
	case !wire.ValidName(c.ID):
		return fmt.Errorf("replica id %q: use 1-128 of [A-Za-z0-9_-]", c.ID)
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("cluster name %q: use 1-128 of [A-Za-z0-9_-]", c.Cluster)
	case len(c.EtcdEndpoints) == 0:
		return errors.New("no etcd endpoints")
	case c.NATSURL == "":
		return errors.New("no NATS URL")
	case c.PredictTTL <= 0:
		return errors.New("PredictTTL must be > 0")
	case c.PredictTTLNoEvents <= 0:
		return errors.New("PredictTTLNoEvents must be > 0")
	case c.ShutdownLinger < 0:
		return errors.New("ShutdownLinger must be >= 0")
	case c.DrainDelay < 0:
		return errors.New("DrainDelay must be >= 0")
	}
	for _, v := range []interface{ Validate() error }{c.Session, c.Ownership, c.Gossip, c.Scheduler, c.Index, c.Ingest, c.Frontend, c.Admission, c.Exporter, c.Prompt, c.Links, c.Tenants} {
		if err := v.Validate(); err != nil {
			return err
		}
	}
	return nil
}

// ReplicaStatus is what a running replica reports to `switchyard up` and
// tests: its addresses and live counters.
type ReplicaStatus struct {
	ID         string
	HTTPAddr   string
	GossipAddr string
	actor      *scheduler.Actor
	client     *admission.Client
	own        *cluster.Ownership
	ix         *kvindex.Index
}

// Snapshot is the admission actor's latest snapshot (at most the
// scheduler's SnapshotInterval old).
func (s *ReplicaStatus) Snapshot() *scheduler.Snapshot { return s.actor.Snapshot() }

// Flush returns a fresh snapshot of the admission actor.
func (s *ReplicaStatus) Flush(ctx context.Context) (*scheduler.Snapshot, error) {
	return s.actor.Flush(ctx)
}

// SchedulableWorkers is how many workers the admission actor selects from.
func (s *ReplicaStatus) SchedulableWorkers(ctx context.Context) (int, error) {
	n := 0
	err := s.actor.Do(ctx, func(c *scheduler.Core) { n = len(c.Workers()) })
	return n, err
}

// Owned lists the classes this replica owns now.
func (s *ReplicaStatus) Owned() []string {
	var out []string
	for class, o := range s.own.Owners() {
		if o.Replica == s.ID {
			out = append(out, class)
		}
	}
	sort.Strings(out)
	return out
}

// Owners is the cluster's class ownership as this replica sees it.
func (s *ReplicaStatus) Owners() map[string]cluster.Owner { return s.own.Owners() }

// Degraded reports whether the replica admits locally because NATS is down.
func (s *ReplicaStatus) Degraded() bool { return s.client.Degraded() }

// IndexedBlocks is the number of (block, worker) entries in the KV index.
func (s *ReplicaStatus) IndexedBlocks() int { return s.ix.TotalBlocks() }

// RunReplica runs one router replica until ctx ends. ready, if non-nil, is
// called once the replica serves (registries loaded, HTTP listening).
func RunReplica(ctx context.Context, cfg ReplicaConfig, log *zap.Logger, reg *prometheus.Registry, ready func(*ReplicaStatus)) error {
	cfg.normalize()
	if len(cfg.PolicyYAML) == 0 {
		cfg.PolicyYAML = defaultPolicyYAML
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("replica config: %w", err)
	}
	log = log.With(zap.String("replica", cfg.ID))

	tlsMetrics := tlsconf.NewMetrics(reg)
	etcd, err := cfg.Links.dialEtcd(cfg.EtcdEndpoints, log, tlsMetrics)
	if err != nil {
		return err
	}
	defer etcd.Close()
	natsOpts, err := cfg.Links.natsOptions(cfg.NATSURL, log, tlsMetrics, nats.Name(cfg.ID), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true))
	if err != nil {
		return err
	}
	nc, err := nats.Connect(cfg.NATSURL, natsOpts...)
	if err != nil {
		return fmt.Errorf("nats: %w", err)
	}
	defer nc.Close()

	deps := cluster.Deps{Logger: log, Registerer: reg}
	session, err := cluster.NewSession(etcd, cfg.Session, deps)
	if err != nil {
		return err
	}
	rcfg := cluster.RegistryConfig{Cluster: cfg.Cluster, RetryInterval: cfg.Ownership.RetryInterval}
	workersReg, err := cluster.NewWorkers(etcd, rcfg, deps)
	if err != nil {
		return err
	}
	replicasReg, err := cluster.NewReplicas(etcd, rcfg, deps)
	if err != nil {
		return err
	}

	// Policy: seed etcd with ours if the cluster has none; the watched
	// version is authoritative for every replica.
	policy, err := frontend.ParsePolicy(cfg.PolicyYAML)
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	var classes atomic.Pointer[[]scheduler.ClassConfig]
	classes.Store(&policy.Classes)

	g, err := gossip.New(cfg.Gossip, log, reg)
	if err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	// The scheduler reads other replicas' load from a versioned copy of the
	// gossiped view, refreshed every gossip round (publishLoads), so it
	// caches remote loads and skips blocked classes between rounds.
	remote := &scheduler.RemoteLoads{}
	clock := cfg.Clock
	if clock == nil {
		clock = scheduler.RealClock{}
	}
	cfg.Admission.Clock = clock
	core := scheduler.NewCore(cfg.Scheduler, clock, remote, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	core.SetClasses(policy.Classes)
	actor := scheduler.NewActor(core, clock, log)

	ix, err := kvindex.New(cfg.Index, kvindex.RealClock{}, log, reg)
	if err != nil {
		return fmt.Errorf("kv index: %w", err)
	}
	ingest, err := kvingest.NewSubscriber(cfg.Ingest, nc, ix, log, reg)
	if err != nil {
		return fmt.Errorf("kv ingest: %w", err)
	}
	g.SetPredictionSink(func(worker string, hashes []uint64, expires time.Time) {
		_ = ix.PredictUntil(worker, hashes, expires)
	})

	admissionMetrics := metrics.NewAdmission(reg)
	am := admission.NewMetrics(reg)
	am.DegradedByClass = admissionMetrics.DegradedAdmissions
	port := admission.LocalActor(actor, func() []scheduler.ClassConfig { return *classes.Load() })
	server := admission.NewServer(cfg.ID, cfg.Cluster, nc, port, log, am, admission.WithServerClock(clock))
	acfg := cfg.Admission
	acfg.ClusterHealthy = session.Healthy
	client := admission.NewClient(acfg, cfg.ID, cfg.Cluster, nc, port, server, log, am)

	// The ownership manager is the one watcher of the policy key: it hands
	// each version to the app (onPolicy, set once the frontend exists and
	// before ownership runs) in order with its claims and releases.
	var onPolicy func(cluster.ConfigVersion)
	own, err := cluster.NewOwnership(etcd, session, replicasReg, cfg.Ownership, cluster.Callbacks{
		OnPolicy: func(v cluster.ConfigVersion) { onPolicy(v) },
		OnAcquire: func(class string, epoch int64) error {
			if err := server.Own(class, epoch); err != nil {
				log.Error("own class", zap.String("class", class), zap.Error(err))
				return err
			}
			return nil
		},
		OnRelease: func(class string, reason cluster.ReleaseReason) {
			server.Disown(class)
			log.Info("released class", zap.String("class", class), zap.Stringer("reason", reason))
		},
	}, func(raw []byte) ([]string, error) {
		p, err := frontend.ParsePolicy(raw)
		if err != nil {
			return nil, err
		}
		return p.ClassNames(), nil
	}, deps)
	if err != nil {
		return err
	}

	exporter, err := metrics.NewExporter(cfg.Exporter, admissionMetrics, reg, nil)
	if err != nil {
		return err
	}
	// The exporter also pulls the actor's latest snapshot on its own refresh
	// interval, so counters reach /metrics even when the wiring loop is busy.
	exporter.AddSource(func() []metrics.AdmissionSnapshot {
		return []metrics.AdmissionSnapshot{admissionSnapshot(actor.Snapshot(), cfg.Model, cfg.WorkerType), client.Counts(cfg.Model, cfg.WorkerType)}
	})
	routerMetrics := metrics.NewRouter(reg)
	prompts, err := prompt.NewRegistry(cfg.Prompt, prompt.Deps{}, log, reg)
	if err != nil {
		return fmt.Errorf("tokenizers: %w", err)
	}
	prompts.SetPolicy(policy.Tokenizers)

	var keys *tenant.Store
	var tenants frontend.Tenants // nil interface: the API is open
	if cfg.Tenants.KeysFile != "" {
		if keys, err = tenant.NewStore(cfg.Tenants, log, tenant.NewMetrics(reg), nil); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		tenants = keys
	} else {
		log.Warn("no API keys file (-auth.keys-file): the OpenAI API is open to anyone who can reach it")
	}
	// serving: registries and index loaded; draining: the lame duck has
	// begun (/readyz fails, the API still serves); stopping: the drain
	// delay is over (the API answers 503 not_ready with Retry-After).
	var serving, draining, stopping atomic.Bool
	fe, err := frontend.New(cfg.Frontend, frontend.Deps{
		Tenants:  tenants,
		Admitter: admitter{c: client, m: admissionMetrics, model: cfg.Model, workerType: cfg.WorkerType},
		Workers:  workerView{workersReg},
		Prompts:  prompts,
		Index:    prefixIndex{ix: ix, g: g, ttl: cfg.PredictTTL, ttlNoEvents: cfg.PredictTTLNoEvents, publishes: workersReg.PublishesEvents},
		Policy:   policy,
		Ready: func() error {
			switch {
			case stopping.Load():
				return errors.New("shutting down: retry on another router")
			case !serving.Load():
				return errors.New("starting: registries and index not loaded yet")
			}
			// An unhealthy etcd session fences the classes this replica
			// owns (they stop admitting), but the replica still serves as
			// an entry: its requests go to the other owners.
			// No workers is not "not ready": requests then get 503
			// no_endpoints, which tells clients more.
			return nil
		},
		Draining: draining.Load,
		ReadyDetail: func() []string {
			var out []string
			for _, mode := range client.DegradedModes() {
				switch mode {
				case "nats":
					out = append(out, "degraded: NATS unreachable; every class is admitted by this replica's own scheduler until it is back")
				case "etcd":
					out = append(out, fmt.Sprintf("degraded: etcd session unhealthy; requests that find no owner for %v are admitted by this replica's own scheduler until it is back",
						cfg.Admission.EtcdDegradedAfter))
				}
			}
			return out
		},
		ClusterInfo:    clusterInfo(cfg.ID, replicasReg, workersReg, own, actor, g, client, prompts),
		MetricsHandler: metrics.Handler(reg),
		Metrics:        routerMetrics,
		TLSMetrics:     tlsMetrics,
	}, log, reg)
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	onPolicy = (&wiring{cfg: cfg, log: log, actor: actor, fe: fe, classes: &classes, adm: admissionMetrics, prompts: prompts}).applyPolicy
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	httpAddr := ln.Addr().String()
	if cfg.AdvertiseHTTP != "" {
		httpAddr = cfg.AdvertiseHTTP
	}
	var adminLn net.Listener
	if cfg.Frontend.AdminAddr != "" {
		if adminLn, err = net.Listen("tcp", cfg.Frontend.AdminAddr); err != nil {
			_ = ln.Close()
			return fmt.Errorf("listen %s: %w", cfg.Frontend.AdminAddr, err)
		}
	}

	// Shutdown is a lame duck (docs/operations.md, "Stopping a router"):
	//  1. /readyz fails and the replica re-registers as not ready, so its
	//     classes move to settled replicas while it keeps serving the API,
	//     its ownership and policy watchers and NATS, for DrainDelay;
	//  2. new API requests are answered 503 not_ready (Retry-After), and the
	//     ones in flight finish: admitted by the classes' new owners, and
	//     their streams drained, for up to the frontend's ShutdownGrace;
	//  3. whatever still waits for an owner is answered at once
	//     (Client.Leave), ownership stops (remaining classes released, keys
	//     deleted), the final counters are exported, the replica lingers
	//     (ShutdownLinger) with /metrics up, and everything else stops.
	// So the components run under their own contexts, not the caller's.
	grp := newGroup(context.Background())
	ownCtx, stopOwnership := context.WithCancel(context.Background())
	ownDone := make(chan struct{})
	httpCtx, stopHTTP := context.WithCancel(context.Background())
	leave := make(chan struct{}) // closed when the lame duck begins
	sequenced := make(chan struct{})
	go func() {
		defer close(sequenced)
		select {
		case <-ctx.Done():
		case <-grp.ctx.Done(): // a component failed
		}
		start := time.Now()
		if grp.ctx.Err() == nil && serving.Load() { // nobody sends to a replica that never served
			draining.Store(true)
			close(leave)
			log.Info("lame duck: readiness failed, handing classes off, still serving", zap.Duration("drain_delay", cfg.DrainDelay))
			t := time.NewTimer(cfg.DrainDelay)
			select {
			case <-t.C:
			case <-grp.ctx.Done():
			}
			t.Stop()
		}
		stopping.Store(true)
		// From now on every answer closes its connection: when the
		// listener finally closes, no client is left holding an idle one.
		fe.CloseKeepAlives()
		idleCtx, cancelIdle := context.WithTimeout(context.Background(), cfg.Frontend.ShutdownGrace)
		if err := fe.WaitIdle(idleCtx); err != nil {
			log.Warn("requests still in flight after the shutdown grace; cutting them", zap.Duration("grace", cfg.Frontend.ShutdownGrace))
		}
		cancelIdle()
		client.Leave()
		stopOwnership()
		select {
		case <-ownDone:
		case <-time.After(cfg.Ownership.OpTimeout + time.Second):
		case <-grp.ctx.Done():
		}
		if snap, err := flushSoon(actor); err == nil {
			exporter.Observe(admissionSnapshot(snap, cfg.Model, cfg.WorkerType))
		}
		exporter.Observe(client.Counts(cfg.Model, cfg.WorkerType))
		log.Info("drained: classes handed off, final counters exported", zap.Duration("since_stop", time.Since(start)))
		if grp.ctx.Err() == nil && cfg.ShutdownLinger > 0 {
			select {
			case <-time.After(cfg.ShutdownLinger):
			case <-grp.ctx.Done():
			}
		}
		stopHTTP()
		grp.cancel()
	}()
	grp.go_("session", session.Run)
	grp.go_("workers", workersReg.Run)
	grp.go_("replicas", replicasReg.Run)
	grp.go_("scheduler", actor.Run)
	grp.go_("gossip", g.Run)
	grp.go_("kv_ingest", ingest.Run)
	grp.go_("admission_server", server.Run)
	grp.go_("admission_client", client.Run)
	grp.go_("exporter", exporter.Run)
	grp.go_("tokenizers", prompts.Run)
	if keys != nil {
		grp.go_("keys", keys.Run)
	}
	grp.go_("http", func(ctx context.Context) error {
		// Served until the shutdown sequence is done with the API (or a
		// component failed): the streams were drained before, so the
		// frontend's own grace only covers stragglers.
		sctx, cancel := context.WithCancel(httpCtx)
		defer context.AfterFunc(ctx, cancel)()
		defer cancel()
		return fe.Serve(sctx, ln)
	})
	if adminLn != nil {
		grp.go_("http_admin", func(ctx context.Context) error { return fe.ServeAdmin(ctx, adminLn) })
	}
	grp.go_("wiring", func(ctx context.Context) error {
		return runWiring(ctx, wiring{
			cfg: cfg, nc: nc, reg: reg, log: log, etcd: etcd, session: session, workers: workersReg, replicas: replicasReg,
			own: own, actor: actor, remote: remote, ix: ix, g: g, client: client, fe: fe, classes: &classes,
			exporter: exporter, adm: admissionMetrics, router: routerMetrics, httpAddr: httpAddr, prompts: prompts,
			serving: &serving, ready: ready, grp: grp, ownCtx: ownCtx, ownDone: ownDone, leave: leave,
		})
	})
	err = grp.wait()
	stopOwnership()
	stopHTTP()
	<-sequenced
	// Remove the registration now rather than when the lease expires.
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = session.Revoke(rctx)
	return err
}

// flushSoon asks the actor for a fresh snapshot, or returns its last one
// when the actor has stopped.
func flushSoon(a *scheduler.Actor) (*scheduler.Snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if s, err := a.Flush(ctx); err == nil {
		return s, nil
	}
	return a.Snapshot(), nil
}

type wiring struct {
	cfg      ReplicaConfig
	nc       *nats.Conn
	reg      prometheus.Registerer
	log      *zap.Logger
	etcd     *clientv3.Client
	session  *cluster.Session
	workers  *cluster.Workers
	replicas *cluster.Replicas
	own      *cluster.Ownership
	actor    *scheduler.Actor
	remote   *scheduler.RemoteLoads // the scheduler's copy of the gossiped remote load
	ix       *kvindex.Index
	g        *gossip.Gossip
	client   *admission.Client
	fe       *frontend.Server
	classes  *atomic.Pointer[[]scheduler.ClassConfig]
	exporter *metrics.Exporter
	adm      *metrics.Admission
	router   *metrics.Router
	prompts  *prompt.Registry
	httpAddr string
	serving  *atomic.Bool
	ready    func(*ReplicaStatus)
	grp      *group
	ownCtx   context.Context
	ownDone  chan struct{}
	leave    <-chan struct{} // closed when the lame duck begins: register as not ready

	peersCheckedAt time.Time // last catchUpWithPeers (wiring goroutine only)
	classOwned     *prometheus.GaugeVec
	ownedSeries    map[string]struct{} // classes with a classOwned series (wiring goroutine only)
	known          map[string]struct{} // workers with metric series (wiring goroutine only)
}

// runWiring connects the components once the session and registries are up:
// it registers the replica, starts ownership, and then keeps workers,
// policy, ownership views, gossip loads, digests and metrics flowing.
func runWiring(ctx context.Context, w wiring) error {
	w.known = map[string]struct{}{}
	w.classOwned = promauto.With(w.reg).NewGaugeVec(prometheus.GaugeOpts{
		Name: metrics.NameClusterClassOwned,
		Help: "1 if this replica owns the class, 0 if it knows the class but does not own it; summed over replicas, the owners per class.",
	}, []string{metrics.LabelClass})
	if _, err := w.session.WaitLease(ctx); err != nil {
		return err
	}
	if err := w.workers.WaitSynced(ctx); err != nil {
		return err
	}
	if err := w.replicas.WaitSynced(ctx); err != nil {
		return err
	}
	if _, err := cluster.SeedConfig(ctx, w.etcd, w.cfg.Cluster, w.cfg.PolicyYAML, false); err != nil {
		return err
	}
	select {
	case <-w.g.Ready():
	case <-ctx.Done():
		return nil
	}
	info := wire.ReplicaInfo{ID: w.cfg.ID, HTTPAddr: w.httpAddr, GossipAddr: w.g.Addr(), Build: Version(), Ready: true}
	if err := w.session.RegisterReplica(ctx, info); err != nil {
		return err
	}
	reg := registration{info: info, lease: w.session.Lease(), written: true, ready: true}
	w.grp.go_("load_reports", w.followLoadReports)
	w.grp.go_("ownership", func(context.Context) error {
		defer close(w.ownDone)
		return w.own.Run(w.ownCtx) // stopped first, by RunReplica's shutdown sequence
	})
	workersChanged := w.syncWorkers()
	ownersChanged, classesChanged := w.syncOwners()
	w.serving.Store(true)
	if w.ready != nil {
		w.ready(&ReplicaStatus{ID: w.cfg.ID, HTTPAddr: w.httpAddr, GossipAddr: w.g.Addr(), actor: w.actor, client: w.client, own: w.own, ix: w.ix})
	}

	tick := time.NewTicker(w.cfg.Gossip.Interval)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	leave := w.leave
	sessionChanged := w.session.Status().Changed()
	// Each sync returns the change channel of the very snapshot it applied,
	// so a change landing while one is applied is never missed.
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-leave:
			leave = nil
			reg.info.Ready = false
			w.log.Info("registering as not ready: the classes move to the other replicas")
			if !w.register(ctx, &reg) {
				retry.Reset(w.cfg.Ownership.RetryInterval)
			}
		case <-sessionChanged:
			sessionChanged = w.session.Status().Changed()
			if !w.register(ctx, &reg) {
				retry.Reset(w.cfg.Ownership.RetryInterval)
			}
		case <-retry.C:
			if !w.register(ctx, &reg) {
				retry.Reset(w.cfg.Ownership.RetryInterval)
			}
		case <-workersChanged:
			workersChanged = w.syncWorkers()
		case <-ownersChanged:
			ownersChanged, classesChanged = w.syncOwners()
		case <-classesChanged:
			ownersChanged, classesChanged = w.syncOwners()
		case <-tick.C:
			w.publishLoads()
		}
	}
}

// registration is the replica record as last written, and the lease it was
// written under.
type registration struct {
	info    wire.ReplicaInfo
	lease   clientv3.LeaseID
	written bool // a record is in etcd under lease
	ready   bool // the Ready it was written with
}

// register writes the replica record again when the session's lease
// changed (a lost lease was replaced: the old record vanished with it) or
// the record did (not ready in lame duck). It reports false when a write
// failed and should be retried; an unhealthy session waits for its next
// status change instead.
func (w *wiring) register(ctx context.Context, reg *registration) bool {
	st := w.session.Status()
	if st.Lease != reg.lease {
		reg.lease, reg.written = st.Lease, false
	}
	if reg.info.Ready != reg.ready {
		reg.written = false
	}
	if reg.written || !st.Healthy || st.Lease == 0 {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, w.cfg.Ownership.OpTimeout)
	defer cancel()
	if err := w.session.RegisterReplica(rctx, reg.info); err != nil {
		w.log.Warn("registering the replica failed; retrying", zap.Error(err))
		return false
	}
	reg.written = true
	reg.ready = reg.info.Ready
	w.log.Info("replica registered", zap.Int64("lease", int64(st.Lease)), zap.Bool("ready", reg.info.Ready))
	return true
}

// followLoadReports reads the workers' own load reports. Their last KV
// event id reveals a lost trailing batch that no later batch would expose,
// so the index can repair the worker from a dump.
func (w *wiring) followLoadReports(ctx context.Context) error {
	reports := promauto.With(w.reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_router_load_reports_total",
		Help: "Worker load reports received, by result (ok, malformed).",
	}, []string{"result"})
	sub, err := w.nc.Subscribe(wire.NewSubjects(w.cfg.Cluster).LoadAll(), func(m *nats.Msg) {
		r, err := wire.DecodeLoadReport(m.Data)
		if err != nil {
			reports.WithLabelValues("malformed").Inc()
			return
		}
		reports.WithLabelValues("ok").Inc()
		w.ix.NoteLastEventID(r.Worker, r.Instance, r.LastEventID)
	})
	if err != nil {
		return fmt.Errorf("subscribe load reports: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe() // fails only when the connection is already closed
	return nil
}

func (w *wiring) applyPolicy(v cluster.ConfigVersion) {
	p, err := frontend.ParsePolicy(v.Raw)
	if err != nil {
		w.log.Error("policy in etcd is invalid; keeping the previous one", zap.Int64("revision", v.Revision), zap.Error(err))
		return
	}
	w.classes.Store(&p.Classes)
	w.actor.SetClasses(p.Classes)
	w.fe.SetPolicy(p)
	w.prompts.SetPolicy(p.Tokenizers)
	for _, c := range p.Classes {
		w.adm.InitClass(w.cfg.Model, w.cfg.WorkerType, c.Name)
	}
	w.log.Info("policy applied", zap.Int64("revision", v.Revision), zap.Strings("classes", p.ClassNames()))
}

// gossipDigests is the index's per-worker digests in their gossiped form.
func gossipDigests(ix *kvindex.Index) map[string]gossip.Digest {
	out := map[string]gossip.Digest{}
	for _, d := range ix.Digests(nil) {
		out[d.Worker] = gossip.Digest{LastEventID: d.LastID, Blocks: d.Blocks, Instance: d.Instance}
	}
	return out
}

// catchUpWithPeers compares this replica's index with the digests other
// replicas gossip. For each worker it notes the newest event id a peer
// applied from the same engine instance; an index that lags a peer on a
// worker gone quiet has lost a trailing batch that no later batch will
// reveal, and noting the same id twice while still behind resets the worker
// and fetches its dump (kvindex.Index.NoteLastEventID, which the workers'
// own load reports feed too). own is this replica's digests, as it gossips
// them. It returns how many workers it sent to repair.
func catchUpWithPeers(ix *kvindex.Index, own map[string]gossip.Digest, peers map[string]map[string]gossip.Digest) int {
	ahead := map[string]gossip.Digest{} // worker -> newest peer digest of our instance
	for _, ws := range peers {
		for worker, d := range ws {
			mine, ok := own[worker]
			if !ok || mine.Instance != d.Instance || d.LastEventID <= mine.LastEventID {
				continue
			}
			if d.LastEventID > ahead[worker].LastEventID {
				ahead[worker] = d
			}
		}
	}
	repaired := 0
	for worker, d := range ahead {
		if ix.NoteLastEventID(worker, d.Instance, d.LastEventID) == kvindex.OutcomeResync {
			repaired++
		}
	}
	return repaired
}

// syncWorkers hands the registry to the scheduler and drops departed
// workers from the index. It returns the channel that signals the next
// registry change after the snapshot it applied.
func (w *wiring) syncWorkers() <-chan struct{} {
	snap := w.workers.Snapshot()
	ws := make([]scheduler.Worker, 0, len(snap.Items))
	for _, it := range snap.Items {
		wi := it.Info
		ws = append(ws, scheduler.Worker{ID: wi.ID, URL: wi.URL, BlockSize: wi.BlockSize, KVBlocks: wi.KVBlocks, MaxRunning: wi.MaxNumSeqs})
		_ = w.ix.SetCapacity(wi.ID, wi.KVBlocks)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID < ws[j].ID })
	w.actor.SetWorkers(ws)
	w.prompts.SetAdvertised(advertisedTokenizers(snap.Items))
	for _, d := range w.ix.Digests(nil) {
		if _, ok := snap.Items[d.Worker]; !ok {
			w.ix.RemoveWorker(d.Worker)
		}
	}
	for id := range w.known {
		if _, ok := snap.Items[id]; !ok { // departed: drop its series
			w.router.WorkerActiveRequests.DeleteLabelValues(id)
			w.router.WorkerPrefillTokens.DeleteLabelValues(id)
			w.router.WorkerDecodeBlocks.DeleteLabelValues(id)
			delete(w.known, id)
		}
	}
	for id := range snap.Items {
		w.known[id] = struct{}{}
	}
	return snap.Changed()
}

// syncOwners hands the owner view to the admission client and exports which
// classes this replica owns. It returns the channels that signal the next
// change of the owners and of the policy's classes after the views it
// applied: the exported series depend on both.
func (w *wiring) syncOwners() (ownersChanged, classesChanged <-chan struct{}) {
	classes, classesChanged := w.own.ClassesView()
	owners, ownersChanged := w.own.OwnersView()
	out := make(map[string]admission.Owner, len(owners))
	for class, o := range owners {
		out[class] = admission.Owner{Replica: o.Replica, Epoch: o.Epoch}
	}
	// Every class of the policy has a series, 0 while this replica does not
	// own it (also while nobody does), so the sum over replicas is the
	// number of owners and 0 shows; classes gone from the policy lose theirs.
	exported := make(map[string]struct{}, len(classes))
	for _, class := range classes {
		owned := 0.0
		if owners[class].Replica == w.cfg.ID {
			owned = 1
		}
		w.classOwned.WithLabelValues(class).Set(owned)
		exported[class] = struct{}{}
	}
	for class := range w.ownedSeries {
		if _, ok := exported[class]; !ok {
			w.classOwned.DeleteLabelValues(class)
		}
	}
	w.ownedSeries = exported
	w.client.OwnersChanged(out)
	return ownersChanged, classesChanged
}

// publishLoads shares this replica's booked load and index digests over
// gossip, lets the scheduler re-evaluate its queues against the others'
// load, and exports the admission counters.
func (w *wiring) publishLoads() {
	snap := w.actor.Snapshot()
	loads := make(map[string]gossip.WorkerLoad, len(snap.Workers))
	for id, l := range snap.Workers {
		loads[id] = gossip.WorkerLoad{ActiveRequests: l.ActiveRequests, PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks}
	}
	w.g.SetLocalLoads(loads)
	// Projected load per worker: this replica's bookings plus the others'.
	remote := map[string]scheduler.WorkerLoad{}
	for id := range w.workers.Snapshot().Items {
		l, r := snap.Workers[id], w.g.RemoteLoad(id)
		remote[id] = scheduler.WorkerLoad{ActiveRequests: r.ActiveRequests, PrefillTokens: r.PrefillTokens, DecodeBlocks: r.DecodeBlocks}
		w.router.WorkerActiveRequests.WithLabelValues(id).Set(float64(l.ActiveRequests + r.ActiveRequests))
		w.router.WorkerPrefillTokens.WithLabelValues(id).Set(float64(l.PrefillTokens + r.PrefillTokens))
		w.router.WorkerDecodeBlocks.WithLabelValues(id).Set(float64(l.DecodeBlocks + r.DecodeBlocks))
	}
	degraded := 0.0
	if w.client.Degraded() {
		degraded = 1
	}
	w.router.DegradedMode.Set(degraded)
	digests := gossipDigests(w.ix)
	w.g.SetDigests(digests)
	if now := time.Now(); now.Sub(w.peersCheckedAt) >= w.cfg.Gossip.DigestInterval {
		w.peersCheckedAt = now
		catchUpWithPeers(w.ix, digests, w.g.RemoteDigests())
	}
	w.remote.Store(remote) // a new version only if some load changed
	w.actor.Drain()
	w.exporter.Observe(admissionSnapshot(snap, w.cfg.Model, w.cfg.WorkerType))
	w.exporter.Observe(w.client.Counts(w.cfg.Model, w.cfg.WorkerType))
	for class, c := range snap.Classes {
		w.adm.QueueDepth.WithLabelValues(w.cfg.Model, w.cfg.WorkerType, class).Set(float64(c.QueueDepth))
		w.adm.QueuePendingTokens.WithLabelValues(w.cfg.Model, w.cfg.WorkerType, class).Set(float64(c.PendingTokens))
	}
}

func admissionSnapshot(s *scheduler.Snapshot, model, workerType string) metrics.AdmissionSnapshot {
	out := metrics.AdmissionSnapshot{Instance: s.Instance, Seq: s.Seq, Model: model, WorkerType: workerType,
		Classes: make(map[string]metrics.AdmissionCounts, len(s.Classes))}
	for class, c := range s.Classes {
		rej := make(map[string]uint64, len(c.Counters.Rejected))
		for r, n := range c.Counters.Rejected {
			rej[r.String()] = n
		}
		// Received is counted at the entry replica (admission.Client.Counts),
		// once per request whatever moved underneath it; the owner's own
		// count of first attempts is not exported, or it would count twice.
		out.Classes[class] = metrics.AdmissionCounts{Retried: c.Counters.Retried,
			Admitted: c.Counters.Admitted, Cancelled: c.Counters.Cancelled, Rejected: rej}
	}
	return out
}

// quietEtcdLogger is log for the etcd client, which is chatty at info: at
// least warn. (IncreaseLevel on a core that is already stricter fails.)
func quietEtcdLogger(log *zap.Logger) *zap.Logger {
	l := log.Named("etcd")
	if l.Core().Enabled(zap.InfoLevel) {
		l = l.WithOptions(zap.IncreaseLevel(zap.WarnLevel))
	}
	return l
}

// admitter adapts the admission client to the frontend's port, and
// observes how long admission took: the queue wait the owner reports, and
// the rest (the decision, and the hop to a remote owner).
type admitter struct {
	c                 *admission.Client
	m                 *metrics.Admission
	model, workerType string
}

func (a admitter) Admit(ctx context.Context, r *scheduler.Request) (frontend.Ticket, error) {
	start := time.Now()
	t, err := a.c.Admit(ctx, r)
	if err != nil {
		return nil, err
	}
	g := t.Grant()
	a.m.QueueWait.WithLabelValues(a.model, a.workerType, r.Class).Observe(g.QueueWait.Seconds())
	a.m.Decision.WithLabelValues(a.model, a.workerType, r.Class).Observe(max(0, time.Since(start)-g.QueueWait).Seconds())
	return t, nil
}

// workerView adapts the worker registry to the frontend's port.
type workerView struct{ w *cluster.Workers }

func (v workerView) Workers() []frontend.WorkerEntry {
	snap := v.w.Snapshot()
	out := make([]frontend.WorkerEntry, 0, len(snap.Items))
	for _, it := range snap.Items {
		out = append(out, frontend.WorkerEntry{ID: it.Info.ID, URL: it.Info.URL, Model: it.Info.Model, BlockSize: it.Info.BlockSize, Models: it.Info.Models})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// prefixIndex adapts the KV index (exact and predicted entries) to the
// frontend's port, and shares predictions with the other replicas.
type prefixIndex struct {
	ix          *kvindex.Index
	g           *gossip.Gossip // nil: predictions stay local
	ttl         time.Duration  // on workers that publish KV events
	ttlNoEvents time.Duration  // on workers that do not
	publishes   func(worker string) bool
}

var matchPool = sync.Pool{New: func() any { s := make([]kvindex.Match, 0, 64); return &s }}

func (p prefixIndex) Overlaps(dst []scheduler.Overlap, seqHashes []uint64) []scheduler.Overlap {
	buf := matchPool.Get().(*[]kvindex.Match)
	ms := p.ix.Lookup(seqHashes, (*buf)[:0])
	for _, m := range ms {
		dst = append(dst, scheduler.Overlap{Worker: m.Worker, Blocks: m.Blocks})
	}
	*buf = ms
	matchPool.Put(buf)
	return dst
}

func (p prefixIndex) Predict(worker string, seqHashes []uint64) {
	ttl := p.ttl
	if p.publishes != nil && !p.publishes(worker) {
		ttl = p.ttlNoEvents
	}
	_ = p.ix.Predict(worker, seqHashes, ttl)
	if p.g != nil {
		p.g.Predict(worker, seqHashes, ttl)
	}
}

// clusterInfo serves /debug/cluster.
func clusterInfo(id string, reps *cluster.Replicas, ws *cluster.Workers, own *cluster.Ownership, actor *scheduler.Actor, g *gossip.Gossip, client *admission.Client, prompts *prompt.Registry) frontend.ClusterInfoFunc {
	return func(context.Context) (json.RawMessage, error) {
		type replica struct {
			ID, HTTPAddr, GossipAddr string
			Ready                    bool
		}
		type worker struct {
			ID, URL, Model      string
			Models              []string `json:",omitempty"`
			BlockSize, KVBlocks int
			LocalLoad           scheduler.WorkerLoad
			RemoteLoad          gossip.WorkerLoad
		}
		type owner struct {
			Replica string `json:"replica"`
			Epoch   int64  `json:"epoch"`
		}
		doc := struct {
			Self     string                             `json:"self"`
			Degraded bool                               `json:"degraded"`
			Replicas []replica                          `json:"replicas"`
			Owners   map[string]owner                   `json:"owners"`
			Workers  []worker                           `json:"workers"`
			Members  []gossip.Member                    `json:"gossip_members"`
			Classes  map[string]scheduler.ClassSnapshot `json:"classes"`
			// Tokenizers are each known model's tokenizer: its source,
			// spec, path (local, fetched; engine|approximate while it has
			// none), digest and last load error.
			Tokenizers []prompt.ModelInfo `json:"tokenizers"`
		}{Self: id, Degraded: client.Degraded(), Owners: map[string]owner{}, Tokenizers: prompts.Info()}
		for _, r := range reps.Snapshot().Items {
			doc.Replicas = append(doc.Replicas, replica{r.Info.ID, r.Info.HTTPAddr, r.Info.GossipAddr, r.Info.Ready})
		}
		sort.Slice(doc.Replicas, func(i, j int) bool { return doc.Replicas[i].ID < doc.Replicas[j].ID })
		for class, o := range own.Owners() {
			doc.Owners[class] = owner{o.Replica, o.Epoch}
		}
		snap := actor.Snapshot()
		for _, it := range ws.Snapshot().Items {
			doc.Workers = append(doc.Workers, worker{it.Info.ID, it.Info.URL, it.Info.Model, it.Info.Models, it.Info.BlockSize, it.Info.KVBlocks,
				snap.Workers[it.Info.ID], g.RemoteLoad(it.Info.ID)})
		}
		slices.SortFunc(doc.Workers, func(a, b worker) int {
			if a.ID < b.ID {
				return -1
			}
			if a.ID > b.ID {
				return 1
			}
			return 0
		})
		doc.Members = g.Members()
		doc.Classes = snap.Classes
		b, err := json.Marshal(doc)
		return b, err
	}
}

var _ http.Handler = http.NotFoundHandler()

// advertisedTokenizers collects, per served model name, the tokenizer
// sources the workers' registrations advertise, in worker id order.
func advertisedTokenizers(items map[string]cluster.Worker) map[string][]wire.TokenizerSource {
	ids := make([]string, 0, len(items))
	for id := range items {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	out := map[string][]wire.TokenizerSource{}
	for _, id := range ids {
		wi := items[id].Info
		if wi.Tokenizer == nil {
			continue
		}
		for _, m := range append([]string{wi.Model}, wi.Models...) {
			out[m] = append(out[m], *wi.Tokenizer)
		}
	}
	return out
}
