package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var questionRe = regexp.MustCompile(`Question (\d+):`)

// scriptedRouter is a real HTTP server standing in for a router: request n
// (from the prompt's "Question n") gets the behaviour script(n) names.
func scriptedRouter(t *testing.T, script func(n int) string) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body struct {
			Model     string `json:"model"`
			Stream    bool   `json:"stream"`
			MaxTokens int    `json:"max_tokens"`
			Messages  []struct {
				Content string `json:"content"`
			} `json:"messages"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || len(body.Messages) != 1 || !body.Stream {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		m := questionRe.FindStringSubmatch(body.Messages[0].Content)
		n, _ := strconv.Atoi(m[1])
		w.Header().Set("x-request-id", fmt.Sprintf("req-%d", n))
		w.Header().Set("x-switchyard-routed-worker", "worker-"+r.Header.Get("x-switchyard-class"))
		fl := w.(http.Flusher)
		switch script(n) {
		case "not_ready":
			w.Header().Set("content-type", "application/json")
			w.Header().Set("Retry-After", "1")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"error":{"message":"shutting down","type":"service_unavailable","code":"not_ready"}}`))
		case "reject":
			w.Header().Set("content-type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			_, _ = w.Write([]byte(`{"error":{"message":"full","type":"rate_limit_error","code":"queue_full"}}`))
		case "stream_error":
			_, _ = w.Write([]byte(chunk + errEv))
		case "truncate":
			_, _ = w.Write([]byte(chunk))
			fl.Flush()
			panic(http.ErrAbortHandler) // cut the connection mid-stream
		case "hang":
			_, _ = w.Write([]byte(chunk))
			fl.Flush()
			<-r.Context().Done()
		default:
			_, _ = w.Write([]byte(chunk))
			fl.Flush()
			_, _ = w.Write([]byte(finish + done))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func runDriver(t *testing.T, cfg DriverConfig) *Driver {
	t.Helper()
	d, err := NewDriver(cfg, nil)
	require.NoError(t, err)
	require.NoError(t, d.Run(context.Background()))
	d.Close()
	return d
}

func fastConfig(targets ...string) DriverConfig {
	cfg := DefaultDriverConfig()
	cfg.Targets = targets
	cfg.Rate = 1000
	cfg.MaxRequests = 20
	return cfg
}

func TestDriverRecordsExactlyOneOutcomePerRequestSent(t *testing.T) {
	srv := scriptedRouter(t, func(n int) string {
		return [...]string{"ok", "reject", "stream_error", "truncate", "ok"}[n%5]
	})
	d := runDriver(t, fastConfig(srv.URL))
	rs := d.Results()
	require.Len(t, rs, 20)
	assert.Equal(t, 20, d.Sent())
	for i, r := range rs {
		assert.Equal(t, i, r.Seq, "one record per sequence number")
		assert.Equal(t, fmt.Sprintf("req-%d", i), r.RequestID)
	}
	assert.Equal(t, map[Outcome]int{OutcomeSuccess: 8, OutcomeRejected: 4, OutcomeStreamError: 4, OutcomeTruncated: 4}, Tally(rs))
	assert.Equal(t, "queue_full", rs[1].Code)
	assert.Equal(t, "upstream_failed", rs[2].Code)
	assert.True(t, rs[0].Admitted())
	assert.False(t, rs[1].Admitted())
}

func TestDriverSendsEveryFifthRequestAsBatchAndTheRestAsInteractive(t *testing.T) {
	srv := scriptedRouter(t, func(int) string { return "ok" })
	rs := runDriver(t, fastConfig(srv.URL)).Results()
	require.Len(t, rs, 20)
	for _, r := range rs {
		want := "interactive"
		if r.Seq%5 == 4 {
			want = "batch"
		}
		assert.Equal(t, want, r.Class)
		assert.Equal(t, "worker-"+want, r.Worker, "the class travels in x-switchyard-class")
	}
}

func TestDriverSkipsDisabledTargetsAndRoundRobinsTheOthers(t *testing.T) {
	a := scriptedRouter(t, func(int) string { return "ok" })
	b := scriptedRouter(t, func(int) string { return "ok" })
	c := scriptedRouter(t, func(int) string { return "ok" })
	d, err := NewDriver(fastConfig(a.URL, b.URL, c.URL), nil)
	require.NoError(t, err)
	d.SetEnabled(b.URL, false)
	require.NoError(t, d.Run(context.Background()))
	d.Close()
	per := map[string]int{}
	for _, r := range d.Results() {
		per[r.Target]++
	}
	assert.Equal(t, map[string]int{a.URL: 10, c.URL: 10}, per)
	assert.Zero(t, d.InFlight(a.URL))
}

func TestDriverCallsARequestThatOutlivesItsTimeoutATimeout(t *testing.T) {
	srv := scriptedRouter(t, func(int) string { return "hang" })
	cfg := fastConfig(srv.URL)
	cfg.MaxRequests = 2
	cfg.RequestTimeout = 200 * time.Millisecond
	rs := runDriver(t, cfg).Results()
	assert.Equal(t, map[Outcome]int{OutcomeTimeout: 2}, Tally(rs))
}

func TestDriverCallsARefusedConnectionATransportError(t *testing.T) {
	srv := scriptedRouter(t, func(int) string { return "ok" })
	url := srv.URL
	srv.Close() // nothing listens there any more
	cfg := fastConfig(url)
	cfg.MaxRequests = 3
	assert.Equal(t, map[Outcome]int{OutcomeTransport: 3}, Tally(runDriver(t, cfg).Results()))
}

func TestDriverStopsSendingWhenItsContextEndsButLetsRequestsInFlightFinish(t *testing.T) {
	release := make(chan struct{})
	var once sync.Once
	started := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(started) })
		<-release
		_, _ = w.Write([]byte(finish + done))
	}))
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.MaxRequests = 0
	cfg.Rate = 1 // one request, then the stop
	d, err := NewDriver(cfg, nil)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	<-started
	cancel()
	close(release)
	require.NoError(t, <-done)
	d.Close()
	assert.Equal(t, map[Outcome]int{OutcomeSuccess: 1}, Tally(d.Results()), "the request in flight at the stop still ends in success")
}

