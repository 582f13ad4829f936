package app

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/kvingest"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// replica is one router replica's components, built by build (which starts
// nothing) and run as the services of replica.services.
type replica struct {
	cfg   ReplicaConfig
	log   *zap.Logger
	reg   *prometheus.Registry
	ready func(*ReplicaStatus) // called once the replica serves

	// Links to etcd and NATS, closed when RunReplica returns.
	etcd *clientv3.Client
	nc   *nats.Conn

	// cluster/: the session lease, the registries and class ownership.
	session  *cluster.Session
	workers  *cluster.Workers
	replicas *cluster.Replicas
	own      *cluster.Ownership

	// Admission: the actor of the owned classes, its owner side (server)
	// and entry side (client), and the policy's classes as last applied.
	actor   *scheduler.Actor
	remote  *scheduler.RemoteLoads // the scheduler's copy of the gossiped remote load
	server  *admission.Server
	client  *admission.Client
	classes atomic.Pointer[[]scheduler.ClassConfig]
	buckets *admission.BucketSync // the owned classes' tenant buckets, carried in etcd
	quota   *admission.Quota      // tenants' quotas leased across the class owners

	// The KV index, fed from NATS, and gossip.
	ix     *kvindex.Index
	ingest *kvingest.Subscriber
	// silence flags workers whose KV events never reach the index.
	silence *kvingest.Silence
	gossip  *gossip.Gossip
	// sessions is the session → worker table the frontend routes by,
	// shared with the other replicas through gossip.
	sessions *scheduler.SessionTable
	suspects *workerSuspects // workers suspected of a hung engine, over gossip

	// frontend/: the API, its listeners, tokenizers and API keys (nil: open).
	fe       *frontend.Server
	ln       net.Listener
	adminLn  net.Listener // nil without -http.admin-addr
	httpAddr string       // advertised
	prompts  *prompt.Registry
	keys     *tenant.Store

	// metrics/.
	exporter *metrics.Exporter
	adm      *metrics.Admission
	router   *metrics.Router

	// serving: registries and index loaded; draining: the lame duck has
	// begun (/readyz fails, the API still serves); stopping: the drain
	// delay is over (the API answers 503 not_ready with Retry-After).
	serving, draining, stopping atomic.Bool
	leave                       chan struct{} // closed when the lame duck begins: register as not ready
	stopBegan                   time.Time     // when the lame duck began (or the stop, if it never served)

	m membershipState // the membership service's own state

	reports loadReports // the workers' last load reports, for /debug/cluster
}

