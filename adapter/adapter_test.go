package adapter

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/wire"
)

type runningAdapter struct {
	a    *Adapter
	url  string
	reg  *prometheus.Registry
	stop func()
}

func testAdapterConfig(eng *fakeEngine, etcd *testenv.Etcd, n *testenv.NATS) Config {
	cfg := DefaultConfig()
	cfg.EngineURL = eng.srv.URL
	cfg.ID, cfg.Cluster = "w1", testCluster
	cfg.Listen = "127.0.0.1:0"
	cfg.EtcdEndpoints, cfg.NATSURL = etcd.Endpoints, n.URL
	cfg.LeaseTTL = 2 * time.Second
	cfg.HealthInterval = 20 * time.Millisecond
	cfg.LoadInterval = 20 * time.Millisecond
	cfg.HeartbeatInterval = 20 * time.Millisecond
	return cfg
}

// heldStream stands in for the engine's event stream: it runs until ctx
// ends, so the adapter sees a live subscriber, and the test feeds the
// mirror itself. Tests through real ZMQ sockets are in zmq_e2e_test.go.
func heldStream(ctx context.Context) error {
	<-ctx.Done()
	return nil
}

func startAdapter(t *testing.T, cfg Config, etcd *testenv.Etcd, n *testenv.NATS) *runningAdapter {
	t.Helper()
	return startAdapterWith(t, cfg, etcd, n, heldStream)
}

func startAdapterWith(t *testing.T, cfg Config, etcd *testenv.Etcd, n *testenv.NATS, events func(context.Context) error) *runningAdapter {
	t.Helper()
	reg := prometheus.NewRegistry()
	urls := make(chan string, 1)
	a, err := New(cfg, Deps{Etcd: etcd.Client(t), NATS: n.Conn(t), Logger: zap.NewNop(), Registerer: reg, Gatherer: reg,
		Ready: func(u string) { urls <- u }})
	require.NoError(t, err)
	if a.runEvents != nil && events != nil { // nil: the real enginekv subscriber
		a.runEvents = events
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, a.Run(ctx)) })
	r := &runningAdapter{a: a, reg: reg, stop: func() { cancel(); wg.Wait() }}
	t.Cleanup(r.stop)
	select {
	case r.url = <-urls:
	case <-time.After(10 * time.Second):
		t.Fatal("adapter did not serve")
	}
	return r
}

func httpGet(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, b
}

func TestAnAdapterMakesAVLLMEngineAWorkerWhoseCacheRoutersIndex(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.KVEvents = "tcp://127.0.0.1:5557" // not dialled: heldStream stands in
	router := startRouterIndex(t, n, "w1", 2048)
	ra := startAdapter(t, cfg, etcd, n)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	assert.True(t, registered(t, watcher, "w1").PublishesEvents)

	f := &feeder{h: ra.a.Mirror()}
	a := newPrompt(1, 4, testBS)
	l := newPrompt(1, 2, testBS)
	l.lora, l.loraID = "sql-lora", 1
	f.batch(a.stored(0, 4), l.stored(0, 2))
	router.holdsExactly(t, "w1", slices.Concat(a.want(testSalt, 4), l.want(testSalt, 2)), "mirrored through the adapter")

	code, body := httpGet(t, ra.url+"/healthz")
	assert.Equal(t, http.StatusOK, code, string(body))
	code, body = httpGet(t, ra.url+"/metrics")
	assert.Equal(t, http.StatusOK, code)
	assert.Contains(t, string(body), "switchyard_adapter_kv_blocks_total")
	assert.Contains(t, string(body), "switchyard_adapter_registered 1")
}

func TestReadyzNeedsTheRegistration(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	eng.healthy.Store(false)
	ra := startAdapter(t, testAdapterConfig(eng, etcd, n), etcd, n)
	code, body := httpGet(t, ra.url+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, string(body), "not registered")
	eng.healthy.Store(true)
	testenv.Eventually(t, 5*time.Second, func() bool { c, _ := httpGet(t, ra.url+"/readyz"); return c == http.StatusOK }, "ready once registered")
}

