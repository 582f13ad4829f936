package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"
)

// DriverConfig configures the load driver. DefaultDriverConfig holds every
// default.
type DriverConfig struct {
	// Targets are the routers' base URLs (http://127.0.0.1:18081 ...).
	// Requests go round robin over the enabled ones.
	Targets []string
	// Rate is the steady request rate in requests per second (open loop: a
	// slow answer does not slow the sending).
	Rate float64
	// MaxRequests stops the driver after that many requests; 0 = until the
	// context passed to Run is done.
	MaxRequests int
	// Model is the model name sent.
	Model string
	// MaxTokens is each request's max_tokens.
	MaxTokens int
	// BatchEvery sends every n-th request in class "batch"; the others go to
	// class "interactive", which is therefore the busiest. 0 = never batch.
	BatchEvery int
	// Prefixes is how many distinct shared prompt prefixes the prompts cycle
	// through, so KV-aware routing has cache hits to find.
	Prefixes int
	// RequestTimeout bounds one request from send to the end of its stream.
	RequestTimeout time.Duration
	// Redirects is how many times a request that no router took in is
	// sent again, to the next target, as a client behind a load balancer
	// would: no answer at all before any response byte (refused, or a
	// keep-alive connection closed under it), or a 503 not_ready or
	// shutting_down, which a router answers before admission. 0 = never.
	// The targets stay in the rotation: the driver never avoids a router.
	Redirects int
	// APIKey, if set, is sent as "Authorization: Bearer APIKey" (routers
	// with a keys file).
	APIKey string
}

// DefaultDriverConfig returns the defaults of the driver.
func DefaultDriverConfig() DriverConfig {
	return DriverConfig{
		Rate:           25,
		Model:          "switchyard-sim",
		MaxTokens:      16,
		BatchEvery:     5,
		Prefixes:       8,
		RequestTimeout: 60 * time.Second,
	}
}

// Validate names the first bad field.
func (c DriverConfig) Validate() error {
	switch {
	case len(c.Targets) == 0:
		return errors.New("driver config: Targets must not be empty")
	case !(c.Rate > 0) || c.Rate > 10000:
		return fmt.Errorf("driver config: Rate %v must be in (0, 10000]", c.Rate)
	case c.MaxRequests < 0:
		return fmt.Errorf("driver config: MaxRequests %d must not be negative", c.MaxRequests)
	case c.Model == "":
		return errors.New("driver config: Model must not be empty")
	case c.MaxTokens <= 0:
		return fmt.Errorf("driver config: MaxTokens %d must be positive", c.MaxTokens)
	case c.BatchEvery < 0:
		return fmt.Errorf("driver config: BatchEvery %d must not be negative", c.BatchEvery)
	case c.Prefixes <= 0:
		return fmt.Errorf("driver config: Prefixes %d must be positive", c.Prefixes)
	case c.RequestTimeout <= 0:
		return fmt.Errorf("driver config: RequestTimeout %v must be positive", c.RequestTimeout)
	case c.Redirects < 0:
		return fmt.Errorf("driver config: Redirects %d must not be negative", c.Redirects)
	}
	return nil
}

// Result is one request's record. The driver writes it once, when the
// request reached its terminal outcome.
type Result struct {
	Seq       int
	Target    string // router base URL the request entered
	Class     string
	Start     time.Time
	End       time.Time
	Status    int // HTTP status; 0 when none arrived
	Outcome   Outcome
	Code      string // error code from the error body or error event
	Worker    string // x-switchyard-routed-worker
	RequestID string // x-request-id
	Chunks    int
	Err       string
	// Header is when the response headers arrived (zero: none did): a
	// streamed request's wait for admission and the worker's first byte.
	Header time.Time
	// Redirected counts the earlier attempts no router took in (see
	// DriverConfig.Redirects); Target is the last attempt's router.
	Redirected int
}

// Admitted reports whether a router granted the request a worker (the
// response started streaming from one).
func (r Result) Admitted() bool {
	return r.Status == http.StatusOK
}

