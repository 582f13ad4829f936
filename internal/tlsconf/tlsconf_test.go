package tlsconf

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeClock is a settable clock for the reload check.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *fakeClock) Add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func newCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, time.Hour)
	require.NoError(t, err)
	return ca
}

// serve runs a TLS echo of the peer's client certificate CN on loopback
// until the test ends and returns its address.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	require.NoError(t, err)
	var wg sync.WaitGroup
	t.Cleanup(func() { _ = ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				tc := c.(*tls.Conn)
				if err := tc.Handshake(); err != nil {
					return
				}
				cn := "-"
				if pc := tc.ConnectionState().PeerCertificates; len(pc) > 0 {
					cn = pc[0].Subject.CommonName
				}
				_, _ = io.WriteString(c, cn)
			}()
		}
	}()
	return ln.Addr().String()
}

// dial handshakes with addr and returns the server's leaf certificate and
// what the server wrote back (the client certificate's CN, or "-").
func dial(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, string, error) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, "", err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	if err != nil {
		return nil, "", err
	}
	return c.ConnectionState().PeerCertificates[0], string(b), nil
}

func TestAServerPicksUpARewrittenCertificateAtTheNextCheckAndKeepsTheOldOneWhileTheNewDoesNotLoad(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "test-ca")
	f, err := ca.WriteFiles(dir, "first", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	reg := prometheus.NewPedanticRegistry()
	m := NewMetrics(reg)
	cfg, err := ServerConfig{CertFile: f.Cert, KeyFile: f.Key}.Build(Deps{Name: "http", Metrics: m, Now: clock.Now})
	require.NoError(t, err)
	addr := serve(t, cfg)
	client, err := ClientConfig{CAFile: f.CA}.Build(Deps{})
	require.NoError(t, err)

	leaf, _, err := dial(t, addr, client)
	require.NoError(t, err)
	require.Equal(t, "first", leaf.Subject.CommonName)

	// A new pair written over the old files: not seen before the interval.
	c2, k2, err := ca.Issue("second", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.Cert, c2, 0o600))
	require.NoError(t, os.WriteFile(f.Key, k2, 0o600))
	leaf, _, err = dial(t, addr, client)
	require.NoError(t, err)
	require.Equal(t, "first", leaf.Subject.CommonName, "files are looked at once per interval")
	clock.Add(DefaultCheckInterval)
	leaf, _, err = dial(t, addr, client)
	require.NoError(t, err)
	require.Equal(t, "second", leaf.Subject.CommonName)

	// Half a rotation (a certificate without its key) keeps serving the last good pair.
	c3, _, err := ca.Issue("third", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(f.Cert, c3, 0o600))
	clock.Add(DefaultCheckInterval)
	leaf, _, err = dial(t, addr, client)
	require.NoError(t, err)
	require.Equal(t, "second", leaf.Subject.CommonName)
	require.InDelta(t, 1, testutil.ToFloat64(m.reloads.WithLabelValues("http", "failed")), 0)
	require.InDelta(t, 1, testutil.ToFloat64(m.reloads.WithLabelValues("http", "reloaded")), 0)
}

func TestAServerRequiringClientCertificatesRefusesAClientWithoutOneAndNamesTheOneThatHasIt(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "test-ca")
	srv, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	cli, err := ca.WriteFiles(dir, "router-1", nil, Client, time.Hour)
	require.NoError(t, err)
	cfg, err := ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}.Build(Deps{})
	require.NoError(t, err)
	addr := serve(t, cfg)

	anon, err := ClientConfig{CAFile: srv.CA}.Build(Deps{})
	require.NoError(t, err)
	_, _, err = dial(t, addr, anon)
	require.Error(t, err, "a client without a certificate must be refused")

	// A certificate from another CA is refused too.
	other := newCA(t, "other-ca")
	odir := t.TempDir()
	of, err := other.WriteFiles(odir, "intruder", nil, Client, time.Hour)
	require.NoError(t, err)
	foreign, err := ClientConfig{CAFile: srv.CA, CertFile: of.Cert, KeyFile: of.Key}.Build(Deps{})
	require.NoError(t, err)
	_, _, err = dial(t, addr, foreign)
	require.Error(t, err)

	ok, err := ClientConfig{CAFile: srv.CA, CertFile: cli.Cert, KeyFile: cli.Key}.Build(Deps{})
	require.NoError(t, err)
	_, cn, err := dial(t, addr, ok)
	require.NoError(t, err)
	require.Equal(t, "router-1", cn)
}

