package adapter

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/listflag"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// Config is everything one adapter needs. Defaults live in DefaultConfig;
// RegisterFlags binds every field to a flag.
type Config struct {
	// Engine is the kind of engine fronted.
	Engine Engine
	// EngineURL is where the adapter reaches the engine (usually loopback
	// in the same pod); EngineAdvertiseURL is what routers are told
	// (default EngineURL).
	EngineURL          string
	EngineAdvertiseURL string
	// MetricsURL is the engine's Prometheus endpoint (default
	// EngineURL/metrics for vllm and sglang; none for openai).
	MetricsURL string
	// EngineTLS verifies an https:// EngineURL or MetricsURL (-engine-tls.*):
	// the CA bundle the engine's certificate must chain to (default the
	// system's roots), the client certificate sent when the engine asks
	// for one (re-read when it changes), the name expected and the lowest
	// version. Routers reach the registered URL with their own
	// -http.engine-tls.* settings.
	EngineTLS tlsconf.ClientConfig

	// KVEvents is the engine's ZMQ PUB endpoint ("" : no KV events);
	// KVEventsBind makes the adapter bind it instead of connecting, for
	// engines that dial out. KVReplay is the engine's replay ROUTER
	// endpoint ("" : no replay). KVTopic filters the topic.
	KVEvents        string
	KVEventsBind    bool
	KVReplay        string
	KVTopic         string
	KVReplayTimeout time.Duration
	// KVTiers lists the lower tiers whose blocks are mirrored, each as a
	// stream of its own (tiers.go): "cpu", "disk" or both, comma-separated
	// ("": the GPU tier only, lower tiers' blocks skipped).
	KVTiers string
	// KVTierBlocks is each lower tier's capacity in blocks as routers are
	// told ("cpu=262144,disk=1048576"); a tier of KVTiers not named here
	// is advertised at 8 times the GPU tier's blocks.
	KVTierBlocks string
	// DPSize > 1 fronts one rank, DPRank, of an engine run with data
	// parallelism (dp.go): the worker registers as ID-dp<rank>, follows
	// the rank's events on KVEvents' port + rank (vLLM's convention), and
	// routers pin the rank with the X-data-parallel-rank header.
	DPRank int
	DPSize int
	// Role is the engine's disaggregation role (role.go): -role,
	// -kv-transfer, -bootstrap-port.
	Role RoleConfig

	ID      string
	Cluster string
	// Listen is the adapter's own HTTP address (/metrics, /readyz,
	// /healthz, /tokenizer/); AdvertiseURL is its base URL as routers
	// reach it (default from the bound address).
	Listen       string
	AdvertiseURL string
	// TLS serves the adapter's HTTP port over TLS (-tls.*); the default
	// AdvertiseURL is then https://, and routers fetch tokenizer files from
	// it with their -http.engine-tls.* settings.
	TLS tlsconf.ServerConfig

	EtcdEndpoints []string
	NATSURL       string
	LeaseTTL      time.Duration

	Overrides Overrides
	Labels    map[string]string
	// APIs are the APIs the engine serves beyond OpenAI's, registered as
	// wire.WorkerInfo.APIs (wire.APIMessages: vLLM from about v0.11.1).
	APIs []string

	HealthInterval     time.Duration
	HealthTimeout      time.Duration
	HealthFailures     int
	RediscoverInterval time.Duration

	LoadInterval time.Duration

	HeartbeatInterval time.Duration
	DumpChunkBlocks   int
	// KVSample publishes only the block hashes a router's sampled index
	// keeps at this rate (MirrorConfig.Sample; 0 or 1: every hash).
	KVSample int
	// MaxMirrorEntries bounds the engine-hash map (0: four times the
	// engine's KV blocks, at least 4096).
	MaxMirrorEntries int

	// TokenizerDir is a model directory whose tokenizer files are served
	// and advertised; TokenizerSpec advertises a built-in tokenizer instead.
	TokenizerDir  string
	TokenizerSpec string
}

