package app

import (
	"context"
	cryptorand "crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"golang.org/x/sync/errgroup"
	"golang.org/x/term"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/tenant"
	"github.com/switchyard/switchyard/wire"
)

// UpConfig is a whole local cluster in one process.
type UpConfig struct {
	Replicas   int
	Workers    int
	HTTPBase   int // first replica's port; the others follow
	WorkerPort int // first worker's port
	EtcdPort   int // client port; the peer port is the next one
	NATSPort   int
	Host       string
	Speedup    float64
	DataDir    string // embedded etcd data; empty: a temporary directory removed on exit
	Replica    ReplicaConfig
	Worker     WorkerConfig
	Status     time.Duration // live status refresh; 0 disables it
	// Protocol is the workers' protocol: ProtocolNative, or ProtocolVLLM
	// to run each simulated worker as a vLLM-protocol engine with a
	// `switchyard adapter` beside it (the path a real vLLM fleet takes).
	Protocol string
	// ZMQPort is the first vLLM-protocol worker's KV event port (its
	// replay port is the next one; the other workers follow in pairs);
	// AdapterPort is the first adapter's HTTP port.
	ZMQPort     int
	AdapterPort int
	// TLS runs every link over TLS with credentials: a CA made for the run
	// issues the certificates of etcd (mutual TLS), NATS (mutual TLS and a
	// user per role with the subject permissions of deploy/nats/auth.conf),
	// the routers' API and the workers' HTTP, which routers verify. With
	// ProtocolVLLM the engines require client certificates (the adapters'
	// and the routers') and the adapters serve HTTPS too. Gossip is
	// encrypted either way; the engines' ZMQ events stay plaintext on the
	// host.
	TLS bool
	// DPSize > 1 runs every simulated engine with data parallelism: N
	// ranks behind one API server, an adapter per rank (up_dp.go). It
	// needs ProtocolVLLM.
	DPSize int
	// PDPrefill and PDDecode make the first PDPrefill workers prefill
	// workers and the next PDDecode decode workers, speaking PDTransfer
	// (wire.TransferVLLM or wire.TransferSGLang); up_pd.go.
	PDPrefill, PDDecode int
	PDTransfer          string
}

// DefaultUpConfig is the embedded default of `make up`.
func DefaultUpConfig() UpConfig {
	return UpConfig{
		Replicas: 3, Workers: 8, HTTPBase: 8080, WorkerPort: 9001, EtcdPort: 12379, NATSPort: 14222,
		Host: "127.0.0.1", Speedup: 1, Replica: upReplicaConfig(), Worker: DefaultWorkerConfig(),
		Status: time.Second, Protocol: ProtocolNative, ZMQPort: 15557, AdapterPort: 9101,
		PDTransfer: wire.TransferVLLM,
	}
}

// upReplicaConfig is a router's defaults in `up`: no load balancer sits in
// front of the local replicas, so the lame duck's drain delay is short.
func upReplicaConfig() ReplicaConfig {
	c := DefaultReplicaConfig()
	c.DrainDelay = time.Second
	return c
}

