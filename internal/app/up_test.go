package app

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"go.uber.org/zap/zaptest/observer"

	"github.com/switchyard/switchyard/tenant"
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

func TestUpWithAKeysFileAnswers401And403And429AsTheReadmeSays(t *testing.T) {
	const key = "sk-up-test-0123456789abcdef0123456789abcdef"
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	require.NoError(t, os.WriteFile(keys, []byte(`tenants:
  - id: demo
    keys: [`+tenant.HashKey(key)+`]
    models: [switchyard-sim]
    quota: {requests_per_minute: 2}
`), 0o600))
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- Up(ctx, []string{"-auth.keys-file", keys, "-replicas", "1", "-workers", "1", "-port", "0",
			"-worker-port", "0", "-etcd-port", "0", "-nats-port", "0", "-speedup", "50", "-status-interval", "0",
			"-data-dir", t.TempDir()}, pw, io.Discard)
		_ = pw.Close()
	}()
	lines := bufio.NewScanner(pr)
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	var addr string
	sawKeys := false
	for addr == "" || !sawKeys {
		require.True(t, lines.Scan(), "up ended before printing its endpoint and keys file")
		if m := endpoint.FindStringSubmatch(lines.Text()); m != nil {
			addr = m[1]
		}
		sawKeys = sawKeys || strings.Contains(lines.Text(), "API keys from "+keys)
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()

	call := func(bearer, model string) (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions",
			strings.NewReader(`{"model":"`+model+`","prompt":"hello","max_tokens":2}`))
		require.NoError(t, err)
		req.Header.Set("content-type", "application/json")
		if bearer != "" {
			req.Header.Set("authorization", "Bearer "+bearer)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}
	code, body := call("", "switchyard-sim")
	require.Equal(t, http.StatusUnauthorized, code, body)
	code, body = call(key, "another-model")
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "model_not_allowed")
	for i := 0; i < 2; i++ {
		code, body = call(key, "switchyard-sim")
		require.Equal(t, http.StatusOK, code, body)
	}
	code, body = call(key, "switchyard-sim")
	require.Equal(t, http.StatusTooManyRequests, code, body)
	require.Contains(t, body, "quota_exceeded")

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("up did not stop within 60s of Ctrl-C")
	}
}

func TestUpRefusesAnInvalidKeysFileBeforeStarting(t *testing.T) {
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	require.NoError(t, os.WriteFile(keys, []byte("tenants:\n  - id: demo\n    keys: [not-a-hash]\n"), 0o600))
	var stderr strings.Builder
	err := Up(context.Background(), []string{"-auth.keys-file", keys}, io.Discard, &stderr)
	require.ErrorIs(t, err, ErrUsage)
	require.Contains(t, stderr.String(), "up: -auth.keys-file "+keys)
}

func TestTheStatusLineFitsAnEightyColumnTerminalAndIsOneLinePerIntervalElsewhere(t *testing.T) {
	line := "requests 1234567  admitted 1234000  rejected 567  queued 12  in flight 345  indexed blocks 987654  DEGRADED 1"
	require.Greater(t, len(line), 80)

	narrow := formatStatusLine(line, 80)
	require.True(t, strings.HasPrefix(narrow, "\r"), "a terminal's line is rewritten in place")
	require.NotContains(t, narrow, "\n")
	require.Len(t, narrow, 1+79, "79 columns: the cursor never reaches the last one, so nothing wraps")
	require.Equal(t, line[:79], narrow[1:])

	wide := formatStatusLine(line, 200)
	require.True(t, strings.HasPrefix(wide, "\r"+line), "a wide terminal shows the whole line")
	require.Len(t, wide, 1+199, "padded to erase a longer previous line")
	require.Empty(t, strings.TrimSpace(wide[1+len(line):]))

	require.Equal(t, line+"\n", formatStatusLine(line, 0), "not a terminal: one line per interval")
}

func TestAStoppedUpLeavesGossipCleanlyWithNothingAlarmingLogged(t *testing.T) {
	core, logs := observer.New(zap.WarnLevel)
	cfg := upTestConfig(t, 3, 1)
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunUp(ctx, cfg, zap.New(core), pw); _ = pw.Close() }()
	lines := bufio.NewScanner(pr)
	for lines.Scan() && !strings.HasPrefix(lines.Text(), "Ctrl-C") {
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(60 * time.Second):
		t.Fatal("up did not stop within 60s of Ctrl-C")
	}
	for _, e := range logs.All() {
		require.NotContains(t, e.Message, "did not leave cleanly", "a normal stop: %v", e.ContextMap())
	}
}

