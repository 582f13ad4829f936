package app

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// A vLLM-protocol engine serving HTTPS that requires client certificates,
// its adapter serving HTTPS and advertising the model's tokenizer files,
// and a router that has no tokenizer of its own for the model: with
// -http.engine-tls.* the router fetches the files from the adapter over
// HTTPS and routes to the engine over HTTPS.
func TestARouterFetchesTheTokenizerFromAnHTTPSAdapterAndServesThroughItsHTTPSEngine(t *testing.T) {
	dir := testenv.Llama3Dir(t)
	ca, err := tlsconf.NewCA("adapter-tls-test", time.Hour)
	require.NoError(t, err)
	pki := t.TempDir()
	srv, err := ca.WriteFiles(pki, "server", []string{"127.0.0.1", "localhost"}, tlsconf.Server, time.Hour)
	require.NoError(t, err)
	cli, err := ca.WriteFiles(pki, "client", nil, tlsconf.Client, time.Hour)
	require.NoError(t, err)
	withCert := tlsconf.ClientConfig{CAFile: srv.CA, CertFile: cli.Cert, KeyFile: cli.Key}

	c := newTestCluster(t, 0)
	e := startVLLMEngine(t, c, "v1", func(w *WorkerConfig) {
		w.Tokenizer = dir
		w.TLS = tlsconf.ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key, ClientCAFile: srv.CA}
	}, func(a *adapter.Config) {
		a.EngineTLS = withCert
		a.TLS = tlsconf.ServerConfig{CertFile: srv.Cert, KeyFile: srv.Key}
		a.TokenizerDir = dir
	})
	require.True(t, strings.HasPrefix(e.worker.url, "https://"), e.worker.url)
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Frontend.EngineTLS = withCert })
	c.waitOwned(defaultClasses, "r1")

	debug := func() string {
		resp, err := http.Get("http://" + r.status.HTTPAddr + "/debug/cluster")
		if err != nil {
			return ""
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	// Generous: loading Llama 3's tokenizer under the race detector on a
	// shared machine takes seconds; it ends as soon as the files are in.
	testenv.Eventually(t, 60*time.Second, func() bool {
		return strings.Contains(debug(), `"path":"fetched"`)
	}, "the router fetched the tokenizer files from the adapter over HTTPS")
	doc := debug()
	assert.Contains(t, doc, `"spec":"fetched:https://127.0.0.1:`, "from the adapter's https:// URL")
	assert.Contains(t, doc, `"url":"https://127.0.0.1:`, "the engine registered at its https:// URL")

	cl := r.client()
	resp, err := cl.Chat.Completions.New(testenv.Context(t), openai.ChatCompletionNewParams{
		Model: testModel, MaxTokens: openai.Int(4),
		Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Which track does the night train take?")},
	})
	require.NoError(t, err)
	assert.Equal(t, int64(4), resp.Usage.CompletionTokens)
	assert.Equal(t, 1.0, metricSum(t, r.status.HTTPAddr, "switchyard_router_tokenize_total", map[string]string{"model": testModel, "path": "fetched"}),
		"tokenized with the fetched files")
}