// Up is the `switchyard up` subcommand: embedded etcd and NATS, router
// replicas and simulated workers on localhost, until Ctrl-C.
func Up(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, level, help, err := parseSubcommand(upFlags, args, stderr)
	if help || err != nil {
		return err
	}
	// -workers 0 fronts only real engines, each joined by its own
	// `switchyard adapter` against the embedded etcd and NATS.
	if cfg.Replicas < 1 || cfg.Workers < 0 {
		_, _ = fmt.Fprintln(stderr, "up: need at least one replica, and no negative number of workers")
		return ErrUsage
	}
	if cfg.Protocol != ProtocolNative && cfg.Protocol != ProtocolVLLM {
		_, _ = fmt.Fprintf(stderr, "up: -protocol %q must be %s or %s\n", cfg.Protocol, ProtocolNative, ProtocolVLLM)
		return ErrUsage
	}
	if ports := upPorts(cfg); cfg.Protocol == ProtocolVLLM && len(ports) < upPortCount(cfg) {
		_, _ = fmt.Fprintf(stderr, "up: with %d workers the workers', adapters' and ZeroMQ ports overlap: set -adapter-port and -zmq-port\n", cfg.Workers)
		return ErrUsage
	}
	if cfg.DPSize > 1 && cfg.Protocol != ProtocolVLLM {
		// Ranks are vLLM's: their adapters register them.
		_, _ = fmt.Fprintln(stderr, "up: -dp-size needs -protocol vllm")
		return ErrUsage
	}
	if cfg.DPSize < 0 || cfg.DPSize > 64 {
		_, _ = fmt.Fprintf(stderr, "up: -dp-size %d must be in [0, 64]\n", cfg.DPSize)
		return ErrUsage
	}
	if err := cfg.validatePD(); err != nil {
		_, _ = fmt.Fprintf(stderr, "up: %v\n", err)
		return ErrUsage
	}
	if cfg.Protocol == ProtocolVLLM && cfg.ZMQPort == 0 {
		// The adapters must know where their engines publish.
		_, _ = fmt.Fprintln(stderr, "up: -protocol vllm needs a -zmq-port")
		return ErrUsage
	}
	if err := checkUpKeysFile(cfg.Replica.Tenants); err != nil {
		// Every replica would fail on it and be restarted again and again.
		_, _ = fmt.Fprintf(stderr, "up: %v\n", err)
		return ErrUsage
	}
	if err := waitUpPorts(ctx, cfg, 5*time.Second, stderr); err != nil {
		return err
	}
	log := newLogger(stderr, level)
	defer func() { _ = log.Sync() }()
	return RunUp(ctx, cfg, log, stdout)
}

// upFlags is up's flag set, bound to a default config; resolve turns the
// parsed flags into the cluster's config (policy file read).
func upFlags() (*flag.FlagSet, func() (UpConfig, zapcore.Level, error)) {
	cfg := DefaultUpConfig()
	fs := flag.NewFlagSet("up", flag.ContinueOnError)
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "router replicas")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "simulated workers")
	fs.IntVar(&cfg.HTTPBase, "port", cfg.HTTPBase, "OpenAI API port of the first replica; the others use the next ports")
	fs.IntVar(&cfg.WorkerPort, "worker-port", cfg.WorkerPort, "port of the first worker; the others use the next ports")
	fs.IntVar(&cfg.EtcdPort, "etcd-port", cfg.EtcdPort, "embedded etcd client port (the peer port is the next one)")
	fs.IntVar(&cfg.NATSPort, "nats-port", cfg.NATSPort, "embedded NATS port")
	fs.StringVar(&cfg.Host, "host", cfg.Host, "address every component listens on")
	fs.Float64Var(&cfg.Speedup, "speedup", cfg.Speedup, "simulated engines run this many times faster than the timing model")
	fs.StringVar(&cfg.DataDir, "data-dir", cfg.DataDir, "embedded etcd data directory (default: a temporary one)")
	fs.DurationVar(&cfg.Status, "status-interval", cfg.Status, "live status refresh (0: off)")
	fs.StringVar(&cfg.Protocol, "protocol", cfg.Protocol, "workers' protocol: native, or vllm (each worker speaks vLLM's KV event protocol and metrics, and a switchyard adapter beside it joins it to the cluster)")
	fs.IntVar(&cfg.ZMQPort, "zmq-port", cfg.ZMQPort, "with -protocol vllm: the first worker's KV event port; its replay port is the next, the other workers follow in pairs (default: -worker-port + 200)")
	fs.IntVar(&cfg.AdapterPort, "adapter-port", cfg.AdapterPort, "with -protocol vllm: the first adapter's HTTP port; the others use the next ports (default: -worker-port + 100)")
	fs.DurationVar(&cfg.Replica.DrainDelay, "shutdown-drain-delay", cfg.Replica.DrainDelay, "on Ctrl-C each router fails /readyz, hands its classes off and keeps serving this long (lame duck) before draining its streams")
	fs.DurationVar(&cfg.Replica.Frontend.ShutdownGrace, "shutdown-grace", cfg.Replica.Frontend.ShutdownGrace, "how long each router then waits for its in-flight requests and streams")
	fs.IntVar(&cfg.DPSize, "dp-size", cfg.DPSize, "with -protocol vllm: run every simulated engine with this many data-parallel ranks behind one API server, an adapter per rank (0 or 1: none)")
	fs.BoolVar(&cfg.TLS, "tls", cfg.TLS, "run every link over TLS with credentials, from a CA made for this run (docs/security.md)")
	var pd string
	fs.StringVar(&pd, "pd", "", "run a disaggregated fleet xPyD (for example 2P2D): the first x simulated workers prefill, the next y decode, the rest of -workers (raised to x+y) run both")
	fs.StringVar(&cfg.PDTransfer, "kv-transfer", cfg.PDTransfer, "with -pd: the role workers' KV transfer protocol, vllm or sglang")
	var policyFile string
	fs.StringVar(&policyFile, "policy", "", "policy classes YAML (default: deploy/policy.yaml, built in)")
	cfg.Replica.Tenants.RegisterFlags(fs, "auth.")
	level := zapcore.WarnLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	resolve := func() (UpConfig, zapcore.Level, error) {
		c := cfg
		given := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
		deriveVLLMPorts(&c, given["adapter-port"], given["zmq-port"])
		if pd != "" {
			var err error
			if c.PDPrefill, c.PDDecode, err = parsePDShape(pd); err != nil {
				return c, level, err
			}
			c.pdWorkers()
		}
		if policyFile != "" {
			raw, err := os.ReadFile(policyFile)
			if err != nil {
				return c, level, fmt.Errorf("policy: %w", err)
			}
			c.Replica.PolicyYAML = raw
		}
		return c, level, nil
	}
	return fs, resolve
}

