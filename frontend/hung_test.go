package frontend

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// hungEngine is a worker whose engine has stopped: it accepts connections
// and reads requests but answers nothing (or, with headersFirst, sends a
// stream's 200 headers and then nothing), until the request's context ends
// or release is closed; released, it answers like upstream (the requests
// it held too, unless it already sent their headers).
type hungEngine struct {
	srv          *httptest.Server
	headersFirst bool
	release      chan struct{}
	once         sync.Once
	hung         atomic.Int32 // requests that saw the hang
	up           *upstream
}

func newHungEngine(t *testing.T, headersFirst bool) *hungEngine {
	h := &hungEngine{headersFirst: headersFirst, release: make(chan struct{}), up: &upstream{tokens: 2}}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-h.release:
			h.up.serve(w, r)
			return
		default:
		}
		h.hung.Add(1)
		if h.headersFirst {
			w.Header().Set("Content-Type", "text/event-stream")
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
		}
		select {
		case <-r.Context().Done():
		case <-h.release:
			if !h.headersFirst {
				h.up.serve(w, r) // thawed: the held request is answered
			}
		}
	}))
	t.Cleanup(func() {
		h.resume()
		h.srv.Close()
	})
	return h
}

func (h *hungEngine) resume() { h.once.Do(func() { close(h.release) }) }

// suspectsRecorder is a Suspects that records its calls.
type suspectsRecorder struct {
	mu        sync.Mutex
	suspected map[string]int
	recovered map[string]int
}

func (s *suspectsRecorder) Suspect(w string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.suspected == nil {
		s.suspected = map[string]int{}
	}
	s.suspected[w]++
}

func (s *suspectsRecorder) Recovered(w string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.recovered == nil {
		s.recovered = map[string]int{}
	}
	s.recovered[w]++
}

func (s *suspectsRecorder) Suspected(w string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.suspected[w] > s.recovered[w]
}

func (s *suspectsRecorder) counts(w string) (suspected, recovered int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.suspected[w], s.recovered[w]
}

// fastFirstByte is a config whose first-byte timeout is short, so a test
// that waits on a hung worker ends quickly.
func fastFirstByte() Config {
	cfg := DefaultConfig()
	cfg.FirstByteFloor, cfg.FirstByteCap = 50*time.Millisecond, 100*time.Millisecond
	cfg.FirstBytePerToken = 10 * time.Millisecond
	return cfg
}

// postWithin is post with a client deadline: a request that would wait on a
// hung worker fails the test instead of hanging it.
func postWithin(t *testing.T, d time.Duration, url, body string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err, "the request waited on the hung worker")
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err, "the request waited on the hung worker")
	return resp.StatusCode, resp.Header, string(b)
}

