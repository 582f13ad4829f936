package healthcheck

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/tlsconf"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMainExitsZeroOnlyWhenTheURLAnswers200(t *testing.T) {
	ok := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	defer ok.Close()
	sick := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		http.Error(w, "starting", http.StatusServiceUnavailable)
	}))
	defer sick.Close()
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"--url", ok.URL}, "", &out, &errOut); code != 0 {
		t.Fatalf("healthy URL: exit %d (%s)", code, errOut.String())
	}
	if code := Main(context.Background(), []string{"--url", sick.URL}, "", &out, &errOut); code != 1 {
		t.Fatalf("503 URL: exit %d; want 1", code)
	}
	if !bytes.Contains(errOut.Bytes(), []byte("status 503: starting")) {
		t.Fatalf("the failure says why: %q", errOut.String())
	}
	if code := Main(context.Background(), []string{"--bogus"}, "", &out, &errOut); code != 2 {
		t.Fatalf("bad flag: exit %d; want 2", code)
	}
	ok.CloseClientConnections()
	ok.Client().CloseIdleConnections()
	http.DefaultClient.CloseIdleConnections()
}

func TestMainProbesAnHTTPSServerWithTheGivenCAAndClientCertificate(t *testing.T) {
	ca, err := tlsconf.NewCA("test-ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	srv, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	cli, err := ca.WriteFiles(dir, "probe", nil, tlsconf.Client, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	if s.TLS, err = (tlsconf.ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}).Build(tlsconf.Deps{}); err != nil {
		t.Fatal(err)
	}
	s.StartTLS()
	defer s.Close()
	var out, errOut bytes.Buffer
	if code := Main(context.Background(), []string{"--url", s.URL, "--ca-file", srv.CA}, "", &out, &errOut); code != 1 {
		t.Fatalf("without a client certificate: exit %d; want 1", code)
	}
	args := []string{"--url", s.URL, "--ca-file", srv.CA, "--cert-file", cli.Cert, "--key-file", cli.Key}
	if code := Main(context.Background(), args, "", &out, &errOut); code != 0 {
		t.Fatalf("with CA and certificate: exit %d (%s)", code, errOut.String())
	}
}
