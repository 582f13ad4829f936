package bench

import (
	"bytes"
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func testRunnerConfig(targets ...string) RunnerConfig {
	cfg := DefaultRunnerConfig()
	cfg.Targets = targets
	cfg.Model = "test-model"
	return cfg
}

func newTestRunner(t *testing.T, cfg RunnerConfig, deps RunnerDeps) *Runner {
	t.Helper()
	r, err := NewRunner(cfg, deps)
	require.NoError(t, err)
	return r
}

func smallRequests(n int, every time.Duration) []TraceRequest {
	reqs := make([]TraceRequest, n)
	for i := range reqs {
		reqs[i] = TraceRequest{
			Index: i, Arrival: time.Duration(i) * every, InputLength: 40, OutputLength: 3,
			Segments: []Segment{{Seed: 1, Len: 32}, {Seed: uint64(100 + i), Len: 8}},
		}
	}
	return reqs
}

func TestRunnerCapturesTTFTUsageAndOutcomeFromAStreamingEndpoint(t *testing.T) {
	up := newUpstream(t)
	up.CachedTokens = 32
	reqs := smallRequests(2, 0)
	reqs[0].Class, reqs[0].Priority, reqs[0].Deadline, reqs[0].Session = "chat", 2, 1500*time.Millisecond, "s1"
	var c collect
	stats, err := newTestRunner(t, testRunnerConfig(up.URL), RunnerDeps{}).Run(testenv.Context(t), NewSliceSource(reqs), c.sink)
	require.NoError(t, err)
	assert.Equal(t, 2, stats.Dispatched)
	res := c.byIndex(t, 2)

	seen := up.requests()
	require.Len(t, seen, 2)
	slices.SortFunc(seen, func(a, b seenRequest) int {
		return strings.Compare(a.Header.Get("X-Request-Id"), b.Header.Get("X-Request-Id"))
	})
	first := seen[0]
	id0, id1 := first.Header.Get("X-Request-Id"), seen[1].Header.Get("X-Request-Id")
	require.True(t, strings.HasSuffix(id0, "-0") && strings.HasSuffix(id1, "-1"), "ids %q %q", id0, id1)
	assert.Equal(t, strings.TrimSuffix(id0, "-0"), strings.TrimSuffix(id1, "-1"), "one random prefix per run")
	assert.Equal(t, "/v1/completions", first.Path)
	assert.Equal(t, "test-model", first.Body.Model)
	assert.Equal(t, reqs[0].Tokens(DefaultVocab()), first.Body.Prompt, "the prompt is the synthesized token array")
	assert.Equal(t, 3, first.Body.MaxTokens)
	assert.True(t, first.Body.Stream)
	assert.True(t, first.Body.StreamOptions.IncludeUsage)
	assert.Equal(t, "chat", first.Header.Get("x-switchyard-class"))
	assert.Equal(t, "2", first.Header.Get("x-switchyard-priority"))
	assert.Equal(t, "1500", first.Header.Get("x-switchyard-deadline-ms"))
	assert.Equal(t, "", seen[1].Header.Get("x-switchyard-class"), "no hints, no headers")
	assert.Equal(t, "", seen[1].Header.Get("x-switchyard-deadline-ms"))
	assert.Equal(t, seen[0].Body.Prompt[:32], seen[1].Body.Prompt[:32], "a shared segment is a shared prefix on the wire")

	for _, r := range res {
		assert.Equal(t, OutcomeOK, r.Outcome, r.Error)
		assert.Equal(t, http.StatusOK, r.HTTPStatus)
		assert.Equal(t, 3, r.Chunks)
		assert.Len(t, r.ITL, 2)
		assert.Positive(t, r.TTFT)
		assert.LessOrEqual(t, r.TTFT, r.E2E)
		assert.Equal(t, 40, r.PromptTokens)
		assert.Equal(t, 3, r.CompletionTokens)
		assert.Equal(t, 32, r.CachedTokens)
		assert.Equal(t, "worker-a", r.Worker)
		assert.Equal(t, up.URL, r.Target)
	}
	assert.Equal(t, "chat", res[0].Class)
	assert.Equal(t, "s1", res[0].Session)
	assert.Equal(t, 1500*time.Millisecond, res[0].Deadline)
}

func TestRunnerPacesArrivalsOpenLoopByTheScaledTraceClock(t *testing.T) {
	up := newUpstream(t)
	clock := newFakeClock()
	start := clock.Now()
	cfg := testRunnerConfig(up.URL)
	cfg.Speedup = 2
	reqs := smallRequests(3, 0)
	reqs[1].Arrival, reqs[2].Arrival = 10*time.Second, 30*time.Second

	var c collect
	errc := make(chan error, 1)
	go func() {
		_, err := newTestRunner(t, cfg, RunnerDeps{Clock: clock}).Run(testenv.Context(t), NewSliceSource(reqs), c.sink)
		errc <- err
	}()

	testenv.Eventually(t, 10*time.Second, func() bool {
		return up.count() == 1 && slices.Equal(clock.Deadlines(), []time.Time{start.Add(5 * time.Second)})
	}, "request 0 goes at once and the runner sleeps until 10 s / speedup 2")
	clock.Advance(5*time.Second - time.Nanosecond)
	assert.Equal(t, []time.Time{start.Add(5 * time.Second)}, clock.Deadlines(), "not woken early")
	clock.Advance(time.Nanosecond)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return up.count() == 2 && slices.Equal(clock.Deadlines(), []time.Time{start.Add(15 * time.Second)})
	}, "request 1 sent at 5 s, request 2 due at 30 s / 2")
	clock.Advance(10 * time.Second)
	require.NoError(t, <-errc)

	res := c.byIndex(t, 3)
	for i, want := range []time.Duration{0, 5 * time.Second, 15 * time.Second} {
		assert.Equal(t, want, res[i].Scheduled, "request %d", i)
		assert.Equal(t, want, res[i].Sent, "request %d is sent on schedule", i)
		assert.Equal(t, OutcomeOK, res[i].Outcome)
	}
}