// deriveVLLMPorts puts the adapters and the engines' ZeroMQ ports beside
// the workers' unless given: adapters from -worker-port + 100, ZeroMQ pairs
// from -worker-port + 200 (9101 and 9201 by default), so moving the
// workers moves them too. With -worker-port 0 (any) the adapters take any
// port and the ZeroMQ ports keep their fixed default.
func deriveVLLMPorts(c *UpConfig, adapterGiven, zmqGiven bool) {
	if c.WorkerPort == 0 {
		if !adapterGiven {
			c.AdapterPort = 0
		}
		return
	}
	if !adapterGiven {
		c.AdapterPort = c.WorkerPort + vllmAdapterOffset
	}
	if !zmqGiven {
		c.ZMQPort = c.WorkerPort + vllmZMQOffset
	}
}

const vllmAdapterOffset, vllmZMQOffset = 100, 200

// vllmBanner says where -protocol vllm put the engines, their ZeroMQ
// event and replay ports and their adapters.
func vllmBanner(cfg UpConfig) string {
	span := func(base, n int) string {
		switch {
		case base == 0:
			return "free ports"
		case n == 1:
			return fmt.Sprintf("%s:%d", cfg.Host, base)
		}
		return fmt.Sprintf("%s:%d-%d", cfg.Host, base, base+n-1)
	}
	return fmt.Sprintf("  workers speak vLLM's protocol: engines on %s, their ZeroMQ KV events and replay on %s (in pairs),\n"+
		"  each joined by a switchyard adapter (/metrics, /readyz) on %s\n",
		span(cfg.WorkerPort, cfg.Workers), span(cfg.ZMQPort, 2*cfg.Workers*cfg.dpRanks()), span(cfg.AdapterPort, cfg.Workers*cfg.dpRanks())) +
		dpBanner(cfg)
}

// dpBanner says how -dp-size split the engines into ranks.
func dpBanner(cfg UpConfig) string {
	if cfg.DPSize <= 1 {
		return ""
	}
	return fmt.Sprintf("  each engine runs %d data-parallel ranks behind its API server: %d routing targets (worker-N-dp<rank>),\n"+
		"  each rank with its own KV cache and events, pinned by X-data-parallel-rank\n", cfg.DPSize, cfg.Workers*cfg.DPSize)
}

// upPorts names the fixed ports up is about to listen on (port 0: any).
func upPorts(cfg UpConfig) map[int]string {
	ports := map[int]string{}
	add := func(base, n int, what string) {
		for i := 0; i < n && base != 0; i++ {
			ports[base+i] = fmt.Sprintf(what, i+1)
		}
	}
	add(cfg.HTTPBase, cfg.Replicas, "router-%d's API")
	add(cfg.WorkerPort, cfg.Workers, "worker-%d's API")
	if cfg.EtcdPort != 0 {
		ports[cfg.EtcdPort], ports[cfg.EtcdPort+1] = "embedded etcd's client port", "embedded etcd's peer port"
	}
	if cfg.NATSPort != 0 {
		ports[cfg.NATSPort] = "embedded NATS"
	}
	if cfg.Protocol == ProtocolVLLM {
		add(cfg.AdapterPort, cfg.Workers*cfg.dpRanks(), "worker-%d's adapter")
		add(cfg.ZMQPort, 2*cfg.Workers*cfg.dpRanks(), "ZeroMQ port %d of the vLLM workers' event and replay pairs")
	}
	return ports
}

