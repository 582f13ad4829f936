package app

// Disaggregated prefill and decode end to end with SGLang's protocol: a
// real replica over real simulated workers (prefill, decode, both), real
// NATS, etcd and HTTP, and the official OpenAI Go client. The router sends
// the same body to the prefill and the decode server at once, with the
// prefill server's bootstrap_host and bootstrap_port and one
// bootstrap_room; the decode server waits on the prefill's bootstrap port
// for that room, and only its answer reaches the client.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// sglangWorker makes a worker an SGLang prefill or decode server; a
// prefill's bootstrap server binds a free port, which it registers.
func sglangWorker(role string) func(*WorkerConfig) {
	return func(cfg *WorkerConfig) {
		cfg.PD.Role = role
		cfg.PD.KVTransfer = wire.TransferSGLang
		cfg.PD.PullTimeout = 10 * time.Second
		if role == wire.RolePrefill {
			cfg.PD.BootstrapListen = "127.0.0.1:0"
		}
	}
}

// legRecorder is an HTTP front for a worker: it proxies to the worker
// (streams flushed as they come) and keeps the bodies of the generation
// requests it forwarded. close makes the worker unreachable to the router
// while its registration stays: connections are refused.
type legRecorder struct {
	srv    *httptest.Server
	target atomic.Value // string: the worker's own URL
	mu     sync.Mutex
	bodies [][]byte
}

// frontedWorker starts worker id behind a legRecorder, registered with the
// front's URL.
func (c *testCluster) frontedWorker(id string, mutate func(*WorkerConfig)) (*runningWorker, *legRecorder) {
	f := &legRecorder{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "completions") {
			b, err := io.ReadAll(r.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			f.mu.Lock()
			f.bodies = append(f.bodies, b)
			f.mu.Unlock()
			r.Body = io.NopCloser(bytes.NewReader(b))
		}
		u, _ := url.Parse(f.target.Load().(string))
		p := httputil.NewSingleHostReverseProxy(u)
		p.FlushInterval = -1
		p.ErrorLog = log.New(io.Discard, "", 0) // the router's probes end mid-flight
		p.ServeHTTP(w, r)
	}))
	c.t.Cleanup(f.srv.Close)
	// a free port for the worker itself, outside the ephemeral range that
	// other tests' connections draw from
	addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(c.t))
	f.target.Store("http://" + addr)
	w := c.addWorker(id, func(cfg *WorkerConfig) {
		if mutate != nil {
			mutate(cfg)
		}
		cfg.Listen, cfg.AdvertiseURL = addr, f.srv.URL
	})
	return w, f
}

func (f *legRecorder) requests() [][]byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([][]byte(nil), f.bodies...)
}

// close refuses the router's connections from now on.
func (f *legRecorder) close() {
	f.srv.CloseClientConnections()
	f.srv.Close()
}

// bootstrapFields are the SGLang members of a leg's body.
type bootstrapFields struct {
	Host string  `json:"bootstrap_host"`
	Port int     `json:"bootstrap_port"`
	Room *uint64 `json:"bootstrap_room"`
}

func bootstrapOf(t *testing.T, body []byte) (bootstrapFields, map[string]json.RawMessage) {
	t.Helper()
	var b bootstrapFields
	require.NoError(t, json.Unmarshal(body, &b), string(body))
	var m map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &m))
	return b, m
}

func TestAnSGLangLongPromptRunsAsAPairAndAShortOneRunsAggregated(t *testing.T) {
	c := routerTestCluster(t)
	both := c.addWorker("b1", nil)
	pre, preFront := c.frontedWorker("p1", sglangWorker(wire.RolePrefill))
	dec, decFront := c.frontedWorker("d1", sglangWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 64)
	cl := r.client()
	ctx := testenv.Context(t)

	// Long: the same body to p1 and d1 at once; d1's answer streams.
	stream := cl.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model:     testModel,
		Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(strings.Repeat("a long shared context ", 60))},
		MaxTokens: openai.Int(6),
	})
	chunks := 0
	for stream.Next() {
		if ch := stream.Current().Choices; len(ch) > 0 && ch[0].Delta.Content != "" {
			chunks++
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, 6, chunks, "the decode server's six tokens, not the prefill's one")

	// Both servers got the same request with the same bootstrap fields:
	// p1's host and registered bootstrap port, one room in [0, 2^63-1].
	pl, dl := preFront.requests(), decFront.requests()
	require.Len(t, pl, 1)
	require.Len(t, dl, 1)
	pb, pm := bootstrapOf(t, pl[0])
	db, dm := bootstrapOf(t, dl[0])
	require.NotNil(t, pb.Room)
	require.Equal(t, pb, db)
	require.Equal(t, pm, dm, "the two legs carry the same body")
	require.Equal(t, "127.0.0.1", pb.Host)
	require.NotZero(t, pb.Port)
	require.LessOrEqual(t, *pb.Room, uint64(1<<63-1))
	require.JSONEq(t, "true", string(dm["stream"]), "the client's body, unchanged: the prefill leg streams too")

	kv := "switchyard_worker_kv_transfers_total"
	require.Equal(t, 1.0, labelled(pre.reg, kv, map[string]string{"role": wire.RolePrefill, "outcome": kvServed}))
	require.Equal(t, 1.0, labelled(dec.reg, kv, map[string]string{"role": wire.RoleDecode, "outcome": kvPulled}))
	require.Equal(t, 1.0, labelled(pre.reg, "switchyard_engine_output_tokens_total", nil), "the prefill server ran one token")
	require.Equal(t, 6.0, labelled(dec.reg, "switchyard_engine_output_tokens_total", nil))
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated", "reason": "long_prefill"}))
	require.Zero(t, labelled(r.reg, metrics.NameDisaggLegErrors, nil))
	require.Zero(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))

	// The room was consumed: the prefill's bootstrap server, at the
	// address the legs named, holds nothing for it any more.
	roomURL := fmt.Sprintf("http://%s/v1/rooms/%d?wait=0s", net.JoinHostPort(pb.Host, strconv.Itoa(pb.Port)), *pb.Room)
	resp, err := http.Get(roomURL)
	require.NoError(t, err)
	_ = resp.Body.Close()
	require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)

	// Short: aggregated on the both-worker, no bootstrap fields anywhere.
	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
		MaxTokens: openai.Int(4),
	})
	require.NoError(t, err)
	require.Equal(t, int64(4), comp.Usage.CompletionTokens)
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "aggregated", "reason": "short_prefill"}))
	require.Positive(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))
	require.Len(t, preFront.requests(), 1)
	require.Len(t, decFront.requests(), 1)
}

