package links

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startSecureEtcd runs an embedded etcd whose client URL is https and that
// requires client certificates from ca.
func startSecureEtcd(t *testing.T, ca *tlsconf.CA) string {
	t.Helper()
	dir := t.TempDir()
	srv, err := ca.WriteFiles(dir, "etcd", []string{"127.0.0.1", "localhost"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(dir, "data")
	cfg.Logger, cfg.LogLevel = "zap", "fatal"
	cfg.LogOutputs = []string{"stderr"}
	client, _ := url.Parse("https://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)))
	peer, _ := url.Parse("http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)))
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*client}, []url.URL{*client}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peer}, []url.URL{*peer}
	cfg.InitialCluster = cfg.Name + "=" + peer.String()
	cfg.ListenMetricsUrls = nil
	cfg.ClientTLSInfo.CertFile, cfg.ClientTLSInfo.KeyFile = srv.Cert, srv.Key
	cfg.ClientTLSInfo.TrustedCAFile = srv.CA
	cfg.ClientTLSInfo.ClientCertAuth = true
	e, err := embed.StartEtcd(cfg)
	require.NoError(t, err)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		t.Fatal("etcd not ready")
	}
	t.Cleanup(e.Close)
	return client.String()
}

func clientFor(t *testing.T, e Etcd, endpoint string) *clientv3.Client {
	t.Helper()
	cfg, err := e.ClientConfig([]string{endpoint}, zap.NewNop(), tlsconf.Deps{})
	require.NoError(t, err)
	cfg.DialTimeout = 10 * time.Second // bcrypt of etcd auth is slow under -race
	c, err := clientv3.New(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func put(c *clientv3.Client) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := c.Put(ctx, "/switchyard/test/k", "v")
	return err
}

func TestAnEtcdClientWithoutACertificateIsRefusedWhenTheServerRequiresOne(t *testing.T) {
	ca, err := tlsconf.NewCA("test-ca", time.Hour)
	require.NoError(t, err)
	endpoint := startSecureEtcd(t, ca)
	dir := t.TempDir()
	cli, err := ca.WriteFiles(dir, "router-1", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)

	// The CA alone verifies the server but proves nothing about the client.
	anon := clientFor(t, Etcd{TLS: tlsconf.ClientConfig{CAFile: cli.CA}}, endpoint)
	require.Error(t, put(anon), "etcd accepted a client without a certificate")

	// A certificate from a CA the server does not trust is refused too.
	other, err := tlsconf.NewCA("other-ca", time.Hour)
	require.NoError(t, err)
	odir := t.TempDir()
	of, err := other.WriteFiles(odir, "intruder", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	intruder := clientFor(t, Etcd{TLS: tlsconf.ClientConfig{CAFile: cli.CA, CertFile: of.Cert, KeyFile: of.Key}}, endpoint)
	require.Error(t, put(intruder))

	ok := clientFor(t, Etcd{TLS: tlsconf.ClientConfig{CAFile: cli.CA, CertFile: cli.Cert, KeyFile: cli.Key}}, endpoint)
	require.NoError(t, put(ok))
}

func TestEtcdUsersAuthenticateWithAPasswordFromAFile(t *testing.T) {
	e := testenv.StartEtcd(t)
	admin := e.Client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := admin.UserAdd(ctx, "root", "root-pw")
	require.NoError(t, err)
	_, err = admin.UserGrantRole(ctx, "root", "root")
	require.NoError(t, err)
	_, err = admin.AuthEnable(ctx)
	require.NoError(t, err)

	pw := filepath.Join(t.TempDir(), "pw")
	require.NoError(t, os.WriteFile(pw, []byte("root-pw\n"), 0o600))
	require.NoError(t, put(clientFor(t, Etcd{Username: "root", PasswordFile: pw}, e.Endpoints[0])))

	require.Error(t, tryPut(t, Etcd{Username: "root", Password: "guess"}, e.Endpoints[0]), "a wrong password must be refused")
	require.Error(t, tryPut(t, Etcd{}, e.Endpoints[0]), "no user, no access once auth is on")
}

// tryPut connects with e and puts a key: a refusal may come from the dial
// (a failed authentication) or from the request.
func tryPut(t *testing.T, e Etcd, endpoint string) error {
	t.Helper()
	cfg, err := e.ClientConfig([]string{endpoint}, zap.NewNop(), tlsconf.Deps{})
	require.NoError(t, err)
	cfg.DialTimeout = 10 * time.Second // bcrypt of etcd auth is slow under -race
	c, err := clientv3.New(cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	return put(c)
}

func TestLinkSettingsAreValidatedByField(t *testing.T) {
	require.ErrorContains(t, Etcd{Password: "x"}.Validate("etcd."), "etcd.username")
	require.ErrorContains(t, Etcd{Username: "u", Password: "x", PasswordFile: "f"}.Validate("etcd."), "etcd.password-file")
	require.ErrorContains(t, NATS{User: "u", Token: "t"}.Validate("nats."), "nats.user")
	require.ErrorContains(t, NATS{Token: "t", TokenFile: "f"}.Validate("nats."), "nats.token-file")
	require.ErrorContains(t, NATS{TLS: tlsconf.ClientConfig{KeyFile: "k"}}.Validate("nats."), "nats.cert-file")
	_, err := Etcd{TLS: tlsconf.ClientConfig{CAFile: "ca"}}.ClientConfig([]string{"http://127.0.0.1:2379"}, zap.NewNop(), tlsconf.Deps{})
	require.ErrorContains(t, err, "not https")
	_, err = Etcd{}.ClientConfig([]string{"https://a:2379", "http://b:2379"}, zap.NewNop(), tlsconf.Deps{})
	require.ErrorContains(t, err, "mixes")
	opts, err := NATS{}.Options("nats://127.0.0.1:4222", tlsconf.Deps{})
	require.NoError(t, err)
	require.Empty(t, opts, "plaintext without credentials stays as before")
}

// An etcd outage of three session TTLs or more (docs/operations.md, e2e
// scenario 7) must not leave a client disconnected for seconds after etcd is
// back. gRPC's default reconnect backoff (1 s, ×1.6, up to 120 s) schedules
// the attempts of a 12 s outage near 9.3 s and 15.8 s after the cut (±20%
// jitter each), so the client would reconnect about 3.8 s after etcd
// returned, longer than the fence's TTL/2, and a class owner would stay
// fenced while its peers had recovered. ClientConfig bounds the backoff.
func TestAnEtcdClientReconnectsWithinASecondOrSoOfEtcdReturningAfterALongOutage(t *testing.T) {
	e := testenv.StartEtcd(t)
	px := testenv.StartProxy(t, mustHost(t, e.Endpoints[0]))
	cfg, err := Etcd{}.ClientConfig([]string{"http://" + px.Addr()}, zap.NewNop(), tlsconf.Deps{})
	require.NoError(t, err)
	c, err := clientv3.New(cfg)
	require.NoError(t, err)
	defer func() { _ = c.Close() }()
	ctx := testenv.Context(t)
	_, err = c.Put(ctx, "k", "v")
	require.NoError(t, err)

	px.Cut()
	time.Sleep(12 * time.Second)
	px.Restore()
	back := time.Now()
	gctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = c.Get(gctx, "k") // waits for a ready connection
	require.NoError(t, err)
	took := time.Since(back)
	t.Logf("first request answered %v after etcd was reachable again", took.Round(time.Millisecond))
	require.Less(t, took, 2*time.Second, "the client must reconnect soon after etcd returns, not on a long backoff")
}

func mustHost(t *testing.T, endpoint string) string {
	t.Helper()
	u, err := url.Parse(endpoint)
	require.NoError(t, err)
	return u.Host
}