// upPortCount is how many fixed ports up listens on (upPorts has fewer
// when two uses overlap).
func upPortCount(cfg UpConfig) int {
	n := 0
	for _, base := range []struct{ port, count int }{{cfg.HTTPBase, cfg.Replicas}, {cfg.WorkerPort, cfg.Workers},
		{cfg.EtcdPort, 2}, {cfg.NATSPort, 1}} {
		if base.port != 0 {
			n += base.count
		}
	}
	if cfg.Protocol == ProtocolVLLM {
		if cfg.AdapterPort != 0 {
			n += cfg.Workers * cfg.dpRanks()
		}
		if cfg.ZMQPort != 0 {
			n += 2 * cfg.Workers * cfg.dpRanks()
		}
	}
	return n
}

// waitUpPorts checks that every fixed port is free, waiting up to patience
// for a previous up that is still stopping to let go of them, and
// otherwise names the first busy port and what up wanted it for.
func waitUpPorts(ctx context.Context, cfg UpConfig, patience time.Duration, stderr io.Writer) error {
	ports := upPorts(cfg)
	sorted := slices.Sorted(maps.Keys(ports))
	deadline := time.Now().Add(patience)
	for said := false; ; {
		busy, err := firstBusyPort(cfg.Host, sorted)
		if busy == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			by := "is another `switchyard up`, or anything else, still running there? (`ss -ltnp 'sport = :" + strconv.Itoa(busy) + "'` names it)"
			if owner := portOwner(busy); owner != "" {
				by = "held by " + owner
			}
			return fmt.Errorf("port %d (%s) on %s is in use: %v; %s; -port, -worker-port, -etcd-port and -nats-port move the cluster",
				busy, ports[busy], cfg.Host, err, by)
		}
		if !said {
			_, _ = fmt.Fprintf(stderr, "up: port %d (%s) is in use; waiting up to %v for it to be released...\n", busy, ports[busy], patience)
			said = true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// firstBusyPort returns the first of ports that host cannot listen on.
func firstBusyPort(host string, ports []int) (int, error) {
	for _, p := range ports {
		l, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			return p, err
		}
		_ = l.Close()
	}
	return 0, nil
}

// checkUpKeysFile loads the keys file (if any) the way each replica will.
func checkUpKeysFile(c tenant.Config) error {
	if c.KeysFile == "" {
		return nil
	}
	if err := c.Validate(); err != nil {
		return err
	}
	raw, err := os.ReadFile(c.KeysFile)
	if err != nil {
		return fmt.Errorf("-auth.keys-file: %w", err)
	}
	if _, err := tenant.Parse(raw); err != nil {
		return fmt.Errorf("-auth.keys-file %s: %w", c.KeysFile, err)
	}
	return nil
}

// RunUp runs the local cluster until ctx ends.
func RunUp(ctx context.Context, cfg UpConfig, log *zap.Logger, stdout io.Writer) error {
	dir := cfg.DataDir
	if dir == "" {
		tmp, err := os.MkdirTemp("", "switchyard-up-")
		if err != nil {
			return err
		}
		defer os.RemoveAll(tmp)
		dir = tmp
	}
	workerIDs := make([]string, 0, cfg.Workers*cfg.dpRanks())
	for i := range cfg.Workers {
		id := fmt.Sprintf("worker-%d", i+1)
		if cfg.DPSize <= 1 {
			workerIDs = append(workerIDs, id)
			continue
		}
		for r := range cfg.DPSize { // each rank's adapter is its own NATS user
			workerIDs = append(workerIDs, adapter.DPWorkerID(id, r))
		}
	}
	var pki *upPKI
	if cfg.TLS {
		var err error
		if pki, err = newUpPKI(filepath.Join(dir, "pki"), cfg.Host, workerIDs); err != nil {
			return fmt.Errorf("up -tls: %w", err)
		}
	}
	etcdURL, stopEtcd, err := startEmbeddedEtcd(filepath.Join(dir, "etcd"), cfg.Host, cfg.EtcdPort, pki)
	if err != nil {
		return err
	}
	defer stopEtcd()
	natsURL, stopNATS, err := startEmbeddedNATS(cfg.Host, cfg.NATSPort, pki)
	if err != nil {
		return err
	}
	defer stopNATS()

	// One random gossip key per run: the local cluster's gossip is
	// encrypted like a production one, and nothing else can join it.
	key := make([]byte, 32)
	if _, err := cryptorand.Read(key); err != nil {
		return err
	}
	cfg.Replica.Gossip.SecretKey = key

	cfg.pdWorkers()
	grp, gctx := errgroup.WithContext(ctx)
	for i := 0; i < cfg.Workers; i++ {
		wc := cfg.Worker
		wc.ID = fmt.Sprintf("worker-%d", i+1)
		wc.Cluster = cfg.Replica.Cluster
		wc.Listen = net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.WorkerPort, i)))
		wc.Engine.Speedup = cfg.Speedup
		cfg.pdRole(i, &wc)
		if cfg.Protocol == ProtocolVLLM && cfg.DPSize > 1 {
			startDPEngine(gctx, grp, cfg, i, wc, etcdURL, natsURL, pki, log)
			continue
		}
		if cfg.Protocol == ProtocolVLLM {
			startVLLMWorkerAndAdapter(gctx, grp, cfg, i, wc, etcdURL, natsURL, pki, log)
			continue
		}
		wc.EtcdEndpoints = []string{etcdURL}
		wc.NATSURL = natsURL
		if pki != nil {
			wc.Links = pki.workerLinks(wc.ID)
			// Only the routers (with their client certificate) call a
			// worker: nothing else gets its API.
			wc.TLS = tlsconf.ServerConfig{CertFile: pki.worker.Cert, KeyFile: pki.worker.Key, ClientCAFile: pki.worker.CA}
		}
		grp.Go(named(gctx, wc.ID, func(ctx context.Context) error {
			return RunWorker(ctx, wc, log.Named(wc.ID), metrics.NewRegistry())
		}))
	}
	var mu sync.Mutex
	statuses := make([]*ReplicaStatus, cfg.Replicas)
	readyCh := make(chan struct{}, cfg.Replicas)
	var gossipSeed string
	var others sync.WaitGroup // the replicas but the first, until they stop
	for i := 0; i < cfg.Replicas; i++ {
		rc := cfg.Replica
		rc.ID = fmt.Sprintf("router-%d", i+1)
		rc.HTTPAddr = net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.HTTPBase, i)))
		rc.EtcdEndpoints = []string{etcdURL}
		rc.NATSURL = natsURL
		rc.Gossip.BindAddr, rc.Gossip.BindPort = cfg.Host, 0
		if pki != nil {
			rc.Links = pki.routerLinks()
			rc.Frontend.TLS = tlsconf.ServerConfig{CertFile: pki.router.Cert, KeyFile: pki.router.Key}
			rc.Frontend.EngineTLS = tlsconf.ClientConfig{CAFile: pki.routerClient.CA, CertFile: pki.routerClient.Cert, KeyFile: pki.routerClient.Key}
		}
		if gossipSeed != "" {
			rc.Gossip.Join = []string{gossipSeed}
		}
		i := i
		started := make(chan string, 1)
		// The replicas leave gossip in two steps: the others together, then
		// the first one, alone. All leaving at once, each sees the others
		// gone and nobody is left to carry its leave broadcast: every stop
		// timed out and warned "gossip did not leave cleanly".
		rctx := gctx
		if i == 0 {
			var stopFirst context.CancelFunc
			rctx, stopFirst = context.WithCancel(context.WithoutCancel(gctx))
			go func() {
				<-gctx.Done()
				others.Wait()
				stopFirst()
			}()
		} else {
			others.Add(1)
		}
		grp.Go(named(rctx, rc.ID, func(ctx context.Context) error {
			if i > 0 {
				defer others.Done()
			}
			// A replica survives a lost etcd session (it takes a new lease);
			// one that fails for another reason is restarted after a
			// second, as an orchestrator would.
			for first := true; ; first = false {
				err := RunReplica(ctx, rc, log.Named(rc.ID), metrics.NewRegistry(), func(s *ReplicaStatus) {
					mu.Lock()
					statuses[i] = s
					mu.Unlock()
					if first {
						started <- s.GossipAddr
						readyCh <- struct{}{}
					}
				})
				if ctx.Err() != nil || err == nil {
					return nil //nolint:nilerr // stopping: an error now is part of the shutdown, not a failure
				}
				log.Error("replica stopped; restarting it", zap.String("replica", rc.ID), zap.Error(err))
				select {
				case <-ctx.Done():
					return nil
				case <-time.After(time.Second):
				}
			}
		}))
		// Replicas join gossip through the first one, so start it first.
		if i == 0 {
			select {
			case gossipSeed = <-started:
			case <-gctx.Done():
				return grp.Wait()
			}
		}
	}
	for i := 0; i < cfg.Replicas; i++ {
		select {
		case <-readyCh:
		case <-gctx.Done():
			return grp.Wait()
		}
	}
	// Announce only once every replica's scheduler sees every worker, so the
	// first request cannot meet an empty worker list.
	deadline := time.Now().Add(30 * time.Second)
	for _, s := range statuses {
		for {
			n, err := s.SchedulableWorkers(gctx)
			if err != nil {
				return grp.Wait()
			}
			if n >= cfg.Workers*cfg.dpRanks() {
				break
			}
			if time.Now().After(deadline) {
				log.Warn("not every worker registered within 30s", zap.String("replica", s.ID), zap.Int("workers", n))
				break
			}
			select {
			case <-gctx.Done():
				return grp.Wait()
			case <-time.After(20 * time.Millisecond):
			}
		}
	}
	_, _ = fmt.Fprintf(stdout, "Switchyard is up: %d router replicas, %d simulated workers (embedded etcd %s, NATS %s)\n", cfg.Replicas, cfg.Workers, etcdURL, natsURL)
	scheme, curl := "http", "curl -s"
	if pki != nil {
		scheme, curl = "https", "curl -s --cacert "+pki.caFile()
		_, _ = fmt.Fprintf(stdout, "  every link over TLS: CA %s (made for this run), etcd and NATS with client certificates, NATS users per role\n", pki.caFile())
	}
	for _, s := range statuses {
		_, _ = fmt.Fprintf(stdout, "  OpenAI API  %s://%s/v1   (readiness /readyz, metrics /metrics, cluster /debug/cluster)\n", scheme, s.HTTPAddr)
	}
	_, _ = fmt.Fprintf(stdout, "  Operators' page  %s://%s/   (the whole tier, live, from any replica's /)\n", scheme, statuses[0].HTTPAddr)
	if cfg.Workers == 0 {
		_, _ = fmt.Fprintf(stdout, "  no simulated workers: join real engines with `switchyard adapter` (etcd %s, NATS %s)\n", etcdURL, natsURL)
	} else {
		_, _ = fmt.Fprintf(stdout, "  model %s tokenized with %s on routers and workers alike\n", cfg.Worker.Model, cfg.Worker.Tokenizer)
	}
	if cfg.Protocol == ProtocolVLLM {
		_, _ = fmt.Fprint(stdout, vllmBanner(cfg))
	}
	_, _ = fmt.Fprint(stdout, pdBanner(cfg))
	if f := cfg.Replica.Tenants.KeysFile; f != "" {
		_, _ = fmt.Fprintf(stdout, "  API keys from %s: every request needs -H 'authorization: Bearer KEY' (reloaded every %v)\n", f, cfg.Replica.Tenants.ReloadInterval)
		curl += " -H 'authorization: Bearer KEY'"
	}
	_, _ = fmt.Fprintf(stdout, "Try: %s %s://%s/v1/completions -H 'content-type: application/json' -d '{\"model\":\"%s\",\"prompt\":\"hello\",\"max_tokens\":8}'\n", curl, scheme, statuses[0].HTTPAddr, cfg.Worker.Model)
	_, _ = fmt.Fprintln(stdout, "Ctrl-C stops the cluster.")
	if cfg.Status > 0 {
		// On a terminal the status line is rewritten in place, fitted to
		// the terminal's width; elsewhere (logs, CI) one full line is
		// printed per interval.
		width := func() int { return 0 }
		if f, ok := stdout.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			width = func() int {
				w, _, err := term.GetSize(int(f.Fd()))
				if err != nil || w <= 0 {
					return 80
				}
				return w
			}
		}
		current := func() []*ReplicaStatus {
			mu.Lock()
			defer mu.Unlock()
			return slices.Clone(statuses)
		}
		grp.Go(named(gctx, "status", func(ctx context.Context) error { return printStatus(ctx, stdout, current, cfg.Status, width) }))
	}
	err = grp.Wait()
	_, _ = fmt.Fprintln(stdout, "\nSwitchyard stopped.")
	return err
}