// DefaultConfig is the one place adapter defaults are spelled.
func DefaultConfig() Config {
	return Config{
		Engine:             EngineVLLM,
		EngineURL:          "http://127.0.0.1:8000",
		KVReplayTimeout:    2 * time.Second,
		ID:                 "worker-1",
		Cluster:            "default",
		Listen:             "127.0.0.1:9100",
		EtcdEndpoints:      []string{"http://127.0.0.1:2379"},
		NATSURL:            nats.DefaultURL,
		LeaseTTL:           5 * time.Second,
		HealthInterval:     time.Second,
		HealthTimeout:      5 * time.Second,
		HealthFailures:     3,
		RediscoverInterval: 30 * time.Second,
		LoadInterval:       200 * time.Millisecond,
		HeartbeatInterval:  DefaultMirrorConfig().HeartbeatInterval,
		DumpChunkBlocks:    DefaultMirrorConfig().DumpChunkBlocks,
	}
}

// Validate names the first bad field.
func (c Config) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
	}
	if _, err := parseTiers(c.KVTiers); err != nil {
		return err
	}
	if _, err := parseTierBlocks(c.KVTierBlocks); err != nil {
		return err
	}
	if err := c.validateDP(); err != nil {
		return err
	}
	switch {
	case c.Engine < EngineVLLM || c.Engine > EngineOpenAI:
		return bad("engine %v", c.Engine)
	case !validHTTPURL(c.EngineURL):
		return bad("engine-url %q is not an http(s) URL", c.EngineURL)
	case c.EngineAdvertiseURL != "" && !validHTTPURL(c.EngineAdvertiseURL):
		return bad("engine-advertise-url %q is not an http(s) URL", c.EngineAdvertiseURL)
	case c.MetricsURL != "" && !validHTTPURL(c.MetricsURL):
		return bad("metrics-url %q is not an http(s) URL", c.MetricsURL)
	case c.KVEvents != "" && c.Engine == EngineOpenAI:
		return bad("kv-events: an openai engine publishes no KV events")
	case c.KVEvents == "" && (c.KVReplay != "" || c.KVEventsBind):
		return bad("kv-replay and kv-events-bind need kv-events")
	case c.KVReplayTimeout <= 0:
		return bad("kv-replay-timeout %v must be positive", c.KVReplayTimeout)
	case !wire.ValidName(c.ID):
		return bad("id %q must be 1-128 of [A-Za-z0-9_-]", c.ID)
	case !wire.ValidName(c.Cluster):
		return bad("cluster %q must be 1-128 of [A-Za-z0-9_-]", c.Cluster)
	case c.Listen == "":
		return bad("listen is empty")
	case len(c.EtcdEndpoints) == 0:
		return bad("etcd-endpoints is empty")
	case c.NATSURL == "":
		return bad("nats-url is empty")
	case c.LeaseTTL < time.Second || c.LeaseTTL%time.Second != 0:
		return bad("lease-ttl %v must be whole seconds, at least 1s", c.LeaseTTL)
	case c.HealthInterval <= 0 || c.HealthTimeout <= 0:
		return bad("health-interval %v and health-timeout %v must be positive", c.HealthInterval, c.HealthTimeout)
	case c.HealthFailures < 1:
		return bad("health-failures %d must be at least 1", c.HealthFailures)
	case c.RediscoverInterval <= 0:
		return bad("rediscover-interval %v must be positive", c.RediscoverInterval)
	case c.LoadInterval <= 0:
		return bad("load-interval %v must be positive", c.LoadInterval)
	case c.HeartbeatInterval <= 0:
		return bad("heartbeat-interval %v must be positive", c.HeartbeatInterval)
	case c.DumpChunkBlocks <= 0 || c.DumpChunkBlocks > wire.MaxBlocksPerMessage:
		return bad("dump-chunk-blocks %d must be in [1, %d]", c.DumpChunkBlocks, wire.MaxBlocksPerMessage)
	case c.KVTiers != "" && c.KVEvents == "":
		return bad("kv-tiers needs kv-events")
	case c.KVSample < 0 || c.KVSample > kvindex.MaxSample:
		return bad("kv-sample %d must be in [0, %d]", c.KVSample, kvindex.MaxSample)
	case c.MaxMirrorEntries < 0:
		return bad("max-mirror-entries %d must not be negative", c.MaxMirrorEntries)
	case c.TokenizerDir != "" && c.TokenizerSpec != "":
		return bad("tokenizer-dir and tokenizer-spec are exclusive")
	case c.Overrides.BlockSize < 0 || c.Overrides.BlockSize > maxBlockSize:
		return bad("block-size %d must be in [0, %d]", c.Overrides.BlockSize, maxBlockSize)
	case c.Overrides.KVBlocks < 0 || c.Overrides.MaxModelLen < 0 || c.Overrides.MaxNumSeqs < 0 || c.Overrides.MaxBatchedTokens < 0:
		return bad("kv-blocks, max-model-len, max-num-seqs and max-batched-tokens must not be negative")
	}
	for _, m := range c.Overrides.Models {
		if m == "" {
			return bad("models has an empty name")
		}
	}
	if err := c.Role.Validate(); err != nil {
		return err
	}
	if err := c.EngineTLS.Validate("engine-tls."); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.EngineTLS.Enabled() && !isHTTPS(c.EngineURL) && !isHTTPS(c.MetricsURL) {
		// Settings that secure nothing would read as a secured link.
		return bad("engine-tls.* is set but neither engine-url %q nor metrics-url %q is https://", c.EngineURL, c.MetricsURL)
	}
	if err := c.TLS.Validate("tls."); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if c.AdvertiseURL != "" {
		// Over plain HTTP to a TLS port, routers would fall back to hashing
		// without the engine's tokenizer.
		if err := wire.CheckAdvertiseURL(c.AdvertiseURL, c.TLS.Enabled()); err != nil {
			return bad("advertise-url %v", err)
		}
	}
	return nil
}

func validHTTPURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != ""
}

func isHTTPS(s string) bool {
	u, err := url.Parse(s)
	return err == nil && u.Scheme == "https"
}

// RegisterFlags binds every field to a flag named prefix+name.
func (c *Config) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Var(&c.Engine, prefix+"engine", "engine kind: vllm, sglang or openai")
	fs.StringVar(&c.EngineURL, prefix+"engine-url", c.EngineURL, "engine base URL as the adapter reaches it")
	fs.StringVar(&c.EngineAdvertiseURL, prefix+"engine-advertise-url", c.EngineAdvertiseURL, "engine base URL registered for routers (default: -engine-url)")
	fs.StringVar(&c.MetricsURL, prefix+"metrics-url", c.MetricsURL, "engine Prometheus endpoint (default: <engine-url>/metrics for vllm and sglang, none for openai)")
	c.EngineTLS.RegisterFlags(fs, prefix+"engine-tls.", "the engine at an https:// -engine-url or -metrics-url")
	fs.StringVar(&c.KVEvents, prefix+"kv-events", c.KVEvents, "engine KV events ZMQ endpoint, e.g. tcp://127.0.0.1:5557 (empty: no KV events)")
	fs.BoolVar(&c.KVEventsBind, prefix+"kv-events-bind", c.KVEventsBind, "bind -kv-events instead of connecting (for engines that dial out)")
	fs.StringVar(&c.KVReplay, prefix+"kv-replay", c.KVReplay, "engine KV event replay ZMQ ROUTER endpoint (empty: no replay)")
	fs.StringVar(&c.KVTopic, prefix+"kv-topic", c.KVTopic, "KV event topic to subscribe to (empty: all)")
	fs.DurationVar(&c.KVReplayTimeout, prefix+"kv-replay-timeout", c.KVReplayTimeout, "how long one replay request may take")
	fs.StringVar(&c.ID, prefix+"id", c.ID, "worker id (etcd key and NATS subject token)")
	fs.StringVar(&c.Cluster, prefix+"cluster", c.Cluster, "cluster name (etcd prefix and NATS subjects)")
	fs.StringVar(&c.Listen, prefix+"listen", c.Listen, "adapter HTTP listen address (/metrics, /readyz, /healthz, /tokenizer/)")
	fs.StringVar(&c.AdvertiseURL, prefix+"advertise-url", c.AdvertiseURL, "adapter base URL routers fetch tokenizer files from (default: from the bound address)")
	c.TLS.RegisterFlags(fs, prefix+"tls.", "the adapter's HTTP port")
	fs.Func(prefix+"etcd-endpoints", "comma-separated etcd endpoints (default "+strings.Join(c.EtcdEndpoints, ",")+")", func(s string) error {
		c.EtcdEndpoints = listflag.Split(s)
		return nil
	})
	fs.StringVar(&c.NATSURL, prefix+"nats-url", c.NATSURL, "NATS URL")
	fs.DurationVar(&c.LeaseTTL, prefix+"lease-ttl", c.LeaseTTL, "etcd lease TTL of the registration (whole seconds)")
	fs.StringVar(&c.Overrides.Model, prefix+"model", c.Overrides.Model, "served model name (default: discovered)")
	fs.Func(prefix+"models", "comma-separated further model names served (added to the discovered ones)", func(s string) error {
		c.Overrides.Models = listflag.Split(s)
		return nil
	})
	fs.IntVar(&c.Overrides.BlockSize, prefix+"block-size", c.Overrides.BlockSize, "tokens per KV block (0: discovered; openai: 16)")
	fs.IntVar(&c.Overrides.KVBlocks, prefix+"kv-blocks", c.Overrides.KVBlocks, "KV blocks of the engine (0: discovered; openai: 65536)")
	fs.IntVar(&c.Overrides.MaxModelLen, prefix+"max-model-len", c.Overrides.MaxModelLen, "context length in tokens (0: discovered)")
	fs.IntVar(&c.Overrides.MaxNumSeqs, prefix+"max-num-seqs", c.Overrides.MaxNumSeqs, "concurrent requests of the engine (0: discovered or unlimited)")
	fs.BoolVar(&c.Overrides.PrioritySchedules, prefix+"priority-scheduling", c.Overrides.PrioritySchedules, "the engine schedules by priority (vLLM --scheduling-policy priority): routers pass each request's priority on")
	fs.IntVar(&c.Overrides.MaxBatchedTokens, prefix+"max-batched-tokens", c.Overrides.MaxBatchedTokens, "tokens per engine step (0: discovered or unknown)")
	fs.Func(prefix+"labels", "comma-separated key=value labels registered with the worker", func(s string) error {
		m, err := parseLabels(s)
		if err != nil {
			return err
		}
		c.Labels = m
		return nil
	})
	fs.Func(prefix+"engine-apis", "comma-separated APIs the engine serves beyond OpenAI's, registered for routers: anthropic-messages (vLLM >= 0.11.1 serves /v1/messages)", func(s string) error {
		c.APIs = listflag.Split(s)
		for _, api := range c.APIs {
			if api != wire.APIMessages {
				return fmt.Errorf("unknown API %q (known: %s)", api, wire.APIMessages)
			}
		}
		return nil
	})
	fs.DurationVar(&c.HealthInterval, prefix+"health-interval", c.HealthInterval, "engine health probe period")
	fs.DurationVar(&c.HealthTimeout, prefix+"health-timeout", c.HealthTimeout, "timeout of one health probe or discovery")
	fs.IntVar(&c.HealthFailures, prefix+"health-failures", c.HealthFailures, "consecutive failed probes that deregister the worker")
	fs.DurationVar(&c.RediscoverInterval, prefix+"rediscover-interval", c.RediscoverInterval, "how often a registered engine's models and shape are read again")
	fs.DurationVar(&c.LoadInterval, prefix+"load-interval", c.LoadInterval, "engine metrics scrape and load report period")
	fs.DurationVar(&c.HeartbeatInterval, prefix+"heartbeat-interval", c.HeartbeatInterval, "period of empty KV batches (heartbeats) to routers")
	fs.IntVar(&c.DumpChunkBlocks, prefix+"dump-chunk-blocks", c.DumpChunkBlocks, "hashes per KV dump reply chunk")
	fs.IntVar(&c.KVSample, prefix+"kv-sample", c.KVSample, "publish only the block hashes routers' sampled indexes keep at this rate (0 or 1: every hash); at most every router's -index.sample")
	fs.StringVar(&c.KVTiers, prefix+"kv-tiers", c.KVTiers, "lower KV tiers to mirror for routers, comma-separated: cpu, disk (empty: GPU blocks only)")
	fs.StringVar(&c.KVTierBlocks, prefix+"kv-tier-blocks", c.KVTierBlocks, "capacity in blocks of each lower tier, e.g. cpu=262144,disk=1048576 (default 8 x the engine's KV blocks)")
	fs.IntVar(&c.DPRank, prefix+"dp-rank", c.DPRank, "data-parallel rank this adapter fronts (with -dp-size > 1)")
	fs.IntVar(&c.DPSize, prefix+"dp-size", c.DPSize, "data-parallel size of the engine (0 or 1: no data parallelism)")
	c.Role.registerFlags(fs, prefix)
	fs.IntVar(&c.MaxMirrorEntries, prefix+"max-mirror-entries", c.MaxMirrorEntries, "bound of the engine-hash map (0: 4 x the engine's KV blocks, at least 4096)")
	fs.StringVar(&c.TokenizerDir, prefix+"tokenizer-dir", c.TokenizerDir, "model directory whose tokenizer files are served and advertised")
	fs.StringVar(&c.TokenizerSpec, prefix+"tokenizer-spec", c.TokenizerSpec, "built-in tokenizer to advertise instead, e.g. tiktoken:o200k_base")
}

