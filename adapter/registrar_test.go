package adapter

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func testRegistrarConfig(url string) RegistrarConfig {
	return RegistrarConfig{Worker: "w1", Cluster: testCluster, URL: url, Engine: EngineVLLM, PublishesEvents: true,
		LeaseTTL: 2 * time.Second, ProbeInterval: 20 * time.Millisecond, ProbeTimeout: time.Second,
		FailureThreshold: 3, RediscoverInterval: time.Hour}
}

// startRegistrar runs a registrar with its own etcd client and returns a
// stop function that cancels it and waits.
func startRegistrar(t *testing.T, cli *clientv3.Client, cfg RegistrarConfig, reg prometheus.Registerer) (*Registrar, func()) {
	t.Helper()
	eng := newEngineClient(cfg.Engine, cfg.URL, "", &http.Client{})
	r, err := NewRegistrar(cfg, cli, eng, nil, zap.NewNop(), reg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, r.Run(ctx)) })
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	return r, stop
}

// registered reads the worker's record from etcd, or nil.
func registered(t *testing.T, cli *clientv3.Client, worker string) *wire.WorkerInfo {
	t.Helper()
	resp, err := cli.Get(context.Background(), wire.NewKeys(testCluster).Worker(worker))
	require.NoError(t, err)
	if len(resp.Kvs) == 0 {
		return nil
	}
	info, err := wire.DecodeWorkerInfo(resp.Kvs[0].Value)
	require.NoError(t, err)
	return info
}

func newEtcdClient(t *testing.T, e *testenv.Etcd) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: e.Endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	require.NoError(t, err)
	return cli
}

func TestTheWorkerIsRegisteredWithWhatVLLMTellsIncludingItsLoRA(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	r, _ := startRegistrar(t, etcd.Client(t), testRegistrarConfig(eng.srv.URL), prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	info := registered(t, watcher, "w1")
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", info.Model)
	assert.Equal(t, []string{"sql-lora"}, info.Models)
	assert.True(t, info.Serves("sql-lora"))
	assert.Equal(t, 16, info.BlockSize)
	assert.Equal(t, 2048, info.KVBlocks)
	assert.Equal(t, 8192, info.MaxModelLen)
	assert.Equal(t, eng.srv.URL, info.URL)
	assert.True(t, info.PublishesEvents)
	assert.True(t, r.Registered())
}

func TestFlagsOverrideEveryDiscoveredValue(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Overrides = Overrides{Model: "llama", Models: []string{"alias"}, BlockSize: 32, KVBlocks: 100, MaxModelLen: 4096,
		MaxNumSeqs: 64, MaxBatchedTokens: 2048}
	startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	info := registered(t, watcher, "w1")
	assert.Equal(t, "llama", info.Model)
	assert.Equal(t, []string{"sql-lora", "alias", "meta-llama/Llama-3.1-8B-Instruct"}, info.Models,
		"the engine's names, the flag's, and the engine's own base name")
	assert.Equal(t, []int{32, 100, 4096, 64, 2048}, []int{info.BlockSize, info.KVBlocks, info.MaxModelLen, info.MaxNumSeqs, info.MaxBatchedTokens})
}

func TestTheRegistrationFollowsTheEnginesHealthAfterNFailedProbes(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	eng.healthy.Store(false)
	watcher := etcd.Client(t)
	reg := prometheus.NewRegistry()
	r, _ := startRegistrar(t, etcd.Client(t), testRegistrarConfig(eng.srv.URL), reg)

	// Unhealthy from the start: probed, never registered.
	testenv.Eventually(t, 5*time.Second, func() bool { return eng.probes.Load() >= 5 }, "probes")
	assert.Nil(t, registered(t, watcher, "w1"), "an unhealthy engine is not registered")

	eng.healthy.Store(true)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil && r.Registered() }, "registered once healthy")

	// Two failures are not enough; the third deregisters.
	eng.healthy.Store(false)
	start := eng.probes.Load()
	testenv.Eventually(t, 5*time.Second, func() bool { return !r.Registered() }, "deregistered")
	assert.GreaterOrEqual(t, eng.probes.Load()-start, int64(3), "at least FailureThreshold failed probes before deregistering")
	assert.Nil(t, registered(t, watcher, "w1"))

	eng.healthy.Store(true)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registered again on recovery")
	assert.Equal(t, 2.0, testutil.ToFloat64(r.registrations.WithLabelValues("registered")))
	assert.Equal(t, 1.0, testutil.ToFloat64(r.registrations.WithLabelValues("deregistered")))
}

