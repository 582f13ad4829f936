package e2e

import (
	"crypto/tls"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/tlsconf"
)

func TestClientTLSTrustsTheGeneratedCAAndNoOther(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsconf.NewCA("e2e test", time.Hour)
	require.NoError(t, err)
	f, err := ca.WriteFiles(dir, "router-1", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cert, err := tls.LoadX509KeyPair(f.Cert, f.Key)
	require.NoError(t, err)

	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	t.Cleanup(srv.Close)

	cfg, err := ClientTLS(f.CA)
	require.NoError(t, err)
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err := client.Get(srv.URL)
	require.NoError(t, err)
	require.NoError(t, resp.Body.Close())
	assert.Equal(t, http.StatusOK, resp.StatusCode)
	client.CloseIdleConnections()

	other, err := tlsconf.NewCA("another", time.Hour)
	require.NoError(t, err)
	of, err := other.WriteFiles(t.TempDir(), "x", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cfg, err = ClientTLS(of.CA)
	require.NoError(t, err)
	client = &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
	resp, err = client.Get(srv.URL)
	if err == nil {
		_ = resp.Body.Close()
	}
	require.Error(t, err, "a server signed by another CA must not be trusted")
	client.CloseIdleConnections()
}

func TestClientTLSIsNilWithoutACAFileAndAnErrorForAFileWithoutCertificates(t *testing.T) {
	cfg, err := ClientTLS("")
	require.NoError(t, err)
	assert.Nil(t, cfg)

	bad := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(bad, []byte("not a certificate"), 0o600))
	_, err = ClientTLS(bad)
	require.ErrorIs(t, err, ErrNoCACertificates)

	_, err = ClientTLS(filepath.Join(t.TempDir(), "missing.crt"))
	require.Error(t, err)
}
