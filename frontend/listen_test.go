package frontend

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// testPKI is a throwaway CA with a server certificate for 127.0.0.1.
type testPKI struct {
	ca  *tlsconf.CA
	srv tlsconf.Files
	dir string
}

func newTestPKI(t *testing.T) testPKI {
	t.Helper()
	ca, err := tlsconf.NewCA("test-ca", time.Hour)
	require.NoError(t, err)
	dir := t.TempDir()
	f, err := ca.WriteFiles(dir, "server", []string{"127.0.0.1"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	return testPKI{ca: ca, srv: f, dir: dir}
}

// httpsClient trusts the PKI's CA (HTTP/2 when the server offers it).
func (p testPKI) httpsClient(t *testing.T) *http.Client {
	t.Helper()
	c, err := tlsconf.ClientConfig{CAFile: p.srv.CA}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: c, ForceAttemptHTTP2: true}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func streamThrough(t *testing.T, client *http.Client, url string) (string, string) {
	t.Helper()
	resp, err := client.Post(url, "application/json", strings.NewReader(streamBody("m")))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode, string(b))
	return string(b), resp.Proto
}

func TestAStreamLongerThanTheReadAndWriteTimeoutsArrivesWholeOverPlainHTTPAndTLS(t *testing.T) {
	pki := newTestPKI(t)
	for _, secure := range []bool{false, true} {
		name := map[bool]string{false: "plaintext HTTP/1.1", true: "TLS with HTTP/2"}[secure]
		t.Run(name, func(t *testing.T) {
			up := newUpstream(t, 16)
			up.interval = 250 * time.Millisecond // 3.75 s of stream
			ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
			cfg := DefaultConfig()
			// Well under the stream's length, but not so short that a
			// loaded machine (the -race suite on 2 cores) misses reading
			// the request or making one write in time: 300 ms broke a
			// write under HTTP/2 there.
			cfg.WriteTimeout, cfg.ReadTimeout = time.Second, 1500*time.Millisecond
			client, scheme := http.DefaultClient, "http://"
			if secure {
				cfg.TLS = tlsconf.ServerConfig{CertFile: pki.srv.Cert, KeyFile: pki.srv.Key}
				client, scheme = pki.httpsClient(t), "https://"
			}
			s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
			base := scheme + strings.TrimPrefix(startServer(t, s), "http://")
			body, proto := streamThrough(t, client, base+"/v1/completions")
			require.Equal(t, 18, strings.Count(body, "data: "), "16 tokens, usage and [DONE]: %q", body)
			require.Contains(t, body, "data: [DONE]")
			if secure {
				require.Equal(t, "HTTP/2.0", proto)
			}
		})
	}
}

func TestAClientThatStopsReadingAStreamIsCutAfterTheWriteTimeout(t *testing.T) {
	up := newUpstream(t, 200000) // ~18 MB of stream: more than every socket buffer on the way holds
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	cfg := DefaultConfig()
	cfg.WriteTimeout = 100 * time.Millisecond
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)
	// A raw client with a tiny receive buffer that sends the request and
	// never reads: the router's writes block once the socket buffers fill.
	conn, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	defer conn.Close()
	require.NoError(t, conn.(*net.TCPConn).SetReadBuffer(4096))
	body := streamBody("m")
	_, err = io.WriteString(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+
		strconv.Itoa(len(body))+"\r\n\r\n"+body)
	require.NoError(t, err)
	testenv.Eventually(t, 20*time.Second, func() bool {
		tk := rec.ticket(0)
		return tk != nil && tk.finished.Load() == 1
	}, "the stalled stream is cut")
	require.True(t, rec.ticket(0).aborted.Load(), "the stream ended as aborted, not completed")
}

func TestHeadersOverTheLimitAreRefusedWith431(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxHeaderBytes = 1024
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(&grantRecorder{}), Workers: staticWorkers{}})
	base := startServer(t, s)
	req, err := http.NewRequest(http.MethodGet, base+"/healthz", nil)
	require.NoError(t, err)
	req.Header.Set("X-Big", strings.Repeat("a", 8<<10))
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
	req.Header.Del("X-Big")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode)
}

func TestTheAPIListenerServesAtMostMaxConnsConnectionsAtOnce(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxConns = 1
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(&grantRecorder{}), Workers: staticWorkers{}})
	base := startServer(t, s)
	hold, err := net.Dial("tcp", strings.TrimPrefix(base, "http://"))
	require.NoError(t, err)
	_, err = io.WriteString(hold, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	buf := make([]byte, 64)
	_, err = hold.Read(buf) // served: the one connection is taken and kept alive
	require.NoError(t, err)

	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/healthz", nil)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err == nil {
		resp.Body.Close()
	}
	require.Error(t, err, "a second connection is not served while the first is open")

	require.NoError(t, hold.Close())
	resp, err = (&http.Client{Transport: tr}).Get(base + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, 200, resp.StatusCode, "served once the first connection closed")
}

func TestTheAdminListenerTakesMetricsAndDebugOffTheAPIListener(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AdminAddr = "127.0.0.1:0"
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(&grantRecorder{}), Workers: staticWorkers{},
		MetricsHandler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics\n") }),
		ClusterInfo:    func(context.Context) (json.RawMessage, error) { return json.RawMessage(`{}`), nil },
	})
	api := startServer(t, s)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeAdmin(ctx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	admin := "http://" + ln.Addr().String()

	get := func(url string) int {
		resp, err := http.Get(url)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	require.Equal(t, 404, get(api+"/metrics"))
	require.Equal(t, 404, get(api+"/debug/cluster"))
	require.Equal(t, 200, get(api+"/healthz"))
	require.Equal(t, 200, get(admin+"/metrics"))
	require.Equal(t, 200, get(admin+"/debug/cluster"))
	require.Equal(t, 200, get(admin+"/readyz"))
	require.Equal(t, 404, get(admin+"/v1/models"), "the API is not on the admin listener")
}

func TestEnginesOverHTTPSAreVerifiedWithTheCABundleAndSeeTheClientCertificate(t *testing.T) {
	pki := newTestPKI(t)
	up := &upstream{tokens: 3}
	var sawCN string
	up.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
			sawCN = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		up.serve(w, r)
	}))
	engTLS, err := tlsconf.ServerConfig{CertFile: pki.srv.Cert, KeyFile: pki.srv.Key, ClientCAFile: pki.srv.CA,
		ClientAuth: tlsconf.ClientAuthVerifyIfGiven}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	up.srv.TLS = engTLS
	up.srv.StartTLS()
	t.Cleanup(up.srv.Close)
	ws := staticWorkers{{ID: "w1", URL: up.srv.URL, Model: "m", BlockSize: 16}}
	require.True(t, strings.HasPrefix(up.srv.URL, "https://"))

	// Without the CA the router does not trust the engine: the request fails.
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", streamBody("m"), nil)
	require.NotEqual(t, 200, status, body)
	require.Zero(t, up.requests.Load())

	cli, err := pki.ca.WriteFiles(pki.dir, "router-1", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	cfg := DefaultConfig()
	cfg.EngineTLS = tlsconf.ClientConfig{CAFile: cli.CA, CertFile: cli.Cert, KeyFile: cli.Key}
	s2, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	status, _, body = post(t, startServer(t, s2)+"/v1/completions", streamBody("m"), nil)
	require.Equal(t, 200, status, body)
	require.Contains(t, body, "data: [DONE]")
	require.Equal(t, "router-1", sawCN)
}
