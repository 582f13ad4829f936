package app

import (
	"context"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

// openAIServer answers /v1/models as any OpenAI-compatible server does.
func openAIServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v1/models" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"object":"list","data":[{"id":"llama3.2:3b","object":"model","owned_by":"library"}]}`))
	}))
	t.Cleanup(srv.Close)
	return srv
}

func TestAdapterCommandRegistersAnOpenAIServerFromFlagsAndEnvironment(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := openAIServer(t)
	t.Setenv("SWITCHYARD_ETCD_ENDPOINTS", strings.Join(etcd.Endpoints, ","))
	t.Setenv("SWITCHYARD_NATS_URL", n.URL)
	t.Setenv("SWITCHYARD_ID", "from-env") // the flag wins
	var stdout, stderr lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Adapter(ctx, []string{"--engine", "openai", "--engine-url", eng.URL, "--id", "ollama-1", "--cluster", "ad",
			"--listen", "127.0.0.1:0", "--lease-ttl", "2s", "--health-interval", "50ms", "--kv-blocks", "1000",
			"--log-level", "warn"}, &stdout, &stderr)
	}()
	cli := etcd.Client(t)
	var info *wire.WorkerInfo
	testenv.Eventually(t, 10*time.Second, func() bool {
		resp, err := cli.Get(context.Background(), wire.NewKeys("ad").Worker("ollama-1"))
		if err != nil || len(resp.Kvs) == 0 {
			return false
		}
		info, err = wire.DecodeWorkerInfo(resp.Kvs[0].Value)
		return err == nil
	}, "no registration; stderr: %s", stderr.String())
	assert.Equal(t, "llama3.2:3b", info.Model)
	assert.False(t, info.PublishesEvents)
	assert.Equal(t, 1000, info.KVBlocks)
	assert.Equal(t, eng.URL, info.URL)
	assert.Contains(t, stdout.String(), "adapter ollama-1 fronting openai engine")

	_, rest, ok := strings.Cut(stdout.String(), "; serving ")
	require.True(t, ok, stdout.String())
	url := strings.TrimSpace(rest)
	testenv.Eventually(t, 5*time.Second, func() bool {
		resp, err := http.Get(url + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	}, "readyz")
	// The router's own health check subcommand works against the adapter.
	require.NoError(t, Healthcheck(context.Background(), []string{"--url", url + "/readyz"}, io.Discard, io.Discard))

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("adapter did not stop")
	}
	resp, err := cli.Get(context.Background(), wire.NewKeys("ad").Worker("ollama-1"))
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "an orderly stop deregisters")
}

func TestAdapterCommandRejectsBadFlagsAsUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--engine", "tgi"},
		{"--engine-url", "localhost:8000"},
		{"--engine", "openai", "--kv-events", "tcp://127.0.0.1:5557"},
		{"--kv-replay", "tcp://127.0.0.1:5558"},
		{"--no-such-flag"},
	} {
		var stderr lockedBuffer
		err := Adapter(context.Background(), args, io.Discard, &stderr)
		assert.ErrorIsf(t, err, ErrUsage, "%v: %s", args, stderr.String())
	}
}

// TestEveryAdapterFlagIsDocumentedWithItsDefault reads the adapter section
// of docs/configuration.md: each flag must appear as `-name` with its
// default as the binary prints it.
func TestEveryAdapterFlagIsDocumentedWithItsDefault(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("..", "..", "docs", "configuration.md"))
	require.NoError(t, err)
	doc := string(raw)
	_, section, ok := strings.Cut(doc, "\n## switchyard adapter\n")
	require.True(t, ok, "docs/configuration.md has no '## switchyard adapter' section")
	if i := strings.Index(section, "\n## "); i >= 0 {
		section = section[:i]
	}
	cfg := adapter.DefaultConfig()
	fs := flag.NewFlagSet("adapter", flag.ContinueOnError)
	cfg.RegisterFlags(fs, "")
	fs.String("log-level", "info", "")
	fs.VisitAll(func(f *flag.Flag) {
		row := ""
		for _, line := range strings.Split(section, "\n") {
			if strings.HasPrefix(line, "| `-"+f.Name+"`") {
				row = line
			}
		}
		if !assert.NotEmptyf(t, row, "flag -%s is not in the adapter table", f.Name) {
			return
		}
		def := f.DefValue
		if f.Name == "etcd-endpoints" {
			def = strings.Join(cfg.EtcdEndpoints, ",")
		}
		if def == "" || def == "0" || def == "false" || def == "0s" {
			return // no default to show beyond "none"
		}
		assert.Containsf(t, row, "`"+def+"`", "the row of -%s shows its default %q", f.Name, def)
	})
}
