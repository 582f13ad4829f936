package frontend

import (
	"bufio"
	"context"
	"io"
	"math"
	"net"
	"net/http"
	"runtime/metrics"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/scheduler"
)

// BenchmarkRouterOverhead measures what the router adds to a streaming
// request, alone (streams=1) and at 200 concurrent streams: the TTFT through the router (parse,
// classify, tokenize, hash, real admission actor, proxy) minus the TTFT
// straight to the same worker, and the router's CPU per request (process
// CPU per request through the router minus process CPU per request straight
// to the worker: the client and the worker are in the process both times).
// The worker is a minimal in-process streaming server, so the difference is
// the router's alone. Run with e.g. -benchtime=2000x.
//
// Client, router and worker share the machine's cores, so the subtraction is
// noisy; two more metrics size the noise without changing the ones above:
// rerun-spread-p50-ms is how far an identical second routed pass lands from
// the first, and sched-wait-p50/p99-ms is how long runnable goroutines
// waited for a core during the routed pass (runtime/metrics
// /sched/latencies, bucket upper bounds).
//
// streams=200 is 200 concurrent streams in steady state: the client
// goroutines start staggered over one stream's duration, as independent
// clients would, so requests arrive evenly. streams=200/lockstep starts all
// 200 at once; as every request lasts the same, they stay in step and 200
// requests reach the router within about a millisecond every half second.
// That worst case mostly measures how fast the router clears a burst on the
// machine's cores.
func BenchmarkRouterOverhead(b *testing.B) {
	b.Run("streams=1", func(b *testing.B) { benchRouterOverhead(b, 1, false) })
	b.Run("streams=200", func(b *testing.B) { benchRouterOverhead(b, 200, false) })
	b.Run("streams=200/lockstep", func(b *testing.B) { benchRouterOverhead(b, 200, true) })
}

// streamDuration is how long one benchmark stream lasts at 200 streams: 20
// tokens, 25 ms apart.
const streamDuration = 500 * time.Millisecond

func benchRouterOverhead(b *testing.B, streams int, lockstep bool) {
	// Each stream lasts about half a second (20 tokens, 25 ms apart), so 200
	// concurrent streams are a realistic load, not a CPU saturation test.
	// (A single stream runs back to back, so it measures the bare path.)
	up := newUpstream(b, 20)
	stagger := time.Duration(0)
	if streams > 1 {
		up.interval = streamDuration / 20
		if !lockstep {
			stagger = streamDuration
		}
	}
	const nWorkers = 8
	var ws staticWorkers
	var sw []scheduler.Worker
	for i := 0; i < nWorkers; i++ {
		id := "w" + string(rune('a'+i))
		ws = append(ws, WorkerEntry{ID: id, URL: up.URL(), Model: "m", BlockSize: 16})
		sw = append(sw, scheduler.Worker{ID: id, URL: up.URL(), BlockSize: 16, KVBlocks: 65536})
	}
	pol := DefaultPolicy()
	core := scheduler.NewCore(scheduler.DefaultConfig(), scheduler.RealClock{}, nil, nil)
	actor := scheduler.NewActor(core, nil, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = actor.Run(ctx) })
	actor.SetClasses(pol.Classes)
	actor.SetWorkers(sw)
	s, err := New(DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: ws, Policy: pol}, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(b, err)
	srv := newBenchServer(b, s)
	defer func() {
		srv.stop()
		cancel()
		wg.Wait()
	}()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * streams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	prompt := `{"model":"m","stream":true,"max_tokens":20,"prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 24) + `"}`

	// Warm both paths (connections, pools) outside the measurement.
	runStreams(b, client, up.URL()+"/v1/completions", prompt, 2*streams, streams, stagger)
	runStreams(b, client, srv.url+"/v1/completions", prompt, 2*streams, streams, stagger)

	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	direct := runStreams(b, client, up.URL()+"/v1/completions", prompt, b.N, streams, stagger)
	cpu1 := cpuTime()
	sched0 := schedLatencies()
	routed := runStreams(b, client, srv.url+"/v1/completions", prompt, b.N, streams, stagger)
	sched1 := schedLatencies()
	cpu2 := cpuTime()
	b.StopTimer()
	// Client, router and worker share the machine's cores (and other
	// processes may too), so the difference of two passes carries noise.
	// Two numbers bound it, outside the timed part: how long runnable
	// goroutines waited for a core during the routed pass, and how far a
	// second routed pass, identical to the first, lands from it.
	rerun := runStreams(b, client, srv.url+"/v1/completions", prompt, b.N, streams, stagger)

	p50d, p50r := percentile(direct, 0.5), percentile(routed, 0.5)
	p99d, p99r := percentile(direct, 0.99), percentile(routed, 0.99)
	b.ReportMetric(float64(p50d.Microseconds())/1000, "direct-ttft-p50-ms")
	b.ReportMetric(float64(p50r.Microseconds())/1000, "routed-ttft-p50-ms")
	b.ReportMetric(float64((p50r-p50d).Microseconds())/1000, "added-ttft-p50-ms")
	b.ReportMetric(float64((p99r-p99d).Microseconds())/1000, "added-ttft-p99-ms")
	perReq := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 / float64(b.N) }
	b.ReportMetric(perReq(cpu2-cpu1)-perReq(cpu1-cpu0), "router-cpu-ms/req")
	b.ReportMetric(float64((percentile(rerun, 0.5)-p50r).Abs().Microseconds())/1000, "rerun-spread-p50-ms")
	b.ReportMetric(schedPercentile(sched0, sched1, 0.5)*1000, "sched-wait-p50-ms")
	b.ReportMetric(schedPercentile(sched0, sched1, 0.99)*1000, "sched-wait-p99-ms")
}

