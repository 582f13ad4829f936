package frontend

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"runtime"
	rtmetrics "runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
)

// BenchmarkReplicaThroughput is one router replica's requests per second
// per core against a bare net/http/httputil.ReverseProxy in front of the
// same engine, in the same run. Every request is a 4k-token chat (the next
// turn of one conversation, a new final message each time) tokenized with
// o200k_base, routed KV-aware over a real kvindex.Index (lookup, then the
// decision's prediction), admitted by the real actor and streamed back: 64
// tokens from an in-process engine that sends them as fast as it can.
//
// Clients, engine and proxy share the process, so a component's CPU is
// the process CPU of a pass through it minus that of the same requests sent
// straight to the engine; requests per second per core is the inverse of
// that CPU per request. The passes run interleaved in three rounds and the
// median round counts. The ratio router ÷ proxy (ratio-%) is the headline;
// the goal is at least 50%. Run with e.g. -benchtime 2000x; the machine's
// other load makes single runs swing, so compare the ratio, measured in one
// run, rather than the absolute rates.
func BenchmarkReplicaThroughput(b *testing.B) {
	benchReplicaThroughput(b, []byte(chatBody(b, 4096)))
}

// BenchmarkReplicaThroughputLines is BenchmarkReplicaThroughput with the
// chat's sentences on lines of their own: its messages hold escaped
// newlines ("\n" in the JSON), as real conversations do, where
// chatBody's have none.
func BenchmarkReplicaThroughputLines(b *testing.B) {
	chat := bytes.ReplaceAll([]byte(chatBody(b, 4096)), []byte(") "), []byte(`)\n`))
	benchReplicaThroughput(b, chat)
}

func benchReplicaThroughput(b *testing.B, chat []byte) {
	const clients = 32
	up := newUpstream(b, 64)
	router, stopRouter := newScaleRouter(b, up.URL())
	defer stopRouter()
	proxyURL, stopProxy := newBareProxy(b, up.URL())
	defer stopProxy()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients, DisableCompression: true}}
	defer client.CloseIdleConnections()
	turns := nextTurns(b, chat)
	var seq atomic.Int64
	body := func() string { return turns(int(seq.Add(1))) }
	const path = "/v1/chat/completions"

	// A pass is charged for collecting its own garbage (the GC inside the
	// timed window), so that the router's allocations are not billed to
	// the next pass.
	pass := func(base string, n int) (cpu, wall time.Duration) {
		c0, t0 := cpuTime(), time.Now()
		runStreams(b, client, base+path, body, n, clients, 0)
		runtime.GC()
		return cpuTime() - c0, time.Since(t0)
	}
	for _, base := range []string{up.URL(), proxyURL, router} {
		pass(base, 2*clients) // connections, pools, the tokenizer's caches
	}
	// Three rounds of the three passes, interleaved, so that a burst of the
	// machine's other load lands in one round; the median round is
	// reported.
	const rounds = 3
	per := max(clients, b.N/rounds)
	var proxyCost, routerCost [rounds]float64
	var proxyWall, routerWall time.Duration
	b.ResetTimer()
	for r := range rounds {
		directCPU, _ := pass(up.URL(), per)
		pCPU, pWall := pass(proxyURL, per)
		rCPU, rWall := pass(router, per)
		proxyWall += pWall
		routerWall += rWall
		perReq := func(d time.Duration) float64 { return d.Seconds() / float64(per) }
		proxyCost[r] = perReq(pCPU) - perReq(directCPU)
		routerCost[r] = perReq(rCPU) - perReq(directCPU)
	}
	b.StopTimer()
	reportMedianCosts(b, proxyCost[:], routerCost[:])
	b.ReportMetric(float64(rounds*per)/proxyWall.Seconds(), "proxy-wall-req/s")
	b.ReportMetric(float64(rounds*per)/routerWall.Seconds(), "router-wall-req/s")
}

