package k8s

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/wire"
)

// startK8sNATS runs an in-process NATS server on the nats.conf of the
// ConfigMap switchyard-nats-config, its certificate paths pointed at a test
// CA's files, and returns its URL and the client files.
func startK8sNATS(t *testing.T) (string, tlsconf.Files) {
	t.Helper()
	var conf string
	for _, o := range byKind(loadManifests(t), "ConfigMap") {
		if o.Metadata.Name == "switchyard-nats-config" {
			conf = o.Data["nats.conf"]
		}
	}
	require.NotEmpty(t, conf, "no nats.conf in the ConfigMap switchyard-nats-config")
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("test", time.Hour)
	require.NoError(t, err)
	_, err = ca.WriteFiles(dir, "tls", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cli, err := ca.WriteFiles(dir, "client", []string{"client"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	conf = strings.ReplaceAll(conf, "/etc/nats-tls/", dir+"/")
	path := filepath.Join(dir, "nats.conf")
	require.NoError(t, os.WriteFile(path, []byte(conf), 0o600))
	t.Setenv("SWITCHYARD_NATS_ROUTER_PASSWORD", "router-secret")
	t.Setenv("SWITCHYARD_NATS_WORKER_PASSWORD", "worker-secret")
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	require.NotNil(t, opts.TLSConfig, "the server config has TLS")
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return "tls://" + strings.TrimPrefix(strings.TrimPrefix(s.ClientURL(), "nats://"), "tls://"), cli
}

// connectK8s dials as user with the options a Switchyard process builds
// from its -nats.* flags; permission violations land on the channel.
func connectK8s(t *testing.T, url string, n links.NATS) (*nats.Conn, chan error, error) {
	t.Helper()
	opts, err := n.Options(url, tlsconf.Deps{})
	require.NoError(t, err)
	errs := make(chan error, 16) // a few violations; more are dropped, the test reads the first
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(url, opts...)
	if err == nil {
		t.Cleanup(nc.Close)
	}
	return nc, errs, err
}

func TestTheK8sNATSRefusesClientsWithoutACertificateAndWorkersCannotTouchAdmission(t *testing.T) {
	url, cli := startK8sNATS(t)
	withCert := tlsconf.ClientConfig{CAFile: cli.CA, CertFile: cli.Cert, KeyFile: cli.Key}

	_, _, err := connectK8s(t, url, links.NATS{TLS: tlsconf.ClientConfig{CAFile: cli.CA}, User: "router", Password: "router-secret"})
	require.Error(t, err, "a client without a certificate is refused (verify: true)")
	require.NotContains(t, err.Error(), "lookup")
	_, _, err = connectK8s(t, url, links.NATS{TLS: withCert, User: "router", Password: "wrong"})
	require.ErrorIs(t, err, nats.ErrAuthorization, "a wrong password is refused")

	subj := wire.NewSubjects("default")
	router, _, err := connectK8s(t, url, links.NATS{TLS: withCert, User: "router", Password: "router-secret"})
	require.NoError(t, err)
	events, err := router.SubscribeSync(subj.KVAll())
	require.NoError(t, err)
	admits, err := router.SubscribeSync(subj.Admit("realtime"))
	require.NoError(t, err)
	require.NoError(t, router.Flush())

	w, errs, err := connectK8s(t, url, links.NATS{TLS: withCert, User: "worker", Password: "worker-secret"})
	require.NoError(t, err)
	require.NoError(t, w.Publish(subj.KV("worker-a"), []byte("own")))
	m, err := events.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, subj.KV("worker-a"), m.Subject)
	for _, s := range []string{subj.Admit("realtime"), subj.Cancel("realtime"), subj.Life("router-1"), subj.Adopt("realtime")} {
		require.NoError(t, w.Publish(s, []byte("forged")))
		testenv.AwaitPermissionViolation(t, errs, s)
	}
	_, err = w.SubscribeSync(subj.Admit("realtime"))
	require.NoError(t, err)
	testenv.AwaitPermissionViolation(t, errs, subj.Admit("realtime"))
	require.NoError(t, router.Flush())
	_, err = admits.NextMsg(100 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "a forged admission request reached the router")

	require.NoError(t, router.Publish(subj.Admit("realtime"), []byte("ok")))
	_, err = admits.NextMsg(5 * time.Second)
	require.NoError(t, err, "the router's own admission traffic goes through")
}
