package main

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/tenant"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestItWritesCertificatesTheTLSPackageLoadsAKeyringAndOnePasswordPerNATSUser(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "certs")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"-dir", dir, "-routers", "2", "-workers", "3"}, &out, &errOut), errOut.String())
	for _, n := range []string{"etcd", "nats", "router-1", "router-2", "worker-1", "worker-3"} {
		f := tlsconf.ServerConfig{CertFile: filepath.Join(dir, n+".crt"), KeyFile: filepath.Join(dir, n+".key"), ClientCAFile: filepath.Join(dir, "ca.crt")}
		_, err := f.Build(tlsconf.Deps{})
		require.NoError(t, err, n)
		_, err = tlsconf.ClientConfig{CAFile: filepath.Join(dir, "ca.crt"), CertFile: f.CertFile, KeyFile: f.KeyFile}.Build(tlsconf.Deps{})
		require.NoError(t, err, n)
	}
	b, err := os.ReadFile(filepath.Join(dir, "gossip.keyring"))
	require.NoError(t, err)
	k, err := gossip.ParseKeyring(b)
	require.NoError(t, err)
	require.Len(t, k.Primary, 32)
	env, err := os.ReadFile(filepath.Join(dir, "secrets.env"))
	require.NoError(t, err)
	for _, v := range []string{"SWITCHYARD_NATS_ROUTER_PASSWORD=", "SWITCHYARD_NATS_WORKER_1_PASSWORD=", "SWITCHYARD_NATS_WORKER_3_PASSWORD="} {
		require.Contains(t, string(env), v)
	}
	require.NotContains(t, string(env), "WORKER_4_")
	require.False(t, strings.Contains(string(env), "PASSWORD=\n"), "no empty password")
	// nats-server reads a referenced variable as a config value: a leading
	// digit or '-' makes it a number and fails the start.
	for _, line := range strings.Split(strings.TrimSpace(string(env)), "\n") {
		if strings.HasPrefix(line, "#") {
			continue
		}
		_, pw, _ := strings.Cut(line, "=")
		require.Regexp(t, `^sy[0-9a-f]{48}$`, pw, line)
	}

	key, err := os.ReadFile(filepath.Join(dir, "api.key"))
	require.NoError(t, err)
	raw, err := os.ReadFile(filepath.Join(dir, "keys.yaml"))
	require.NoError(t, err)
	set, err := tenant.Parse(raw)
	require.NoError(t, err)
	tn, ok := set.Lookup(strings.TrimSpace(string(key)))
	require.True(t, ok, "api.key is not a key of keys.yaml")
	for _, class := range []string{"interactive", "batch", "realtime"} {
		require.True(t, tn.AllowsClass(class), class)
	}
	_, ok = set.Lookup("sy-not-the-key")
	require.False(t, ok)
}

func TestWithK8sItWritesEveryFileTheKustomizationReadsWithAnAdminKey(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "secrets")
	var out, errOut bytes.Buffer
	require.Equal(t, 0, run([]string{"-k8s", "-dir", dir, "-namespace", "llm"}, &out, &errOut), errOut.String())
	for _, n := range []string{"etcd", "nats", "router", "worker"} {
		f := tlsconf.ServerConfig{CertFile: filepath.Join(dir, n+".crt"), KeyFile: filepath.Join(dir, n+".key"), ClientCAFile: filepath.Join(dir, "ca.crt")}
		_, err := f.Build(tlsconf.Deps{})
		require.NoError(t, err, n)
		// The certificate names the Service, also in the namespace (routers
		// verify workers by switchyard-worker), and loopback for probes.
		raw, err := os.ReadFile(f.CertFile)
		require.NoError(t, err)
		block, _ := pem.Decode(raw)
		require.NotNil(t, block)
		cert, err := x509.ParseCertificate(block.Bytes)
		require.NoError(t, err)
		for _, host := range []string{"switchyard-" + n, "switchyard-" + n + ".llm.svc", "127.0.0.1"} {
			require.NoError(t, cert.VerifyHostname(host), "%s: %s", n, host)
		}
	}
	// The kustomization's secretGenerator reads exactly these.
	for _, f := range []string{"nats-router.password", "nats-worker.password", "gossip.keyring", "keys.yaml", "api.key", "admin.key"} {
		info, err := os.Stat(filepath.Join(dir, f))
		require.NoError(t, err, f)
		require.Equal(t, os.FileMode(0o600), info.Mode().Perm(), f)
	}
	for _, f := range []string{"nats-router.password", "nats-worker.password"} {
		pw, err := os.ReadFile(filepath.Join(dir, f))
		require.NoError(t, err)
		require.Regexp(t, `^sy[0-9a-f]{48}$`, string(pw))
	}
	raw, err := os.ReadFile(filepath.Join(dir, "keys.yaml"))
	require.NoError(t, err)
	set, err := tenant.Parse(raw)
	require.NoError(t, err)
	api, err := os.ReadFile(filepath.Join(dir, "api.key"))
	require.NoError(t, err)
	admin, err := os.ReadFile(filepath.Join(dir, "admin.key"))
	require.NoError(t, err)
	_, ok := set.Lookup(strings.TrimSpace(string(api)))
	require.True(t, ok, "api.key is a tenant's key")
	_, ok = set.LookupAdmin(strings.TrimSpace(string(admin)))
	require.True(t, ok, "admin.key is an admin key")
	_, ok = set.LookupAdmin(strings.TrimSpace(string(api)))
	require.False(t, ok)
}