// reportMedianCosts reports the median round's CPU per request (seconds)
// of the proxy and the router, the requests per second per core they
// stand for, and the headline ratio. It sorts both slices.
func reportMedianCosts(b *testing.B, proxyCost, routerCost []float64) {
	slices.Sort(proxyCost)
	slices.Sort(routerCost)
	pc, rc := proxyCost[len(proxyCost)/2], routerCost[len(routerCost)/2]
	b.ReportMetric(pc*1e3, "proxy-cpu-ms/req")
	b.ReportMetric(rc*1e3, "router-cpu-ms/req")
	b.ReportMetric(1/pc, "proxy-req/s/core")
	b.ReportMetric(1/rc, "router-req/s/core")
	b.ReportMetric(100*pc/rc, "ratio-%")
}

// BenchmarkReplicaStreams1000 is the CPU and memory of 1,000 concurrent
// streams through one router replica: 64 tokens 25 ms apart (1.6 s a
// stream), the clients staggered over one stream's duration so that 1,000
// are open at any time. CPU is the router's CPU per stream (routed pass
// minus direct pass) times the streams started per second, memory the Go heap and goroutine stacks in use while the
// streams are open, minus the same during the direct pass. Run with
// -benchtime 3000x (three streams per client).
func BenchmarkReplicaStreams1000(b *testing.B) {
	const streams, tokens, interval = 1000, 64, 25 * time.Millisecond
	up := newUpstream(b, tokens)
	up.interval = interval
	router, stopRouter := newScaleRouter(b, up.URL())
	defer stopRouter()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * streams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	turns := nextTurns(b, []byte(chatBody(b, 4096)))
	var seq atomic.Int64
	body := func() string { return turns(int(seq.Add(1))) }
	const path = "/v1/chat/completions"
	stagger := tokens * interval

	// pass runs n streams and samples the memory in use halfway through
	// the run (by then every client is streaming).
	pass := func(base string, n int) (cpu, wall time.Duration, mem uint64) {
		done := make(chan struct{})
		var sampled atomic.Uint64
		half := time.Duration(n/streams) * stagger / 2
		go func() {
			defer close(done)
			time.Sleep(stagger + half/2) //nolint:forbidigo // wall time on purpose: the streams run on wall time
			sampled.Store(memInUse())
		}()
		c0, t0 := cpuTime(), time.Now()
		runStreams(b, client, base+path, body, n, streams, stagger)
		cpu, wall = cpuTime()-c0, time.Since(t0)
		<-done
		return cpu, wall, sampled.Load()
	}
	pass(router, streams) // warm: connections both ways
	runtime.GC()
	b.ResetTimer()
	dCPU, _, dMem := pass(up.URL(), b.N)
	runtime.GC()
	rCPU, rWall, rMem := pass(router, b.N)
	b.StopTimer()
	// Cores at 1,000 open streams: the router's CPU per stream times the
	// streams that start per second when each lasts its nominal 1.6 s (on
	// a loaded machine the passes run slower than that, which would dilute
	// a CPU-per-wall-second figure).
	perStream := (rCPU - dCPU).Seconds() / float64(b.N)
	b.ReportMetric(perStream*streams/stagger.Seconds(), "router-cores/1k-streams")
	b.ReportMetric(perStream*1e3, "router-cpu-ms/stream")
	b.ReportMetric((float64(rMem)-float64(dMem))/(1<<20), "router-MiB/1k-streams")
	b.ReportMetric(float64(b.N)/rWall.Seconds(), "req/s")
}

// memInUse is the Go heap and goroutine stacks in use, in bytes.
func memInUse() uint64 {
	s := []rtmetrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"}}
	rtmetrics.Read(s)
	return s[0].Value.Uint64() + s[1].Value.Uint64()
}

// scaleIndex is the KV-aware port over a real kvindex.Index, as a replica
// wires it: lookups of exact and predicted entries, predictions recorded
// for every decision.
type scaleIndex struct{ ix *kvindex.Index }

func (p scaleIndex) Overlaps(dst []scheduler.Overlap, seqHashes []uint64) []scheduler.Overlap {
	for _, m := range p.ix.Lookup(seqHashes, nil) {
		dst = append(dst, scheduler.Overlap{Worker: m.Worker, Blocks: m.Blocks})
	}
	return dst
}

