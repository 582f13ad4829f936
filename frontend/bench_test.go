package frontend

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"math"
	"net"
	"net/http"
	"runtime/metrics"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/prompt"
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
//
// Prompts are tokenized with a real tokenizer (o200k_base, chats rendered
// with ChatML): the 1k-token completion prompt of the earlier runs, and a
// 4k-token chat (chat=4k), the case whose router CPU per request should stay
// within 0.5 ms.
func BenchmarkRouterOverhead(b *testing.B) {
	completion := `{"model":"m","stream":true,"max_tokens":20,"prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 24) + `"}`
	chat := chatBody(b, 4096)
	b.Run("streams=1", func(b *testing.B) { benchRouterOverhead(b, 1, false, completion, "/v1/completions") })
	b.Run("streams=1/chat=4k", func(b *testing.B) { benchRouterOverhead(b, 1, false, chat, "/v1/chat/completions") })
	// The same chat never seen before (its first message differs on every
	// request of every pass), and as the next turn of a conversation the
	// router has seen (a new final user message on every request).
	b.Run("streams=1/chat=4k/fresh", func(b *testing.B) {
		benchRouterOverheadBodies(b, 1, false, freshChats(b, []byte(chat)), "/v1/chat/completions")
	})
	b.Run("streams=1/chat=4k/next-turn", func(b *testing.B) {
		benchRouterOverheadBodies(b, 1, false, nextTurns(b, []byte(chat)), "/v1/chat/completions")
	})
	b.Run("streams=200", func(b *testing.B) { benchRouterOverhead(b, 200, false, completion, "/v1/completions") })
	b.Run("streams=200/chat=4k", func(b *testing.B) { benchRouterOverhead(b, 200, false, chat, "/v1/chat/completions") })
	b.Run("streams=200/lockstep", func(b *testing.B) { benchRouterOverhead(b, 200, true, completion, "/v1/completions") })
}

// realPrompts is a prompt registry serving model "m" with o200k_base.
func realPrompts(b testing.TB) *prompt.Registry {
	cfg := prompt.DefaultConfig()
	cfg.Tokenizers = map[string]string{"m": "tiktoken:o200k_base"}
	reg, err := prompt.NewRegistry(cfg, prompt.Deps{}, zap.NewNop(), nil)
	require.NoError(b, err)
	return reg
}

// chatBody is a streaming chat request of about tokens o200k tokens: a
// system prompt and alternating turns of varied English and code.
func chatBody(b testing.TB, tokens int) string {
	m, err := prompt.OpenSpec("tiktoken:o200k_base", 0)
	require.NoError(b, err)
	sentences := []string{
		"Routers admit requests per class and pick the worker whose cache holds the longest prefix.",
		"If a worker is busy, the scheduler weighs the cached blocks against its queued prefill tokens.",
		"func (c *Core) Admit(r *Request) (Grant, error) { return c.pick(r) } // the hot path",
		"Deadlines order the queue; a request past its due time is rejected with 429 exactly once.",
		"The quick brown fox jumps over the lazy dog, twice, while 1234 tokens stream back at 25 ms each.",
	}
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	var msgs []msg
	var text strings.Builder
	for i := 0; len(m.Encode(text.String())) < tokens; i++ {
		var turn strings.Builder
		for j := range 6 {
			turn.WriteString(sentences[(i*7+j*3)%len(sentences)])
			turn.WriteString(" (")
			turn.WriteString(strconv.Itoa(i*10 + j))
			turn.WriteString(") ")
		}
		role := []string{"system", "user", "assistant"}[min(i, 1+(i+1)%2)]
		msgs = append(msgs, msg{role, turn.String()})
		text.WriteString(turn.String())
	}
	raw, err := json.Marshal(map[string]any{"model": "m", "stream": true, "max_tokens": 20, "messages": msgs})
	require.NoError(b, err)
	return string(raw)
}

// streamDuration is how long one benchmark stream lasts at 200 streams: 20
// tokens, 25 ms apart.
const streamDuration = 500 * time.Millisecond

func benchRouterOverhead(b *testing.B, streams int, lockstep bool, body, path string) {
	benchRouterOverheadBodies(b, streams, lockstep, func(int) string { return body }, path)
}

