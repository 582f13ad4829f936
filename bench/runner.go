package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/listflag"

	"go.uber.org/zap"
)

// RunnerConfig configures the live open-loop runner.
type RunnerConfig struct {
	// Targets are OpenAI-compatible base URLs ("http://host:8080" or
	// ".../v1"), used round-robin in dispatch order.
	Targets []string
	// Model is the request's "model" field.
	Model string
	// Speedup divides trace arrival offsets: 2 replays twice as fast.
	Speedup float64
	// MaxRequests stops after this many requests (0: the whole trace).
	MaxRequests int
	// Concurrency caps requests in flight (0: no cap, a pure open loop).
	// When the cap is reached the dispatcher waits for a slot, and the wait
	// shows as Sent > Scheduled in the results. It sizes the slot semaphore.
	Concurrency int
	// Timeout bounds one request from sending to the end of its stream
	// (0: none).
	Timeout time.Duration
	// Vocab bounds synthesized prompt token ids.
	Vocab Vocab
	// WorkerHeader is the response header that names the serving worker
	// (for per-worker load); empty disables.
	WorkerHeader string
	// RequestIDPrefix starts each request's x-request-id
	// (<prefix>-<trace index>). Engines may adopt the id (Switchyard's
	// simulated worker does, to make output reproducible), so ids must be
	// unique among requests in flight: empty means a random prefix per run.
	RequestIDPrefix string
	// IgnoreEOS sends "ignore_eos": true (a vLLM extension) so real engines
	// generate exactly max_tokens; off by default because strict OpenAI
	// servers reject unknown fields.
	IgnoreEOS bool
	// ProgressInterval is the progress line's refresh period.
	ProgressInterval time.Duration
}

// DefaultRunnerConfig returns the defaults: real-time replay of the whole
// trace, no concurrency cap, 10 minute timeout, default vocabulary.
func DefaultRunnerConfig() RunnerConfig {
	return RunnerConfig{
		Targets:          []string{"http://127.0.0.1:8080"},
		Model:            "switchyard-sim",
		Speedup:          1,
		Timeout:          10 * time.Minute,
		Vocab:            DefaultVocab(),
		WorkerHeader:     "x-switchyard-routed-worker",
		ProgressInterval: time.Second,
	}
}

// maxConcurrency bounds the slot semaphore.
const maxConcurrency = 1 << 20

// Validate names the first bad field.
func (c RunnerConfig) Validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: runner %s", ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	if len(c.Targets) == 0 {
		return bad("targets is empty")
	}
	for i, t := range c.Targets {
		u, err := url.Parse(t)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return bad("targets[%d] %q is not an http(s) base URL", i, t)
		}
	}
	switch {
	case c.Model == "":
		return bad("model is empty")
	case !(c.Speedup > 0) || math.IsInf(c.Speedup, 0):
		return bad("speedup %v must be positive and finite", c.Speedup)
	case c.MaxRequests < 0:
		return bad("max_requests %d must not be negative", c.MaxRequests)
	case c.Concurrency < 0 || c.Concurrency > maxConcurrency:
		return bad("concurrency %d outside [0, %d]", c.Concurrency, maxConcurrency)
	case c.Timeout < 0:
		return bad("timeout %v must not be negative", c.Timeout)
	case c.ProgressInterval <= 0:
		return bad("progress_interval %v must be positive", c.ProgressInterval)
	}
	if err := c.Vocab.Validate(); err != nil {
		return fmt.Errorf("runner: %w", err)
	}
	return nil
}

