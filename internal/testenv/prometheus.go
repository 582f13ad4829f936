package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ErrNoSamples is returned by Prometheus.Query when the query matched no
// series (an empty instant vector), e.g. before the first scrape.
var ErrNoSamples = errors.New("testenv: prometheus query returned no samples")

// Prometheus is a real Prometheus server (the `prometheus` binary, Debian
// package `prometheus`) scraping the given targets, for integration tests that
// check what a deployment's dashboards and rules would see.
type Prometheus struct {
	// URL is the server's base URL, e.g. http://127.0.0.1:41234.
	URL    string
	client *http.Client
}

// StartPrometheus runs the prometheus binary on a free loopback port with a
// temporary config and data directory, scraping targets at /metrics every
// scrapeInterval, and waits until it is ready. targets are host:port pairs;
// a URL (e.g. an httptest.Server's URL) is reduced to its host:port. The test
// is skipped when the binary is not on PATH. The server is stopped, and its
// log printed if the test failed, when the test ends.
func StartPrometheus(t testing.TB, targets []string, scrapeInterval time.Duration) *Prometheus {
	t.Helper()
	return StartPrometheusJobs(t, []PrometheusJob{{Name: "testenv", Targets: targets}}, nil, scrapeInterval)
}

// PrometheusJob is one scrape job: its name (the job label), targets, and
// the bearer token it presents (empty: none), e.g. a router's admin key.
type PrometheusJob struct {
	Name        string
	Targets     []string
	BearerToken string
}

// StartPrometheusJobs is StartPrometheus with named jobs (rules that select
// on job, like deploy/prometheus/rules.yml's down alerts, need the real
// names) and rule files (absolute paths), evaluated every scrapeInterval.
func StartPrometheusJobs(t testing.TB, jobs []PrometheusJob, ruleFiles []string, scrapeInterval time.Duration) *Prometheus {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus binary not on PATH (Debian: apt-get install prometheus); skipping the Prometheus integration test")
	}
	if scrapeInterval <= 0 {
		t.Fatalf("StartPrometheus: scrapeInterval must be positive, got %v", scrapeInterval)
	}
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(prometheusConfig(t, jobs, ruleFiles, scrapeInterval)), 0o644); err != nil {
		t.Fatalf("write prometheus config: %v", err)
	}
	logPath := filepath.Join(dir, "prometheus.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatalf("create prometheus log: %v", err)
	}
	addr := "127.0.0.1:" + strconv.Itoa(FreePort(t))
	cmd := exec.Command(bin,
		"--config.file="+cfgPath,
		"--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
	// A file, not a pipe: exec then starts no copying goroutines.
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		t.Fatalf("start prometheus: %v", err)
	}
	exited := make(chan error, 1) // size one: the waiter never blocks, even if nobody reads
	go func() { exited <- cmd.Wait() }()

	transport := &http.Transport{}
	p := &Prometheus{URL: "http://" + addr, client: &http.Client{Transport: transport, Timeout: 10 * time.Second}}
	t.Cleanup(func() {
		transport.CloseIdleConnections()
		_ = cmd.Process.Signal(os.Interrupt)
		select {
		case <-exited: //nolint:errcheck // the exit status after SIGINT is not interesting
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited //nolint:errcheck // killed: its exit status is not interesting
		}
		_ = logFile.Close()
		if t.Failed() {
			if b, err := os.ReadFile(logPath); err == nil {
				t.Logf("prometheus log:\n%s", b)
			}
		}
	})

	deadline := time.Now().Add(30 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err // let the cleanup see the exit too
			b, _ := os.ReadFile(logPath)
			t.Fatalf("prometheus exited before becoming ready: %v\n%s", err, b)
		default:
		}
		if p.ready() {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("prometheus not ready on %s within 30s", addr)
		}
		time.Sleep(20 * time.Millisecond) // polling an observable state (/-/ready)
	}
}