// freshChats gives request i a chat whose first message starts with its
// own number, so no two requests share a prefix.
func freshChats(b *testing.B, chat []byte) func(i int) string {
	at := bytes.Index(chat, []byte(`"content":"`))
	require.Positive(b, at, "chatBody has a first message")
	at += len(`"content":"`)
	return func(i int) string {
		return string(chat[:at]) + "Session " + strconv.Itoa(i) + ". " + string(chat[at:])
	}
}

// nextTurns gives request i the chat with a final user message of its own.
func nextTurns(b *testing.B, chat []byte) func(i int) string {
	end := bytes.LastIndex(chat, []byte(`],"model"`))
	require.Positive(b, end, "chatBody's messages are followed by its model")
	return func(i int) string {
		return string(chat[:end]) + `,{"role":"user","content":"And in turn ` + strconv.Itoa(i) + `, which worker holds the prefix?"}` + string(chat[end:])
	}
}

// benchRouterOverheadBodies is benchRouterOverhead with request i of the
// whole run (warm-up and every pass) sending bodyOf(i).
func benchRouterOverheadBodies(b *testing.B, streams int, lockstep bool, bodyOf func(i int) string, path string) {
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
	actor, stopActor := startBenchActor(pol, sw)
	s, err := New(DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: ws, Policy: pol, Prompts: realPrompts(b)}, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(b, err)
	srv := newBenchServer(b, s)
	defer func() {
		srv.stop()
		stopActor()
	}()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 2 * streams, DisableCompression: true}}
	defer client.CloseIdleConnections()
	var seq atomic.Int64
	prompt := func() string { return bodyOf(int(seq.Add(1))) }

	// Warm both paths (connections, pools) outside the measurement.
	runStreams(b, client, up.URL()+path, prompt, 2*streams, streams, stagger)
	runStreams(b, client, srv.url+path, prompt, 2*streams, streams, stagger)

	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cpuTime()
	direct := runStreams(b, client, up.URL()+path, prompt, b.N, streams, stagger)
	cpu1 := cpuTime()
	sched0 := schedLatencies()
	routed := runStreams(b, client, srv.url+path, prompt, b.N, streams, stagger)
	sched1 := schedLatencies()
	cpu2 := cpuTime()
	b.StopTimer()
	// Client, router and worker share the machine's cores (and other
	// processes may too), so the difference of two passes carries noise.
	// Two numbers bound it, outside the timed part: how long runnable
	// goroutines waited for a core during the routed pass, and how far a
	// second routed pass, identical to the first, lands from it.
	rerun := runStreams(b, client, srv.url+path, prompt, b.N, streams, stagger)

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
func runStreams(b *testing.B, client *http.Client, url string, bodyOf func() string, n, streams int, stagger time.Duration) []time.Duration {
	out := make([]time.Duration, n)
	var next sync.WaitGroup
	jobs := make(chan int)
	for g := 0; g < streams; g++ {
		next.Go(func() {
			time.Sleep(time.Duration(g) * stagger / time.Duration(streams))
			for i := range jobs {
				body := bodyOf()
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

func newBenchServer(b testing.TB, s *Server) *benchServer {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	return &benchServer{url: "http://" + ln.Addr().String(), stop: func() { cancel(); <-done }} //nolint:errcheck // Serve's exit error is not what the benchmark measures
}

// BenchmarkRequestPath is the per-request work before admission on one
// goroutine: parse, validate, tokenize and hash. The toy tokenizer on the
// 1k-token completion prompt is the baseline of earlier runs; the others
// use real tokenizers. chat=4k/tokenizer=llama3 renders Llama 3's own
// template (Jinja) and, the conversation being resent as multi-turn
// clients do, reuses its rendered prefix's ids from the incremental cache.
func BenchmarkRequestPath(b *testing.B) {
	completion := []byte(`{"model":"m","stream":true,"max_tokens":64,"prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 110) + `"}`)
	chat := []byte(chatBody(b, 4096))
	b.Run("completion=1k/tokenizer=toy", func(b *testing.B) { benchRequestPath(b, toyPrompts(b, "m"), endpointCompletions, completion) })
	b.Run("completion=1k/tokenizer=o200k", func(b *testing.B) { benchRequestPath(b, realPrompts(b), endpointCompletions, completion) })
	b.Run("chat=4k/tokenizer=o200k", func(b *testing.B) { benchRequestPath(b, realPrompts(b), endpointChat, chat) })
	llama3 := func(b *testing.B) *prompt.Registry {
		dir := testenv.Llama3Dir(b)
		cfg := prompt.DefaultConfig()
		cfg.Tokenizers = map[string]string{"m": dir}
		reg, err := prompt.NewRegistry(cfg, prompt.Deps{}, zap.NewNop(), nil)
		require.NoError(b, err)
		return reg
	}
	b.Run("chat=4k/tokenizer=llama3", func(b *testing.B) { benchRequestPath(b, llama3(b), endpointChat, chat) })
	// A chat the router has never seen: every iteration's system prompt
	// starts differently, so no cached prefix applies and no identical body
	// repeats. This is the cost of a new conversation.
	b.Run("chat=4k/fresh/tokenizer=o200k", func(b *testing.B) { benchRequestPathFresh(b, realPrompts(b), chat) })
	b.Run("chat=4k/fresh/tokenizer=llama3", func(b *testing.B) { benchRequestPathFresh(b, llama3(b), chat) })
	// A conversation's next turn: the same 4k history with a user message
	// the router has not seen yet, every iteration a different one. With
	// Llama 3 the history up to its last <|eot_id|> comes from the
	// incremental cache; o200k's ChatML markers are not special tokens, so
	// there it is encoded in full, like a fresh chat. Building each body
	// (one copy of the history) is inside the measurement.
	b.Run("chat=4k/next-turn/tokenizer=o200k", func(b *testing.B) { benchRequestPathTurns(b, realPrompts(b), chat) })
	b.Run("chat=4k/next-turn/tokenizer=llama3", func(b *testing.B) { benchRequestPathTurns(b, llama3(b), chat) })
}

func benchRequestPath(b *testing.B, prompts Prompts, ep endpoint, body []byte) {
	benchRequestBodies(b, prompts, ep, len(body), func(int) []byte { return body })
}

// benchRequestPathTurns sends chat with a new final user message each
// iteration.
func benchRequestPathTurns(b *testing.B, prompts Prompts, chat []byte) {
	end := bytes.LastIndex(chat, []byte(`],"model"`))
	require.Positive(b, end, "chatBody's messages are followed by its model")
	var buf []byte
	benchRequestBodies(b, prompts, endpointChat, len(chat), func(i int) []byte {
		buf = append(buf[:0], chat[:end]...)
		buf = append(buf, `,{"role":"user","content":"And in turn `...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, `, which worker holds the prefix?"}`...)
		return append(buf, chat[end:]...)
	})
}

// benchRequestPathFresh sends chat with a different start of its first
// message each iteration.
func benchRequestPathFresh(b *testing.B, prompts Prompts, chat []byte) {
	at := bytes.Index(chat, []byte(`"content":"`))
	require.Positive(b, at, "chatBody has a first message")
	at += len(`"content":"`)
	var buf []byte
	benchRequestBodies(b, prompts, endpointChat, len(chat), func(i int) []byte {
		buf = append(buf[:0], chat[:at]...)
		buf = append(buf, "Session "...)
		buf = strconv.AppendInt(buf, int64(i), 10)
		buf = append(buf, ". "...)
		return append(buf, chat[at:]...)
	})
}

func benchRequestBodies(b *testing.B, prompts Prompts, ep endpoint, size int, bodyOf func(i int) []byte) {
	b.ReportAllocs()
	b.SetBytes(int64(size))
	tokens := 0
	cpu0 := cpuTime()
	for i := 0; b.Loop(); i++ {
		body := bodyOf(i)
		p, apiErr := parseRequest(ep, body, http.Header{})
		if apiErr != nil {
			b.Fatal(apiErr)
		}
		res, err := prompts.Tokenize(context.Background(), "m", p.input, nil)
		if err != nil {
			b.Fatal(err)
		}
		tokens = res.IDs.Len()
		_ = res.SequenceHashes(16, kvindex.ModelSeed("m"))
	}
	// On a shared machine wall time per op includes waiting for a core;
	// process CPU per op is the router's cost.
	b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/1000/float64(b.N), "cpu-ms/op")
	b.ReportMetric(float64(tokens), "tokens/op")
}

// startBenchActor runs a real admission actor (default config, real clock,
// no log) with pol's classes over workers, until stop returns.
func startBenchActor(pol *Policy, workers []scheduler.Worker) (actor *scheduler.Actor, stop func()) {
	core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, nil)
	actor = scheduler.NewActor(core, nil, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = actor.Run(ctx) })
	actor.SetClasses(pol.Classes)
	actor.SetWorkers(workers)
	return actor, func() { cancel(); wg.Wait() }
}