func TestAnAttemptOnAHungWorkerIsCancelledAtTheFirstByteTimeoutAndRetriedElsewhere(t *testing.T) {
	for name, c := range map[string]struct {
		headersFirst bool
		body         string
		reason       string
	}{
		"stream, nothing at all":        {false, `{"model":"m","prompt":"hi","stream":true}`, firstByteNoHeaders},
		"stream, headers but no data":   {true, `{"model":"m","prompt":"hi","stream":true}`, firstByteNoEvent},
		"non-streaming with max_tokens": {false, `{"model":"m","prompt":"hi","max_tokens":2}`, firstByteNoHeaders},
	} {
		t.Run(name, func(t *testing.T) {
			bad, good := newHungEngine(t, c.headersFirst), newUpstream(t, 2)
			ws := staticWorkers{{ID: "bad", URL: bad.srv.URL, Model: "m", BlockSize: 16}, {ID: "good", URL: good.URL(), Model: "m", BlockSize: 16}}
			rec := &grantRecorder{}
			s, reg := newTestServer(t, fastFirstByte(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
			status, h, body := postWithin(t, 10*time.Second, startServer(t, s)+"/v1/completions", c.body)
			require.Equal(t, 200, status, body)
			assert.Equal(t, "good", h.Get(HeaderRoutedWorker))
			assert.NotContains(t, body, "error", "nothing of the hung attempt reached the client")

			require.Len(t, rec.reqs, 2)
			assert.Equal(t, []string{"good"}, rec.reqs[1].Allowed, "the hung worker is excluded from the retry")
			assert.True(t, rec.ticket(0).aborted.Load(), "the hung attempt's booking is released as aborted")
			assert.Equal(t, int32(0), rec.ticket(0).first.Load())
			assert.Equal(t, int32(1), bad.hung.Load())
			assert.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_router_first_byte_timeouts_total", map[string]string{"reason": c.reason}))
		})
	}
}

func TestTheOnlyEligibleWorkerIsWaitedForWithoutAFirstByteTimeout(t *testing.T) {
	slow := newHungEngine(t, false)
	ws := staticWorkers{{ID: "slow", URL: slow.srv.URL, Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	s, reg := newTestServer(t, fastFirstByte(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)
	done := make(chan struct{})
	go func() {
		defer close(done)
		status, h, body := postWithin(t, 30*time.Second, base+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`)
		assert.Equal(t, 200, status, body)
		assert.Equal(t, "slow", h.Get(HeaderRoutedWorker))
	}()
	// Held well past the 100 ms cap: a timeout would have failed the
	// request (no worker is left to retry on).
	testenv.Eventually(t, 10*time.Second, func() bool { return slow.hung.Load() == 1 }, "the request reaches the worker")
	held := time.NewTimer(300 * time.Millisecond) // an injected delay, not an assertion on time
	<-held.C
	slow.resume()
	<-done
	assert.Len(t, rec.reqs, 1, "no retry")
	assert.Equal(t, 0.0, testenv.MetricValue(t, reg, "switchyard_router_first_byte_timeouts_total", map[string]string{"reason": firstByteNoHeaders}))
}

func TestConsecutiveFirstByteTimeoutsMarkTheWorkerSuspectAndASuccessClearsIt(t *testing.T) {
	bad, good := newHungEngine(t, false), newUpstream(t, 2)
	ws := staticWorkers{{ID: "bad", URL: bad.srv.URL, Model: "m", BlockSize: 16}, {ID: "good", URL: good.URL(), Model: "m", BlockSize: 16}}
	rec := &grantRecorder{}
	sus := &suspectsRecorder{}
	cfg := fastFirstByte()
	cfg.SuspectAfter = 2
	s, reg := newTestServer(t, cfg, Deps{Admitter: grantInOrder(rec, ws...), Workers: ws, Suspects: sus})
	base := startServer(t, s)
	body := `{"model":"m","prompt":"hi","stream":true}`

	status, _, out := postWithin(t, 10*time.Second, base+"/v1/completions", body)
	require.Equal(t, 200, status, out)
	n, _ := sus.counts("bad")
	assert.Equal(t, 0, n, "one timeout is not yet a suspicion")

	status, _, out = postWithin(t, 10*time.Second, base+"/v1/completions", body)
	require.Equal(t, 200, status, out)
	n, _ = sus.counts("bad")
	assert.Equal(t, 1, n, "the second consecutive timeout marks the worker suspect")
	assert.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_router_worker_suspicions_total", nil))

	bad.resume()
	status, h, out := postWithin(t, 10*time.Second, base+"/v1/completions", body)
	require.Equal(t, 200, status, out)
	assert.Equal(t, "bad", h.Get(HeaderRoutedWorker), "the engine answers again")
	n, r := sus.counts("bad")
	assert.Equal(t, 1, n)
	assert.Equal(t, 1, r, "a success clears the suspicion")
	assert.False(t, sus.Suspected("good"))
	_, r = sus.counts("good")
	assert.Equal(t, 0, r, "successes on unsuspected workers tell nobody")
}

func TestTheFirstByteTimeoutFollowsThePredictionWithinItsBoundsAndOnlyWhereARetryIsPossible(t *testing.T) {
	cfg := DefaultConfig() // factor 4, floor 2s, cap 10s, 100ms per token, 3 attempts
	for name, c := range map[string]struct {
		stream    bool
		maxTokens int
		pinned    string
		attempt   int
		alone     bool // no other eligible worker
		predicted time.Duration
		want      time.Duration
	}{
		"no other worker: none":               {stream: true, alone: true},
		"no prediction: the cap":              {stream: true, want: 10 * time.Second},
		"short prediction: the floor":         {stream: true, predicted: 100 * time.Millisecond, want: 2 * time.Second},
		"prediction times the factor":         {stream: true, predicted: time.Second, want: 4 * time.Second},
		"long prediction: the cap":            {stream: true, predicted: 5 * time.Second, want: 10 * time.Second},
		"non-streaming adds its output":       {maxTokens: 20, predicted: time.Second, want: 6 * time.Second},
		"non-streaming and unbounded: none":   {predicted: time.Second},
		"pinned: none":                        {stream: true, pinned: "w1"},
		"the last attempt: none":              {stream: true, attempt: 2},
		"the second of three attempts: timed": {stream: true, attempt: 1, want: 10 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			r := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
			x := &exchange{s: &Server{cfg: cfg}, r: r, attempt: c.attempt, others: !c.alone,
				p: &parsedRequest{stream: c.stream, maxTokens: c.maxTokens, hints: hints{worker: c.pinned}}}
			assert.Equal(t, c.want, x.firstByteTimeout(scheduler.Grant{PredictedTTFT: c.predicted}))
		})
	}
}

func TestFirstByteConfigIsValidated(t *testing.T) {
	for name, mutate := range map[string]func(*Config){
		"factor below one":      func(c *Config) { c.FirstByteFactor = 0.5 },
		"no floor":              func(c *Config) { c.FirstByteFloor = 0 },
		"cap below the floor":   func(c *Config) { c.FirstByteCap = time.Second },
		"negative per token":    func(c *Config) { c.FirstBytePerToken = -1 },
		"negative suspicion":    func(c *Config) { c.SuspectAfter = -1 },
		"suspicion for no time": func(c *Config) { c.SuspectTTL = 0 },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := DefaultConfig()
			mutate(&cfg)
			require.Error(t, cfg.Validate())
		})
	}
	cfg := DefaultConfig()
	cfg.FirstByteCap = 0
	require.NoError(t, cfg.Validate(), "0 turns the first-byte timeout off")
}