func (p scaleIndex) Predict(worker string, seqHashes []uint64) {
	_ = p.ix.Predict(worker, seqHashes, 10*time.Second)
}

// newScaleRouter serves a router replica on loopback in front of 8 workers
// that are all the engine at engineURL.
func newScaleRouter(b testing.TB, engineURL string) (string, func()) {
	const nWorkers = 8
	var ws staticWorkers
	var sw []scheduler.Worker
	for i := 0; i < nWorkers; i++ {
		id := "w" + strconv.Itoa(i)
		ws = append(ws, WorkerEntry{ID: id, URL: engineURL, Model: "m", BlockSize: 16})
		sw = append(sw, scheduler.Worker{ID: id, URL: engineURL, BlockSize: 16, KVBlocks: 65536})
	}
	ix, err := kvindex.New(kvindex.DefaultConfig(), clock.Real{}, nil, nil)
	require.NoError(b, err)
	pol := DefaultPolicy()
	actor, stopActor := startBenchActor(pol, sw)
	s, err := New(DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: ws, Index: scaleIndex{ix}, Policy: pol, Prompts: realPrompts(b)}, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(b, err)
	srv := newBenchServer(b, s)
	return srv.url, func() { srv.stop(); stopActor() }
}

// newBareProxy serves the baseline: the standard library's reverse proxy,
// flushing every write as a streaming proxy must.
func newBareProxy(b testing.TB, engineURL string) (string, func()) {
	target, err := url.Parse(engineURL)
	require.NoError(b, err)
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.FlushInterval = -1
	tr := &http.Transport{MaxIdleConnsPerHost: 256, DisableCompression: true}
	rp.Transport = tr
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(b, err)
	hs := &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String(), func() {
		_ = hs.Shutdown(context.Background())
		<-done
		tr.CloseIdleConnections()
	}
}

// BenchmarkReplicaOneTarget sends the requests of BenchmarkReplicaThroughput
// through one target per sub-benchmark (direct, proxy, router), so that a
// CPU profile holds one of them: compare the router's against the proxy's
// with go tool pprof -diff_base. Besides the process CPU per request it
// reports the read and write system calls per request (syscr, syscw of
// /proc/self/io; Linux only, 0 elsewhere).
func BenchmarkReplicaOneTarget(b *testing.B) {
	for _, target := range []string{"direct", "proxy", "router"} {
		b.Run(target, func(b *testing.B) {
			const clients = 32
			up := newUpstream(b, 64)
			base := up.URL()
			switch target {
			case "proxy":
				u, stop := newBareProxy(b, up.URL())
				defer stop()
				base = u
			case "router":
				u, stop := newScaleRouter(b, up.URL())
				defer stop()
				base = u
			}
			client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * clients, DisableCompression: true}}
			defer client.CloseIdleConnections()
			turns := nextTurns(b, []byte(chatBody(b, 4096)))
			var seq atomic.Int64
			body := func() string { return turns(int(seq.Add(1))) }
			url := base + "/v1/chat/completions"
			runStreams(b, client, url, body, 2*clients, clients, 0) // warm
			runtime.GC()
			b.ResetTimer()
			c0, r0, w0 := cpuTime(), syscallsRead(), syscallsWritten()
			runStreams(b, client, url, body, b.N, clients, 0)
			runtime.GC()
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(float64((cpuTime()-c0).Microseconds())/n, "cpu-us/req")
			b.ReportMetric(float64(syscallsRead()-r0)/n, "syscr/req")
			b.ReportMetric(float64(syscallsWritten()-w0)/n, "syscw/req")
		})
	}
}

func syscallsRead() int    { return procIO("syscr") }
func syscallsWritten() int { return procIO("syscw") }

// procIO is a counter of /proc/self/io (0 where there is none).
func procIO(name string) int {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ": "); ok && k == name {
			n, _ := strconv.Atoi(v)
			return n
		}
	}
	return 0
}
