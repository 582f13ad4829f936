package app

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

func TestUpWithTLSServesOverHTTPSAndRefusesClientsWithoutCredentials(t *testing.T) {
	cfg := upTestConfig(t, 2, 2)
	cfg.TLS = true
	up := startUpRun(t, cfg)
	defer up.stop(t)

	endpoint := regexp.MustCompile(`OpenAI API  https://(\S+)/v1`)
	caLine := regexp.MustCompile(`CA (\S+) \(made for this run\)`)
	upLine := regexp.MustCompile(`embedded etcd (\S+), NATS (\S+)\)`)
	lines := up.lines
	var addrs []string
	var caFile, etcdURL, natsURL string
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(lines.Text()); m != nil {
			addrs = append(addrs, m[1])
		}
		if m := caLine.FindStringSubmatch(lines.Text()); m != nil {
			caFile = m[1]
		}
		if m := upLine.FindStringSubmatch(lines.Text()); m != nil {
			etcdURL, natsURL = m[1], m[2]
		}
	}
	up.drain()
	require.Len(t, addrs, 2, "up prints one https endpoint per replica")
	require.NotEmpty(t, caFile)
	require.True(t, strings.HasPrefix(etcdURL, "https://"), etcdURL)
	require.True(t, strings.HasPrefix(natsURL, "tls://"), natsURL)

	tc, err := tlsconf.ClientConfig{CAFile: caFile}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	for _, a := range addrs {
		resp, err := client.Post("https://"+a+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"switchyard-sim","prompt":"hello over TLS","max_tokens":4}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "completion via %s: %s", a, body)
		require.Contains(t, string(body), `"completion_tokens":4`)
		require.Contains(t, resp.Header.Get("X-Switchyard-Routed-Worker"), "worker-", "routed to a worker over HTTPS")
		// Plain HTTP on the API port gets nowhere.
		resp, err = http.Get("http://" + a + "/readyz")
		if err == nil {
			resp.Body.Close()
			require.Equal(t, http.StatusBadRequest, resp.StatusCode, "net/http answers plaintext on a TLS port with 400")
		}
	}

	// The workers registered https:// URLs: the router reached them over TLS.
	resp, err := client.Get("https://" + addrs[0] + "/debug/cluster")
	require.NoError(t, err)
	doc, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var cluster struct {
		Workers []struct {
			URL string `json:"url"`
		} `json:"workers"`
	}
	require.NoError(t, json.Unmarshal(doc, &cluster), "%s", doc)
	require.Len(t, cluster.Workers, 2, "%s", doc)
	for _, w := range cluster.Workers {
		require.True(t, strings.HasPrefix(w.URL, "https://"), "worker URL %q", w.URL)
	}
	require.NotContains(t, string(doc), `"url":"http://`)
	// The operators' page reaches every peer over TLS too.
	resp, err = client.Get("https://" + addrs[0] + "/debug/tier")
	require.NoError(t, err)
	tier, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, len(addrs), strings.Count(string(tier), `"reachable":true`), "%s", tier)
	// A worker answers only clients with a certificate of the run's CA (the
	// routers'): the CA alone gets a failed handshake.
	m := regexp.MustCompile(`"url":"(https://[^"]+)"`).FindStringSubmatch(string(doc))
	require.NotNil(t, m, "%s", doc)
	if resp, err := client.Get(m[1] + "/readyz"); err == nil {
		resp.Body.Close()
		t.Fatalf("worker %s answered a client without a certificate: %s", m[1], resp.Status)
	}

	// etcd: the CA alone (no client certificate) is refused.
	ecfg, err := links.Etcd{TLS: tlsconf.ClientConfig{CAFile: caFile}}.ClientConfig([]string{etcdURL}, zap.NewNop(), tlsconf.Deps{})
	require.NoError(t, err)
	ecfg.DialTimeout = 2 * time.Second
	if ec, err := clientv3.New(ecfg); err == nil {
		pctx, pcancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = ec.Put(pctx, "/switchyard/default/intruder", "x")
		pcancel()
		_ = ec.Close()
		require.Error(t, err, "etcd accepted a client without a certificate")
	}
	// NATS: TLS verified by the CA but no client certificate: refused.
	opts, err := links.NATS{TLS: tlsconf.ClientConfig{CAFile: caFile}, User: "router", Password: "guess"}.Options(natsURL, tlsconf.Deps{})
	require.NoError(t, err)
	_, err = nats.Connect(natsURL, opts...)
	require.Error(t, err)
}

func TestUpsNATSPermissionsAreTheShippedOnes(t *testing.T) {
	t.Setenv("SWITCHYARD_NATS_ROUTER_PASSWORD", "r")
	for i := 1; i <= 8; i++ {
		t.Setenv(fmt.Sprintf("SWITCHYARD_NATS_WORKER_%d_PASSWORD", i), "w")
	}
	shipped, err := natsserver.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats", "auth.conf"))
	require.NoError(t, err)
	byName := map[string]*natsserver.Permissions{}
	for _, u := range shipped.Users {
		byName[u.Username] = u.Permissions
	}
	ours := map[string]*natsserver.Permissions{}
	for _, u := range natsUsers("r", map[string]string{"worker-1": "w", "worker-7": "w"}) {
		ours[u.Username] = u.Permissions
	}
	for _, name := range []string{"router", "worker-1", "worker-7"} {
		require.Equal(t, byName[name], ours[name], "user %s", name)
	}
}