// Driver sends streaming chat completions at a steady rate and records each
// request's terminal outcome.
type Driver struct {
	cfg    DriverConfig
	client *http.Client

	mu       sync.Mutex
	disabled map[string]bool
	inflight map[string]int // by target
	onWorker map[string]int // streams in flight per routed worker
	results  []Result
	sent     int
}

// NewDriver checks cfg; client nil means a client with no overall timeout
// (each request has its own) and connections kept per target.
func NewDriver(cfg DriverConfig, client *http.Client) (*Driver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if client == nil {
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}
	}
	return &Driver{cfg: cfg, client: client, disabled: map[string]bool{}, inflight: map[string]int{}, onWorker: map[string]int{}}, nil
}

// Close releases the idle connections of the driver's client. Call it after
// Run returned.
func (d *Driver) Close() { d.client.CloseIdleConnections() }

// SetEnabled takes a target out of (or back into) the rotation, as a load
// balancer's health check would. Requests in flight on it are unaffected.
func (d *Driver) SetEnabled(target string, on bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.disabled[target] = !on
}

// InFlight is the number of requests in flight through target.
func (d *Driver) InFlight(target string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.inflight[target]
}

// BusiestWorker is the worker with the most streams in flight now, and how
// many; "" when none is streaming.
func (d *Driver) BusiestWorker() (string, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	best, n := "", 0
	for w, c := range d.onWorker {
		if c > n || (c == n && w < best) {
			best, n = w, c
		}
	}
	return best, n
}

// Results returns a copy of the finished requests' records, in sequence order.
func (d *Driver) Results() []Result {
	d.mu.Lock()
	out := append([]Result(nil), d.results...)
	d.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

// Sent is the number of requests sent so far.
func (d *Driver) Sent() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sent
}

// Run sends requests until ctx is done or MaxRequests were sent, then waits
// for every request in flight to reach its outcome (ctx does not cut them
// short: each is bounded by RequestTimeout). It returns only after all the
// goroutines it started exited.
func (d *Driver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	interval := time.Duration(float64(time.Second) / d.cfg.Rate)
	tick := time.NewTicker(interval)
	defer tick.Stop()
	next := 0 // round-robin position
	for seq := 0; d.cfg.MaxRequests == 0 || seq < d.cfg.MaxRequests; seq++ {
		target, ok := d.pick(&next)
		if ok {
			d.mu.Lock()
			d.sent++
			d.inflight[target]++
			d.mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				d.record(d.send(ctx, seq, target))
			}()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
	return nil
}

func (d *Driver) pick(next *int) (string, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for range d.cfg.Targets {
		t := d.cfg.Targets[*next%len(d.cfg.Targets)]
		*next++
		if !d.disabled[t] {
			return t, true
		}
	}
	return "", false
}

func (d *Driver) record(r Result) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.inflight[r.Target]--
	d.results = append(d.results, r)
}

func (d *Driver) class(seq int) string {
	if d.cfg.BatchEvery > 0 && seq%d.cfg.BatchEvery == d.cfg.BatchEvery-1 {
		return "batch"
	}
	return "interactive"
}

// prompt shares a long prefix among every Prefixes-th request and ends with
// a unique suffix, so the KV index has real overlaps to route by.
func (d *Driver) prompt(seq int) string {
	p := seq % d.cfg.Prefixes
	var b strings.Builder
	for i := range 24 {
		fmt.Fprintf(&b, "shared prefix %d sentence %d about routing and caches. ", p, i)
	}
	fmt.Fprintf(&b, "Question %d: what happens next?", seq)
	return b.String()
}

// send runs one request, redirecting it to the next targets while no
// router took it in (DriverConfig.Redirects).
func (d *Driver) send(ctx context.Context, seq int, target string) Result {
	r := d.do(ctx, seq, target)
	for n := 1; n <= d.cfg.Redirects && notTakenIn(r); n++ {
		<-time.After(50 * time.Millisecond) // a short pause, as a client's retry would make
		next := d.nextTarget(target, 1)
		d.mu.Lock()
		d.inflight[target]--
		d.inflight[next]++
		d.mu.Unlock()
		target = next
		start := r.Start
		r = d.do(ctx, seq, target)
		r.Start, r.Redirected = start, n
	}
	return r
}

