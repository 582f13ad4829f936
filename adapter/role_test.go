package adapter

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func TestAnSGLangPrefillRegistersItsRoleAndBootstrapPortFromItsServerInfo(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	eng.setModels(`{"object":"list","data":[{"id":"Qwen/Qwen2.5-7B-Instruct","object":"model","owned_by":"sglang","root":"Qwen/Qwen2.5-7B-Instruct","max_model_len":32768}]}`)
	info := `{"served_model_name":"Qwen/Qwen2.5-7B-Instruct","page_size":16,"max_total_num_tokens":160000,` +
		`"disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998}`
	eng.info.Store(&info)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Engine = EngineSGLang
	startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	got := registered(t, watcher, "w1")
	assert.Equal(t, wire.RolePrefill, got.RoleOf())
	assert.Equal(t, wire.TransferSGLang, got.KVTransfer)
	assert.Equal(t, 8998, got.BootstrapPort)
}

func TestAVLLMEngineTakesItsRoleFromTheFlags(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	cfg := testRegistrarConfig(eng.srv.URL)
	cfg.Role = RoleConfig{Role: wire.RoleDecode}
	startRegistrar(t, etcd.Client(t), cfg, prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	got := registered(t, watcher, "w1")
	assert.Equal(t, wire.RoleDecode, got.RoleOf())
	assert.Equal(t, wire.TransferVLLM, got.KVTransfer)
	assert.Zero(t, got.BootstrapPort)
}

func TestAnEngineThatSaysNothingRegistersAsBoth(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	eng := startFakeEngine(t)
	watcher := etcd.Client(t)
	startRegistrar(t, etcd.Client(t), testRegistrarConfig(eng.srv.URL), prometheus.NewRegistry())
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	got := registered(t, watcher, "w1")
	assert.Empty(t, got.Role)
	assert.Empty(t, got.KVTransfer)
}

func TestBadRoleFlagsAreNamed(t *testing.T) {
	require.ErrorContains(t, RoleConfig{Role: "encode"}.Validate(), "Role")
	require.ErrorContains(t, RoleConfig{KVTransfer: "nixl"}.Validate(), "KVTransfer")
	require.ErrorContains(t, RoleConfig{BootstrapPort: 70000}.Validate(), "BootstrapPort")
	require.NoError(t, RoleConfig{Role: wire.RolePrefill, KVTransfer: wire.TransferSGLang, BootstrapPort: 8998}.Validate())
}

func TestServerInfoReadsTheDisaggregationMode(t *testing.T) {
	si, err := ParseServerInfo([]byte(`{"page_size":1,"disaggregation_mode":"null"}`))
	require.NoError(t, err)
	require.Empty(t, si.Role)
	si, err = ParseServerInfo([]byte(`{"page_size":1,"disaggregation_mode":"decode","disaggregation_bootstrap_port":8998}`))
	require.NoError(t, err)
	require.Equal(t, wire.RoleDecode, si.Role)
	_, err = ParseServerInfo([]byte(`{"page_size":1,"disaggregation_mode":"prefill","disaggregation_bootstrap_port":-3}`))
	require.ErrorIs(t, err, ErrMalformed)
}