func parseLabels(s string) (map[string]string, error) {
	m := map[string]string{}
	for _, kv := range listflag.Split(s) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("label %q is not key=value", kv)
		}
		m[k] = v
	}
	return m, nil
}

// Deps are the adapter's injected collaborators.
type Deps struct {
	Etcd       *clientv3.Client
	NATS       *nats.Conn
	Logger     *zap.Logger
	Registerer prometheus.Registerer
	// Gatherer serves /metrics (nil: /metrics answers 404).
	Gatherer prometheus.Gatherer
	// HTTPClient talks to the engine (nil: one with Config.EngineTLS;
	// timeouts are per request). A client given here brings its own TLS
	// settings, so Config.EngineTLS must then be empty.
	HTTPClient *http.Client
	// TLSMetrics counts reloads of the TLS files (nil: not counted).
	TLSMetrics *tlsconf.Metrics
	// Ready, if set, is called once with the adapter's HTTP base URL when
	// it serves. It must not block.
	Ready func(url string)
}

// Adapter makes one engine a worker of the cluster (see doc.go).
type Adapter struct {
	cfg    Config
	deps   Deps
	log    *zap.Logger
	eng    *engineClient
	mirror *Mirror // nil without KV events
	// tiers are the lower tiers' mirrors (-kv-tiers), tierReg their
	// metrics, labelled by tier and served beside the Gatherer's.
	tiers   []*Mirror
	tierReg *prometheus.Registry
	load    *LoadReporter
	files   []wire.NamedFile
	// serverTLS serves the HTTP port over TLS (nil: plaintext).
	serverTLS *tls.Config

	total     atomic.Int64 // registered KV blocks
	shapeOnce sync.Once
	shaped    chan struct{} // closed at the first registration's shape
	live      atomic.Bool   // the event subscriber runs
	subRuns   prometheus.Counter
	reg       *Registrar
	// runEvents runs the engine event subscriber once; a field so tests
	// can stand in for the engine's stream.
	runEvents func(ctx context.Context) error
}

