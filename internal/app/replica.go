package app

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/service"
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
	// WorkerType labels the admission counters. They have no model label:
	// a class queue holds the requests of every model (docs/metrics.md).
	WorkerType string
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
	Clock clock.Clock
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

// KubernetesTerminationGrace is Kubernetes' default
// terminationGracePeriodSeconds: a stop with the default configuration
// finishes inside it (TestTheDefaultStopFitsKubernetesDefaultGrace).
const KubernetesTerminationGrace = 30 * time.Second

// stopRevoke bounds the lease revoke that ends a stop.
const stopRevoke = 2 * time.Second

// StopBound is the longest the replica's stop (the lame duck, lame_duck.go)
// may take by design: the drain delay, one wait for the requests in flight
// (ShutdownGrace, a deadline the HTTP server's own shutdown does not
// extend), the ownership hand-off (OpTimeout + 1 s), the linger and the
// lease revoke. A supervisor's kill grace must exceed it.
func (c ReplicaConfig) StopBound() time.Duration {
	return c.DrainDelay + c.Frontend.ShutdownGrace + c.Ownership.OpTimeout + time.Second +
		c.ShutdownLinger + stopRevoke
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
	buckets    *admission.BucketSync
	server     *admission.Server
	suspects   *workerSuspects // tests read its view
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
//
// The replica is a set of services (internal/service) started in
// dependency order and stopped in reverse; services lists them. Stopping
// is a lame duck (docs/operations.md, "Stopping a router"):
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
//
// So the services run under their own contexts, not the caller's: ctx
// ending begins that sequence.
func RunReplica(ctx context.Context, cfg ReplicaConfig, log *zap.Logger, reg *prometheus.Registry, ready func(*ReplicaStatus)) error {
	cfg.normalize()
	if len(cfg.PolicyYAML) == 0 {
		cfg.PolicyYAML = defaultPolicyYAML
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("replica config: %w", err)
	}
	log = log.With(zap.String("replica", cfg.ID))

	r := &replica{cfg: cfg, log: log, reg: reg, ready: ready}
	defer r.closeLinks()
	if err := r.build(); err != nil {
		return err
	}
	m, err := service.New(r.services()...)
	if err != nil {
		return err
	}
	err = m.Run(ctx)
	// Remove the registration now rather than when the lease expires.
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = r.session.Revoke(rctx)
	return err
}

// services is the replica as services, in the order of the architecture
// (docs/architecture.md): the cluster's state first, then admission and
// the KV index, the API, the membership that joins them to the cluster,
// class ownership, and the lame duck around it all. Each starts after what
// it depends on and stops before it.
func (r *replica) services() []service.Service {
	// The API keys file and the admin listener are optional: without them
	// the service only keeps its place in the order (no Run).
	keys, admin := service.Service{Name: "keys"}, service.Service{Name: "api_admin"}
	if r.keys != nil {
		keys.Run = r.keys.Run
	}
	if r.adminLn != nil {
		admin.Run = func(ctx context.Context) error { return r.fe.ServeAdmin(ctx, r.adminLn) }
	}
	return []service.Service{
		// cluster/ (etcd): the session lease and the registries.
		{Name: "session", Run: r.session.Run},
		{Name: "workers", Run: r.workers.Run},
		{Name: "replicas", Run: r.replicas.Run},
		// The admission actor: queues, selector and ledger of the classes
		// this replica owns.
		{Name: "scheduler", Run: r.actor.Run},
		// gossip/ (memberlist): loads, predictions and digests.
		{Name: "gossip", Run: r.gossip.Run},
		// kvindex fed by the workers' KV events over NATS.
		{Name: "kv_ingest", Run: r.ingest.Run},
		// admission/: the owner side (NATS admit.<class>) and the entry side.
		{Name: "admission_server", Deps: []string{"scheduler"}, Run: r.server.Run},
		{Name: "admission_client", Deps: []string{"admission_server", "session"}, Run: r.client.Run},
		// The owned classes' tenant buckets, saved to etcd (design §16).
		{Name: "bucket_sync", Deps: []string{"admission_server"}, Run: r.buckets.Run},
		// Tenants' quotas leased across the class owners (design §16).
		{Name: "quota", Deps: []string{"admission_server", "admission_client"}, Run: r.quota.Run},
		// metrics/: the high-water exporter of the admission counters.
		{Name: "exporter", Deps: []string{"scheduler", "admission_client"}, Run: r.exporter.Run},
		{Name: "tokenizers", Run: r.prompts.Run},
		keys,
		// frontend/: the OpenAI API, served from the start (/readyz says
		// "starting" until the replica serves).
		admin,
		{Name: "api", Deps: []string{"admission_client", "workers", "kv_ingest", "gossip", "tokenizers", "keys", "exporter"},
			Run: r.serveAPI},
		// The replica joins the cluster (registers once its registries are
		// loaded) and keeps workers, policy, owners and loads flowing.
		{Name: "membership", Deps: []string{"session", "workers", "replicas", "scheduler", "gossip", "admission_client", "api"},
			Start: r.join, Run: r.follow},
		{Name: "load_reports", Deps: []string{"membership"}, Run: r.followLoadReports},
		// Workers whose KV events never reach the index, for the page
		// and the alert.
		{Name: "kv_silence", Deps: []string{"kv_ingest", "api"}, Run: r.watchKVSilence},
		// On stop: the final counters, then the linger with /metrics up.
		{Name: "final_metrics", Deps: []string{"membership", "exporter", "api", "api_admin"}, Stop: r.exportFinalMetrics},
		// cluster/ class ownership: claims once this replica is registered,
		// and releases every class before the final counters and the API.
		{Name: "ownership", Deps: []string{"membership", "admission_server", "final_metrics"}, Run: r.own.Run,
			StopTimeout: r.cfg.Ownership.OpTimeout + time.Second},
		// Serving: ready once everything runs; on stop, the lame duck's
		// drain while everything still runs.
		{Name: "lame_duck", Deps: []string{"ownership", "api", "admission_client"}, Start: r.serve, Stop: r.drain},
	}
}
