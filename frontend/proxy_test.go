package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// grantTo returns an admitter that grants each attempt to the next worker
// of ws (by attempt number), recording the requests and tickets.
type grantRecorder struct {
	mu      sync.Mutex
	reqs    []scheduler.Request
	tickets []*fakeTicket
}

func grantInOrder(rec *grantRecorder, ws ...WorkerEntry) *fakeAdmitter {
	return &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		w := ws[r.Attempt%len(ws)]
		t := &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: w.ID, WorkerURL: w.URL, Booking: scheduler.BookingID(r.Attempt + 1)}}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.reqs = append(rec.reqs, *r)
		rec.tickets = append(rec.tickets, t)
		return t, nil
	}}
}

func (rec *grantRecorder) ticket(i int) *fakeTicket {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	if i >= len(rec.tickets) {
		return nil
	}
	return rec.tickets[i]
}

func streamBody(model string) string {
	return `{"model":"` + model + `","prompt":"hello there","stream":true,"stream_options":{"include_usage":true}}`
}

func TestStreamingResponsePassesThroughEventByEventAndMarksTheLifecycle(t *testing.T) {
	up := newUpstream(t, 5)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	m := metrics.NewRouter(nil)
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws, Metrics: m})
	base := startServer(t, s)

	status, h, body := post(t, base+"/v1/completions", streamBody("m"), nil)
	require.Equal(t, 200, status, body)
	assert.Equal(t, "text/event-stream", h.Get("Content-Type"))
	assert.Equal(t, "w1", h.Get(HeaderRoutedWorker))
	events := strings.Split(strings.TrimSpace(body), "\n\n")
	require.Len(t, events, 7, "5 tokens, a usage chunk and [DONE]: %q", body)
	assert.Equal(t, `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"t0 "}]}`, events[0])
	assert.Contains(t, events[5], `"cached_tokens":32`)
	assert.Equal(t, "data: [DONE]", events[6])

	tk := rec.ticket(0)
	require.NotNil(t, tk)
	assert.Equal(t, int32(1), tk.dispatched.Load())
	assert.Equal(t, int32(1), tk.first.Load())
	assert.Equal(t, int32(1), tk.finished.Load())
	assert.False(t, tk.aborted.Load())
	assert.Equal(t, 32.0, testutil.ToFloat64(m.CachedTokens.WithLabelValues("m", "default")), "usage reaches the token counters")
	assert.Equal(t, 40.0, testutil.ToFloat64(m.PromptTokens.WithLabelValues("m", "default")))
	assert.Equal(t, uint64(1), histogramCount(t, m.TTFT.WithLabelValues("m", "default")))
	assert.Equal(t, uint64(4), histogramCount(t, m.ITL.WithLabelValues("m", "default")), "5 tokens have 4 gaps; [DONE] and usage are not tokens")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.HTTPResponses.WithLabelValues(metrics.RouteCompletions, "200")))
}

func TestNonStreamingResponseIsRelayedWithItsUsage(t *testing.T) {
	up := newUpstream(t, 3)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	status, h, body := post(t, startServer(t, s)+"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	require.Equal(t, 200, status, body)
	assert.Equal(t, "application/json", h.Get("Content-Type"))
	var out struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &out))
	assert.Equal(t, 32, out.Usage.PromptTokensDetails.CachedTokens)
	tk := rec.ticket(0)
	assert.Equal(t, int32(1), tk.first.Load())
	assert.Equal(t, int32(1), tk.finished.Load())
	assert.False(t, tk.aborted.Load())
}

func TestWorkerFailingBeforeTheFirstByteIsRetriedOnAnotherWorker(t *testing.T) {
	for name, breakIt := range map[string]func(u *upstream){
		"server error":            func(u *upstream) { u.failStatus.Store(503) },
		"stream dies before data": func(u *upstream) { u.dieBeforeFirst.Store(true) },
	} {
		t.Run(name, func(t *testing.T) {
			bad, good := newUpstream(t, 2), newUpstream(t, 2)
			breakIt(bad)
			ws := staticWorkers{{ID: "bad", URL: bad.URL(), Model: "m", BlockSize: 16}, {ID: "good", URL: good.URL(), Model: "m", BlockSize: 16}}
			rec := &grantRecorder{}
			s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
			status, h, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
			require.Equal(t, 200, status, body)
			assert.Equal(t, "good", h.Get(HeaderRoutedWorker))
			assert.True(t, strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]"), body)

			require.Len(t, rec.reqs, 2)
			assert.Equal(t, 1, rec.reqs[1].Attempt, "the second admission is a retry")
			assert.Equal(t, []string{"good"}, rec.reqs[1].Allowed, "the failed worker is excluded")
			assert.Equal(t, rec.reqs[0].ID, rec.reqs[1].ID, "same request id across attempts")
			assert.True(t, rec.ticket(0).aborted.Load(), "the failed booking is freed as aborted")
			assert.Equal(t, int32(0), rec.ticket(0).first.Load())
			assert.False(t, rec.ticket(1).aborted.Load())
		})
	}
}