// schedLatencies reads the runtime's histogram of how long goroutines stayed
// runnable before running, cumulative since the process started.
func schedLatencies() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/latencies:seconds"}}
	metrics.Read(s)
	if s[0].Value.Kind() != metrics.KindFloat64Histogram {
		return nil
	}
	return s[0].Value.Float64Histogram()
}

// schedPercentile is the q-quantile, in seconds, of the scheduling latencies
// recorded between two readings (the upper bound of the bucket holding it).
func schedPercentile(before, after *metrics.Float64Histogram, q float64) float64 {
	if before == nil || after == nil {
		return 0
	}
	var total uint64
	for i := range after.Counts {
		total += after.Counts[i] - before.Counts[i]
	}
	want := uint64(q * float64(total))
	var seen uint64
	for i := range after.Counts {
		if seen += after.Counts[i] - before.Counts[i]; seen > want {
			if math.IsInf(after.Buckets[i+1], 1) {
				return after.Buckets[i] // the open-ended last bucket: its lower bound
			}
			return after.Buckets[i+1]
		}
	}
	return 0
}

// runStreams sends n streaming requests from `streams` goroutines and
// returns each request's time to its first data event. Goroutine g starts
// g·stagger/streams late, so with stagger equal to one request's duration
// the requests arrive evenly instead of in step.
func runStreams(b *testing.B, client *http.Client, url, body string, n, streams int, stagger time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	var next sync.WaitGroup
	jobs := make(chan int)
	for g := 0; g < streams; g++ {
		next.Go(func() {
			time.Sleep(time.Duration(g) * stagger / time.Duration(streams))
			for i := range jobs {
				start := time.Now()
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					continue
				}
				br := bufio.NewReader(resp.Body)
				for {
					line, err := br.ReadString('\n')
					if strings.HasPrefix(line, "data:") {
						out[i] = time.Since(start)
						break
					}
					if err != nil {
						b.Errorf("no data event: %v", err)
						break
					}
				}
				_, _ = io.Copy(io.Discard, br)
				resp.Body.Close()
			}
		})
	}
	for i := 0; i < n; i++ {
		jobs <- i
	}
	close(jobs)
	next.Wait()
	return out
}

func percentile(ds []time.Duration, q float64) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[int(q*float64(len(s)-1))]
}

// cpuTime is the process's user + system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// benchServer serves a Server on loopback for a benchmark.
type benchServer struct {
	url  string
	stop func()
}

func newBenchServer(b *testing.B, s *Server) *benchServer {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	return &benchServer{url: "http://" + ln.Addr().String(), stop: func() { cancel(); <-done }} //nolint:errcheck // Serve's exit error is not what the benchmark measures
}
