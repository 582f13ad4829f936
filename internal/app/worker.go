package app

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/listflag"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/wire"
)

// WorkerConfig configures one simulated worker process: the engine, its
// OpenAI HTTP API, and its links to NATS (KV events, load reports, dumps) and
// etcd (lease-bound workerRegistration).
type WorkerConfig struct {
	// ID names the worker in etcd and in NATS subjects.
	ID string
	// Cluster scopes every etcd key and NATS subject.
	Cluster string
	// Model is the model name the worker serves.
	Model string
	// Models are further names it serves (aliases, as vLLM's
	// --served-model-name lists several); registered as WorkerInfo.Models.
	Models []string
	// Tokenizer is the spec of the tokenizer the simulated engine tokenizes
	// prompts and decodes output with (package prompt: a Hugging Face
	// directory, a tokenizer.json, or tiktoken:ENCODING built in).
	Tokenizer string
	// Listen is the HTTP listen address; port 0 picks a free port.
	Listen string
	// AdvertiseURL is the base URL registered in etcd; empty derives it from
	// the bound address.
	AdvertiseURL string
	// EtcdEndpoints, when set, make the worker register under a lease.
	EtcdEndpoints []string
	// NATSURL, when set, makes the worker publish KV events and load reports
	// and answer dump requests.
	NATSURL string
	// LeaseTTL is the workerRegistration lease's time to live.
	LeaseTTL time.Duration
	// LoadInterval is the period of load reports; LoadMinInterval bounds how
	// often a change triggers an extra one.
	LoadInterval    time.Duration
	LoadMinInterval time.Duration
	// GracePeriod bounds the drain of in-flight requests at shutdown.
	GracePeriod time.Duration
	// DumpChunkBlocks is the default number of hashes per dump reply chunk.
	DumpChunkBlocks int
	// MaxBodyBytes bounds request bodies (413 beyond).
	MaxBodyBytes int64
	// DefaultMaxTokens applies when a request gives no max_tokens.
	DefaultMaxTokens int
	// Labels are copied into the workerRegistration record.
	Labels map[string]string
	// Messages serves Anthropic's Messages API (/v1/messages and its
	// count_tokens) and registers it (wire.APIMessages); off, routers
	// translate Messages requests to chat completions for this worker.
	Messages bool
	// Engine configures the simulated engine (WorkerID is set from ID).
	Engine engine.Config
	// Protocol is ProtocolNative (the default) or ProtocolVLLM, in which
	// the worker speaks vLLM's protocol as configured by VLLM and registers
	// nowhere (worker_vllm.go).
	Protocol string
	VLLM     VLLMWorkerConfig
	// PD is the worker's disaggregation role and KV transfer protocol
	// (worker_pd.go): -role, -kv-transfer, -bootstrap-port.
	PD PDConfig
	// Links secure the connections to etcd and NATS (-etcd.*, -nats.*);
	// TLS serves the worker's HTTP API over TLS (-tls.*), and its
	// registered URL is then https://.
	Links Links
	TLS   tlsconf.ServerConfig

	// Ready, if set, is called once with the worker's base URL when it
	// serves HTTP and is registered. It must not block.
	Ready func(url string) `json:"-"`
	// Clock drives the engine; nil is the wall clock.
	Clock clock.Clock `json:"-"`
}

// DefaultWorkerConfig returns the defaults of a worker.
func DefaultWorkerConfig() WorkerConfig {
	return WorkerConfig{
		ID:               "worker-1",
		Cluster:          "default",
		Model:            "switchyard-sim",
		Tokenizer:        DefaultSimTokenizer,
		Listen:           "127.0.0.1:9001",
		LeaseTTL:         5 * time.Second,
		LoadInterval:     100 * time.Millisecond,
		LoadMinInterval:  10 * time.Millisecond,
		GracePeriod:      10 * time.Second,
		DumpChunkBlocks:  4096,
		MaxBodyBytes:     8 << 20,
		DefaultMaxTokens: 256,
		Messages:         true,
		Engine:           engine.DefaultConfig(),
		Protocol:         ProtocolNative,
		VLLM:             defaultVLLMWorkerConfig(),
		PD:               defaultPDConfig(),
	}
}