func TestDriverConfigValidationNamesTheBadField(t *testing.T) {
	cfg := DefaultDriverConfig()
	assert.ErrorContains(t, cfg.Validate(), "Targets")
	cfg.Targets = []string{"http://127.0.0.1:1"}
	require.NoError(t, cfg.Validate())
	cfg.Rate = 0
	assert.ErrorContains(t, cfg.Validate(), "Rate")
	cfg = fastConfig("x")
	cfg.MaxTokens = 0
	assert.ErrorContains(t, cfg.Validate(), "MaxTokens")
}

// A request no router took in (nothing answered, or 503 not_ready) goes to
// the next router, as many times as configured; one that was answered with
// an admission error is not sent again.
func TestTheDriverRedirectsRequestsNoRouterTookInAndOnlyThose(t *testing.T) {
	lame := scriptedRouter(t, func(n int) string {
		if n%2 == 0 {
			return "not_ready"
		}
		return "reject"
	})
	gone := httptest.NewServer(http.NotFoundHandler())
	goneURL := gone.URL
	gone.Close() // refuses connections from now on
	good := scriptedRouter(t, func(int) string { return "ok" })

	cfg := fastConfig(lame.URL, goneURL, good.URL)
	cfg.MaxRequests = 12
	cfg.Redirects = 2
	d := runDriver(t, cfg)
	for _, r := range d.Results() {
		switch {
		case r.Seq%3 == 0 && r.Seq%2 == 1: // to lame, rejected there: an answer, kept
			assert.Equal(t, OutcomeRejected, r.Outcome, "request %d", r.Seq)
			assert.Equal(t, "queue_full", r.Code)
			assert.Zero(t, r.Redirected)
		case r.Seq%3 == 0: // to lame, not_ready: lame -> gone -> good
			assert.Equal(t, OutcomeSuccess, r.Outcome, "request %d", r.Seq)
			assert.Equal(t, 2, r.Redirected)
			assert.Equal(t, good.URL, r.Target)
		case r.Seq%3 == 1: // to gone: refused, then good
			assert.Equal(t, OutcomeSuccess, r.Outcome, "request %d", r.Seq)
			assert.Equal(t, 1, r.Redirected)
		default:
			assert.Equal(t, OutcomeSuccess, r.Outcome, "request %d", r.Seq)
			assert.Zero(t, r.Redirected)
			assert.False(t, r.Header.IsZero(), "the headers' arrival is recorded")
		}
	}
	for _, target := range cfg.Targets {
		assert.Zero(t, d.InFlight(target), "in-flight counts follow redirected requests")
	}
}

func TestDriverSendsItsAPIKeyAsABearerTokenAndNoneWithoutOne(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Header.Get("Authorization"))
		mu.Unlock()
		_, _ = w.Write([]byte(finish + done))
	}))
	t.Cleanup(srv.Close)
	cfg := fastConfig(srv.URL)
	cfg.MaxRequests = 2
	cfg.APIKey = "sy-test-key"
	assert.Equal(t, map[Outcome]int{OutcomeSuccess: 2}, Tally(runDriver(t, cfg).Results()))
	cfg.APIKey = ""
	assert.Equal(t, map[Outcome]int{OutcomeSuccess: 2}, Tally(runDriver(t, cfg).Results()))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"Bearer sy-test-key", "Bearer sy-test-key", "", ""}, seen)
}