// New builds an adapter; it reads the tokenizer directory and the TLS files
// but starts nothing.
func New(cfg Config, deps Deps) (*Adapter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg, err := cfg.forRank()
	if err != nil {
		return nil, err
	}
	if deps.Etcd == nil || deps.NATS == nil {
		return nil, fmt.Errorf("%w: adapter needs etcd and NATS clients", ErrInvalidConfig)
	}
	if deps.HTTPClient != nil && cfg.EngineTLS.Enabled() {
		return nil, fmt.Errorf("%w: engine-tls.* would be ignored: Deps.HTTPClient brings its own TLS settings", ErrInvalidConfig)
	}
	if deps.Logger == nil {
		deps.Logger = zap.NewNop()
	}
	if deps.Registerer == nil {
		deps.Registerer = prometheus.NewRegistry()
	}
	log := deps.Logger.Named("adapter").With(zap.String("worker", cfg.ID), zap.Stringer("engine", cfg.Engine))
	if deps.HTTPClient == nil {
		// Built even without settings: an https:// engine is then verified
		// against the system's roots.
		ctls, err := cfg.EngineTLS.Build(tlsconf.Deps{Name: "engine", Logger: log, Metrics: deps.TLSMetrics})
		if err != nil {
			return nil, fmt.Errorf("%w: engine-tls: %w", ErrInvalidConfig, err)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = ctls
		deps.HTTPClient = &http.Client{Transport: tr}
	}
	stls, err := cfg.TLS.Build(tlsconf.Deps{Name: "adapter_http", Logger: log, Metrics: deps.TLSMetrics, NextProtos: tlsconf.HTTPProtos})
	if err != nil {
		return nil, fmt.Errorf("%w: tls: %w", ErrInvalidConfig, err)
	}
	a := &Adapter{cfg: cfg, deps: deps, log: log, shaped: make(chan struct{}), serverTLS: stls,
		eng: newEngineClient(cfg.Engine, cfg.EngineURL, cfg.MetricsURL, deps.HTTPClient)}
	a.eng.tlsFailures = promauto.With(deps.Registerer).NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_engine_tls_failures_total",
		Help: "Requests to the engine that failed at TLS, by reason (verify: its certificate does not verify; not_tls: it answered in plaintext; refused: it ended the handshake, e.g. for a missing client certificate)."},
		[]string{"reason"})
	for _, f := range tlsFailures {
		a.eng.tlsFailures.WithLabelValues(f.String())
	}
	a.subRuns = promauto.With(deps.Registerer).NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_subscriber_restarts_total",
		Help: "Times the engine event subscriber stopped with an error and was started again."})
	if cfg.TokenizerDir != "" {
		files, err := LoadTokenizerDir(cfg.TokenizerDir)
		if err != nil {
			return nil, err
		}
		a.files = files
	}
	if cfg.KVEvents != "" {
		mc := DefaultMirrorConfig()
		mc.Worker, mc.Cluster, mc.HeartbeatInterval, mc.DumpChunkBlocks = cfg.ID, cfg.Cluster, cfg.HeartbeatInterval, cfg.DumpChunkBlocks
		mc.Sample = cfg.KVSample
		if a.mirror, err = NewMirror(mc, deps.NATS, log, deps.Registerer); err != nil {
			return nil, err
		}
		if err := a.newTierMirrors(mc); err != nil {
			return nil, err
		}
		a.runEvents = a.subscriberRunner()
	}
	var flavor Flavor // openai: either engine's names
	switch cfg.Engine {
	case EngineVLLM:
		flavor = FlavorVLLM
	case EngineSGLang:
		flavor = FlavorSGLang
	}
	if a.eng.metricsURL != "" {
		a.load, err = newLoadReporter(LoadConfig{Worker: cfg.ID, Cluster: cfg.Cluster, Interval: cfg.LoadInterval,
			Timeout: cfg.HealthTimeout, Flavor: flavor, Rank: cfg.rank()}, a.eng, deps.NATS, a.position, func() int { return int(a.total.Load()) },
			log, deps.Registerer)
		if err != nil {
			return nil, err
		}
	}
	return a, nil
}