func TestACancelledSGLangPairStreamReleasesBothBookings(t *testing.T) {
	r, pre, dec := cancelAPairStream(t, sglangWorker)
	// Nothing runs on for the client that left: the decode engine dropped
	// the sequence, and the prefill served its room once.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return gauge(dec.reg, "switchyard_engine_running_requests", nil) == 0 &&
			gauge(dec.reg, "switchyard_engine_waiting_requests", nil) == 0
	}, "the decode engine dropped the cancelled sequence")
	require.Equal(t, 1.0, pre.kvTransfers(kvServed))
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated"}))
}

// firstByteTimeouts counts attempts the router gave up on for want of a
// first byte (frontend/hung.go).
const firstByteTimeouts = "switchyard_router_first_byte_timeouts_total"

// runLong sends n long completions at once and returns their errors.
func runLong(ctx context.Context, cl openai.Client, prompt string, n int) []error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = cl.Completions.New(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("%s turn %d", prompt, i))},
				MaxTokens: openai.Int(4),
			})
		}()
	}
	wg.Wait()
	return errs
}

// An SGLang prefill server that stops answering (its address closed while
// its record stays registered): the decode leg waiting for its room is
// cancelled at once, and the pair is retried on the other prefill server.
// Every request succeeds, and the decode server is left with no waiter.
func TestAStoppedSGLangPrefillServerIsRetriedOnTheOther(t *testing.T) {
	c := routerTestCluster(t)
	workers := map[string]*runningWorker{}
	fronts := map[string]*legRecorder{}
	for _, id := range []string{"p1", "p2"} {
		workers[id], fronts[id] = c.frontedWorker(id, sglangWorker(wire.RolePrefill))
	}
	dec := c.addWorker("d1", sglangWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 1) // every request a pair, its prefill KV-aware
	cl := r.client()
	ctx := testenv.Context(t)
	prompt := strings.Repeat("the shared context of this test ", 40)
	require.NoError(t, runLong(ctx, cl, prompt+" warm", 1)[0])
	served := func(id string) float64 { return workers[id].kvTransfers(kvServed) }
	require.Equal(t, 1.0, served("p1")+served("p2"), "the warm-up ran as a pair")
	// The warm-up's prefill server holds the prefix: the selector prefers it.
	hot, cold := "p1", "p2"
	if served("p2") > served("p1") {
		hot, cold = "p2", "p1"
	}
	fronts[hot].close()
	before := served(cold)

	for _, err := range runLong(ctx, cl, prompt, 8) {
		require.NoError(t, err)
	}
	require.Positive(t, labelled(r.reg, metrics.NameDisaggLegErrors, map[string]string{"leg": "prefill"}),
		"some prefill legs went to the stopped server %s and failed", hot)
	require.Equal(t, 8.0, served(cold)-before, "every request's room was filled by %s", cold)
	require.Equal(t, 9.0, dec.kvTransfers(kvPulled))
	require.Zero(t, dec.kvTransfers(kvTimeout), "no decode waited out its room")
	require.Zero(t, labelled(r.reg, firstByteTimeouts, nil), "the prefill's failure cancelled its decode leg: no timer had to")
	testenv.Eventually(t, 10*time.Second, func() bool {
		return gauge(r.reg, metrics.NameWorkerActiveRequests, map[string]string{metrics.LabelWorker: "d1"}) <= 0 &&
			gauge(r.reg, metrics.NameWorkerActiveRequests, map[string]string{metrics.LabelWorker: hot}) <= 0 &&
			gauge(r.reg, metrics.NameWorkerActiveRequests, map[string]string{metrics.LabelWorker: cold}) <= 0
	}, "every booking released")
}

// With its only SGLang prefill server stopped, a long request falls back
// to the both-worker and runs aggregated.
func TestAStoppedOnlySGLangPrefillServerFallsBackToAggregated(t *testing.T) {
	c := routerTestCluster(t)
	both := c.addWorker("b1", nil)
	_, front := c.frontedWorker("p1", sglangWorker(wire.RolePrefill))
	c.addWorker("d1", sglangWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 64)
	cl := r.client()
	ctx := testenv.Context(t)
	front.close()

	for _, err := range runLong(ctx, cl, strings.Repeat("a long shared context ", 60), 4) {
		require.NoError(t, err)
	}
	require.Positive(t, labelled(r.reg, metrics.NameDisaggLegErrors, map[string]string{"leg": "prefill"}))
	require.GreaterOrEqual(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil), 4.0,
		"each request ended on the both-worker")
	require.Zero(t, labelled(r.reg, firstByteTimeouts, nil), "the prefill's failure cancelled its decode leg: no timer had to")
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, id := range []string{"b1", "p1", "d1"} {
			if gauge(r.reg, metrics.NameWorkerActiveRequests, map[string]string{metrics.LabelWorker: id}) > 0 {
				return false
			}
		}
		return true
	}, "every booking released")
}