func TestReadyzNeedsTheEventStreamAndAFailedSubscriberIsRestartedUnderANewInstance(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.KVEvents = "tcp://127.0.0.1:5557"
	router := startRouterIndex(t, n, "w1", 2048)
	fail := make(chan struct{})
	runs := make(chan struct{}, 16)
	ra := startAdapterWith(t, cfg, etcd, n, func(ctx context.Context) error {
		runs <- struct{}{}
		select {
		case <-ctx.Done():
			return nil
		case <-fail:
			return errors.New("engine stream broken")
		}
	})
	testenv.Eventually(t, 5*time.Second, func() bool { c, _ := httpGet(t, ra.url+"/readyz"); return c == http.StatusOK }, "ready")
	f := &feeder{h: ra.a.Mirror()}
	a := newPrompt(1, 3, testBS)
	f.batch(a.stored(0, 3))
	router.holdsExactly(t, "w1", a.want(testSalt, 3), "before the failure")
	before, _ := ra.a.Mirror().Position()

	close(fail) // every run fails from now on
	testenv.Eventually(t, 5*time.Second, func() bool { c, _ := httpGet(t, ra.url+"/readyz"); return c == http.StatusServiceUnavailable }, "not ready while the stream is down")
	code, body := httpGet(t, ra.url+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code)
	assert.Contains(t, string(body), "KV event stream")
	testenv.Eventually(t, 5*time.Second, func() bool { return len(runs) >= 2 }, "restarted")
	after, _ := ra.a.Mirror().Position()
	assert.NotEqual(t, before, after, "continuity lost: a new instance")
	router.holdsExactly(t, "w1", nil, "the router forgot the engine's blocks")
}

func TestLoadReportsCarryTheEnginesMetricsAndTheMirrorsPosition(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.KVEvents = "tcp://127.0.0.1:5557"
	reports := loadReports(t, n, "w1")
	ra := startAdapter(t, cfg, etcd, n)
	testenv.Eventually(t, 5*time.Second, func() bool { return ra.a.Registered() }, "registration")
	f := &feeder{h: ra.a.Mirror()}
	f.batch(newPrompt(1, 3, testBS).stored(0, 3))
	instance, last := ra.a.Mirror().Position()
	var r *wire.LoadReport
	testenv.Eventually(t, 5*time.Second, func() bool {
		select {
		case r = <-reports:
			return r.LastEventID == last && r.Instance == instance
		default:
			return false
		}
	}, "a report at the mirror's position")
	assert.Equal(t, 4, r.Running, "3 + 1 over two engines")
	assert.Equal(t, 2, r.Waiting)
	assert.InDelta(t, 0.25, r.KVUsage, 1e-9)
	assert.InDelta(t, 0.3, r.PrefixHitRate, 1e-9, "the engine's own prefix-cache hits over its queries")
	assert.Equal(t, 2048, r.KVBlocksTotal)
	assert.Equal(t, 512, r.KVBlocksUsed)

	// Garbage metrics are counted and publish nothing.
	eng.setMetrics("garbage{{{")
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(ra.a.load.scrapes.WithLabelValues("malformed")) >= 3
	}, "malformed scrapes counted")
	for len(reports) > 0 {
		<-reports
	}
	before := testutil.ToFloat64(ra.a.load.reports.WithLabelValues("ok"))
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(ra.a.load.scrapes.WithLabelValues("malformed")) >= 6
	}, "more malformed scrapes")
	assert.Equal(t, before, testutil.ToFloat64(ra.a.load.reports.WithLabelValues("ok")), "no report from garbage")
}

func TestTheAdapterServesAndAdvertisesTheModelsTokenizerFiles(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	dir := t.TempDir()
	files := map[string]string{
		"tokenizer.json":         `{"version":"1.0","model":{"type":"BPE"}}`,
		"tokenizer_config.json":  `{"chat_template":"{{ messages }}"}`,
		"generation_config.json": `{"eos_token_id":[1,2]}`,
		"config.json":            `{"not":"served"}`,
	}
	for name, body := range files {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600))
	}
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.TokenizerDir = dir
	ra := startAdapter(t, cfg, etcd, n)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	src := registered(t, watcher, "w1").Tokenizer
	require.NotNil(t, src)
	assert.Equal(t, ra.url+"/tokenizer", src.URL)
	assert.Equal(t, []string{"tokenizer.json", "tokenizer_config.json", "generation_config.json"}, src.Files)
	// What a router does: fetch every file, recompute the digest.
	var fetched []wire.NamedFile
	for _, name := range src.Files {
		code, body := httpGet(t, src.URL+"/"+name)
		require.Equal(t, http.StatusOK, code, name)
		assert.Equal(t, files[name], string(body))
		fetched = append(fetched, wire.NamedFile{Name: name, Data: body})
	}
	assert.Equal(t, src.SHA256, wire.TokenizerDigest(fetched))
	code, _ := httpGet(t, src.URL+"/config.json")
	assert.Equal(t, http.StatusNotFound, code)
	code, _ = httpGet(t, src.URL+"/..%2fconfig.json")
	assert.Equal(t, http.StatusNotFound, code)
}