// build creates every component, wired to each other, and starts nothing.
func (r *replica) build() error {
	cfg, log, reg := &r.cfg, r.log, r.reg
	r.leave = make(chan struct{})

	tlsMetrics := tlsconf.NewMetrics(reg)
	etcd, err := cfg.Links.dialEtcd(cfg.EtcdEndpoints, log, tlsMetrics)
	if err != nil {
		return err
	}
	r.etcd = etcd
	// A connection cut silently (packets dropped, no reset) is only noticed
	// by pings: at the bound's pace, not NATS's default two minutes, so a
	// silent cut too makes this replica withdraw from class placement
	// (watchNATS) within about three ping intervals plus the bound.
	natsOpts, err := cfg.Links.natsOptions(cfg.NATSURL, log, tlsMetrics, nats.Name(cfg.ID), nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond),
		nats.RetryOnFailedConnect(true), nats.PingInterval(max(cfg.Admission.OwnerUnreachableAfter, time.Second)), nats.MaxPingsOutstanding(2))
	if err != nil {
		return err
	}
	if r.nc, err = nats.Connect(cfg.NATSURL, natsOpts...); err != nil {
		return fmt.Errorf("nats: %w", err)
	}

	deps := cluster.Deps{Logger: log, Registerer: reg}
	if r.session, err = cluster.NewSession(etcd, cfg.Session, deps); err != nil {
		return err
	}
	rcfg := cluster.RegistryConfig{Cluster: cfg.Cluster, RetryInterval: cfg.Ownership.RetryInterval}
	if r.workers, err = cluster.NewWorkers(etcd, rcfg, deps); err != nil {
		return err
	}
	if r.replicas, err = cluster.NewReplicas(etcd, rcfg, deps); err != nil {
		return err
	}

	// Policy: seed etcd with ours if the cluster has none; the watched
	// version is authoritative for every replica.
	policy, err := frontend.ParsePolicy(cfg.PolicyYAML)
	if err != nil {
		return fmt.Errorf("policy: %w", err)
	}
	r.classes.Store(&policy.Classes)

	// The listeners come before gossip: their addresses and the build go
	// in the node meta that /debug/cluster shows for each member.
	if r.ln, err = net.Listen("tcp", cfg.HTTPAddr); err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	r.httpAddr = r.ln.Addr().String()
	if cfg.AdvertiseHTTP != "" {
		r.httpAddr = cfg.AdvertiseHTTP
	}
	if cfg.Frontend.AdminAddr != "" {
		if r.adminLn, err = net.Listen("tcp", cfg.Frontend.AdminAddr); err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Frontend.AdminAddr, err)
		}
	}
	cfg.Gossip.Meta.HTTPAddr, cfg.Gossip.Meta.Version = r.httpAddr, Version()
	if r.gossip, err = gossip.New(cfg.Gossip, log, reg); err != nil {
		return fmt.Errorf("gossip: %w", err)
	}
	r.suspects = newWorkerSuspects(r.gossip, cfg.Frontend.SuspectTTL, log, reg)
	// The scheduler reads other replicas' load from a versioned copy of the
	// gossiped view, refreshed every gossip round (publishLoads), so it
	// caches remote loads and skips blocked classes between rounds.
	r.remote = &scheduler.RemoteLoads{}
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	cfg.Admission.Clock = clk
	// The herd band keys its draw by a block the index can report
	// (scheduler.Config.IndexKeeps): with a sampled index, the kept ones.
	if n := cfg.Index.Sample; n > 1 {
		cfg.Scheduler.IndexKeeps = func(h uint64) bool { return kvindex.Sampled(h, n) }
	}
	core := scheduler.NewCore(cfg.Scheduler, clk, r.remote, rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64())))
	core.SetClasses(policy.Classes)
	r.actor = scheduler.NewActor(core, clk, log)

	if r.ix, err = kvindex.New(cfg.Index, clock.Real{}, log, reg); err != nil {
		return fmt.Errorf("kv index: %w", err)
	}
	if r.ingest, err = kvingest.NewSubscriber(cfg.Ingest, r.nc, r.ix, log, reg); err != nil {
		return fmt.Errorf("kv ingest: %w", err)
	}
	r.silence = kvingest.NewSilence(cfg.Ingest.SilentWindow, cfg.Ingest.SilentBlocks, reg)
	r.gossip.SetPredictionSink(func(worker string, hashes []uint64, expires time.Time) {
		_ = r.ix.PredictUntil(worker, hashes, expires)
	})
	r.sessions = scheduler.NewSessionTable(cfg.Frontend.MaxSessions, cfg.Frontend.SessionTTL)
	r.gossip.SetSessionSink(func(session uint64, worker string, at, expires time.Time) {
		r.sessions.Record(session, worker, at, expires)
	})

	r.adm = metrics.NewAdmission(reg)
	am := admission.NewMetrics(reg)
	am.DegradedByClass = r.adm.DegradedAdmissions
	port := admission.LocalActor(r.actor, func() []scheduler.ClassConfig { return *r.classes.Load() })
	acfg := cfg.Admission
	r.server = admission.NewServer(cfg.ID, cfg.Cluster, r.nc, port, log, am, admission.WithServerClock(clk), admission.WithAdoptHold(acfg.AdoptHold),
		admission.WithEntries(r.entryReplicas))
	acfg.ClusterHealthy = r.session.Healthy
	acfg.ReplicasAlive = r.replicasAlive
	r.client = admission.NewClient(acfg, cfg.ID, cfg.Cluster, r.nc, port, r.server, log, am)
	qcfg := admission.DefaultQuotaConfig()
	qcfg.HomeOf = r.tenantHome
	r.quota = admission.NewQuota(qcfg, r.server, r.client, log)
	core.SetTenantHook(r.quota) // before the actor runs
	r.quota.UseStore(cluster.NewQuotaBuckets(etcd, cfg.Cluster), acfg.BucketSyncInterval, cfg.Ownership.OpTimeout)
	r.buckets = admission.NewBucketSync(cluster.NewBuckets(etcd, cfg.Cluster), admission.ActorBuckets(r.actor), r.server,
		acfg.BucketSyncInterval, cfg.Ownership.OpTimeout, clk, log, am)

	// The ownership manager is the one watcher of the policy key: it hands
	// each version to applyPolicy in order with its claims and releases.
	// applyPolicy uses the frontend, which exists before ownership runs.
	r.own, err = cluster.NewOwnership(etcd, r.session, r.replicas, cfg.Ownership, cluster.Callbacks{
		OnPolicy: r.applyPolicy,
		OnAcquire: func(class string, epoch int64) error {
			r.buckets.Acquired(class) // before anything is admitted
			r.quota.Acquired(class)
			if err := r.server.Own(class, epoch); err != nil {
				log.Error("own class", zap.String("class", class), zap.Error(err))
				return err
			}
			return nil
		},
		OnRelease: func(class string, reason cluster.ReleaseReason) {
			epoch, owned := r.server.Owns(class)
			r.server.Disown(class)
			if owned && (reason == cluster.ReleaseHandoff || reason == cluster.ReleaseShutdown) && r.session.Healthy() {
				r.buckets.Released(class, epoch) // the key is still ours: carry the exact levels
				r.quota.Released(class, epoch)
			}
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

	if r.exporter, err = metrics.NewExporter(cfg.Exporter, r.adm, reg, nil); err != nil {
		return err
	}
	// The exporter also pulls the actor's latest snapshot on its own refresh
	// interval, so counters reach /metrics even when the membership loop is
	// busy.
	r.exporter.AddSource(func() []metrics.AdmissionSnapshot {
		return []metrics.AdmissionSnapshot{admissionSnapshot(r.actor.Snapshot(), cfg.WorkerType), r.client.Counts(cfg.WorkerType)}
	})
	r.router = metrics.NewRouter(reg)
	// Tokenizer files come from adapters and token ids from engines, both
	// at the URLs workers register: the engine TLS settings verify them.
	var promptDeps prompt.Deps
	if cfg.Frontend.EngineTLS.Enabled() {
		if promptDeps.TLS, err = cfg.Frontend.EngineTLS.Build(tlsconf.Deps{Name: "engine_tokenizer", Logger: log, Metrics: tlsMetrics}); err != nil {
			return fmt.Errorf("tokenizers: %w", err)
		}
	}
	if r.prompts, err = prompt.NewRegistry(cfg.Prompt, promptDeps, log, reg); err != nil {
		return fmt.Errorf("tokenizers: %w", err)
	}
	r.prompts.SetPolicy(policy.Tokenizers)

	var tenants frontend.Tenants // nil interfaces: the API is open
	var admins frontend.Admins
	if cfg.Tenants.KeysFile != "" {
		if r.keys, err = tenant.NewStore(cfg.Tenants, log, tenant.NewMetrics(reg), nil); err != nil {
			return fmt.Errorf("keys: %w", err)
		}
		tenants, admins = r.keys, r.keys
	}
	warnAdminSurface(log, cfg.Frontend.AdminAddr, r.keys)
	page, err := r.opsPage(tlsMetrics)
	if err != nil {
		return err
	}
	r.fe, err = frontend.New(cfg.Frontend, frontend.Deps{
		Tenants:  tenants,
		Admins:   admins,
		Admitter: admitter{c: r.client, m: r.adm, workerType: cfg.WorkerType},
		Workers:  workerView{r.workers},
		Prompts:  r.prompts,
		Index: prefixIndex{ix: r.ix, g: r.gossip, ttl: cfg.PredictTTL, ttlNoEvents: cfg.PredictTTLNoEvents,
			publishes: r.workers.PublishesEvents},
		Policy:         policy,
		Ready:          r.readiness,
		Draining:       r.draining.Load,
		ReadyDetail:    r.readyDetail,
		ClusterInfo:    r.clusterInfo,
		AdminPages:     page.DataRoutes(),
		AdminShell:     page.ShellRoutes(),
		MetricsHandler: metrics.Handler(reg),
		Metrics:        r.router,
		TLSMetrics:     tlsMetrics,
		Suspects:       r.suspects,
		Sessions:       r.sessions,
		SessionShare:   r.gossip,
	}, log, reg)
	if err != nil {
		return fmt.Errorf("frontend: %w", err)
	}
	return nil
}

// warnAdminSurface says at startup who can read the API and the admin
// routes (/metrics: tenant ids; /debug/cluster: engine URLs, a way around
// every quota); frontend/admin.go decides where they are served.
func warnAdminSurface(log *zap.Logger, adminAddr string, keys *tenant.Store) {
	switch {
	case keys == nil && adminAddr == "":
		log.Warn("no API keys file (-auth.keys-file) and no admin listener (-http.admin-addr): the OpenAI API, /metrics and /debug/* are open to anyone who can reach the API listener")
	case keys == nil:
		log.Warn("no API keys file (-auth.keys-file): the OpenAI API is open to anyone who can reach it")
	case adminAddr == "" && len(keys.Set().Admins()) == 0:
		log.Warn("no admin listener (-http.admin-addr) and no admins in the keys file: /metrics and /debug/* refuse every request on the API listener")
	case adminAddr == "":
		log.Info("no admin listener (-http.admin-addr): /metrics and /debug/* on the API listener need an admin key", zap.Strings("admins", keys.Set().Admins()))
	}
}

// closeLinks closes what build opened: the listeners (unless served, which
// closes them) and the etcd and NATS connections.
func (r *replica) closeLinks() {
	for _, ln := range []net.Listener{r.ln, r.adminLn} {
		if ln != nil {
			_ = ln.Close() // already closed when it was served
		}
	}
	if r.nc != nil {
		r.nc.Close()
	}
	if r.etcd != nil {
		_ = r.etcd.Close()
	}
}

// readiness is the frontend's ready check.
func (r *replica) readiness() error {
	switch {
	case r.stopping.Load():
		return errors.New("shutting down: retry on another router")
	case !r.serving.Load():
		return errors.New("starting: registries and index not loaded yet")
	}
	// An unhealthy etcd session fences the classes this replica owns (they
	// stop admitting), but the replica still serves as an entry: its
	// requests go to the other owners. No workers is not "not ready":
	// requests then get 503 no_endpoints, which tells clients more.
	return nil
}

// readyDetail is what /readyz adds about the degraded modes.
func (r *replica) readyDetail() []string {
	var out []string
	for _, mode := range r.client.DegradedModes() {
		switch mode {
		case "nats":
			out = append(out, "degraded: NATS unreachable; every class is admitted by this replica's own scheduler until it is back")
		case "etcd":
			out = append(out, fmt.Sprintf("degraded: etcd session unhealthy; requests that find no owner for %v are admitted by this replica's own scheduler until it is back",
				r.cfg.Admission.EtcdDegradedAfter))
		case "owner_unreachable":
			un := r.client.UnreachableOwners()
			classes := make([]string, 0, len(un))
			for class, owner := range un {
				classes = append(classes, class+" (owner "+owner+")")
			}
			sort.Strings(classes)
			out = append(out, fmt.Sprintf("degraded: class owners answer no responders over NATS for %v; admitted by this replica's own scheduler until they answer or the classes move: %s",
				r.cfg.Admission.OwnerUnreachableAfter, strings.Join(classes, ", ")))
		}
	}
	if r.m.natsWithdrawn.Load() {
		out = append(out, fmt.Sprintf("withdrawn: NATS unreachable for %v; registered as not ready so the classes this replica owned move to replicas that can serve them, and it claims none until NATS is back",
			r.cfg.Admission.OwnerUnreachableAfter))
	}
	return out
}

// tenantHome is a tenant's home class (frontend's homeClass): its default
// class when the policy has it, else the policy's default. Its owner is the
// tenant's quota owner (admission.Quota).
func (r *replica) tenantHome(id string) string {
	if r.fe == nil {
		return ""
	}
	pol := r.fe.Policy()
	if pol == nil {
		return ""
	}
	if r.keys != nil {
		for _, t := range r.keys.Set().Tenants() {
			if t.ID == id && t.DefaultClass != "" && pol.HasClass(t.DefaultClass) {
				return t.DefaultClass
			}
		}
	}
	return pol.DefaultClass
}