// `switchyard up -tls -protocol vllm`: every simulated engine speaks only
// vLLM's protocol over HTTPS and requires a client certificate; its adapter
// reaches it with the run's CA and a client certificate and serves HTTPS
// itself; routers verify both. A chat completion goes through the real
// OpenAI client, and the engines refuse plaintext, a client trusting
// another CA and one without a certificate.
func TestUpWithTLSRunsVLLMEnginesAndTheirAdaptersOverHTTPS(t *testing.T) {
	cfg := upTestConfig(t, 1, 2)
	cfg.TLS = true
	cfg.Protocol = ProtocolVLLM
	ports := freePortRun(t, 6) // two engines' event and replay ports, then two adapters
	cfg.ZMQPort, cfg.AdapterPort = ports, ports+4
	up := startUpRun(t, cfg)
	defer up.stop(t)

	endpoint := regexp.MustCompile(`OpenAI API  https://(\S+)/v1`)
	caLine := regexp.MustCompile(`CA (\S+) \(made for this run\)`)
	var addr, caFile string
	for up.lines.Scan() && !strings.HasPrefix(up.lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		if m := caLine.FindStringSubmatch(up.lines.Text()); m != nil {
			caFile = m[1]
		}
	}
	up.drain()
	require.NotEmpty(t, addr, "up prints an https endpoint")
	require.NotEmpty(t, caFile)

	tc, err := tlsconf.ClientConfig{CAFile: caFile}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: tc, ForceAttemptHTTP2: true}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	cl := openai.NewClient(option.WithBaseURL("https://"+addr+"/v1"), option.WithHTTPClient(client),
		option.WithAPIKey("unused"), option.WithMaxRetries(0))
	var hr *http.Response
	chat, err := cl.Chat.Completions.New(testenv.Context(t), openai.ChatCompletionNewParams{
		Model: "switchyard-sim", MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello over TLS, through an adapter.")},
	}, option.WithResponseInto(&hr))
	require.NoError(t, err)
	require.Len(t, chat.Choices, 1)
	assert.Equal(t, int64(4), chat.Usage.CompletionTokens)
	assert.Contains(t, hr.Header.Get("X-Switchyard-Routed-Worker"), "worker-", "routed to an engine over HTTPS")

	// The adapters registered their engines' https:// URLs, which they
	// could only do by reaching each engine over verified TLS with a
	// client certificate.
	resp, err := client.Get("https://" + addr + "/debug/cluster")
	require.NoError(t, err)
	doc, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	var cd clusterDoc
	require.NoError(t, json.Unmarshal(doc, &cd))
	var engines [][]string // [_, url] per worker, as the regexp matches gave them
	for _, w := range cd.Workers {
		require.True(t, strings.HasPrefix(w.URL, "https://"), "%s", doc)
		engines = append(engines, []string{"", w.URL})
	}
	require.Len(t, engines, 2, "%s", doc)
	require.NotContains(t, string(doc), `"url":"http://`)

	// The adapters serve HTTPS (routers fetch tokenizer files there).
	for i := range 2 {
		a := fmt.Sprintf("127.0.0.1:%d", cfg.AdapterPort+i)
		resp, err := client.Get("https://" + a + "/readyz")
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "adapter %s: %s", a, body)
		if resp, err := http.Get("http://" + a + "/readyz"); err == nil {
			resp.Body.Close()
			assert.Equal(t, http.StatusBadRequest, resp.StatusCode, "plaintext on the adapter's TLS port")
		}
	}

	// What an adapter with the wrong settings meets at its engine.
	pki := filepath.Join(cfg.DataDir, "pki")
	other, err := tlsconf.NewCA("another CA", time.Hour)
	require.NoError(t, err)
	odir := t.TempDir()
	of, err := other.WriteFiles(odir, "intruder", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	get := func(c tlsconf.ClientConfig, url string) (int, error) {
		t.Helper()
		tc, err := c.Build(tlsconf.Deps{})
		require.NoError(t, err)
		tr := &http.Transport{TLSClientConfig: tc}
		defer tr.CloseIdleConnections()
		resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get(url)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	withCert := tlsconf.ClientConfig{CAFile: caFile, CertFile: filepath.Join(pki, "worker-client.crt"), KeyFile: filepath.Join(pki, "worker-client.key")}
	for _, e := range engines {
		health := e[1] + "/health"
		code, err := get(withCert, health)
		require.NoError(t, err, "the adapters' own settings")
		require.Equal(t, http.StatusOK, code)

		code, err = get(tlsconf.ClientConfig{}, "http://"+strings.TrimPrefix(health, "https://"))
		if err == nil {
			assert.Equal(t, http.StatusBadRequest, code, "plaintext to %s", health)
		}
		_, err = get(tlsconf.ClientConfig{CAFile: of.CA, CertFile: withCert.CertFile, KeyFile: withCert.KeyFile}, health)
		var unknown x509.UnknownAuthorityError
		assert.ErrorAs(t, err, &unknown, "a client trusting another CA refuses %s", health)
		_, err = get(tlsconf.ClientConfig{CAFile: caFile}, health)
		assert.Error(t, err, "%s requires a client certificate", health)
		_, err = get(tlsconf.ClientConfig{CAFile: caFile, CertFile: of.Cert, KeyFile: of.Key}, health)
		assert.Error(t, err, "%s refuses a client certificate of another CA", health)
	}
}

// `up -tls -protocol vllm -dp-size 2`: each engine's API server and its
// ranks serve HTTPS and require a client certificate; every rank's
// adapter registers the API server's https:// URL with its own NATS
// user, and requests through the router land on ranks and their KV
// events reach the index.
func TestUpWithTLSRunsDataParallelEnginesOverHTTPS(t *testing.T) {
	cfg := upTestConfig(t, 1, 2)
	cfg.TLS = true
	cfg.Protocol = ProtocolVLLM
	cfg.DPSize = 2
	ports := freePortRun(t, 12) // 2 engines × 2 ranks × (event, replay), then 4 adapters
	cfg.ZMQPort, cfg.AdapterPort = ports, ports+8
	up := startUpRun(t, cfg)
	defer up.stop(t)

	endpoint := regexp.MustCompile(`OpenAI API  https://(\S+)/v1`)
	caLine := regexp.MustCompile(`CA (\S+) \(made for this run\)`)
	var addr, caFile string
	for up.lines.Scan() && !strings.HasPrefix(up.lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		if m := caLine.FindStringSubmatch(up.lines.Text()); m != nil {
			caFile = m[1]
		}
	}
	up.drain()
	require.NotEmpty(t, addr, "up prints an https endpoint")
	require.NotEmpty(t, caFile)
	tc, err := tlsconf.ClientConfig{CAFile: caFile}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	tr := &http.Transport{TLSClientConfig: tc}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}

	var doc clusterDoc
	testenv.Eventually(t, 20*time.Second, func() bool {
		resp, err := client.Get("https://" + addr + "/debug/cluster")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		doc = clusterDoc{}
		return json.NewDecoder(resp.Body).Decode(&doc) == nil && len(doc.Workers) == 4
	}, "four ranks registered")
	require.Len(t, doc.Engines, 2)
	for _, e := range doc.Engines {
		assert.True(t, strings.HasPrefix(e.URL, "https://"), "engine %s at %s", e.ID, e.URL)
		assert.Len(t, e.Ranks, 2)
	}

	cl := openai.NewClient(option.WithBaseURL("https://"+addr+"/v1"), option.WithHTTPClient(client),
		option.WithAPIKey("unused"), option.WithMaxRetries(0))
	routed := map[string]bool{}
	for _, w := range []string{"worker-1-dp0", "worker-1-dp1", "worker-2-dp0", "worker-2-dp1"} {
		var hr *http.Response
		chat, err := cl.Chat.Completions.New(testenv.Context(t), openai.ChatCompletionNewParams{
			Model: "switchyard-sim", MaxTokens: openai.Int(3),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Hello over TLS, to one rank.")},
		}, option.WithHeader("x-switchyard-worker", w), option.WithResponseInto(&hr))
		require.NoError(t, err, "pinned to %s", w)
		assert.EqualValues(t, 3, chat.Usage.CompletionTokens)
		assert.Equal(t, w, hr.Header.Get("X-Switchyard-Routed-Worker"))
		routed[w] = true
	}
	// Each rank's adapter publishes its rank's events under its own NATS user.
	testenv.Eventually(t, 20*time.Second, func() bool {
		resp, err := client.Get("https://" + addr + "/debug/cluster")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		doc = clusterDoc{}
		if json.NewDecoder(resp.Body).Decode(&doc) != nil {
			return false
		}
		for _, w := range doc.Workers {
			if routed[w.ID] && w.Indexed == 0 {
				return false
			}
		}
		return len(doc.Workers) == 4
	}, "every rank's blocks indexed")

	// The API server requires a client certificate, as a single engine does.
	if resp, err := client.Get(doc.Engines[0].URL + "/health"); err == nil {
		resp.Body.Close()
		t.Fatal("the API server served a client without a certificate")
	}
	pki := filepath.Join(cfg.DataDir, "pki")
	wc, err := tlsconf.ClientConfig{CAFile: caFile, CertFile: filepath.Join(pki, "worker-client.crt"), KeyFile: filepath.Join(pki, "worker-client.key")}.Build(tlsconf.Deps{})
	require.NoError(t, err)
	wtr := &http.Transport{TLSClientConfig: wc}
	defer wtr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: wtr, Timeout: 10 * time.Second}).Get(doc.Engines[0].URL + "/health")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, http.StatusOK, resp.StatusCode)
}