// instanceWithoutEvents stands for the engine in load reports when no
// mirror runs: routers index nothing of it, so no id is ever checked.
var instanceWithoutEvents = newInstance()

func (a *Adapter) position() (uint64, uint64) {
	if a.mirror == nil {
		return instanceWithoutEvents, 0
	}
	return a.mirror.Position()
}

// Mirror is the adapter's KV mirror (nil without -kv-events): the
// enginekv.Handler its subscriber feeds.
func (a *Adapter) Mirror() *Mirror { return a.mirror }

// Registered reports whether the worker is in etcd now.
func (a *Adapter) Registered() bool { return a.reg != nil && a.reg.Registered() }

// ready says why the adapter is not ready, or "" when it is.
func (a *Adapter) ready() string {
	switch {
	case a.reg == nil || !a.reg.Registered():
		return "not registered: the engine is not healthy or its shape is unknown"
	case a.mirror != nil && !a.live.Load():
		return "the engine's KV event stream is not followed"
	}
	return ""
}

// onInfo shapes the mirror before each registration is written, so the
// first events after it are rehashed right.
func (a *Adapter) onInfo(info wire.WorkerInfo) error {
	if a.mirror != nil {
		max := a.cfg.MaxMirrorEntries
		if max == 0 {
			max = max4(info.KVBlocks)
		}
		if err := a.mirror.Configure(Shape{Model: info.SaltName(), BlockSize: info.BlockSize, MaxEntries: max}); err != nil {
			return err
		}
		for _, t := range a.tiers {
			if err := t.Configure(Shape{Model: info.SaltName(), BlockSize: info.BlockSize, MaxEntries: max}); err != nil {
				return err
			}
		}
	}
	a.total.Store(int64(info.KVBlocks))
	a.shapeOnce.Do(func() { close(a.shaped) })
	return nil
}