// portAt is the i-th port from base; base 0 means any free port.
func portAt(base, i int) int {
	if base == 0 {
		return 0
	}
	return base + i
}

// printStatus prints the status line every interval: rewritten in place
// when width reports a terminal's width, one line each time when it
// reports 0 (not a terminal).
func printStatus(ctx context.Context, w io.Writer, replicas func() []*ReplicaStatus, every time.Duration, width func() int) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		_, _ = io.WriteString(w, formatStatusLine(statusLine(replicas()), width()))
	}
}

// statusLine sums the replicas' counters: admissions, queue and owners.
func statusLine(rs []*ReplicaStatus) string {
	var recv, adm, rej, queued, bookings int
	degraded := 0
	for _, r := range rs {
		s := r.Snapshot()
		for _, c := range s.Classes {
			recv += int(c.Counters.Received)
			adm += int(c.Counters.Admitted)
			queued += c.QueueDepth
			for _, n := range c.Counters.Rejected {
				rej += int(n)
			}
		}
		bookings += s.Bookings
		if r.Degraded() {
			degraded++
		}
	}
	line := fmt.Sprintf("requests %d  admitted %d  rejected %d  queued %d  in flight %d  indexed blocks %d",
		recv, adm, rej, queued, bookings, rs[0].IndexedBlocks())
	if degraded > 0 {
		line += fmt.Sprintf("  DEGRADED %d", degraded)
	}
	return line
}