// Validate names the first bad field.
func (c *WorkerConfig) Validate() error {
	switch {
	case !wire.ValidName(c.ID):
		return fmt.Errorf("worker config: ID %q must be 1-128 of [A-Za-z0-9_-]", c.ID)
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("worker config: Cluster %q must be 1-128 of [A-Za-z0-9_-]", c.Cluster)
	case c.Model == "":
		return errors.New("worker config: Model must not be empty")
	case c.Tokenizer == "":
		return errors.New("worker config: Tokenizer must not be empty")
	case c.Listen == "":
		return errors.New("worker config: Listen must not be empty")
	case c.LeaseTTL < time.Second:
		return fmt.Errorf("worker config: LeaseTTL %v must be at least 1s", c.LeaseTTL)
	case c.LoadInterval <= 0:
		return fmt.Errorf("worker config: LoadInterval %v must be positive", c.LoadInterval)
	case c.LoadMinInterval < 0 || c.LoadMinInterval > c.LoadInterval:
		return fmt.Errorf("worker config: LoadMinInterval %v must be in [0, LoadInterval]", c.LoadMinInterval)
	case c.GracePeriod < 0:
		return fmt.Errorf("worker config: GracePeriod %v must not be negative", c.GracePeriod)
	case c.DumpChunkBlocks <= 0 || c.DumpChunkBlocks > wire.MaxBlocksPerMessage:
		return fmt.Errorf("worker config: DumpChunkBlocks %d must be in [1, %d]", c.DumpChunkBlocks, wire.MaxBlocksPerMessage)
	case c.MaxBodyBytes <= 0:
		return fmt.Errorf("worker config: MaxBodyBytes %d must be positive", c.MaxBodyBytes)
	case c.DefaultMaxTokens <= 0:
		return fmt.Errorf("worker config: DefaultMaxTokens %d must be positive", c.DefaultMaxTokens)
	}
	if err := c.Engine.Validate(); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	if err := c.Links.Validate(); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	if err := c.PD.Validate(); err != nil {
		return err
	}
	if err := c.TLS.Validate("tls."); err != nil {
		return fmt.Errorf("worker config: %w", err)
	}
	if c.AdvertiseURL != "" {
		if err := wire.CheckAdvertiseURL(c.AdvertiseURL, c.TLS.Enabled()); err != nil {
			return fmt.Errorf("worker config: AdvertiseURL %w", err)
		}
	}
	return c.validateProtocol()
}

// RegisterFlags registers the worker's flags (and the engine's, unprefixed)
// under prefix.
func (c *WorkerConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.ID, prefix+"id", c.ID, "worker id (etcd key and NATS subject token)")
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "cluster name")
	fs.StringVar(&c.Model, prefix+"model", c.Model, "model name served")
	fs.Func(prefix+"served-model-names", "comma-separated further names the worker serves (aliases)", func(s string) error {
		c.Models = listflag.Split(s)
		return nil
	})
	fs.StringVar(&c.Tokenizer, prefix+"tokenizer", c.Tokenizer, "tokenizer spec: a Hugging Face model directory, a tokenizer.json, or tiktoken:o200k_base|cl100k_base (built in)")
	fs.StringVar(&c.Listen, prefix+"listen", c.Listen, "HTTP listen address")
	fs.StringVar(&c.AdvertiseURL, prefix+"advertise-url", c.AdvertiseURL, "base URL registered in etcd (default: from the bound address)")
	fs.Func(prefix+"etcd-endpoints", "comma-separated etcd endpoints (empty: do not register)", func(s string) error {
		c.EtcdEndpoints = listflag.Split(s)
		return nil
	})
	fs.StringVar(&c.NATSURL, prefix+"nats-url", c.NATSURL, "NATS URL (empty: publish no events or loads)")
	fs.DurationVar(&c.LeaseTTL, prefix+"lease-ttl", c.LeaseTTL, "workerRegistration lease TTL")
	fs.DurationVar(&c.LoadInterval, prefix+"load-interval", c.LoadInterval, "load report period")
	fs.DurationVar(&c.LoadMinInterval, prefix+"load-min-interval", c.LoadMinInterval, "minimum gap between change-triggered load reports")
	fs.DurationVar(&c.GracePeriod, prefix+"grace-period", c.GracePeriod, "drain time for in-flight requests at shutdown")
	fs.IntVar(&c.DumpChunkBlocks, prefix+"dump-chunk-blocks", c.DumpChunkBlocks, "hashes per KV dump reply chunk")
	fs.Int64Var(&c.MaxBodyBytes, prefix+"max-body-bytes", c.MaxBodyBytes, "maximum request body size")
	fs.IntVar(&c.DefaultMaxTokens, prefix+"default-max-tokens", c.DefaultMaxTokens, "max_tokens when a request gives none")
	fs.BoolVar(&c.Messages, prefix+"messages", c.Messages, "serve Anthropic's Messages API (/v1/messages) and register it; false: routers translate Messages requests to chat completions for this worker")
	fs.StringVar(&c.Protocol, prefix+"protocol", c.Protocol, "engine protocol: native (etcd and NATS) or vllm (vLLM's ZMQ KV events and metrics; an adapter registers the worker)")
	c.VLLM.registerFlags(fs, prefix)
	c.PD.registerFlags(fs, prefix)
	c.Engine.RegisterFlags(fs, prefix)
	c.Engine.RegisterTransferFlags(fs, prefix)
	c.Links.Etcd.RegisterFlags(fs, prefix+"etcd.")
	c.Links.NATS.RegisterFlags(fs, prefix+"nats.")
	c.TLS.RegisterFlags(fs, prefix+"tls.", "the worker's HTTP API")
}