func prometheusConfig(t testing.TB, jobs []PrometheusJob, ruleFiles []string, interval time.Duration) string {
	t.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "global:\n  scrape_interval: %s\n  scrape_timeout: %s\n  evaluation_interval: %s\n",
		promDuration(interval), promDuration(interval), promDuration(interval))
	if len(ruleFiles) > 0 {
		b.WriteString("rule_files:\n")
		for _, f := range ruleFiles {
			fmt.Fprintf(&b, "  - %q\n", f)
		}
	}
	b.WriteString("scrape_configs:\n")
	for _, job := range jobs {
		fmt.Fprintf(&b, "  - job_name: %q\n    metrics_path: /metrics\n", job.Name)
		if job.BearerToken != "" {
			fmt.Fprintf(&b, "    authorization:\n      credentials: %q\n", job.BearerToken)
		}
		b.WriteString("    static_configs:\n      - targets:\n")
		for _, target := range job.Targets {
			if strings.Contains(target, "://") {
				u, err := url.Parse(target)
				if err != nil {
					t.Fatalf("StartPrometheus: target %q: %v", target, err)
				}
				target = u.Host
			}
			fmt.Fprintf(&b, "          - %q\n", target)
		}
	}
	return b.String()
}

// promDuration renders d in Prometheus' duration syntax (milliseconds are
// its finest unit).
func promDuration(d time.Duration) string {
	ms := d.Milliseconds()
	if ms < 1 {
		ms = 1
	}
	return strconv.FormatInt(ms, 10) + "ms"
}

func (p *Prometheus) ready() bool {
	resp, err := p.client.Get(p.URL + "/-/ready")
	if err != nil {
		return false
	}
	_ = resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// Query runs an instant query and returns its value: a scalar as is, an
// instant vector as the sum of its samples. An empty vector returns
// ErrNoSamples; other result types and API errors return an error.
func (p *Prometheus) Query(ctx context.Context, promql string) (float64, error) {
	u := p.URL + "/api/v1/query?" + url.Values{"query": {promql}}.Encode()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return 0, fmt.Errorf("query %q: %w", promql, err)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("query %q: %w", promql, err)
	}
	defer resp.Body.Close()
	var body struct {
		Status    string `json:"status"`
		ErrorType string `json:"errorType"`
		Error     string `json:"error"`
		Data      struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return 0, fmt.Errorf("query %q: decode response (HTTP %d): %w", promql, resp.StatusCode, err)
	}
	if body.Status != "success" {
		return 0, fmt.Errorf("query %q: %s: %s", promql, body.ErrorType, body.Error)
	}
	switch body.Data.ResultType {
	case "scalar":
		var sample [2]any
		if err := json.Unmarshal(body.Data.Result, &sample); err != nil {
			return 0, fmt.Errorf("query %q: decode scalar: %w", promql, err)
		}
		return sampleValue(promql, sample)
	case "vector":
		var vec []struct {
			Value [2]any `json:"value"`
		}
		if err := json.Unmarshal(body.Data.Result, &vec); err != nil {
			return 0, fmt.Errorf("query %q: decode vector: %w", promql, err)
		}
		if len(vec) == 0 {
			return 0, fmt.Errorf("query %q: %w", promql, ErrNoSamples)
		}
		sum := 0.0
		for _, s := range vec {
			v, err := sampleValue(promql, s.Value)
			if err != nil {
				return 0, err
			}
			sum += v
		}
		return sum, nil
	default:
		return 0, fmt.Errorf("query %q: result type %q is not a scalar or instant vector", promql, body.Data.ResultType)
	}
}

// sampleValue decodes a [timestamp, "value"] pair; Prometheus sends values
// as strings so NaN and ±Inf survive JSON.
func sampleValue(promql string, s [2]any) (float64, error) {
	str, ok := s[1].(string)
	if !ok {
		return 0, fmt.Errorf("query %q: sample value %v is not a string", promql, s[1])
	}
	v, err := strconv.ParseFloat(str, 64)
	if err != nil {
		return 0, fmt.Errorf("query %q: sample value: %w", promql, err)
	}
	return v, nil
}
