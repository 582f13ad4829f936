package frontend

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tokenizer"
)

// fakeAdmitter is a function-field Admitter for pure request-path tests.
type fakeAdmitter struct {
	admit func(ctx context.Context, r *scheduler.Request) (Ticket, error)
}

func (f *fakeAdmitter) Admit(ctx context.Context, r *scheduler.Request) (Ticket, error) {
	return f.admit(ctx, r)
}

// fakeTicket records lifecycle marks.
type fakeTicket struct {
	grant                       scheduler.Grant
	dispatched, first, finished atomic.Int32
	aborted                     atomic.Bool
}

func (t *fakeTicket) Grant() scheduler.Grant { return t.grant }
func (t *fakeTicket) Dispatched()            { t.dispatched.Add(1) }
func (t *fakeTicket) FirstToken()            { t.first.Add(1) }
func (t *fakeTicket) Finish(aborted bool) {
	t.finished.Add(1)
	t.aborted.Store(aborted)
}

// staticWorkers is a fixed registry.
type staticWorkers []WorkerEntry

func (s staticWorkers) Workers() []WorkerEntry { return s }

// fakeIndex is a function-field PrefixIndex.
type fakeIndex struct {
	mu        sync.Mutex
	overlaps  []scheduler.Overlap
	predicted map[string][]uint64
}

func (f *fakeIndex) Overlaps(dst []scheduler.Overlap, _ []uint64) []scheduler.Overlap {
	return append(dst, f.overlaps...)
}

func (f *fakeIndex) Predict(worker string, seq []uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.predicted == nil {
		f.predicted = map[string][]uint64{}
	}
	f.predicted[worker] = seq
}

// upstream is a small real OpenAI-ish HTTP worker for proxy tests: it streams
// `tokens` chunks and a usage chunk, with hooks to block or fail.
type upstream struct {
	srv      *httptest.Server
	tokens   int
	requests atomic.Int32
	// failStatus, when non-zero, is answered instead of a completion.
	failStatus atomic.Int32
	// breakAfter, when > 0, cuts the connection after that many chunks.
	breakAfter atomic.Int32
	// gate, when set, is waited on before the first chunk.
	gate chan struct{}
	// dieBeforeFirst sends the 200 headers, then closes the connection.
	dieBeforeFirst atomic.Bool
	// holdAfterFirst blocks after the first chunk until the router goes away.
	holdAfterFirst atomic.Bool
	// preamble is written before the first chunk (SSE comments, event: lines).
	preamble string
	// interval paces the chunks after the first, like a decode step (set
	// before the first request).
	interval time.Duration
	// cancelled counts requests whose client (the router) went away.
	cancelled atomic.Int32
	// chunkUsage, when set, is the usage member of every token chunk:
	// "null" as SGLang sends it, "running" for vLLM's
	// continuous_usage_stats (the count so far), set before the first
	// request.
	chunkUsage string
	lastBody   atomic.Value // string
	lastPath   atomic.Value // string
}

func newUpstream(t testing.TB, tokens int) *upstream {
	u := &upstream{tokens: tokens}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	t.Cleanup(u.srv.Close)
	return u
}

func (u *upstream) URL() string { return u.srv.URL }

func (u *upstream) serve(w http.ResponseWriter, r *http.Request) {
	u.requests.Add(1)
	body, _ := io.ReadAll(r.Body)
	u.lastBody.Store(string(body))
	u.lastPath.Store(r.URL.Path)
	if s := u.failStatus.Load(); s != 0 {
		http.Error(w, `{"error":{"message":"injected","type":"server_error"}}`, int(s))
		return
	}
	var req struct {
		Stream        bool `json:"stream"`
		StreamOptions struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	_ = json.Unmarshal(body, &req)
	if u.gate != nil {
		select {
		case <-u.gate:
		case <-r.Context().Done():
			u.cancelled.Add(1)
			return
		}
	}
	usage := fmt.Sprintf(`{"prompt_tokens":40,"completion_tokens":%d,"total_tokens":%d,"prompt_tokens_details":{"cached_tokens":32}}`, u.tokens, 40+u.tokens)
	if !req.Stream {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"cmpl-1","object":"text_completion","model":"m","choices":[{"index":0,"text":"%s","finish_reason":"length"}],"usage":%s}`,
			strings.Repeat("t ", u.tokens), usage)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	f := w.(http.Flusher)
	if u.preamble != "" {
		fmt.Fprint(w, u.preamble)
	}
	if u.dieBeforeFirst.Load() {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			_ = conn.Close()
		}
		return
	}
	for i := 0; i < u.tokens; i++ {
		if i == 1 && u.holdAfterFirst.Load() {
			<-r.Context().Done()
			u.cancelled.Add(1)
			return
		}
		if i > 0 && u.interval > 0 {
			select {
			case <-time.After(u.interval):
			case <-r.Context().Done():
				return
			}
		}
		if b := u.breakAfter.Load(); b > 0 && int(b) == i {
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				_ = conn.Close()
			}
			return
		}
		var member string
		switch u.chunkUsage {
		case "null":
			member = `,"usage":null`
		case "running":
			member = fmt.Sprintf(`,"usage":{"prompt_tokens":40,"completion_tokens":%d,"total_tokens":%d}`, i+1, 41+i)
		}
		if _, err := fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"t%d \"}]%s}\n\n", i, member); err != nil {
			u.cancelled.Add(1)
			return
		}
		f.Flush()
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":[],\"usage\":%s}\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
	f.Flush()
}

// startServer serves s on a loopback port until the test ends and returns its
// base URL. Cleanup waits for Serve to return.
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	return "http://" + ln.Addr().String()
}

// newTestServer builds a Server with test defaults and a private registry.
func newTestServer(t *testing.T, cfg Config, deps Deps) (*Server, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	if deps.Prompts == nil {
		deps.Prompts = toyPrompts(t, "m", "other")
	}
	s, err := New(cfg, deps, zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	return s, reg
}

// post sends body to url with headers and returns status, headers and body.
func post(t *testing.T, url, body string, headers map[string]string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, resp.Header, string(b)
}

// apiErr decodes an OpenAI error body.
func apiErr(t *testing.T, body string) errorObject {
	t.Helper()
	var e errorBody
	require.NoError(t, json.Unmarshal([]byte(body), &e), "error body: %s", body)
	return e.Error
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// toyPrompts is a prompt registry whose models all use the toy tokenizer
// with the plain ChatML rendering: the frontend's tests are about the
// request path, not tokenization (package prompt and internal/app test the
// real tokenizers).
func toyPrompts(tb testing.TB, models ...string) *prompt.Registry {
	tb.Helper()
	cfg := prompt.DefaultConfig()
	cfg.Tokenizers = map[string]string{}
	for _, m := range models {
		cfg.Tokenizers[m] = "toy"
	}
	reg, err := prompt.NewRegistry(cfg, prompt.Deps{LoadSpec: func(string, int64) (*prompt.Model, error) {
		return &prompt.Model{Spec: "toy", Encode: tokenizer.Encode, Template: prompt.PlainChat{}}, nil
	}}, zap.NewNop(), nil)
	require.NoError(tb, err)
	return reg
}