// RegisterFlags registers the runner's flags as <prefix>target, ...
func (c *RunnerConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.Func(prefix+"target", "comma-separated OpenAI base URLs, used round-robin (default "+strings.Join(c.Targets, ",")+")", func(s string) error {
		c.Targets = listflag.Split(s)
		return nil
	})
	fs.StringVar(&c.Model, prefix+"model", c.Model, "model name sent with each request")
	fs.Float64Var(&c.Speedup, prefix+"speedup", c.Speedup, "replay speed factor (2 = twice as fast as the trace)")
	fs.IntVar(&c.MaxRequests, prefix+"max-requests", c.MaxRequests, "stop after this many requests (0: all)")
	fs.IntVar(&c.Concurrency, prefix+"concurrency", c.Concurrency, "maximum requests in flight (0: unlimited, pure open loop)")
	fs.DurationVar(&c.Timeout, prefix+"timeout", c.Timeout, "per-request timeout (0: none)")
	fs.StringVar(&c.WorkerHeader, prefix+"worker-header", c.WorkerHeader, "response header naming the serving worker")
	fs.StringVar(&c.RequestIDPrefix, prefix+"request-id-prefix", c.RequestIDPrefix, "x-request-id prefix (empty: random per run)")
	fs.BoolVar(&c.IgnoreEOS, prefix+"ignore-eos", c.IgnoreEOS, `send "ignore_eos": true (vLLM) so engines generate max_tokens`)
	fs.Func(prefix+"vocab", fmt.Sprintf("token id range first:limit for synthesized prompts (default %d:%d)", c.Vocab.First, c.Vocab.Limit), func(s string) error {
		a, b, ok := strings.Cut(s, ":")
		first, err1 := strconv.ParseUint(a, 10, 32)
		limit, err2 := strconv.ParseUint(b, 10, 32)
		if !ok || err1 != nil || err2 != nil {
			return fmt.Errorf("want first:limit, e.g. 256:50000")
		}
		c.Vocab = Vocab{First: uint32(first), Limit: uint32(limit)}
		return nil
	})
}

// RunStats counts what a run did.
type RunStats struct {
	// Dispatched requests were sent (each produced exactly one Result).
	Dispatched int
	// Started and Finished are the clock readings at the run's start and
	// after the last request ended.
	Started, Finished time.Time
}

// Runner replays a trace open-loop against OpenAI-compatible endpoints.
// It is reusable for sequential runs but not concurrent ones.
type Runner struct {
	cfg         RunnerConfig
	endpoints   []string
	clock       clock.Clock
	log         *zap.Logger
	progress    io.Writer
	progressTTY bool
	transport   *http.Transport
	client      *http.Client

	sent, done, failed atomic.Int64
}

// RunnerDeps are the runner's collaborators.
type RunnerDeps struct {
	// Clock paces and times requests (nil: the wall clock). Per-request
	// timeouts are network deadlines and use the context's wall-clock
	// deadline.
	Clock clock.Clock
	// Log receives diagnostics (nil: discarded).
	Log *zap.Logger
	// Progress receives the progress line (nil: none). With ProgressTTY the
	// line is redrawn in place; otherwise one line is written per refresh.
	Progress    io.Writer
	ProgressTTY bool
}