// notTakenIn reports whether no router took the request in: nothing was
// answered at all, or a 503 that routers send before admission.
func notTakenIn(r Result) bool {
	return r.Outcome == OutcomeTransport || (r.Status == http.StatusServiceUnavailable && (r.Code == "not_ready" || r.Code == "shutting_down"))
}

// nextTarget is the n-th target after target in the configured order.
func (d *Driver) nextTarget(target string, n int) string {
	for i, t := range d.cfg.Targets {
		if t == target {
			return d.cfg.Targets[(i+n)%len(d.cfg.Targets)]
		}
	}
	return target
}

func (d *Driver) do(ctx context.Context, seq int, target string) Result {
	r := Result{Seq: seq, Target: target, Class: d.class(seq), Start: time.Now()}
	defer func() { r.End = time.Now() }()
	body, _ := json.Marshal(map[string]any{
		"model":      d.cfg.Model,
		"stream":     true,
		"max_tokens": d.cfg.MaxTokens,
		"messages":   []map[string]string{{"role": "user", "content": d.prompt(seq)}},
	})
	// The request outlives the driver's stop signal: stopping means "send no
	// more", and every request sent must reach its own outcome.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.cfg.RequestTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodPost, target+"/v1/chat/completions", bytes.NewReader(body))
	if err != nil {
		r.Outcome, r.Err = OutcomeTransport, err.Error()
		return r
	}
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-switchyard-class", r.Class)
	if d.cfg.APIKey != "" {
		req.Header.Set("authorization", "Bearer "+d.cfg.APIKey)
	}
	resp, err := d.client.Do(req)
	if err != nil {
		r.Outcome, r.Err = transportOutcome(rctx, err), err.Error()
		return r
	}
	defer resp.Body.Close()
	r.Header = time.Now()
	r.Status = resp.StatusCode
	r.RequestID = resp.Header.Get("x-request-id")
	r.Worker = resp.Header.Get("x-switchyard-routed-worker")
	if resp.StatusCode != http.StatusOK {
		r.Outcome, r.Code = OutcomeRejected, errorCode(resp.Body)
		return r
	}
	if r.Worker != "" {
		d.mu.Lock()
		d.onWorker[r.Worker]++
		d.mu.Unlock()
		defer func() {
			d.mu.Lock()
			d.onWorker[r.Worker]--
			d.mu.Unlock()
		}()
	}
	s, err := DecodeStream(resp.Body)
	r.Chunks, r.Code = s.Chunks, s.ErrorCode
	switch {
	case errors.Is(err, ErrMalformedStream):
		r.Outcome, r.Err = OutcomeMalformed, err.Error()
	case err != nil && !s.Complete:
		r.Outcome, r.Err = transportOutcome(rctx, err), err.Error()
		if r.Outcome == OutcomeTransport {
			r.Outcome = OutcomeTruncated // the response had started
		}
	default:
		r.Outcome = s.Outcome()
	}
	return r
}

func transportOutcome(ctx context.Context, err error) Outcome {
	if errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
		return OutcomeTimeout
	}
	return OutcomeTransport
}

// errorCode extracts error.code from an OpenAI error body ("" if none).
func errorCode(body io.Reader) string {
	raw, _ := io.ReadAll(io.LimitReader(body, 64<<10))
	var doc struct {
		Error struct {
			Code any `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(raw, &doc) != nil || doc.Error.Code == nil {
		return ""
	}
	return fmt.Sprint(doc.Error.Code)
}

// Tally counts results by outcome.
func Tally(rs []Result) map[Outcome]int {
	out := map[Outcome]int{}
	for _, r := range rs {
		out[r.Outcome]++
	}
	return out
}