func TestATokenizerSpecIsAdvertisedInsteadOfFiles(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.TokenizerSpec = "tiktoken:o200k_base"
	startAdapter(t, cfg, etcd, n)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	b, _ := json.Marshal(registered(t, watcher, "w1").Tokenizer)
	assert.JSONEq(t, `{"spec":"tiktoken:o200k_base"}`, string(b))
}

func TestConfigValidateNamesTheBadField(t *testing.T) {
	for flag, mutate := range map[string]func(*Config){
		"engine-url":          func(c *Config) { c.EngineURL = "127.0.0.1:8000" },
		"kv-events":           func(c *Config) { c.Engine, c.KVEvents = EngineOpenAI, "tcp://x:1" },
		"kv-replay":           func(c *Config) { c.KVReplay = "tcp://x:2" },
		"id":                  func(c *Config) { c.ID = "a.b" },
		"lease-ttl":           func(c *Config) { c.LeaseTTL = 1500 * time.Millisecond },
		"health-failures":     func(c *Config) { c.HealthFailures = 0 },
		"tokenizer-dir":       func(c *Config) { c.TokenizerDir, c.TokenizerSpec = "/x", "tiktoken:o200k_base" },
		"block-size":          func(c *Config) { c.Overrides.BlockSize = -1 },
		"max-mirror-entries":  func(c *Config) { c.MaxMirrorEntries = -1 },
		"models":              func(c *Config) { c.Overrides.Models = []string{""} },
		"engine-tls.key-file": func(c *Config) { c.EngineURL, c.EngineTLS.CertFile = "https://engine:8443", "c.crt" },
		"engine-tls.*":        func(c *Config) { c.EngineTLS.CAFile = "ca.crt" }, // secures nothing: the URLs are http://
		"tls.client-ca-file":  func(c *Config) { c.TLS.ClientCAFile = "ca.crt" },
		"advertise-url": func(c *Config) {
			c.TLS, c.AdvertiseURL = tlsconf.ServerConfig{CertFile: "c.crt", KeyFile: "c.key"}, "http://adapter:9100"
		},
		"tls.min-version": func(c *Config) {
			c.TLS = tlsconf.ServerConfig{CertFile: "c.crt", KeyFile: "c.key", MinVersion: "1.1"}
		},
	} {
		c := DefaultConfig()
		mutate(&c)
		err := c.Validate()
		require.ErrorIsf(t, err, ErrInvalidConfig, flag)
		assert.Containsf(t, err.Error(), flag, "the error names %s", flag)
	}
	assert.NoError(t, DefaultConfig().Validate())
}

func TestAnOpenAIServerWithAMetricsURLGetsLoadReportsFromEitherEnginesNames(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	eng.setMetrics("sglang:num_running_reqs 6\nsglang:num_queue_reqs 1\nsglang:token_usage 0.5\n")
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.Engine, cfg.MetricsURL = EngineOpenAI, eng.srv.URL+"/metrics"
	reports := loadReports(t, n, "w1")
	ra := startAdapter(t, cfg, etcd, n)
	assert.Nil(t, ra.a.Mirror(), "no KV events for an openai engine")
	select {
	case r := <-reports:
		assert.Equal(t, 6, r.Running)
		assert.Equal(t, 1, r.Waiting)
		assert.Equal(t, openAIKVBlocks, r.KVBlocksTotal)
		assert.Equal(t, uint64(0), r.LastEventID)
	case <-time.After(10 * time.Second):
		t.Fatal("no load report")
	}
}