// NewRunner builds a runner. It starts nothing.
func NewRunner(cfg RunnerConfig, deps RunnerDeps) (*Runner, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.Log == nil {
		deps.Log = zap.NewNop()
	}
	eps := make([]string, len(cfg.Targets))
	for i, t := range cfg.Targets {
		t = strings.TrimRight(t, "/")
		if strings.HasSuffix(t, "/v1") {
			eps[i] = t + "/completions"
		} else {
			eps[i] = t + "/v1/completions"
		}
	}
	idle := cfg.Concurrency
	if idle == 0 {
		idle = 1024
	}
	tr := &http.Transport{
		// A load generator talks to the endpoints directly: no proxy from
		// the environment, no gzip (it would buffer the event stream).
		Proxy:               nil,
		DisableCompression:  true,
		MaxIdleConns:        idle,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Runner{
		cfg: cfg, endpoints: eps, clock: deps.Clock, log: deps.Log.Named("bench_runner"),
		progress: deps.Progress, progressTTY: deps.ProgressTTY,
		transport: tr, client: &http.Client{Transport: tr},
	}, nil
}

// Run replays src: request i is sent at start + Arrival_i/Speedup (or as
// soon after as a concurrency slot frees), and sink receives each request's
// Result, one call at a time, as it completes. Run returns after every
// request it sent has ended and every goroutine it started has exited. It
// returns ctx.Err() if cancelled (in-flight requests end as
// OutcomeCancelled) and a source error (for example a *LineError) if the
// trace failed; requests sent before either still reach sink.
func (r *Runner) Run(ctx context.Context, src Source, sink func(Result)) (RunStats, error) {
	r.sent.Store(0)
	r.done.Store(0)
	r.failed.Store(0)
	defer r.transport.CloseIdleConnections()

	idPrefix := r.cfg.RequestIDPrefix
	if idPrefix == "" {
		idPrefix = "bench-" + strconv.FormatUint(rand.Uint64()&0xffffffff, 16)
	}
	start := r.clock.Now()
	stats := RunStats{Started: start}

	var sinkMu sync.Mutex
	emit := func(res Result) {
		r.done.Add(1)
		if res.Outcome != OutcomeOK {
			r.failed.Add(1)
			r.log.Debug("request failed", zap.Int("index", res.Index), zap.String("target", res.Target),
				zap.Stringer("outcome", res.Outcome), zap.Int("http_status", res.HTTPStatus),
				zap.String("error_code", res.ErrorCode), zap.String("error", res.Error))
		}
		sinkMu.Lock()
		defer sinkMu.Unlock()
		sink(res)
	}

	var wg sync.WaitGroup
	progCtx, stopProgress := context.WithCancel(ctx)
	if r.progress != nil {
		wg.Go(func() { r.printProgress(progCtx, start) })
	}

	var slots chan struct{}
	if r.cfg.Concurrency > 0 {
		slots = make(chan struct{}, r.cfg.Concurrency)
	}
	var reqWG sync.WaitGroup
	var runErr error
	for r.cfg.MaxRequests == 0 || stats.Dispatched < r.cfg.MaxRequests {
		req, err := src.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			runErr = fmt.Errorf("trace: %w", err)
			break
		}
		// The body is built before waiting, so its cost does not delay
		// the send.
		body := r.body(&req)
		scheduled := time.Duration(float64(req.Arrival) / r.cfg.Speedup)
		if err := clock.SleepUntil(ctx, r.clock, start.Add(scheduled)); err != nil {
			runErr = err
			break
		}
		if slots != nil {
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				runErr = ctx.Err()
			}
			if runErr != nil {
				break
			}
		}
		endpoint, target := r.endpoints[stats.Dispatched%len(r.endpoints)], r.cfg.Targets[stats.Dispatched%len(r.endpoints)]
		stats.Dispatched++
		r.sent.Add(1)
		reqWG.Go(func() {
			if slots != nil {
				defer func() { <-slots }()
			}
			emit(r.do(ctx, &req, body, idPrefix, endpoint, target, start, scheduled))
		})
	}
	reqWG.Wait()
	stats.Finished = r.clock.Now()
	stopProgress()
	wg.Wait()
	if r.progress != nil {
		r.writeProgress(stats.Finished, start, true)
	}
	r.log.Info("run finished", zap.Int("dispatched", stats.Dispatched), zap.Int64("failed", r.failed.Load()),
		zap.Duration("elapsed", stats.Finished.Sub(start)), zap.NamedError("stop_reason", runErr))
	return stats, runErr
}

// body renders the completions request. Built by hand: a prompt is up to
// ~100k token ids and encoding/json would reflect over each.
func (r *Runner) body(req *TraceRequest) []byte {
	model, _ := json.Marshal(r.cfg.Model) // a string always marshals
	b := make([]byte, 0, 64+len(model)+7*req.InputLength)
	b = append(b, `{"model":`...)
	b = append(b, model...)
	b = append(b, `,"prompt":[`...)
	for i, t := range req.Tokens(r.cfg.Vocab) {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendUint(b, uint64(t), 10)
	}
	b = append(b, `],"max_tokens":`...)
	b = strconv.AppendInt(b, int64(req.OutputLength), 10)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	if r.cfg.IgnoreEOS {
		b = append(b, `,"ignore_eos":true`...)
	}
	return append(b, '}')
}