func max4(kvBlocks int) int { return max(4*kvBlocks, 4096) }

// Run serves until ctx ends: the HTTP port, the registrar, and with KV
// events the mirror and the engine event subscriber, and the load reporter.
// It returns after everything it started has exited.
func (a *Adapter) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("adapter %s: listen %s: %w", a.cfg.ID, a.cfg.Listen, err)
	}
	base := a.cfg.AdvertiseURL
	if base == "" {
		base = wire.AdvertiseURL(ln.Addr().(*net.TCPAddr), a.serverTLS != nil)
	}
	if a.serverTLS != nil {
		ln = tls.NewListener(ln, a.serverTLS)
	}
	base = strings.TrimRight(base, "/")
	rc := RegistrarConfig{
		Worker: a.cfg.ID, Cluster: a.cfg.Cluster, URL: a.cfg.EngineURL, Engine: a.cfg.Engine, Labels: a.cfg.Labels,
		PublishesEvents: a.mirror != nil, Overrides: a.cfg.Overrides, LeaseTTL: a.cfg.LeaseTTL,
		TierBlocks: a.tierBlocks(), DPRank: a.cfg.DPRank, DPSize: a.cfg.DPSize, APIs: a.cfg.APIs, Role: a.cfg.Role,
		ProbeInterval: a.cfg.HealthInterval, ProbeTimeout: a.cfg.HealthTimeout, FailureThreshold: a.cfg.HealthFailures,
		RediscoverInterval: a.cfg.RediscoverInterval,
	}
	if a.cfg.EngineAdvertiseURL != "" {
		rc.URL = a.cfg.EngineAdvertiseURL
	}
	rc.URL = strings.TrimRight(rc.URL, "/")
	switch {
	case a.files != nil:
		rc.Tokenizer = tokenizerSource(base+"/tokenizer", a.files)
	case a.cfg.TokenizerSpec != "":
		rc.Tokenizer = &wire.TokenizerSource{Spec: a.cfg.TokenizerSpec}
	}
	a.reg, err = NewRegistrar(rc, a.deps.Etcd, a.eng, a.onInfo, a.log, a.deps.Registerer)
	if err != nil {
		_ = ln.Close()
		return err
	}

	srv := &http.Server{Handler: a.routes(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: zap.NewStdLog(a.log.Named("http"))}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 8+len(a.tiers)) // one slot per goroutine below: none blocks on exit
	run := func(name string, f func(context.Context) error) {
		wg.Go(func() {
			if err := f(ctx); err != nil {
				errs <- fmt.Errorf("adapter %s: %s: %w", a.cfg.ID, name, err)
				cancel()
			}
		})
	}
	wg.Go(func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			errs <- fmt.Errorf("adapter %s: serve: %w", a.cfg.ID, err)
			cancel()
		}
	})
	run("registrar", a.reg.Run)
	if a.mirror != nil {
		run("mirror", a.mirror.Run)
		for _, t := range a.tiers {
			run("mirror "+t.cfg.Tier.String(), t.Run)
		}
		run("kv_events", a.followEvents)
	}
	if a.load != nil {
		run("load", a.load.Run)
	}
	a.log.Info("adapter serving", zap.String("url", base), zap.String("engine_url", a.cfg.EngineURL))
	if a.deps.Ready != nil {
		a.deps.Ready(base)
	}
	<-ctx.Done()
	sctx, scancel := context.WithTimeout(context.Background(), 2*time.Second)
	_ = srv.Shutdown(sctx)
	scancel()
	wg.Wait()
	close(errs)
	return <-errs // nil when nothing failed
}

