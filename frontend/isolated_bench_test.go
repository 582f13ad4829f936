package frontend

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The isolated benchmark's child process: which target it serves, and the
// engine it serves in front of.
const (
	childTargetEnv = "SWITCHYARD_BENCH_CHILD"
	childEngineEnv = "SWITCHYARD_BENCH_ENGINE"
)

// BenchmarkReplicaThroughputIsolated is BenchmarkReplicaThroughput with the
// router and the bare proxy each in a process of its own (this test binary
// run again as TestReplicaBenchChild), as they are deployed. A target's CPU
// per request is then its own process's CPU over a pass, read with
// getrusage, instead of the difference between two passes of a process
// that also runs the clients and the engine: that difference swung from
// negative to 0.25 ms for the proxy between runs on a loaded machine. Each
// pass ends with a collection in the target, so a pass pays for its own
// garbage. Five rounds of the two passes, interleaved; the median counts.
// Run with e.g. -benchtime 3000x.
func BenchmarkReplicaThroughputIsolated(b *testing.B) {
	const clients, rounds = 32, 5
	up := newUpstream(b, 64)
	proxy := startBenchChild(b, "proxy", up.URL())
	router := startBenchChild(b, "router", up.URL())

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients, DisableCompression: true}}
	defer client.CloseIdleConnections()
	turns := nextTurns(b, []byte(chatBody(b, 4096)))
	var seq atomic.Int64
	body := func() string { return turns(int(seq.Add(1))) }
	const path = "/v1/chat/completions"
	pass := func(c *benchChild, n int) childUsage {
		u0, t0 := c.usage(b), time.Now()
		runStreams(b, client, c.url+path, body, n, clients, 0)
		u := c.usage(b).minus(u0)
		u.wall = time.Since(t0)
		return u
	}
	for _, c := range []*benchChild{proxy, router} {
		pass(c, 2*clients) // connections, pools, the tokenizer's caches
	}
	per := max(clients, b.N/rounds)
	var proxyCost, routerCost [rounds]float64
	var proxyUse, routerUse childUsage
	b.ResetTimer()
	for r := range rounds {
		p, rt := pass(proxy, per), pass(router, per)
		proxyCost[r], routerCost[r] = p.cpu.Seconds()/float64(per), rt.cpu.Seconds()/float64(per)
		proxyUse, routerUse = proxyUse.plus(p), routerUse.plus(rt)
	}
	b.StopTimer()
	n := float64(rounds * per)
	b.ReportMetric(n/proxyUse.wall.Seconds(), "proxy-wall-req/s")
	b.ReportMetric(n/routerUse.wall.Seconds(), "router-wall-req/s")
	b.ReportMetric(float64(proxyUse.syscr)/n, "proxy-syscr/req")
	b.ReportMetric(float64(proxyUse.syscw)/n, "proxy-syscw/req")
	b.ReportMetric(float64(routerUse.syscr)/n, "router-syscr/req")
	b.ReportMetric(float64(routerUse.syscw)/n, "router-syscw/req")
	b.Logf("proxy ms CPU / request by round: %s", formatMillis(proxyCost[:]))
	b.Logf("router ms CPU / request by round: %s", formatMillis(routerCost[:]))
	reportMedianCosts(b, proxyCost[:], routerCost[:])
}

func formatMillis(s []float64) string {
	parts := make([]string, len(s))
	for i, v := range s {
		parts[i] = strconv.FormatFloat(v*1e3, 'f', 3, 64)
	}
	return strings.Join(parts, " ")
}

// benchChild is a target served by a child process: url is where it
// listens; a line "cpu" on its stdin makes it collect its garbage and
// answer its process CPU in nanoseconds and its read and write system
// calls so far (0 where /proc/self/io is missing).
type benchChild struct {
	url string
	in  io.WriteCloser
	out *bufio.Scanner
}

func startBenchChild(b *testing.B, target, engine string) *benchChild {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestReplicaBenchChild$", "-test.count", "1")
	cmd.Env = append(os.Environ(), childTargetEnv+"="+target, childEngineEnv+"="+engine, "GOMAXPROCS=1")
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	require.NoError(b, err)
	out, err := cmd.StdoutPipe()
	require.NoError(b, err)
	require.NoError(b, cmd.Start())
	c := &benchChild{in: in, out: bufio.NewScanner(out)}
	var lines []string
	for c.url == "" && c.out.Scan() {
		lines = append(lines, c.out.Text())
		c.url, _ = strings.CutPrefix(c.out.Text(), "listening ")
	}
	b.Cleanup(func() {
		_ = in.Close() // the child stops when its stdin closes
		_, _ = io.Copy(io.Discard, out)
		if err := cmd.Wait(); err != nil {
			b.Errorf("the %s child: %v", target, err)
		}
	})
	require.NotEmpty(b, c.url, "the %s child did not say where it listens: %q", target, lines)
	return c
}

// childUsage is a child's process CPU and system calls (over a pass: and
// the pass's wall time).
type childUsage struct {
	cpu, wall    time.Duration
	syscr, syscw int
}

func (u childUsage) minus(v childUsage) childUsage {
	return childUsage{u.cpu - v.cpu, u.wall - v.wall, u.syscr - v.syscr, u.syscw - v.syscw}
}

func (u childUsage) plus(v childUsage) childUsage {
	return childUsage{u.cpu + v.cpu, u.wall + v.wall, u.syscr + v.syscr, u.syscw + v.syscw}
}

func (c *benchChild) usage(b *testing.B) childUsage {
	b.Helper()
	_, err := io.WriteString(c.in, "cpu\n")
	require.NoError(b, err)
	for c.out.Scan() {
		if v, ok := strings.CutPrefix(c.out.Text(), "cpu "); ok {
			var u childUsage
			var ns int64
			_, err := fmt.Sscanf(v, "%d %d %d", &ns, &u.syscr, &u.syscw)
			require.NoError(b, err, "the child's answer %q", c.out.Text())
			u.cpu = time.Duration(ns)
			return u
		}
	}
	b.Fatalf("the child stopped before it answered its CPU: %v", c.out.Err())
	return childUsage{}
}

// TestReplicaBenchChild is not a test: it is the child process of
// BenchmarkReplicaThroughputIsolated, which sets childTargetEnv. It serves
// the router or the bare proxy in front of the engine at childEngineEnv
// until its stdin closes, and answers "cpu" lines with its process CPU.
func TestReplicaBenchChild(t *testing.T) {
	target := os.Getenv(childTargetEnv)
	if target == "" {
		t.Skip("runs only as BenchmarkReplicaThroughputIsolated's child process (" + childTargetEnv + " is unset)")
	}
	engine := os.Getenv(childEngineEnv)
	var url string
	var stop func()
	switch target {
	case "router":
		url, stop = newScaleRouter(t, engine)
	case "proxy":
		url, stop = newBareProxy(t, engine)
	default:
		t.Fatalf("%s=%q: want router or proxy", childTargetEnv, target)
	}
	defer stop()
	fmt.Printf("listening %s\n", url)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		if in.Text() == "cpu" {
			runtime.GC()
			fmt.Printf("cpu %d %d %d\n", cpuTime().Nanoseconds(), syscallsRead(), syscallsWritten())
		}
	}
}