// applyEnv sets every flag not given on the command line from
// SWITCHYARD_<NAME> (upper case, '-' and '.' as '_'), so containers can be
// configured by environment. router.go uses it too.
func applyEnv(fs *flag.FlagSet, set map[string]bool) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil || set[f.Name] {
			return
		}
		key := "SWITCHYARD_" + strings.NewReplacer("-", "_", ".", "_").Replace(strings.ToUpper(f.Name))
		if v, ok := os.LookupEnv(key); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", key, v, e)
			}
		}
	})
	return err
}

// Worker is the `switchyard worker` subcommand.
func Worker(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, cfgp, levelp := workerFlags()
	fs.SetOutput(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return ErrUsage
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if err := applyEnv(fs, set); err != nil {
		_, _ = fmt.Fprintf(stderr, "worker: %v\n", err)
		return ErrUsage
	}
	cfg, level := *cfgp, *levelp
	if err := cfg.Validate(); err != nil {
		_, _ = fmt.Fprintf(stderr, "worker: %v\n", err)
		return ErrUsage
	}
	enc := zap.NewProductionEncoderConfig()
	enc.EncodeTime = zapcore.ISO8601TimeEncoder
	log := zap.New(zapcore.NewCore(zapcore.NewJSONEncoder(enc), zapcore.AddSync(stderr), level))
	defer func() { _ = log.Sync() }()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	cfg.Ready = func(url string) { _, _ = fmt.Fprintf(stdout, "worker %s serving %s at %s\n", cfg.ID, cfg.Model, url) }
	return RunWorker(ctx, cfg, log, reg)
}

// workerFlags is the worker's flag set, bound to a default config.
func workerFlags() (*flag.FlagSet, *WorkerConfig, *zapcore.Level) {
	cfg := DefaultWorkerConfig()
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	cfg.RegisterFlags(fs, "")
	level := zapcore.InfoLevel
	fs.Var(flagLevel{&level}, "log-level", "log level (debug, info, warn, error)")
	return fs, &cfg, &level
}

// flagLevel lets zap's level parse through the FlagSet we own (zap.LevelFlag
// registers on the global CommandLine, which a subcommand must not use).
// router.go uses it too.
type flagLevel struct{ l *zapcore.Level }

func (f flagLevel) String() string {
	if f.l == nil {
		return "info"
	}
	return f.l.String()
}
func (f flagLevel) Set(s string) error { return f.l.Set(s) }

// RunWorker runs one worker until ctx ends. Shutdown order: deregister from
// etcd (revoke the lease) so routers stop sending, drain in-flight requests
// for up to GracePeriod, stop the engine (aborting what is left), then close
// NATS and etcd. It returns only after every goroutine it started exited.
//
// Goroutines it owns: the engine's Run loop, the HTTP server (plus one per
// connection, which net/http owns), the load reporter and the lease
// keep-alive; with the vllm protocol, the KV event publisher (enginekv), which
// stops after the engine so its last events go out. Dump requests are answered on nats.go's subscription
// goroutine. The engine serialises its own state; handlers only Submit,
// relay a Stream and Cancel. Ready is called once the worker serves HTTP
// and is registered, with the registered base URL.
func RunWorker(ctx context.Context, cfg WorkerConfig, log *zap.Logger, reg prometheus.Registerer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	log = log.Named("worker").With(zap.String("worker", cfg.ID))
	w := &worker{cfg: cfg, log: log, pdClient: &http.Client{}}
	var err error
	if w.prompts, err = newWorkerPrompts(cfg, log); err != nil {
		return fmt.Errorf("worker %s: %w", cfg.ID, err)
	}
	w.metrics = newWorkerMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"worker": cfg.ID}, reg))
	if g, ok := reg.(prometheus.Gatherer); ok {
		w.gatherer = g
	}

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return fmt.Errorf("worker %s: listen %s: %w", cfg.ID, cfg.Listen, err)
	}
	defer ln.Close() // no-op once the server owns and closed it
	w.url = cfg.AdvertiseURL
	if w.url == "" {
		w.url = wire.AdvertiseURL(ln.Addr().(*net.TCPAddr), cfg.TLS.Enabled())
	}
	tlsMetrics := tlsconf.NewMetrics(prometheus.WrapRegistererWith(prometheus.Labels{"worker": cfg.ID}, reg))
	if cfg.TLS.Enabled() {
		tc, err := cfg.TLS.Build(tlsconf.Deps{Name: "worker_http", Logger: log, Metrics: tlsMetrics, NextProtos: tlsconf.HTTPProtos})
		if err != nil {
			return fmt.Errorf("worker %s: %w", cfg.ID, err)
		}
		ln = tls.NewListener(ln, tc)
	}

	var sink engine.EventSink
	if cfg.NATSURL != "" {
		opts, err := cfg.Links.natsOptions(cfg.NATSURL, log, tlsMetrics,
			nats.Name("switchyard-worker-"+cfg.ID),
			nats.MaxReconnects(-1)) // a worker outlives NATS outages; consumers repair gaps from dumps
		if err != nil {
			return fmt.Errorf("worker %s: %w", cfg.ID, err)
		}
		w.nc, err = nats.Connect(cfg.NATSURL, opts...)
		if err != nil {
			return fmt.Errorf("worker %s: connect nats %s: %w", cfg.ID, cfg.NATSURL, err)
		}
		defer w.nc.Close()
		w.subjects = wire.NewSubjects(cfg.Cluster)
		sink = &kvEventPublisher{w: w}
	}
	var kvPub *enginekv.Publisher
	var vllmReg *prometheus.Registry
	if cfg.Protocol == ProtocolVLLM {
		// The vLLM-side metrics get a registry of their own: vLLM's names
		// carry no worker label, so workers sharing a registry (`up`)
		// would collide.
		vllmReg = prometheus.NewRegistry()
		pcfg, _ := cfg.VLLM.publisherConfig() // validated
		if kvPub, err = enginekv.NewPublisher(pcfg, log, vllmReg); err != nil {
			return fmt.Errorf("worker %s: %w", cfg.ID, err)
		}
		sink = newVLLMEventSink(kvPub, cfg.VLLM.HashSeed, cfg.Engine.BlockSize)
	}
	ecfg := cfg.Engine
	ecfg.WorkerID = cfg.ID
	ecfg.Events = sink
	clk := cfg.Clock
	if clk == nil {
		clk = clock.Real{}
	}
	w.eng, err = engine.New(ecfg, clk)
	if err != nil {
		return fmt.Errorf("worker %s: %w", cfg.ID, err)
	}
	w.now = clk.Now
	w.holds = newKVHolds(clk.Now)
	if err := reg.Register(prometheus.WrapCollectorWith(prometheus.Labels{"worker": cfg.ID}, &engineCollector{eng: w.eng})); err != nil {
		return fmt.Errorf("worker %s: register engine metrics: %w", cfg.ID, err)
	}
	handler := w.routes()
	if vllmReg != nil {
		vllmReg.MustRegister(newVLLMCollector(w.eng, cfg.Engine, cfg.Model, cfg.VLLM.DPRank))
		gs := prometheus.Gatherers{vllmReg}
		if w.gatherer != nil {
			gs = append(gs, w.gatherer)
		}
		handler = vllmRoutes(cfg, handler, gs)
	}

	var wg sync.WaitGroup
	defer wg.Wait()
	// The publisher outlives the engine, so the engine's last events (its
	// Stop flushes) still go out.
	pubCtx, stopPub := context.WithCancel(context.WithoutCancel(ctx))
	defer stopPub()
	if kvPub != nil {
		pubErr := make(chan error, 1)
		wg.Add(1)
		go func() { defer wg.Done(); pubErr <- kvPub.Run(pubCtx) }()
		select {
		case <-kvPub.Ready():
		case err := <-pubErr:
			return fmt.Errorf("worker %s: kv events: %w", cfg.ID, err)
		}
		log.Info("publishing vLLM KV events", zap.String("endpoint", kvPub.Endpoint()),
			zap.String("replay", kvPub.ReplayEndpoint()))
	}
	engCtx, stopEngine := context.WithCancel(context.WithoutCancel(ctx))
	defer stopEngine()
	engDone := make(chan struct{})
	wg.Add(1)
	go func() { defer wg.Done(); defer close(engDone); _ = w.eng.Run(engCtx) }()

	if w.nc != nil {
		sub, err := w.nc.Subscribe(w.subjects.KVDump(cfg.ID), w.answerDump)
		if err != nil {
			return fmt.Errorf("worker %s: subscribe kv dump: %w", cfg.ID, err)
		}
		defer func() { _ = sub.Unsubscribe() }()
		wg.Add(1)
		go func() { defer wg.Done(); w.reportLoad(engCtx) }()
	}

	if cfg.PD.sglangPrefill() {
		bootCtx, stopBoot := context.WithCancel(context.WithoutCancel(ctx))
		defer stopBoot() // before wg.Wait (deferred earlier, runs later)
		if w.bootstrapAddr, err = w.serveBootstrap(bootCtx, &wg); err != nil {
			return fmt.Errorf("worker %s: %w", cfg.ID, err)
		}
		log.Info("serving the SGLang bootstrap port", zap.String("addr", w.bootstrapAddr))
	}

	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: zap.NewStdLog(log.Named("http"))}
	serveErr := make(chan error, 1) // size 1: the serve goroutine never blocks on exit
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			serveErr <- err
		}
	}()

	var rec *workerRegistration
	if len(cfg.EtcdEndpoints) > 0 {
		rec, err = w.register(ctx)
		if err != nil {
			_ = srv.Close()
			stopEngine()
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); rec.keepAlive() }()
	}
	w.ready.Store(true)
	log.Info("worker ready", zap.String("url", w.url), zap.String("model", cfg.Model),
		zap.Uint64("instance", w.eng.Instance()))
	if cfg.Ready != nil {
		cfg.Ready(w.url)
	}

	var runErr error
	select {
	case <-ctx.Done():
	case runErr = <-serveErr:
		runErr = fmt.Errorf("worker %s: serve: %w", cfg.ID, runErr)
	}
	w.ready.Store(false)
	if rec != nil {
		rec.deregister()
	}
	drainCtx, cancelDrain := context.WithTimeout(context.Background(), cfg.GracePeriod)
	if err := srv.Shutdown(drainCtx); err != nil {
		log.Warn("grace period over, aborting in-flight requests", zap.Duration("grace_period", cfg.GracePeriod))
		_ = srv.Close()
	}
	cancelDrain()
	stopEngine() // aborts what is left, so every handler returns
	w.handlers.Wait()
	<-engDone
	stopPub()
	if rec != nil {
		rec.close()
	}
	if w.nc != nil {
		if err := w.nc.Flush(); err != nil {
			log.Debug("nats flush at shutdown", zap.Error(err))
		}
	}
	log.Info("worker stopped")
	return runErr
}

