package adapter

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// enginePKI is a CA made for one test with the engine's server certificate
// (for 127.0.0.1 and localhost) and the adapter's client certificate.
type enginePKI struct {
	server, client tlsconf.Files
}

func newEnginePKI(t *testing.T) enginePKI {
	t.Helper()
	ca, err := tlsconf.NewCA("engine-test-ca", time.Hour)
	require.NoError(t, err)
	dir := t.TempDir()
	var p enginePKI
	p.server, err = ca.WriteFiles(dir, "engine", []string{"127.0.0.1", "localhost"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	p.client, err = ca.WriteFiles(dir, "adapter-w1", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	return p
}

// startHTTPSEngine is the fake vLLM engine serving HTTPS with p's server
// certificate, requiring a client certificate from p's CA when
// requireClient is set.
func startHTTPSEngine(t *testing.T, p enginePKI, requireClient bool) *fakeEngine {
	t.Helper()
	sc := tlsconf.ServerConfig{CertFile: p.server.Cert, KeyFile: p.server.Key}
	if requireClient {
		sc.ClientCAFile = p.server.CA
	}
	cfg, err := sc.Build(tlsconf.Deps{})
	require.NoError(t, err)
	return startTLSEngine(t, cfg)
}

// startTLSEngine is the fake vLLM engine serving HTTPS with cfg.
func startTLSEngine(t *testing.T, cfg *tls.Config) *fakeEngine {
	t.Helper()
	return startFakeEngineWith(t, func(h http.Handler) *httptest.Server {
		srv := httptest.NewUnstartedServer(h)
		srv.TLS = cfg
		// The handshake errors the tests provoke are expected.
		srv.Config.ErrorLog = zap.NewStdLog(zap.NewNop())
		srv.StartTLS()
		return srv
	})
}

// newUnstartedAdapter builds an adapter (not run) on real etcd and NATS
// clients, to probe its engine client directly.
func newUnstartedAdapter(t *testing.T, cfg Config, etcd *testenv.Etcd, n *testenv.NATS) *Adapter {
	t.Helper()
	a, err := New(cfg, Deps{Etcd: etcd.Client(t), NATS: n.Conn(t), Logger: zap.NewNop()})
	require.NoError(t, err)
	return a
}

func TestAnAdapterRegistersAnHTTPSEngineItsCABundleVouchesFor(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	eng := startHTTPSEngine(t, p, false)
	require.True(t, strings.HasPrefix(eng.srv.URL, "https://"))
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.EngineTLS = tlsconf.ClientConfig{CAFile: p.server.CA}
	reports := loadReports(t, n, "w1")
	ra := startAdapter(t, cfg, etcd, n)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration over HTTPS")
	info := registered(t, watcher, "w1")
	assert.Equal(t, eng.srv.URL, info.URL, "routers are told the https:// URL")
	assert.Equal(t, 2048, info.KVBlocks, "discovered from the engine's /metrics over HTTPS")
	select {
	case r := <-reports:
		assert.Equal(t, 4, r.Running, "the load scrape went over HTTPS too (3 + 1 of two engine cores)")
	case <-time.After(10 * time.Second):
		t.Fatal("no load report")
	}
	for _, f := range tlsFailures {
		assert.Zero(t, testutil.ToFloat64(ra.a.eng.tlsFailures.WithLabelValues(f.String())), f.String())
	}
}

func TestAnAdapterRefusesAnEngineItsTLSSettingsDoNotVouchForAndSaysWhy(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	eng := startHTTPSEngine(t, p, false)
	plain := startFakeEngine(t)
	other := newEnginePKI(t)
	cases := []struct {
		name   string
		mutate func(*Config)
		want   tlsFailure
		hint   string
		as     any
	}{
		{"a CA bundle of another CA", func(c *Config) { c.EngineTLS.CAFile = other.server.CA }, tlsVerify, "-engine-tls.ca-file",
			new(x509.UnknownAuthorityError)},
		{"the system's roots", func(c *Config) { c.EngineTLS = tlsconf.ClientConfig{} }, tlsVerify, "-engine-tls.ca-file",
			new(x509.UnknownAuthorityError)},
		{"a name the certificate does not carry", func(c *Config) { c.EngineTLS.ServerName = "engine.other.example" }, tlsVerify,
			"-engine-tls.server-name", new(x509.HostnameError)},
		{"an engine that speaks plaintext", func(c *Config) {
			c.EngineURL = "https://" + strings.TrimPrefix(plain.srv.URL, "http://")
		}, tlsNotTLS, "does not speak TLS", nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg := testAdapterConfig(eng, etcd, n)
			cfg.EngineTLS = tlsconf.ClientConfig{CAFile: p.server.CA}
			c.mutate(&cfg)
			a := newUnstartedAdapter(t, cfg, etcd, n)
			err := a.eng.Health(context.Background())
			t.Log(err)
			require.ErrorIs(t, err, ErrEngineTLS)
			assert.Contains(t, err.Error(), c.hint)
			if c.as != nil {
				assert.ErrorAs(t, err, c.as)
			}
			assert.InDelta(t, 1, testutil.ToFloat64(a.eng.tlsFailures.WithLabelValues(c.want.String())), 0, "counted as %s", c.want)
		})
	}

	// Run end to end, the adapter keeps probing and never registers the
	// engine it cannot verify.
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.EngineTLS = tlsconf.ClientConfig{CAFile: other.server.CA}
	ra := startAdapter(t, cfg, etcd, n)
	testenv.Eventually(t, 5*time.Second, func() bool {
		return testutil.ToFloat64(ra.a.eng.tlsFailures.WithLabelValues(tlsVerify.String())) >= 3
	}, "probes fail at TLS")
	assert.Nil(t, registered(t, etcd.Client(t), "w1"), "an engine that does not verify is not registered")
	code, body := httpGet(t, ra.url+"/readyz")
	assert.Equal(t, http.StatusServiceUnavailable, code, "%s", body)
}

func TestAnEngineRequiringClientCertificatesServesTheAdapterOnlyWithOne(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	eng := startHTTPSEngine(t, p, true)

	cfg := testAdapterConfig(eng, etcd, n)
	cfg.EngineTLS = tlsconf.ClientConfig{CAFile: p.server.CA}
	a := newUnstartedAdapter(t, cfg, etcd, n)
	err := a.eng.Health(context.Background())
	require.ErrorIs(t, err, ErrEngineTLS, "no client certificate")
	assert.Contains(t, err.Error(), "-engine-tls.cert-file")
	assert.InDelta(t, 1, testutil.ToFloat64(a.eng.tlsFailures.WithLabelValues(tlsRefused.String())), 0)

	// A client certificate from a CA the engine does not trust is refused too.
	other := newEnginePKI(t)
	cfg.EngineTLS.CertFile, cfg.EngineTLS.KeyFile = other.client.Cert, other.client.Key
	a = newUnstartedAdapter(t, cfg, etcd, n)
	require.ErrorIs(t, a.eng.Health(context.Background()), ErrEngineTLS, "a client certificate of another CA")

	cfg.EngineTLS.CertFile, cfg.EngineTLS.KeyFile = p.client.Cert, p.client.Key
	startAdapter(t, cfg, etcd, n)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration with a client certificate")
}

func TestTheAdapterServesItsPortOverTLSAndAdvertisesHTTPSTokenizerFiles(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.TLS = tlsconf.ServerConfig{CertFile: p.server.Cert, KeyFile: p.server.Key}
	dir := testTokenizerDir(t)
	cfg.TokenizerDir = dir
	ra := startAdapter(t, cfg, etcd, n)
	require.True(t, strings.HasPrefix(ra.url, "https://127.0.0.1:"), ra.url)
	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	src := registered(t, watcher, "w1").Tokenizer
	require.NotNil(t, src)
	assert.Equal(t, ra.url+"/tokenizer", src.URL)

	tc, err := tlsconf.ClientConfig{CAFile: p.server.CA}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr}).Get(src.URL + "/tokenizer.json")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Equal(t, "HTTP/2.0", resp.Proto, "HTTP/2 by ALPN")
	assert.JSONEq(t, `{"version":"1.0","model":{"type":"BPE"}}`, string(body))

	// Plaintext on the TLS port gets nowhere.
	code, _ := httpGet(t, "http://"+strings.TrimPrefix(ra.url, "https://")+"/healthz")
	assert.Equal(t, http.StatusBadRequest, code, "net/http answers plaintext on a TLS port with 400")
	// Nor does a client that does not trust the adapter's CA.
	resp, err = http.Get(ra.url + "/healthz")
	if err == nil {
		resp.Body.Close()
	}
	var unknown x509.UnknownAuthorityError
	assert.ErrorAs(t, err, &unknown)
}

func testTokenizerDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"version":"1.0","model":{"type":"BPE"}}`), 0o600))
	return dir
}

func TestTLSSettingsThatCannotWorkAreRefusedAtStart(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	eng := startHTTPSEngine(t, p, false)
	cfg := testAdapterConfig(eng, etcd, n)

	missing := cfg
	missing.EngineTLS = tlsconf.ClientConfig{CAFile: filepath.Join(t.TempDir(), "nope.crt")}
	_, err := New(missing, Deps{Etcd: etcd.Client(t), NATS: n.Conn(t)})
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "engine-tls")

	withClient := cfg
	withClient.EngineTLS = tlsconf.ClientConfig{CAFile: p.server.CA}
	_, err = New(withClient, Deps{Etcd: etcd.Client(t), NATS: n.Conn(t), HTTPClient: &http.Client{}})
	require.ErrorIs(t, err, ErrInvalidConfig, "a given HTTP client would ignore engine-tls.*")

	broken := cfg
	broken.TLS = tlsconf.ServerConfig{CertFile: p.server.Key, KeyFile: p.server.Cert}
	_, err = New(broken, Deps{Etcd: etcd.Client(t), NATS: n.Conn(t)})
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, err.Error(), "tls")
}

func TestAnAdapterHeldToTLS13RefusesAnEngineThatStopsAt12(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	p := newEnginePKI(t)
	cert, err := tls.LoadX509KeyPair(p.server.Cert, p.server.Key)
	require.NoError(t, err)
	eng := startTLSEngine(t, &tls.Config{Certificates: []tls.Certificate{cert}, MaxVersion: tls.VersionTLS12})
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.EngineTLS = tlsconf.ClientConfig{CAFile: p.server.CA}
	require.NoError(t, newUnstartedAdapter(t, cfg, etcd, n).eng.Health(context.Background()), "TLS 1.2 is the default floor")
	cfg.EngineTLS.MinVersion = "1.3"
	a := newUnstartedAdapter(t, cfg, etcd, n)
	err = a.eng.Health(context.Background())
	require.ErrorIs(t, err, ErrEngineTLS)
	assert.Contains(t, err.Error(), "-engine-tls.min-version")
	assert.InDelta(t, 1, testutil.ToFloat64(a.eng.tlsFailures.WithLabelValues(tlsRefused.String())), 0)
}