func TestRunnerConcurrencyCapHoldsSendsUntilASlotFrees(t *testing.T) {
	up := newUpstream(t)
	release := make(chan struct{})
	up.respond = func(w http.ResponseWriter, r *http.Request, body completionBody) {
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		up.streamOK(w, body)
	}
	clock := newFakeClock()
	cfg := testRunnerConfig(up.URL)
	cfg.Concurrency = 1
	reqs := smallRequests(3, 0) // all due at once

	var c collect
	errc := make(chan error, 1)
	go func() {
		_, err := newTestRunner(t, cfg, RunnerDeps{Clock: clock}).Run(testenv.Context(t), NewSliceSource(reqs), c.sink)
		errc <- err
	}()
	for i := 1; i <= 3; i++ {
		testenv.Eventually(t, 10*time.Second, func() bool { return up.count() == i }, "request %d reaches the upstream", i)
		// Time passes while request i is held; the next one can only be
		// sent after it ends.
		clock.Advance(time.Second)
		release <- struct{}{}
	}
	require.NoError(t, <-errc)
	res := c.byIndex(t, 3)
	for i, r := range res {
		assert.Equal(t, time.Duration(0), r.Scheduled)
		assert.Equal(t, time.Duration(i)*time.Second, r.Sent, "request %d waited for the slot", i)
	}
	sum := Summarize("cap", res)
	assert.InDelta(t, 2000, sum.SendLag.Max, 1e-9, "the lag behind schedule is reported")
}

