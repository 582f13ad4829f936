package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/internal/tlsconf"
)

// lockedBuffer is an io.Writer safe for the worker's and the test's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *lockedBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *lockedBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestWorkerCommandTakesFlagsWithEnvironmentFallbacks(t *testing.T) {
	t.Setenv("SWITCHYARD_MODEL", "env-model")
	t.Setenv("SWITCHYARD_ID", "from-env") // overridden by the flag below
	var stdout, stderr lockedBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Worker(ctx, []string{"--id", "w9", "--listen", "127.0.0.1:0", "--kv-blocks", "512", "--log-level", "warn"}, &stdout, &stderr)
	}()
	var url string
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, rest, ok := strings.Cut(stdout.String(), " at ")
		url = strings.TrimSpace(rest)
		return ok && strings.HasSuffix(rest, "\n")
	}, "the worker never reported its URL; stderr: %s", stderr.String())
	assert.Contains(t, stdout.String(), "worker w9 serving env-model")

	resp, err := http.Get(url + "/v1/models")
	require.NoError(t, err)
	var models struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&models))
	resp.Body.Close()
	require.Len(t, models.Data, 1)
	assert.Equal(t, "env-model", models.Data[0].ID)

	cancel()
	assert.NoError(t, <-done)
}

func TestWorkerCommandRejectsBadFlagsAsUsageErrors(t *testing.T) {
	ctx := testenv.Context(t)
	assert.ErrorIs(t, Worker(ctx, []string{"--no-such-flag"}, io.Discard, io.Discard), ErrUsage)
	assert.ErrorIs(t, Worker(ctx, []string{"--kv-blocks", "0"}, io.Discard, io.Discard), ErrUsage)
	assert.ErrorIs(t, Worker(ctx, []string{"--id", "bad id"}, io.Discard, io.Discard), ErrUsage)
	assert.NoError(t, Worker(ctx, []string{"-h"}, io.Discard, io.Discard), "help is not an error")
}

func TestWorkerConfigValidateNamesTheBadField(t *testing.T) {
	for field, mutate := range map[string]func(*WorkerConfig){
		"ID":               func(c *WorkerConfig) { c.ID = "" },
		"Cluster":          func(c *WorkerConfig) { c.Cluster = "a.b" },
		"Model":            func(c *WorkerConfig) { c.Model = "" },
		"LeaseTTL":         func(c *WorkerConfig) { c.LeaseTTL = time.Millisecond },
		"LoadMinInterval":  func(c *WorkerConfig) { c.LoadMinInterval = time.Hour },
		"DumpChunkBlocks":  func(c *WorkerConfig) { c.DumpChunkBlocks = 0 },
		"DefaultMaxTokens": func(c *WorkerConfig) { c.DefaultMaxTokens = 0 },
		"NumBlocks":        func(c *WorkerConfig) { c.Engine.NumBlocks = 0 },
		"AdvertiseURL":     func(c *WorkerConfig) { c.AdvertiseURL = "worker-1:9000" },
	} {
		cfg := DefaultWorkerConfig()
		mutate(&cfg)
		err := cfg.Validate()
		require.Error(t, err, field)
		assert.Contains(t, err.Error(), field)
	}
	def := DefaultWorkerConfig()
	assert.NoError(t, def.Validate())
}

func TestAWorkerServingTLSRefusesToAdvertiseAnHTTPURL(t *testing.T) {
	cfg := DefaultWorkerConfig()
	cfg.TLS = tlsconf.ServerConfig{CertFile: "c.crt", KeyFile: "c.key"}
	cfg.AdvertiseURL = "http://worker-1:9000"
	err := cfg.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not https://")
	cfg.AdvertiseURL = "https://worker-1:9000"
	assert.NoError(t, cfg.Validate())
	// TLS ended in front of a plaintext worker.
	cfg.TLS = tlsconf.ServerConfig{}
	assert.NoError(t, cfg.Validate())
}