// subscriberRunner returns a function running one enginekv subscriber,
// built at its first call, fed into the mirror.
func (a *Adapter) subscriberRunner() func(context.Context) error {
	var sub *enginekv.Subscriber
	return func(ctx context.Context) error {
		if sub == nil {
			sc := enginekv.DefaultSubscriberConfig()
			sc.Endpoint, sc.Bind, sc.ReplayEndpoint, sc.Topic = a.cfg.KVEvents, a.cfg.KVEventsBind, a.cfg.KVReplay, a.cfg.KVTopic
			if a.cfg.KVReplayTimeout > 0 {
				sc.ReplayTimeout = a.cfg.KVReplayTimeout
			}
			s, err := enginekv.NewSubscriber(sc, a.handler(), a.log, a.deps.Registerer)
			if err != nil {
				return err
			}
			sub = s
		}
		return sub.Run(ctx)
	}
}

// followEvents runs the engine event subscriber once the mirror knows the
// engine's shape, and again after it fails. A failed subscriber lost
// continuity, so the mirror starts over before the next run.
func (a *Adapter) followEvents(ctx context.Context) error {
	select {
	case <-a.shaped:
	case <-ctx.Done():
		return nil
	}
	wait := 250 * time.Millisecond
	for {
		a.live.Store(true)
		err := a.runEvents(ctx)
		a.live.Store(false)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the subscriber ended because ctx did: a normal stop
		}
		a.subRuns.Inc()
		a.mirror.restart(repairSubscriber)
		for _, t := range a.tiers {
			t.restart(repairSubscriber)
		}
		a.log.Warn("engine event subscriber stopped; starting it again", zap.Error(err), zap.Duration("in", wait))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, 30*time.Second)
	}
}