// workerRegistration is the worker's lease-bound record in etcd.
type workerRegistration struct {
	w       *worker
	cli     *clientv3.Client
	key     string
	val     string
	mu      sync.Mutex
	lease   clientv3.LeaseID
	ctx     context.Context // ends at deregistration
	cancel  context.CancelFunc
	stopped chan struct{}
}

func (w *worker) register(ctx context.Context) (*workerRegistration, error) {
	info := &wire.WorkerInfo{
		ID: w.cfg.ID, URL: w.url, Model: w.cfg.Model,
		BlockSize: w.cfg.Engine.BlockSize, KVBlocks: w.cfg.Engine.NumBlocks,
		MaxNumSeqs: w.cfg.Engine.MaxNumSeqs, MaxBatchedTokens: w.cfg.Engine.MaxNumBatchedTokens,
		Labels: w.cfg.Labels, PublishesEvents: w.nc != nil,
		Models: w.cfg.Models, MaxModelLen: w.cfg.Engine.MaxModelLen, Tokenizer: w.tokenizerSource(),
		Role: w.cfg.PD.Role,
	}
	if w.cfg.PD.Role != wire.RoleBoth {
		info.KVTransfer = w.cfg.PD.KVTransfer
		if w.cfg.PD.sglangPrefill() {
			info.BootstrapPort = w.bootstrapPort()
		}
	}
	if w.cfg.Messages {
		info.APIs = []string{wire.APIMessages}
	}
	val, err := wire.EncodeWorkerInfo(info)
	if err != nil {
		return nil, fmt.Errorf("worker %s: encode workerRegistration: %w", w.cfg.ID, err)
	}
	cli, err := w.cfg.Links.dialEtcd(w.cfg.EtcdEndpoints, w.log, nil)
	if err != nil {
		return nil, fmt.Errorf("worker %s: %w", w.cfg.ID, err)
	}
	r := &workerRegistration{w: w, cli: cli, key: wire.NewKeys(w.cfg.Cluster).Worker(w.cfg.ID), val: string(val),
		stopped: make(chan struct{})}
	r.ctx, r.cancel = context.WithCancel(context.WithoutCancel(ctx))
	if err := r.put(ctx); err != nil {
		r.cancel()
		_ = cli.Close()
		return nil, err
	}
	return r, nil
}

