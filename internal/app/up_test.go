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
	cfg := upTestConfig(t, 2, 2)
	cfg.Status = 50 * time.Millisecond
	up := startUpRun(t, cfg)
	lines := up.lines

	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	pageAt := regexp.MustCompile(`Operators' page  (http://\S+/) `)
	var addrs []string
	page := ""
	sawStatus := false
	for lines.Scan() && !sawStatus {
		if m := endpoint.FindStringSubmatch(lines.Text()); m != nil {
			addrs = append(addrs, m[1])
		}
		if m := pageAt.FindStringSubmatch(lines.Text()); m != nil {
			page = m[1]
		}
		sawStatus = strings.HasPrefix(lines.Text(), "requests ")
	}
	require.Len(t, addrs, 2, "up prints one endpoint per replica")
	require.True(t, sawStatus, "up prints a live status line")
	require.NotEmpty(t, page, "up prints the operators' page")
	up.drain()
	resp, err := http.Get(page)
	require.NoError(t, err)
	html, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(html), "<title>Switchyard")

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
	up.stop(t)
}

// upTestConfig is the up configuration tests start from: replicas and
// workers as given, every port picked by the kernel, a fast simulation, no
// status line, a fresh data directory.
func upTestConfig(t *testing.T, replicas, workers int) UpConfig {
	cfg := DefaultUpConfig()
	cfg.Replicas, cfg.Workers = replicas, workers
	cfg.HTTPBase, cfg.WorkerPort, cfg.EtcdPort, cfg.NATSPort = 0, 0, 0, 0
	cfg.Speedup = 50
	cfg.Status = 0
	cfg.DataDir = t.TempDir()
	return cfg
}

// upRun is RunUp running in the background: lines scans what it prints.
type upRun struct {
	lines  *bufio.Scanner
	out    *io.PipeReader
	cancel context.CancelFunc
	done   chan error
}

// startUpRun starts RunUp with cfg; the caller stops it with stop.
func startUpRun(t *testing.T, cfg UpConfig) *upRun {
	t.Helper()
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	u := &upRun{lines: bufio.NewScanner(pr), out: pr, cancel: cancel, done: make(chan error, 1)}
	go func() {
		u.done <- RunUp(ctx, cfg, zaptest.NewLogger(t, zaptest.Level(zap.ErrorLevel)), pw)
		_ = pw.Close()
	}()
	return u
}

// drain discards the rest of the output, so up never blocks printing.
func (u *upRun) drain() { go func() { _, _ = io.Copy(io.Discard, u.out) }() }

// stop cancels the run (Ctrl-C) and fails the test unless RunUp returns
// nil within 60s.
func (u *upRun) stop(t *testing.T) {
	t.Helper()
	u.cancel()
	select {
	case err := <-u.done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("up did not stop within 60s of Ctrl-C")
	}
}
