package app

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
)

func TestUpStartsALocalClusterThatServesAndStopsCleanly(t *testing.T) {
	cfg := DefaultUpConfig()
	cfg.Replicas, cfg.Workers = 2, 2
	cfg.HTTPBase, cfg.WorkerPort, cfg.EtcdPort, cfg.NATSPort = 0, 0, 0, 0
	cfg.Speedup = 50
	cfg.Status = 50 * time.Millisecond
	cfg.DataDir = t.TempDir()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- RunUp(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), pw)
		_ = pw.Close()
	}()

	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	lines := bufio.NewScanner(pr)
	var addrs []string
	sawStatus := false
	for lines.Scan() && !sawStatus {
		if m := endpoint.FindStringSubmatch(lines.Text()); m != nil {
			addrs = append(addrs, m[1])
		}
		sawStatus = strings.HasPrefix(lines.Text(), "requests ")
	}
	require.Len(t, addrs, 2, "up prints one endpoint per replica")
	require.True(t, sawStatus, "up prints a live status line")
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	for _, a := range addrs {
		resp, err := http.Get("http://" + a + "/readyz")
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "replica %s is ready", a)
		resp, err = http.Post("http://"+a+"/v1/completions", "application/json",
			strings.NewReader(`{"model":"switchyard-sim","prompt":"hello from the test","max_tokens":4}`))
		require.NoError(t, err)
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, "completion via %s: %s", a, body)
		require.Contains(t, string(body), `"completion_tokens":4`)
	}
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("up did not stop within 60s of Ctrl-C")
	}
}