func TestUpNamesABusyPortAndWhatItWantedItFor(t *testing.T) {
	// Hold a port whose neighbour below is free, so that router-1's API
	// passes and router-2's is the busy one: an ephemeral port's neighbour
	// may belong to another test's connection (tests in other packages run
	// at the same time).
	var l net.Listener
	for range 20 {
		held, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		below, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", held.Addr().(*net.TCPAddr).Port-1))
		if err == nil {
			require.NoError(t, below.Close())
			l = held
			break
		}
		require.NoError(t, held.Close())
	}
	require.NotNil(t, l, "no loopback port with a free neighbour in 20 tries")
	defer l.Close()
	cfg := upTestConfig(t, 2, 1)
	cfg.HTTPBase = l.Addr().(*net.TCPAddr).Port - 1
	err := waitUpPorts(context.Background(), cfg, 0, io.Discard)
	require.Error(t, err)
	require.Contains(t, err.Error(), fmt.Sprintf("port %d (router-2's API) on 127.0.0.1 is in use", cfg.HTTPBase+1))
	comm, rerr := os.ReadFile("/proc/self/comm")
	if rerr == nil { // Linux: the holder is named
		require.Contains(t, err.Error(), fmt.Sprintf("held by %s (pid %d)", strings.TrimSpace(string(comm)), os.Getpid()))
	}
}

func TestUpWaitsForAPortThatAStoppingUpReleases(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	cfg := upTestConfig(t, 1, 1)
	cfg.HTTPBase = l.Addr().(*net.TCPAddr).Port
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- waitUpPorts(context.Background(), cfg, time.Hour, pw); _ = pw.Close() }()
	said := bufio.NewScanner(pr)
	require.True(t, said.Scan())
	require.Contains(t, said.Text(), "router-1's API) is in use; waiting")
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	require.NoError(t, l.Close())
	require.NoError(t, <-done)
}

func TestVLLMModesAdapterAndZeroMQPortsFollowTheWorkerPortAndAreInTheBanner(t *testing.T) {
	fs, resolve := upFlags()
	require.NoError(t, fs.Parse([]string{"-protocol", "vllm", "-worker-port", "19001", "-workers", "4"}))
	cfg, _, err := resolve()
	require.NoError(t, err)
	require.Equal(t, 19101, cfg.AdapterPort)
	require.Equal(t, 19201, cfg.ZMQPort)
	require.Equal(t, "  workers speak vLLM's protocol: engines on 127.0.0.1:19001-19004, their ZeroMQ KV events and replay on 127.0.0.1:19201-19208 (in pairs),\n"+
		"  each joined by a switchyard adapter (/metrics, /readyz) on 127.0.0.1:19101-19104\n", vllmBanner(cfg))

	fs, resolve = upFlags()
	require.NoError(t, fs.Parse([]string{"-protocol", "vllm", "-worker-port", "19001", "-adapter-port", "7000", "-zmq-port", "7100"}))
	cfg, _, err = resolve()
	require.NoError(t, err)
	require.Equal(t, []int{7000, 7100}, []int{cfg.AdapterPort, cfg.ZMQPort}, "given ports are kept")

	fs, resolve = upFlags()
	require.NoError(t, fs.Parse(nil))
	cfg, _, err = resolve()
	require.NoError(t, err)
	require.Equal(t, []int{9101, 9201}, []int{cfg.AdapterPort, cfg.ZMQPort}, "the defaults sit beside the default workers")
}

func TestUpRefusesVLLMPortsThatOverlap(t *testing.T) {
	var stderr strings.Builder
	err := Up(context.Background(), []string{"-protocol", "vllm", "-workers", "150"}, io.Discard, &stderr)
	require.ErrorIs(t, err, ErrUsage)
	require.Contains(t, stderr.String(), "ports overlap: set -adapter-port and -zmq-port")
}

func TestUpNamesEachFixedPortsUse(t *testing.T) {
	cfg := DefaultUpConfig()
	ports := upPorts(cfg)
	require.Len(t, ports, upPortCount(cfg))
	require.Equal(t, "embedded etcd's client port", ports[12379])
	require.Equal(t, "embedded etcd's peer port", ports[12380])
	require.Equal(t, "embedded NATS", ports[14222])
	require.Equal(t, "router-3's API", ports[8082])
	require.Equal(t, "worker-8's API", ports[9008])
}

func TestUpWithNoWorkersFrontsOnlyEnginesThatJoinLater(t *testing.T) {
	cfg := upTestConfig(t, 1, 0)
	up := startUpRun(t, cfg)
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	addr := ""
	sawNone := false
	for up.lines.Scan() {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		sawNone = sawNone || strings.Contains(up.lines.Text(), "no simulated workers")
		if strings.HasPrefix(up.lines.Text(), "Ctrl-C") {
			break
		}
	}
	up.drain()
	require.NotEmpty(t, addr, "up starts its replica")
	require.True(t, sawNone, "up says how engines join")
	resp, err := http.Get("http://" + addr + "/v1/models")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, `{"object":"list","data":[]}`, string(body), "no engine yet")
	up.stop(t)
}