// formatStatusLine is what printStatus writes for line. On a terminal of
// width columns (width > 0) it returns a carriage return and the line cut
// or padded to width-1 columns: it never reaches the last column, so the
// terminal never wraps it onto a new line, and the padding erases a
// longer previous line. Not on a terminal (width 0) it is the line and a
// newline.
func formatStatusLine(line string, width int) string {
	if width <= 0 {
		return line + "\n"
	}
	n := width - 1
	if r := []rune(line); len(r) > n {
		line = string(r[:n])
	}
	return fmt.Sprintf("\r%-*s", n, line)
}

func startEmbeddedEtcd(dir, host string, port int, pki *upPKI) (string, func(), error) {
	if port != 0 {
		return startEmbeddedEtcdAt(dir, host, port, port+1, pki)
	}
	return startEmbeddedEtcdOnFreePorts(dir, host, pki, freePort)
}

// etcdPortAttempts is how many pairs of free ports startEmbeddedEtcdOnFreePorts
// tries before it reports the last bind error.
const etcdPortAttempts = 5

// startEmbeddedEtcdOnFreePorts starts etcd on ports pick finds free. etcd
// needs its ports spelled out in its URLs, so they are picked before etcd
// binds them, and another process (an outgoing connection's local port, on
// a busy machine) can take one in between: etcd then fails to bind before it
// has written anything, and the start is tried again on fresh ports.
func startEmbeddedEtcdOnFreePorts(dir, host string, pki *upPKI, pick func(host string) (int, error)) (string, func(), error) {
	var err error
	for range etcdPortAttempts {
		var client, peer int
		if client, err = pick(host); err != nil {
			return "", nil, err
		}
		if peer, err = pick(host); err != nil {
			return "", nil, err
		}
		var u string
		var stop func()
		u, stop, err = startEmbeddedEtcdAt(dir, host, client, peer, pki)
		if !errors.Is(err, syscall.EADDRINUSE) {
			return u, stop, err
		}
	}
	return "", nil, err
}