func TestRunnerRecordsHTTPErrorsWithTheirOpenAICode(t *testing.T) {
	up := newUpstream(t)
	up.respond = func(w http.ResponseWriter, r *http.Request, body completionBody) {
		if r.Header.Get("x-switchyard-deadline-ms") != "" {
			writeOpenAIError(w, http.StatusTooManyRequests, "deadline_exceeded")
			return
		}
		w.Header().Set("Retry-After", "1")
		writeOpenAIError(w, http.StatusTooManyRequests, "queue_full")
	}
	reqs := smallRequests(2, 0)
	reqs[1].Deadline, reqs[1].Class = time.Millisecond, "chat"
	var c collect
	_, err := newTestRunner(t, testRunnerConfig(up.URL), RunnerDeps{}).Run(testenv.Context(t), NewSliceSource(reqs), c.sink)
	require.NoError(t, err)
	res := c.byIndex(t, 2)
	assert.Equal(t, OutcomeHTTPError, res[0].Outcome)
	assert.Equal(t, 429, res[0].HTTPStatus)
	assert.Equal(t, "queue_full", res[0].ErrorCode)
	assert.Equal(t, "rejected: queue_full", res[0].Error)
	assert.Equal(t, "http_429_queue_full", res[0].OutcomeLabel())
	assert.False(t, res[0].DeadlineMissed, "no deadline, no miss")
	assert.Equal(t, "deadline_exceeded", res[1].ErrorCode)
	assert.True(t, res[1].DeadlineMissed)
}

func TestRunnerCountsAFirstTokenAfterTheDeadlineAsAMiss(t *testing.T) {
	up := newUpstream(t)
	clock := newFakeClock()
	up.respond = func(w http.ResponseWriter, r *http.Request, body completionBody) {
		clock.Advance(2 * time.Second) // the first token comes 2 s after sending
		up.streamOK(w, body)
	}
	reqs := smallRequests(1, 0)
	reqs[0].Deadline = time.Second
	var c collect
	_, err := newTestRunner(t, testRunnerConfig(up.URL), RunnerDeps{Clock: clock}).Run(testenv.Context(t), NewSliceSource(reqs), c.sink)
	require.NoError(t, err)
	res := c.byIndex(t, 1)
	assert.Equal(t, OutcomeOK, res[0].Outcome)
	assert.Equal(t, 2*time.Second, res[0].TTFT)
	assert.True(t, res[0].DeadlineMissed)
}

func TestRunnerClassifiesTransportErrorsAndTimeouts(t *testing.T) {
	// A port nobody listens on: the connection is refused.
	dead := "http://127.0.0.1:" + itoa(testenv.FreePort(t))
	var c collect
	_, err := newTestRunner(t, testRunnerConfig(dead), RunnerDeps{}).Run(testenv.Context(t), NewSliceSource(smallRequests(1, 0)), c.sink)
	require.NoError(t, err)
	res := c.byIndex(t, 1)
	assert.Equal(t, OutcomeTransportError, res[0].Outcome)
	assert.NotEmpty(t, res[0].Error)

	up := newUpstream(t)
	up.respond = func(w http.ResponseWriter, r *http.Request, body completionBody) {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never finishes
	}
	cfg := testRunnerConfig(up.URL)
	cfg.Timeout = 50 * time.Millisecond
	var c2 collect
	_, err = newTestRunner(t, cfg, RunnerDeps{}).Run(testenv.Context(t), NewSliceSource(smallRequests(1, 0)), c2.sink)
	require.NoError(t, err)
	assert.Equal(t, OutcomeTimeout, c2.byIndex(t, 1)[0].Outcome)
}

func TestRunnerCancellationEndsInFlightRequestsAsCancelled(t *testing.T) {
	up := newUpstream(t)
	up.respond = func(w http.ResponseWriter, r *http.Request, body completionBody) {
		<-r.Context().Done()
	}
	clock := newFakeClock()
	reqs := smallRequests(2, time.Hour)
	ctx, cancel := context.WithCancel(testenv.Context(t))
	var c collect
	errc := make(chan error, 1)
	go func() {
		_, err := newTestRunner(t, testRunnerConfig(up.URL), RunnerDeps{Clock: clock}).Run(ctx, NewSliceSource(reqs), c.sink)
		errc <- err
	}()
	testenv.Eventually(t, 10*time.Second, func() bool { return up.count() == 1 && len(clock.Deadlines()) == 1 }, "request 0 in flight, request 1 waiting")
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	res := c.byIndex(t, 1)
	assert.Equal(t, OutcomeCancelled, res[0].Outcome, "the unsent request 1 has no result")
}