func TestFewerThanNFailedProbesKeepTheRegistration(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.FailureThreshold = 1000 // far more than the test's window of failures
	r, _ := startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	eng.healthy.Store(false)
	start := eng.probes.Load()
	testenv.Eventually(t, 5*time.Second, func() bool { return eng.probes.Load()-start >= 10 }, "failed probes")
	assert.True(t, r.Registered())
	assert.NotNil(t, registered(t, watcher, "w1"))
}

func TestAKilledAdaptersRegistrationDisappearsWithinTheLeaseTTL(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cli := newEtcdClient(t, etcd)
	_, stop := startRegistrar(t, cli, testRegistrarConfig(eng.srv.URL), prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	// kill -9: the process's etcd connection goes away without a
	// deregistration or a revoke; only the lease TTL (2 s) removes the key.
	require.NoError(t, cli.Close())
	gone := time.Now()
	testenv.Eventually(t, 6*time.Second, func() bool { return registered(t, watcher, "w1") == nil }, "lease expiry")
	t.Logf("registration gone %v after the client died (lease TTL 2s)", time.Since(gone).Round(100*time.Millisecond))
	stop()
}

func TestAnOrderlyStopDeletesTheRegistrationAtOnce(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.LeaseTTL = 30 * time.Second // expiry would take far longer than the wait below
	_, stop := startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	stop()
	assert.Nil(t, registered(t, watcher, "w1"), "deleted before Run returned")
}

func TestGarbageDiscoveryKeepsAHealthyEngineUnregisteredUnlessFlagsFillIn(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	eng.setModels(`{"data": [ garbage`)
	eng.setMetrics("not prometheus {{{")
	watcher := etcd.Client(t)
	reg := prometheus.NewRegistry()
	r, stop := startRegistrar(t, etcd.Client(t), testRegistrarConfig(eng.srv.URL), reg)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(r.discoveries.WithLabelValues("failed")) >= 3
	}, "failed discoveries counted")
	assert.Nil(t, registered(t, watcher, "w1"))
	stop()

	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Overrides = Overrides{Model: "m", BlockSize: 16, KVBlocks: 512}
	r2, _ := startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registered from flags")
	assert.Equal(t, 1.0, testutil.ToFloat64(r2.discoveries.WithLabelValues("partial")))
	assert.Equal(t, "m", registered(t, watcher, "w1").Model)
}

func TestAnSGLangEngineIsRegisteredFromItsServerInfo(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	eng.setModels(`{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model","owned_by":"sglang","root":"Qwen/Qwen2.5-7B-Instruct","max_model_len":32768}]}`)
	info := `{"served_model_name":"Qwen/Qwen2.5-7B-Instruct","page_size":16,"max_total_num_tokens":160000,"chunked_prefill_size":8192,"max_running_requests":128}`
	eng.info.Store(&info)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Engine = EngineSGLang
	startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	got := registered(t, watcher, "w1")
	assert.Equal(t, []int{16, 10000, 32768, 128, 8192}, []int{got.BlockSize, got.KVBlocks, got.MaxModelLen, got.MaxNumSeqs, got.MaxBatchedTokens})
	assert.Equal(t, "Qwen/Qwen2.5-7B-Instruct", got.Model)
}

func TestAnOpenAIServerIsProbedThroughItsModelListAndRegisteredWithoutEvents(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Engine, cfg.PublishesEvents = EngineOpenAI, false
	r, _ := startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	got := registered(t, watcher, "w1")
	testenv.Eventually(t, 5*time.Second, r.Registered, "the registrar knows it registered")
	assert.False(t, got.PublishesEvents)
	assert.Equal(t, openAIBlockSize, got.BlockSize)
	assert.Equal(t, openAIKVBlocks, got.KVBlocks)
	eng.healthy.Store(false) // /v1/models now fails: that is its health
	testenv.Eventually(t, 5*time.Second, func() bool { return !r.Registered() }, "deregistered")
}
