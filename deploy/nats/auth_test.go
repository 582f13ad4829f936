package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/wire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// startShipped runs an in-process NATS server on the shipped auth.conf, with
// every password variable it references set in the environment.
func startShipped(t *testing.T) string {
	t.Helper()
	setPasswords(t)
	return startConf(t, "auth.conf")
}

// setPasswords sets every password variable auth.conf references.
func setPasswords(t *testing.T) {
	t.Helper()
	t.Setenv("SWITCHYARD_NATS_ROUTER_PASSWORD", "router-secret")
	for i := 1; i <= 8; i++ {
		t.Setenv(fmt.Sprintf("SWITCHYARD_NATS_WORKER_%d_PASSWORD", i), fmt.Sprintf("worker-%d-secret", i))
	}
}

// startConf runs an in-process NATS server on the config file at path, on
// a random local port, until the test ends, and returns its client URL.
func startConf(t *testing.T, path string) string {
	t.Helper()
	opts, err := server.ProcessConfigFile(path)
	require.NoError(t, err)
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", server.RANDOM_PORT, 0
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	require.NoError(t, err)
	go s.Start()
	require.True(t, s.ReadyForConnections(10*time.Second))
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s.ClientURL()
}

// connect dials as user with the options a Switchyard process builds from
// -nats.user and -nats.password. Permission violations land on errs.
func connect(t *testing.T, url, user, password string) (*nats.Conn, chan error) {
	t.Helper()
	opts, err := links.NATS{User: user, Password: password}.Options(url, tlsconf.Deps{})
	require.NoError(t, err)
	errs := make(chan error, 16)
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		select {
		case errs <- err:
		default:
		}
	}))
	nc, err := nats.Connect(url, opts...)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	return nc, errs
}

func TestAWorkersCredentialsPublishItsOwnEventsButNotAnotherWorkersNorAdmissionRequests(t *testing.T) {
	url := startShipped(t)
	subj := wire.NewSubjects("default")
	router, _ := connect(t, url, "router", "router-secret")
	events, err := router.SubscribeSync(subj.KVAll())
	require.NoError(t, err)
	admits, err := router.SubscribeSync(subj.Admit("realtime"))
	require.NoError(t, err)
	loads, err := router.SubscribeSync(subj.LoadAll())
	require.NoError(t, err)
	require.NoError(t, router.Flush())

	w1, errs := connect(t, url, "worker-1", "worker-1-secret")
	// Its own events and load reports go through.
	require.NoError(t, w1.Publish(subj.KV("worker-1"), []byte("own")))
	require.NoError(t, w1.Publish(subj.Load("worker-1"), []byte("own")))
	m, err := events.NextMsg(5 * time.Second)
	require.NoError(t, err)
	require.Equal(t, subj.KV("worker-1"), m.Subject)
	_, err = loads.NextMsg(5 * time.Second)
	require.NoError(t, err)

	// Another worker's events, load, and admission traffic are refused by
	// the server and never reach the router.
	require.NoError(t, w1.Publish(subj.KV("worker-2"), []byte("forged")))
	testenv.AwaitPermissionViolation(t, errs, subj.KV("worker-2"))
	require.NoError(t, w1.Publish(subj.Load("worker-2"), []byte("forged")))
	testenv.AwaitPermissionViolation(t, errs, subj.Load("worker-2"))
	require.NoError(t, w1.Publish(subj.Admit("realtime"), []byte("forged")))
	testenv.AwaitPermissionViolation(t, errs, subj.Admit("realtime"))
	_, err = w1.Request(subj.Admit("realtime"), []byte("forged"), 200*time.Millisecond)
	require.Error(t, err, "a worker cannot make admission requests")
	for _, s := range []string{subj.Cancel("realtime"), subj.Life("router-1"), subj.Adopt("realtime")} {
		require.NoError(t, w1.Publish(s, []byte("forged")))
		testenv.AwaitPermissionViolation(t, errs, s)
	}
	// Nor can it listen to the others' traffic.
	_, err = w1.SubscribeSync(subj.KVAll())
	require.NoError(t, err)
	testenv.AwaitPermissionViolation(t, errs, subj.KVAll())

	require.NoError(t, router.Flush())
	_, err = events.NextMsg(300 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "a forged event reached the router")
	_, err = admits.NextMsg(10 * time.Millisecond)
	require.ErrorIs(t, err, nats.ErrTimeout, "a forged admission request reached the router")
}

func TestAWorkerAnswersItsOwnDumpInManyChunksButCannotAnswerAnotherWorkersRequests(t *testing.T) {
	url := startShipped(t)
	subj := wire.NewSubjects("default")
	router, _ := connect(t, url, "router", "router-secret")
	w1, _ := connect(t, url, "worker-1", "worker-1-secret")
	_, err := w1.Subscribe(subj.KVDump("worker-1"), func(m *nats.Msg) {
		for i := range 5 {
			_ = w1.Publish(m.Reply, []byte{byte(i)})
		}
	})
	require.NoError(t, err)
	require.NoError(t, w1.Flush())
	inbox := nats.NewInbox()
	replies, err := router.SubscribeSync(inbox)
	require.NoError(t, err)
	require.NoError(t, router.PublishRequest(subj.KVDump("worker-1"), inbox, nil))
	for i := range 5 {
		m, err := replies.NextMsg(5 * time.Second)
		require.NoError(t, err, "chunk %d", i)
		require.Equal(t, []byte{byte(i)}, m.Data)
	}

	// worker-2's dump subject is not worker-1's to answer.
	w1b, errs := connect(t, url, "worker-1", "worker-1-secret")
	_, err = w1b.SubscribeSync(subj.KVDump("worker-2"))
	require.NoError(t, err)
	testenv.AwaitPermissionViolation(t, errs, subj.KVDump("worker-2"))
	// Nor may it write into an inbox it was not asked on.
	require.NoError(t, w1b.Publish(inbox, []byte("forged")))
	testenv.AwaitPermissionViolation(t, errs, inbox)
}