func startEmbeddedEtcdAt(dir, host string, port, peerPort int, pki *upPKI) (string, func(), error) {
	cfg := embed.NewConfig()
	cfg.Dir = dir
	cfg.Name = "switchyard-up"
	cfg.Logger = "zap"
	cfg.LogLevel = "fatal"
	scheme := "http"
	if pki != nil {
		// Mutual TLS on the client and the peer port: a client without a
		// certificate from the run's CA is refused.
		scheme = "https"
		for _, ti := range []*transport.TLSInfo{&cfg.ClientTLSInfo, &cfg.PeerTLSInfo} {
			ti.CertFile, ti.KeyFile, ti.TrustedCAFile, ti.ClientCertAuth = pki.etcd.Cert, pki.etcd.Key, pki.etcd.CA, true
		}
	}
	client, _ := url.Parse(scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)))
	peer, _ := url.Parse(scheme + "://" + net.JoinHostPort(host, strconv.Itoa(peerPort)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	e, err := embed.StartEtcd(cfg)
	if err != nil {
		return "", nil, fmt.Errorf("embedded etcd on %s: %w", client.Host, err)
	}
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		return "", nil, errors.New("embedded etcd not ready within 30s")
	}
	return client.String(), e.Close, nil
}

// freePort asks the kernel for a free port on host. Another process could
// take it before etcd binds it; `up` reports that as a start-up error.
func freePort(host string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startEmbeddedNATS(host string, port int, pki *upPKI) (string, func(), error) {
	if port == 0 {
		port = natsserver.RANDOM_PORT
	}
	opts := &natsserver.Options{Host: host, Port: port, NoLog: true, NoSigs: true, MaxPayload: 8 << 20}
	if pki != nil {
		if err := pki.natsTLSOptions(opts); err != nil {
			return "", nil, err
		}
		opts.Users = natsUsers(pki.routerPassword, pki.workerPasswords)
	}
	s, err := natsserver.NewServer(opts)
	if err != nil {
		return "", nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return "", nil, fmt.Errorf("embedded NATS on %s:%d not ready within 10s", host, port)
	}
	u := s.ClientURL() // tls://... when TLS is on
	return u, func() { s.Shutdown(); s.WaitForShutdown() }, nil
}

// startVLLMWorkerAndAdapter runs worker i as a vLLM-protocol engine (it
// registers nowhere and publishes its KV events on ZeroMQ) and an adapter
// beside it that registers it, rehashes its events onto NATS and reports
// its load, as a sidecar does beside a real vLLM server. With pki the
// engine serves HTTPS and requires a client certificate (the adapter's and
// the routers'), and the adapter serves HTTPS and uses the worker's etcd
// and NATS credentials. The ZMQ event link stays plaintext on the host, as
// vLLM's is (docs/security.md).
func startVLLMWorkerAndAdapter(ctx context.Context, grp *errgroup.Group, cfg UpConfig, i int, wc WorkerConfig, etcdURL, natsURL string,
	pki *upPKI, log *zap.Logger) {
	wc.Protocol = ProtocolVLLM
	wc.VLLM.EventsBind = fmt.Sprintf("tcp://%s", net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.ZMQPort, 2*i))))
	wc.VLLM.ReplayBind = fmt.Sprintf("tcp://%s", net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.ZMQPort, 2*i+1))))
	// The adapter reaches the engine where it really listens (its port may
	// be picked at bind time), so it starts once the worker serves.
	served := make(chan string, 1) // size 1: Ready is called once and must not block
	wc.Ready = func(url string) { served <- url }
	if pki != nil {
		wc.TLS = tlsconf.ServerConfig{CertFile: pki.worker.Cert, KeyFile: pki.worker.Key, ClientCAFile: pki.worker.CA}
	}
	grp.Go(named(ctx, wc.ID, func(ctx context.Context) error {
		return RunWorker(ctx, wc, log.Named(wc.ID), metrics.NewRegistry())
	}))
	ac := adapter.DefaultConfig()
	ac.Engine = adapter.EngineVLLM
	ac.KVEvents, ac.KVReplay = wc.VLLM.EventsBind, wc.VLLM.ReplayBind
	ac.ID, ac.Cluster = wc.ID, wc.Cluster
	ac.Listen = net.JoinHostPort(cfg.Host, strconv.Itoa(portAt(cfg.AdapterPort, i)))
	ac.EtcdEndpoints, ac.NATSURL = []string{etcdURL}, natsURL
	var lk Links
	if pki != nil {
		lk = pki.workerLinks(wc.ID)
		ac.EngineTLS = tlsconf.ClientConfig{CAFile: pki.workerClient.CA, CertFile: pki.workerClient.Cert, KeyFile: pki.workerClient.Key}
		ac.TLS = tlsconf.ServerConfig{CertFile: pki.adapter.Cert, KeyFile: pki.adapter.Key}
	}
	name := wc.ID + "-adapter"
	grp.Go(named(ctx, name, func(ctx context.Context) error {
		select {
		case ac.EngineURL = <-served:
		case <-ctx.Done():
			return nil
		}
		return RunAdapterWithLinks(ctx, ac, lk, log.Named(name), nil)
	}))
}