// put grants a fresh lease and writes the record under it.
func (r *workerRegistration) put(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	lease, err := r.cli.Grant(ctx, int64(r.w.cfg.LeaseTTL/time.Second))
	if err != nil {
		return fmt.Errorf("worker %s: grant lease: %w", r.w.cfg.ID, err)
	}
	if _, err := r.cli.Put(ctx, r.key, r.val, clientv3.WithLease(lease.ID)); err != nil {
		return fmt.Errorf("worker %s: register %s: %w", r.w.cfg.ID, r.key, err)
	}
	r.mu.Lock()
	r.lease = lease.ID
	r.mu.Unlock()
	r.w.log.Info("registered", zap.String("key", r.key), zap.Int64("lease", int64(lease.ID)))
	return nil
}

// keepAlive keeps the lease alive until deregistration; a lost lease (etcd
// partition longer than the TTL) is replaced by a fresh workerRegistration.
func (r *workerRegistration) keepAlive() {
	defer close(r.stopped)
	for r.ctx.Err() == nil {
		r.mu.Lock()
		lease := r.lease
		r.mu.Unlock()
		ch, err := r.cli.KeepAlive(r.ctx, lease)
		if err == nil {
			for range ch {
			}
		}
		if r.ctx.Err() != nil {
			return
		}
		r.w.metrics.reregistrations.Inc()
		r.w.log.Warn("workerRegistration lease lost, registering again", zap.Error(err))
		for r.ctx.Err() == nil {
			if err := r.put(r.ctx); err == nil {
				break
			} else {
				r.w.log.Warn("re-workerRegistration failed", zap.Error(err))
			}
			select {
			case <-r.ctx.Done():
			case <-time.After(time.Second):
			}
		}
	}
}

// deregister stops the keep-alive and revokes the lease, deleting the record.
func (r *workerRegistration) deregister() {
	r.cancel()
	<-r.stopped
	r.mu.Lock()
	lease := r.lease
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if _, err := r.cli.Revoke(ctx, lease); err != nil {
		// The lease expires by itself within its TTL.
		r.w.log.Warn("revoke workerRegistration lease", zap.Error(err))
		return
	}
	r.w.log.Info("deregistered", zap.String("key", r.key))
}

func (r *workerRegistration) close() { _ = r.cli.Close() }