func TestTheRouterUsesTheAdmissionSubjectsAndAWrongPasswordIsRefused(t *testing.T) {
	url := startShipped(t)
	subj := wire.NewSubjects("default")
	owner, _ := connect(t, url, "router", "router-secret")
	entry, _ := connect(t, url, "router", "router-secret")
	_, err := owner.Subscribe(subj.Admit("batch"), func(m *nats.Msg) { _ = m.Respond([]byte("grant")) })
	require.NoError(t, err)
	require.NoError(t, owner.Flush())
	m, err := entry.Request(subj.Admit("batch"), []byte("admit"), 5*time.Second)
	require.NoError(t, err)
	require.Equal(t, "grant", string(m.Data))
	// Tenant quotas are leased between routers: a quota owner answers
	// lease requests and holders answer its recalls. An entry asks the
	// owner an attempt went to about it on that owner's status subject.
	for _, s := range []string{subj.Quota("router-1"), subj.QuotaRecall("router-2"), subj.Status("router-1")} {
		_, err = owner.Subscribe(s, func(m *nats.Msg) { _ = m.Respond([]byte("lease")) })
		require.NoError(t, err)
		require.NoError(t, owner.Flush())
		m, err = entry.Request(s, []byte("ask"), 5*time.Second)
		require.NoError(t, err, s)
		require.Equal(t, "lease", string(m.Data))
	}

	opts, err := links.NATS{User: "worker-1", Password: "guess"}.Options(url, tlsconf.Deps{})
	require.NoError(t, err)
	_, err = nats.Connect(url, opts...)
	require.ErrorIs(t, err, nats.ErrAuthorization)
	_, err = nats.Connect(url)
	require.ErrorIs(t, err, nats.ErrAuthorization, "no credentials, no connection")
}

func TestTheShippedTLSConfigRequiresClientCertificatesAndKeepsThePermissions(t *testing.T) {
	setPasswords(t)
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("test-ca", time.Hour)
	require.NoError(t, err)
	srv, err := ca.WriteFiles(dir, "nats", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cli, err := ca.WriteFiles(dir, "worker-1", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	conf, err := os.ReadFile("nats-tls.conf")
	require.NoError(t, err)
	auth, err := os.ReadFile("auth.conf")
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "auth.conf"), auth, 0o600))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "nats-tls.conf"), []byte(strings.ReplaceAll(string(conf), "/certs/", dir+"/")), 0o600))
	url := startConf(t, filepath.Join(dir, "nats-tls.conf"))
	require.True(t, strings.HasPrefix(url, "tls://"), url)

	noCert, err := links.NATS{TLS: tlsconf.ClientConfig{CAFile: srv.CA}, User: "worker-1", Password: "worker-1-secret"}.Options(url, tlsconf.Deps{})
	require.NoError(t, err)
	_, err = nats.Connect(url, noCert...)
	require.Error(t, err, "no client certificate, no connection")

	withCert, err := links.NATS{TLS: tlsconf.ClientConfig{CAFile: srv.CA, CertFile: cli.Cert, KeyFile: cli.Key},
		User: "worker-1", Password: "worker-1-secret"}.Options(url, tlsconf.Deps{})
	require.NoError(t, err)
	errs := make(chan error, 4)
	nc, err := nats.Connect(url, append(withCert, nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))...)
	require.NoError(t, err)
	defer nc.Close()
	subj := wire.NewSubjects("default")
	require.NoError(t, nc.Publish(subj.KV("worker-2"), []byte("forged")))
	testenv.AwaitPermissionViolation(t, errs, subj.KV("worker-2"))
}

// deploy/gencerts writes "sy" and hex digits because nats-server reads a
// referenced variable as a config value: a base64 password that happens to
// start with '-' or a digit fails the server's start.
func TestAPasswordStartingWithADashOrDigitFailsTheConfigAndGencertsFormLoads(t *testing.T) {
	set := func(pw string) {
		t.Setenv("SWITCHYARD_NATS_ROUTER_PASSWORD", pw)
		for i := 1; i <= 8; i++ {
			t.Setenv(fmt.Sprintf("SWITCHYARD_NATS_WORKER_%d_PASSWORD", i), pw)
		}
	}
	set("-Wq3xYz")
	_, err := server.ProcessConfigFile("auth.conf")
	require.Error(t, err, "a leading '-' is read as a number")
	set("sy0123456789abcdef0123456789abcdef0123456789abcdef")
	_, err = server.ProcessConfigFile("auth.conf")
	require.NoError(t, err)
}