func TestAClientRefusesAServerItsCABundleDoesNotVouchFor(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "test-ca")
	srv, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	cfg, err := ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key}.Build(Deps{})
	require.NoError(t, err)
	addr := serve(t, cfg)
	odir := t.TempDir()
	other := newCA(t, "other-ca")
	require.NoError(t, os.WriteFile(filepath.Join(odir, "ca.crt"), other.CertPEM(), 0o600))
	c, err := ClientConfig{CAFile: filepath.Join(odir, "ca.crt")}.Build(Deps{})
	require.NoError(t, err)
	_, _, err = dial(t, addr, c)
	var unknown x509.UnknownAuthorityError
	require.ErrorAs(t, err, &unknown)
}

func TestAClientSendsARewrittenClientCertificateAfterTheInterval(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "test-ca")
	srv, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	cfg, err := ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}.Build(Deps{})
	require.NoError(t, err)
	addr := serve(t, cfg)
	cli, err := ca.WriteFiles(dir, "old-name", nil, Client, time.Hour)
	require.NoError(t, err)
	clock := &fakeClock{now: time.Unix(1000, 0)}
	cc, err := ClientConfig{CAFile: srv.CA, CertFile: cli.Cert, KeyFile: cli.Key}.Build(Deps{Now: clock.Now})
	require.NoError(t, err)
	_, cn, err := dial(t, addr, cc)
	require.NoError(t, err)
	require.Equal(t, "old-name", cn)
	c2, k2, err := ca.Issue("new-name", nil, Client, time.Hour)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(cli.Cert, c2, 0o600))
	require.NoError(t, os.WriteFile(cli.Key, k2, 0o600))
	clock.Add(DefaultCheckInterval)
	_, cn, err = dial(t, addr, cc)
	require.NoError(t, err)
	require.Equal(t, "new-name", cn)
}

func TestAServerWithMinVersion13RefusesATLS12Client(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "test-ca")
	srv, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, Server, time.Hour)
	require.NoError(t, err)
	cfg, err := ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key, MinVersion: "1.3"}.Build(Deps{})
	require.NoError(t, err)
	addr := serve(t, cfg)
	c, err := ClientConfig{CAFile: srv.CA}.Build(Deps{})
	require.NoError(t, err)
	c.MaxVersion = tls.VersionTLS12
	_, _, err = dial(t, addr, c)
	require.Error(t, err)
	c.MaxVersion = 0
	_, _, err = dial(t, addr, c)
	require.NoError(t, err)
}

func TestValidateNamesTheBadField(t *testing.T) {
	cases := []struct {
		name string
		err  error
		want string
	}{
		{"cert without key", ServerConfig{CertFile: "c"}.Validate("http.tls."), "http.tls.key-file"},
		{"key without cert", ServerConfig{KeyFile: "k"}.Validate("http.tls."), "http.tls.cert-file"},
		{"client CA without TLS", ServerConfig{ClientCAFile: "ca"}.Validate("x."), "x.client-ca-file"},
		{"require without CA", ServerConfig{CertFile: "c", KeyFile: "k", ClientAuth: ClientAuthRequire}.Validate(""), "client-auth"},
		{"unknown client auth", ServerConfig{CertFile: "c", KeyFile: "k", ClientCAFile: "ca", ClientAuth: "maybe"}.Validate(""), "client-auth"},
		{"TLS 1.1", ServerConfig{CertFile: "c", KeyFile: "k", MinVersion: "1.1"}.Validate(""), "min-version"},
		{"client cert without key", ClientConfig{CertFile: "c"}.Validate("etcd."), "etcd.key-file"},
		{"client TLS 1.0", ClientConfig{MinVersion: "1.0"}.Validate("nats."), "nats.min-version"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			require.ErrorIs(t, c.err, ErrInvalidConfig)
			require.ErrorContains(t, c.err, c.want)
		})
	}
	require.NoError(t, ServerConfig{}.Validate(""))
	require.NoError(t, ClientConfig{}.Validate(""))
}

func TestBuildFailsOnMissingOrBrokenFilesInsteadOfServingWithout(t *testing.T) {
	dir := t.TempDir()
	_, err := ServerConfig{CertFile: filepath.Join(dir, "nope.crt"), KeyFile: filepath.Join(dir, "nope.key")}.Build(Deps{})
	require.True(t, errors.Is(err, os.ErrNotExist), "%v", err)
	junk := filepath.Join(dir, "junk.pem")
	require.NoError(t, os.WriteFile(junk, []byte("not pem"), 0o600))
	_, err = ServerConfig{CertFile: junk, KeyFile: junk}.Build(Deps{})
	require.Error(t, err)
	_, err = ClientConfig{CAFile: junk}.Build(Deps{})
	require.ErrorContains(t, err, "no PEM certificate")
	cfg, err := ServerConfig{}.Build(Deps{})
	require.NoError(t, err)
	require.Nil(t, cfg, "no files: plaintext")
}