func TestUnreachableWorkerIsRetriedAndAPinnedOneIsNot(t *testing.T) {
	dead := "http://" + deadAddr(t)
	good := newUpstream(t, 1)
	ws := staticWorkers{{ID: "dead", URL: dead, Model: "m", BlockSize: 16}, {ID: "good", URL: good.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)

	status, _, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	require.Equal(t, 200, status, body)
	require.Len(t, rec.reqs, 2)

	rec2 := &grantRecorder{}
	s2, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec2, ws...), Workers: ws})
	status, _, body = post(t, startServer(t, s2)+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderWorker: "dead"})
	require.Equal(t, 502, status, body)
	assert.Equal(t, "upstream_failed", deref(apiErr(t, body).Code))
	assert.Len(t, rec2.reqs, 1, "a pinned request is not moved to another worker")
	assert.True(t, rec2.ticket(0).aborted.Load())
}

func TestRetriesStopAfterMaxAttempts(t *testing.T) {
	a, b := newUpstream(t, 1), newUpstream(t, 1)
	a.failStatus.Store(500)
	b.failStatus.Store(500)
	ws := staticWorkers{{ID: "a", URL: a.URL(), Model: "m", BlockSize: 16}, {ID: "b", URL: b.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	cfg := DefaultConfig()
	cfg.MaxAttempts = 5
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	require.Equal(t, 502, status, body)
	assert.Len(t, rec.reqs, 2, "every eligible worker was tried once, then the request failed")
}

func TestWorkerDyingMidStreamEndsTheStreamWithAnErrorEvent(t *testing.T) {
	up := newUpstream(t, 5)
	up.breakAfter.Store(2)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}, {ID: "w2", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, "the stream had started")
	events := strings.Split(strings.TrimSpace(body), "\n\n")
	require.Len(t, events, 3, body)
	last := strings.TrimPrefix(events[2], "data: ")
	assert.Equal(t, "upstream_failed", deref(apiErr(t, last).Code))
	assert.Len(t, rec.reqs, 1, "no retry once output reached the client")
	assert.True(t, rec.ticket(0).aborted.Load())
	assert.Equal(t, int32(1), rec.ticket(0).finished.Load())
}

func TestClientDisconnectMidStreamCancelsTheWorkerAndFinishesTheTicketAborted(t *testing.T) {
	up := newUpstream(t, 10)
	up.holdAfterFirst.Store(true)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "))
	cancel()
	_ = resp.Body.Close()

	testenv.Eventually(t, 5*time.Second, func() bool {
		tk := rec.ticket(0)
		return tk != nil && tk.finished.Load() == 1
	}, "ticket finished after the client left")
	assert.True(t, rec.ticket(0).aborted.Load())
	testenv.Eventually(t, 5*time.Second, func() bool { return up.cancelled.Load() == 1 }, "the worker saw the cancellation")
}

func TestGracefulShutdownLetsInFlightStreamsFinish(t *testing.T) {
	up := newUpstream(t, 3)
	up.gate = make(chan struct{})
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()

	type result struct {
		status int
		body   string
		err    error
	}
	got := make(chan result, 1)
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
		if err != nil {
			got <- result{err: err}
			return
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		got <- result{status: resp.StatusCode, body: string(b), err: err}
	}()
	testenv.Eventually(t, 5*time.Second, func() bool { return up.requests.Load() == 1 }, "the stream reached the worker")
	cancel()
	testenv.Eventually(t, 5*time.Second, func() bool { return s.ready() != nil }, "shutdown began")
	_, err = net.Dial("tcp", ln.Addr().String())
	assert.Error(t, err, "no new connections during shutdown")
	close(up.gate)

	r := <-got
	require.NoError(t, r.err)
	assert.Equal(t, 200, r.status)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(r.body), "data: [DONE]"), "the stream completed: %q", r.body)
	require.NoError(t, <-served)
	assert.False(t, rec.ticket(0).aborted.Load())
}