// do sends one request and measures it.
// The result is a named return so the deferred E2E and deadline accounting
// applies on every path.
func (r *Runner) do(ctx context.Context, req *TraceRequest, body []byte, idPrefix, endpoint, target string, start time.Time, scheduled time.Duration) (res Result) {
	res = Result{
		Index: req.Index, Session: req.Session, Class: req.Class, Priority: req.Priority,
		Deadline: req.Deadline, Target: target, Scheduled: scheduled,
		InputTokens: req.InputLength, MaxTokens: req.OutputLength,
	}
	reqCtx, cancel := ctx, context.CancelFunc(func() {})
	if r.cfg.Timeout > 0 {
		reqCtx, cancel = context.WithTimeout(ctx, r.cfg.Timeout)
	}
	defer cancel()

	hr, err := http.NewRequestWithContext(reqCtx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil { // endpoints were validated; this is a bug, reported as transport error
		res.Outcome, res.Error = OutcomeTransportError, err.Error()
		return res
	}
	hr.Header.Set("Content-Type", "application/json")
	hr.Header.Set("Accept", "text/event-stream")
	hr.Header.Set("X-Request-Id", idPrefix+"-"+strconv.Itoa(req.Index))
	if req.Class != "" {
		hr.Header.Set("x-switchyard-class", req.Class)
	}
	if req.Priority != 0 {
		hr.Header.Set("x-switchyard-priority", strconv.Itoa(req.Priority))
	}
	if req.Deadline > 0 {
		// Whole milliseconds, rounded up so a sub-millisecond deadline is
		// not sent as "no deadline".
		dl := (req.Deadline + time.Millisecond - 1) / time.Millisecond
		hr.Header.Set("x-switchyard-deadline-ms", strconv.FormatInt(int64(dl), 10))
	}

	sent := r.clock.Now()
	res.Sent = sent.Sub(start)
	defer func() {
		res.E2E = r.clock.Now().Sub(sent)
		res.DeadlineMissed = req.Deadline > 0 &&
			(res.ErrorCode == "deadline_exceeded" || (res.Chunks > 0 && res.TTFT > req.Deadline))
	}()

	resp, err := r.client.Do(hr)
	if err != nil {
		r.failure(ctx, reqCtx, &res, err)
		return res
	}
	defer resp.Body.Close()
	if r.cfg.WorkerHeader != "" {
		res.Worker = resp.Header.Get(r.cfg.WorkerHeader)
	}
	res.HTTPStatus = resp.StatusCode
	if resp.StatusCode/100 != 2 {
		res.Outcome = OutcomeHTTPError
		raw, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var e struct {
			Error *apiError `json:"error"`
		}
		if json.Unmarshal(raw, &e) == nil && e.Error != nil {
			res.ErrorCode, res.Error = e.Error.code(), truncate(e.Error.Message, 500)
		} else {
			res.Error = truncate(strings.TrimSpace(string(raw)), 500)
		}
		return res
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		streamFailed(&res, "not_event_stream", fmt.Sprintf("content type %q, want text/event-stream", ct))
		return res
	}
	if err := readStream(resp.Body, r.clock.Now, sent, &res); err != nil {
		r.failure(ctx, reqCtx, &res, err)
		return res
	}
	if res.Outcome == 0 {
		res.Outcome = OutcomeOK
		if res.CompletionTokens == 0 && res.PromptTokens == 0 {
			// No usage chunk: fall back to what was observed.
			res.CompletionTokens = res.Chunks
		}
	}
	return res
}

// failure classifies a transport-level error: run cancelled, request timed
// out, or anything else.
func (r *Runner) failure(runCtx, reqCtx context.Context, res *Result, err error) {
	switch {
	case runCtx.Err() != nil:
		res.Outcome = OutcomeCancelled
	case reqCtx.Err() != nil:
		res.Outcome = OutcomeTimeout
	default:
		res.Outcome = OutcomeTransportError
	}
	res.Error = truncate(err.Error(), 500)
}

// printProgress refreshes the progress line every ProgressInterval until
// ctx is done.
func (r *Runner) printProgress(ctx context.Context, start time.Time) {
	next := start
	for {
		next = next.Add(r.cfg.ProgressInterval)
		if clock.SleepUntil(ctx, r.clock, next) != nil {
			return
		}
		r.writeProgress(r.clock.Now(), start, false)
	}
}

func (r *Runner) writeProgress(now, start time.Time, final bool) {
	el := now.Sub(start).Seconds()
	rps := 0.0
	if el > 0 {
		rps = float64(r.done.Load()) / el
	}
	line := fmt.Sprintf("sent=%d done=%d errors=%d rps=%.2f elapsed=%.0fs",
		r.sent.Load(), r.done.Load(), r.failed.Load(), rps, el)
	switch {
	case !r.progressTTY:
		fmt.Fprintln(r.progress, line)
	case final:
		fmt.Fprint(r.progress, "\r\x1b[K"+line+"\n")
	default:
		// \r and clear-to-end-of-line redraw one line in place.
		fmt.Fprint(r.progress, "\r\x1b[K"+line)
	}
}