func TestRunnerRoundRobinsOverTargetsAndStopsAtMaxRequests(t *testing.T) {
	a, b := newUpstream(t), newUpstream(t)
	a.Worker, b.Worker = "wa", "wb"
	cfg := testRunnerConfig(a.URL, b.URL+"/v1/")
	cfg.MaxRequests = 5
	cfg.RequestIDPrefix = "run7"
	var c collect
	stats, err := newTestRunner(t, cfg, RunnerDeps{}).Run(testenv.Context(t), NewSliceSource(smallRequests(9, 0)), c.sink)
	require.NoError(t, err)
	assert.Equal(t, 5, stats.Dispatched)
	res := c.byIndex(t, 5)
	for i, r := range res {
		want := []string{a.URL, b.URL + "/v1/"}[i%2]
		assert.Equal(t, want, r.Target, "request %d", i)
	}
	assert.Equal(t, 3, a.count())
	assert.Equal(t, 2, b.count())
	assert.Equal(t, "/v1/completions", b.requests()[0].Path, "a base URL ending in /v1 is not doubled")
	var ids []string
	for _, s := range b.requests() {
		ids = append(ids, s.Header.Get("X-Request-Id"))
	}
	assert.ElementsMatch(t, []string{"run7-1", "run7-3"}, ids, "a fixed prefix makes ids reproducible")
}

func TestRunnerReportsATraceErrorAfterTheRequestsItSent(t *testing.T) {
	up := newUpstream(t)
	r := openMooncake(t, "testdata/mooncake_bad.jsonl", BadLineFail)
	cfg := testRunnerConfig(up.URL)
	cfg.Speedup = 1e6 // the file's arrivals are milliseconds apart
	var c collect
	stats, err := newTestRunner(t, cfg, RunnerDeps{}).Run(testenv.Context(t), r, c.sink)
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 2, le.Line)
	assert.Equal(t, 1, stats.Dispatched)
	assert.Equal(t, OutcomeOK, c.byIndex(t, 1)[0].Outcome)
}

func TestRunnerWritesAProgressLine(t *testing.T) {
	up := newUpstream(t)
	var buf bytes.Buffer
	_, err := newTestRunner(t, testRunnerConfig(up.URL), RunnerDeps{Progress: &buf}).Run(testenv.Context(t), NewSliceSource(smallRequests(2, 0)), func(Result) {})
	require.NoError(t, err)
	assert.Contains(t, buf.String(), "sent=2 done=2 errors=0")
	assert.NotContains(t, buf.String(), "\r", "not a terminal: plain lines")
}

func TestRunnerConfigValidationNamesTheBadField(t *testing.T) {
	for field, mutate := range map[string]func(*RunnerConfig){
		"targets is empty": func(c *RunnerConfig) { c.Targets = nil },
		"targets[0]":       func(c *RunnerConfig) { c.Targets = []string{"ftp://x"} },
		"model":            func(c *RunnerConfig) { c.Model = "" },
		"speedup":          func(c *RunnerConfig) { c.Speedup = 0 },
		"concurrency":      func(c *RunnerConfig) { c.Concurrency = -1 },
		"timeout":          func(c *RunnerConfig) { c.Timeout = -time.Second },
		"vocab":            func(c *RunnerConfig) { c.Vocab = Vocab{First: 9, Limit: 3} },
	} {
		cfg := DefaultRunnerConfig()
		mutate(&cfg)
		err := cfg.Validate()
		require.ErrorIs(t, err, ErrInvalidConfig, field)
		assert.Contains(t, err.Error(), field)
	}
}