func TestShutdownCutsStreamsAfterTheGracePeriod(t *testing.T) {
	up := newUpstream(t, 3)
	up.gate = make(chan struct{}) // never opened: the stream cannot finish
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	cfg := DefaultConfig()
	cfg.ShutdownGrace = 50 * time.Millisecond
	s, _ := newTestServer(t, cfg, Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx, ln) }()
	clientDone := make(chan error, 1)
	go func() {
		resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
		if err == nil {
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		clientDone <- err
	}()
	testenv.Eventually(t, 5*time.Second, func() bool { return up.requests.Load() == 1 }, "the stream reached the worker")
	cancel()
	require.NoError(t, <-served, "Serve returns once the cut handlers have returned")
	assert.Equal(t, int32(1), rec.ticket(0).finished.Load())
	assert.True(t, rec.ticket(0).aborted.Load())
	<-clientDone //nolint:errcheck // the client saw its stream cut; only its exit matters here
}

func TestReadinessGatesTheAPIAndReadyz(t *testing.T) {
	var mu sync.Mutex
	notReady := errors.New("worker registry not loaded")
	readyErr := notReady
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: admitNever(t),
		Workers:  staticWorkers{},
		Ready: func() error {
			mu.Lock()
			defer mu.Unlock()
			return readyErr
		},
	})
	base := startServer(t, s)
	resp, err := http.Get(base + "/readyz")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 503, resp.StatusCode)
	assert.Contains(t, string(b), "worker registry not loaded")

	status, _, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	assert.Equal(t, 503, status)
	assert.Equal(t, "not_ready", deref(apiErr(t, body).Code))

	resp, err = http.Get(base + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "alive even when not ready")

	mu.Lock()
	readyErr = nil
	mu.Unlock()
	resp, err = http.Get(base + "/readyz")
	require.NoError(t, err)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode)
}

func TestReadyzAddsTheServingDetailToAReadyAnswer(t *testing.T) {
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter:    admitNever(t),
		Workers:     staticWorkers{},
		ReadyDetail: func() []string { return []string{"degraded: NATS unreachable"} },
	})
	resp, err := http.Get(startServer(t, s) + "/readyz")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, 200, resp.StatusCode, "a degraded replica still serves")
	assert.Equal(t, "ok\ndegraded: NATS unreachable\n", string(b))
}

func TestModelsListsTheRegisteredModels(t *testing.T) {
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: admitNever(t),
		Workers: staticWorkers{
			{ID: "w1", URL: "http://x", Model: "llama", BlockSize: 16},
			{ID: "w2", URL: "http://y", Model: "llama", BlockSize: 16},
			{ID: "w3", URL: "http://z", Model: "mistral", BlockSize: 16},
		},
	})
	resp, err := http.Get(startServer(t, s) + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var list modelList
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	assert.Equal(t, "list", list.Object)
	require.Len(t, list.Data, 2)
	assert.Equal(t, modelObject{ID: "llama", Object: "model", OwnedBy: "switchyard", Workers: 2}, list.Data[0])
	assert.Equal(t, "mistral", list.Data[1].ID)
}

func TestDebugClusterServesTheProvidersDocument(t *testing.T) {
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter:    admitNever(t),
		Workers:     staticWorkers{},
		ClusterInfo: func(context.Context) (json.RawMessage, error) { return json.RawMessage(`{"replicas":["r1"]}`), nil },
	})
	resp, err := http.Get(startServer(t, s) + "/debug/cluster")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	assert.Equal(t, 200, resp.StatusCode)
	assert.JSONEq(t, `{"replicas":["r1"]}`, string(b))
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	return addr
}

func TestSSELinesBeforeTheFirstDataEventAreRelayedWithIt(t *testing.T) {
	up := newUpstream(t, 1)
	up.preamble = ": keep-alive\n\nevent: message\n"
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status)
	assert.True(t, strings.HasPrefix(body, ": keep-alive\n\nevent: message\ndata: {"), "got %q", body)
}

func histogramCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, o.(prometheus.Metric).Write(&m))
	return m.GetHistogram().GetSampleCount()
}
