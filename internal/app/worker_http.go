package app

import (
	"bytes"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/wire"
)

// worker is one running worker process. The engine owns scheduling; HTTP
// handlers only submit, relay deliveries and cancel.
type worker struct {
	cfg      WorkerConfig
	log      *zap.Logger
	eng      *engine.Engine
	nc       *nats.Conn
	subjects wire.Subjects
	url      string
	metrics  *workerMetrics
	gatherer prometheus.Gatherer
	ready    atomic.Bool
	handlers handlerTracker
	nextID   atomic.Uint64
	prompts  *prompt.Registry
	// Disaggregation (worker_pd.go): the KV a prefill holds for its
	// decodes, the client decodes fetch it with, the bootstrap server's
	// bound address (SGLang prefill), and the engine clock.
	holds         *kvHolds
	pdClient      *http.Client
	bootstrapAddr string
	now           func() time.Time
}

// handlerTracker counts in-flight API handlers so shutdown can wait for them (the
// http.Server does not wait for handlers after Close).
type handlerTracker struct {
	mu     sync.Mutex
	n      int
	closed bool
	zero   chan struct{}
}

func (t *handlerTracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

func (t *handlerTracker) leave() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.n--
	if t.n == 0 && t.zero != nil {
		close(t.zero)
		t.zero = nil
	}
}

// Wait refuses new handlers and returns once the running ones returned.
func (t *handlerTracker) Wait() {
	t.mu.Lock()
	t.closed = true
	if t.n == 0 {
		t.mu.Unlock()
		return
	}
	z := make(chan struct{})
	t.zero = z
	t.mu.Unlock()
	<-z
}

func (w *worker) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", w.handle("completions", w.handleGenerate(prompt.KindCompletion)))
	mux.HandleFunc("POST /v1/chat/completions", w.handle("chat_completions", w.handleGenerate(prompt.KindChat)))
	mux.HandleFunc("POST /v1/responses", w.handle("responses", w.handleGenerate(prompt.KindResponse)))
	mux.HandleFunc("POST /v1/embeddings", w.handle("embeddings", w.handleEmbeddings))
	if w.cfg.Messages {
		w.messagesRoutes(mux) // worker_messages.go
	}
	mux.HandleFunc("GET /v1/kv_transfer/{id}", w.handleKVPull)
	mux.HandleFunc("POST /tokenize", w.handle("tokenize", w.handleTokenize))
	mux.HandleFunc("GET /v1/models", w.handleModels)
	mux.HandleFunc("GET /healthz", func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok\n") })
	mux.HandleFunc("GET /readyz", func(rw http.ResponseWriter, _ *http.Request) {
		if !w.ready.Load() {
			http.Error(rw, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = io.WriteString(rw, "ready\n")
	})
	if w.gatherer != nil {
		mux.Handle("GET /metrics", promhttp.HandlerFor(w.gatherer, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("/", func(rw http.ResponseWriter, r *http.Request) {
		writeWorkerError(rw, &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "not_found",
			Message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)})
	})
	return mux
}

func (w *worker) handleModels(rw http.ResponseWriter, _ *http.Request) {
	data := []map[string]any{}
	for _, m := range w.servedNames() {
		data = append(data, map[string]any{"id": m, "object": "model", "created": 0, "owned_by": "switchyard"})
	}
	writeWorkerJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// servedNames is the model name and its aliases.
func (w *worker) servedNames() []string {
	return append([]string{w.cfg.Model}, w.cfg.Models...)
}

func (w *worker) serves(model string) bool { return slices.Contains(w.servedNames(), model) }

// newWorkerPrompts is the worker's tokenizer registry: every served name
// uses the worker's one tokenizer spec.
func newWorkerPrompts(cfg WorkerConfig, log *zap.Logger) (*prompt.Registry, error) {
	pc := prompt.DefaultConfig()
	pc.Tokenizers = map[string]string{}
	for _, m := range append([]string{cfg.Model}, cfg.Models...) {
		pc.Tokenizers[m] = cfg.Tokenizer
	}
	return prompt.NewRegistry(pc, prompt.Deps{}, log, nil)
}

// tokenize is the worker's tokenizeFunc.
func (w *worker) tokenize(model string, in *prompt.Input) ([][]uint32, error) {
	return w.prompts.TokenizeEach(model, in)
}

// piece is the text of one generated token under the model's tokenizer.
func (w *worker) piece(model string, id uint32) string {
	if m, _ := w.prompts.Model(model); m != nil && m.Decode != nil {
		return m.Decode([]uint32{id})
	}
	return tokenizer.Piece(id)
}

// tokenizerSource is what the worker advertises in its registration: its
// tokenizer spec when routers have it built in.
func (w *worker) tokenizerSource() *wire.TokenizerSource {
	if prompt.BuiltinSpec(w.cfg.Tokenizer) {
		return &wire.TokenizerSource{Spec: w.cfg.Tokenizer}
	}
	return nil
}

// workerAPIError is an OpenAI-shaped error response.
type workerAPIError struct {
	Status  int    `json:"-"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    string `json:"code"`
}

func workerBadRequest(param, code, msg string) *workerAPIError {
	e := &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: code, Message: msg}
	if param != "" {
		e.Param = param
	}
	return e
}

func writeWorkerError(rw http.ResponseWriter, e *workerAPIError) {
	writeWorkerJSON(rw, e.Status, map[string]*workerAPIError{"error": e})
}

func writeWorkerJSON(rw http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil { // only our own types are written: a bug, not bad input
		http.Error(rw, "encode response", http.StatusInternalServerError)
		return
	}
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(status)
	_, _ = rw.Write(append(b, '\n'))
}

// genRequest is a validated generation, embeddings or responses request.
type genRequest struct {
	Kind  prompt.Kind
	Model string
	// Prompts are the prompt token ids, one per batched prompt (a chat or a
	// responses input is one).
	Prompts      [][]uint32
	MaxTokens    int
	Stream       bool
	IncludeUsage bool
	Priority     int
	// N is how many sequences each prompt generates (OpenAI's n): choice
	// i*N+j is prompt i's sequence j, as vLLM numbers them.
	N int
	// PD is the disaggregation part (kv_transfer_params or SGLang's
	// bootstrap fields); nil for an ordinary request.
	PD *pdRequest
	// StopAfter, when positive, ends each sequence as a stop (EOS) after
	// that many tokens: the simulated engine has no EOS of its own, and a
	// prefill whose one token ends the sequence must be testable
	// (request field sim_stop_after).
	StopAfter int
	// Base64 asks for embeddings as base64 little-endian float32.
	Base64 bool
	// ToolCall is the function a chat answers by calling (its output
	// becomes the call's arguments); "" answers with text.
	ToolCall string
}

type rawGenRequest struct {
	prompt.Fields
	rawSampling
	Model               string `json:"model"`
	MaxTokens           *int64 `json:"max_tokens"`
	MaxCompletionTokens *int64 `json:"max_completion_tokens"`
	MaxOutputTokens     *int64 `json:"max_output_tokens"`
	Stream              *bool  `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N              *int64 `json:"n"`
	BestOf         *int64 `json:"best_of"`
	Priority       *int64 `json:"priority"`
	EncodingFormat string `json:"encoding_format"`
	// ToolChoice forces a tool call when it names a function or says
	// "required" (worker_messages.go).
	ToolChoice json.RawMessage `json:"tool_choice"`
	// Disaggregation (worker_pd.go): vLLM's kv_transfer_params, SGLang's
	// bootstrap fields.
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
	BootstrapHost    *string         `json:"bootstrap_host"`
	BootstrapPort    *int64          `json:"bootstrap_port"`
	BootstrapRoom    *uint64         `json:"bootstrap_room"`
	SimStopAfter     *int64          `json:"sim_stop_after"`
}

// tokenizeFunc turns a parsed prompt into per-prompt token ids for a model
// (the worker's prompt registry: the same code routers hash with).
type tokenizeFunc func(model string, in *prompt.Input) ([][]uint32, error)

// parseGenRequest decodes and validates a request body of kind. maxLen
// bounds prompt plus output; defaultMax applies when no max_tokens is given
// (capped to what fits). tok tokenizes the prompt.
func parseGenRequest(body []byte, kind prompt.Kind, tok tokenizeFunc, defaultMax, maxLen int) (*genRequest, *workerAPIError) {
	var raw rawGenRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&raw); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, workerBadRequest(te.Field, "invalid_type", fmt.Sprintf("%s has the wrong type (%s)", te.Field, te.Value))
		}
		return nil, workerBadRequest("", "invalid_json", "the body is not valid JSON: "+err.Error())
	}
	if dec.More() {
		return nil, workerBadRequest("", "invalid_json", "the body has data after the JSON object")
	}
	if raw.Model == "" {
		return nil, workerBadRequest("model", "missing_required_parameter", "you must provide a model")
	}
	if kind == prompt.KindChat || kind == prompt.KindCompletion {
		if e := checkSampling(kind, &raw.rawSampling); e != nil {
			return nil, e
		}
	}
	req := &genRequest{Kind: kind, Model: raw.Model, Base64: raw.EncodingFormat == "base64"}
	if kind == prompt.KindChat || kind == prompt.KindCompletion {
		var apiErr *workerAPIError
		if req.PD, apiErr = parsePD(&raw); apiErr != nil {
			return nil, apiErr
		}
		if raw.SimStopAfter != nil {
			if *raw.SimStopAfter < 1 || *raw.SimStopAfter > math.MaxInt32 {
				return nil, workerBadRequest("sim_stop_after", "invalid_value", "sim_stop_after must be a positive token count")
			}
			req.StopAfter = int(*raw.SimStopAfter)
		}
	}
	in, err := prompt.Parse(kind, &raw.Fields)
	if err != nil {
		return nil, promptAPIError(err)
	}
	if req.Prompts, err = tok(raw.Model, in); err != nil {
		return nil, promptAPIError(err)
	}
	if kind == prompt.KindChat {
		req.ToolCall = forcedTool(raw.ToolChoice, in)
	}
	param := map[prompt.Kind]string{prompt.KindChat: "messages", prompt.KindCompletion: "prompt"}[kind]
	if param == "" {
		param = "input"
	}
	longest := 0
	for _, p := range req.Prompts {
		if len(p) == 0 {
			return nil, workerBadRequest(param, "invalid_value", "the prompt has no tokens")
		}
		longest = max(longest, len(p))
	}
	req.N = 1
	if raw.N != nil {
		switch {
		case kind != prompt.KindChat && kind != prompt.KindCompletion:
			if *raw.N != 1 {
				return nil, workerBadRequest("n", "invalid_value", "only n=1 is supported here")
			}
		case *raw.N < 1 || *raw.N > maxWorkerN:
			return nil, workerBadRequest("n", "invalid_value", fmt.Sprintf("n must be between 1 and %d, got %d", maxWorkerN, *raw.N))
		default:
			req.N = int(*raw.N)
		}
	}
	// best_of generates that many and returns the n best: the simulated
	// engine has no "best", so it serves best_of only equal to n.
	if raw.BestOf != nil && *raw.BestOf != int64(req.N) {
		return nil, workerBadRequest("best_of", "invalid_value", "the simulated engine serves best_of only equal to n")
	}
	if kind == prompt.KindEmbedding {
		if longest > maxLen {
			return nil, &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param,
				Code: "context_length_exceeded", Message: fmt.Sprintf("this model's maximum context length is %d tokens; the input has %d", maxLen, longest)}
		}
		return req, nil
	}
	mt, mparam := raw.MaxTokens, "max_tokens"
	switch {
	case kind == prompt.KindResponse:
		mt, mparam = raw.MaxOutputTokens, "max_output_tokens"
	case raw.MaxCompletionTokens != nil:
		mt, mparam = raw.MaxCompletionTokens, "max_completion_tokens"
	}
	room := maxLen - longest
	switch {
	case mt == nil:
		req.MaxTokens = min(defaultMax, room)
	case *mt < 1:
		return nil, workerBadRequest(mparam, "invalid_value", fmt.Sprintf("%s must be at least 1, got %d", mparam, *mt))
	case *mt > int64(room):
		req.MaxTokens = math.MaxInt32 // reported below as too long
	default:
		req.MaxTokens = int(*mt)
	}
	if room < 1 || req.MaxTokens > room {
		return nil, &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: mparam,
			Code: "context_length_exceeded", Message: fmt.Sprintf(
				"this model's maximum context length is %d tokens; the prompt has %d tokens and leaves no room for the requested output",
				maxLen, longest)}
	}
	if raw.Stream != nil {
		req.Stream = *raw.Stream
	}
	if raw.StreamOptions != nil {
		req.IncludeUsage = raw.StreamOptions.IncludeUsage
	}
	if raw.Priority != nil {
		if *raw.Priority < math.MinInt32 || *raw.Priority > math.MaxInt32 {
			return nil, workerBadRequest("priority", "invalid_value", "priority is out of range")
		}
		req.Priority = int(*raw.Priority)
	}
	return req, nil
}

// maxWorkerN bounds n (the router's bound too, OpenAI's limit).
const maxWorkerN = 128

// promptAPIError maps a prompt package error to a 400.
func promptAPIError(err error) *workerAPIError {
	var re *prompt.RequestError
	if errors.As(err, &re) {
		return workerBadRequest(re.Param, re.Code, re.Message)
	}
	return workerBadRequest("messages", "invalid_value", err.Error())
}

// Response shapes (OpenAI).
type usageOut struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

type chatContent struct {
	Role      string        `json:"role,omitempty"`
	Content   string        `json:"content"`
	ToolCalls []toolCallOut `json:"tool_calls,omitempty"`
}

type choiceOut struct {
	Index        int          `json:"index"`
	Text         *string      `json:"text,omitempty"`
	Message      *chatContent `json:"message,omitempty"`
	Delta        *chatContent `json:"delta,omitempty"`
	Logprobs     any          `json:"logprobs"`
	FinishReason *string      `json:"finish_reason"`
}

type responseOut struct {
	ID      string      `json:"id"`
	Object  string      `json:"object"`
	Created int64       `json:"created"`
	Model   string      `json:"model"`
	Choices []choiceOut `json:"choices"`
	Usage   *usageOut   `json:"usage,omitempty"`
	// KVTransferParams is a vLLM prefill's answer for its decode
	// (worker_pd.go), copied by routers unchanged.
	KVTransferParams json.RawMessage `json:"kv_transfer_params,omitempty"`
}

// handle wraps an API handler with the shutdown tracker, the body limit and
// the request counter (endpoint label).
func (w *worker) handle(endpoint string, h func(rw http.ResponseWriter, r *http.Request, body []byte) string) http.HandlerFunc {
	count := func(outcome string) { w.metrics.requests.WithLabelValues(endpoint, outcome).Inc() }
	return func(rw http.ResponseWriter, r *http.Request) {
		if !w.handlers.enter() {
			count("unavailable")
			writeWorkerError(rw, &workerAPIError{Status: http.StatusServiceUnavailable, Type: "server_error",
				Code: "shutting_down", Message: "the worker is shutting down"})
			return
		}
		defer w.handlers.leave()
		body, err := io.ReadAll(http.MaxBytesReader(rw, r.Body, w.cfg.MaxBodyBytes))
		if err != nil {
			var tooBig *http.MaxBytesError
			if errors.As(err, &tooBig) {
				count("bad_request")
				writeWorkerError(rw, &workerAPIError{Status: http.StatusRequestEntityTooLarge, Type: "invalid_request_error",
					Code: "body_too_large", Message: fmt.Sprintf("the body exceeds %d bytes", tooBig.Limit)})
				return
			}
			// The connection failed before the body was whole: nothing
			// was served, and a router re-admits the request elsewhere.
			count("unread")
			return
		}
		count(h(rw, r, body))
	}
}

// parse validates a request of kind for this worker: a model it serves,
// the prompt tokenized as routers tokenize it.
func (w *worker) parse(r *http.Request, body []byte, kind prompt.Kind) (*genRequest, *workerAPIError) {
	req, apiErr := parseGenRequest(body, kind, w.tokenize, w.cfg.DefaultMaxTokens, w.cfg.Engine.MaxModelLen)
	if apiErr == nil && !w.serves(req.Model) {
		apiErr = &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
			Code: "model_not_found", Message: fmt.Sprintf("the model %q does not exist; this worker serves %q", req.Model, w.cfg.Model)}
	}
	if apiErr == nil {
		if v := r.Header.Get("x-switchyard-priority"); v != "" {
			p, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
			if err != nil {
				apiErr = workerBadRequest("x-switchyard-priority", "invalid_value", "the priority header must be an integer")
			}
			req.Priority = int(p)
		}
	}
	return req, apiErr
}

func (w *worker) handleGenerate(kind prompt.Kind) func(http.ResponseWriter, *http.Request, []byte) string {
	return func(rw http.ResponseWriter, r *http.Request, body []byte) string {
		req, apiErr := w.parse(r, body, kind)
		if apiErr != nil {
			writeWorkerError(rw, apiErr)
			return "bad_request"
		}
		id := fmt.Sprintf("%s-%d", w.cfg.ID, w.nextID.Add(1))
		if v := r.Header.Get("x-request-id"); v != "" && len(v) <= 128 {
			id = v // a caller-chosen id makes the synthetic output reproducible
		}
		resp := &responder{w: w, rw: rw, kind: kind, req: req, id: id, created: time.Now().Unix()}
		seed := kvindex.ModelSeed(req.Model)
		var transfer *engine.Transfer
		if req.PD != nil {
			kv, apiErr := w.pdPrepare(r, req)
			if apiErr != nil {
				writeWorkerError(rw, apiErr)
				return "bad_request"
			}
			if kv != nil {
				// The pulled prompt's KV lands after the transfer model's
				// time for the tokens this engine does not cache itself.
				transfer = &engine.Transfer{Tokens: kv.PromptTokens, Modeled: true}
			}
			if req.PD.Bootstrap != nil && w.cfg.PD.Role == wire.RolePrefill {
				req.MaxTokens = 1 // SGLang's prefill server runs the prompt and its first token
			}
			resp.onDone = func(finish string) json.RawMessage {
				hashes := kvindex.AppendSequenceHashes(nil, req.Prompts[0], w.cfg.Engine.BlockSize, seed)
				return w.pdHold(req, id, finish, hashes)
			}
		}
		engineMax := req.MaxTokens
		if req.StopAfter > 0 && req.StopAfter <= req.MaxTokens {
			engineMax = req.StopAfter // the sequence ends there as on EOS
			resp.stopped = true
		}
		// A batch runs as one engine request per prompt, side by side.
		for i := range len(req.Prompts) * req.N {
			p := req.Prompts[i/req.N] // n sequences of each prompt, in order
			sid := id
			if i > 0 {
				sid = id + "-" + strconv.Itoa(i)
			}
			stream, err := w.eng.Submit(&engine.Request{ID: sid, Prompt: p, MaxTokens: engineMax, Priority: req.Priority, HashSeed: seed, Transfer: transfer})
			if err != nil {
				for _, c := range resp.choices {
					w.eng.Cancel(c.id)
				}
				writeWorkerError(rw, submitAPIError(err))
				return "rejected"
			}
			resp.choices = append(resp.choices, &choiceState{id: sid, s: stream})
		}
		if req.Stream {
			return resp.stream(r)
		}
		return resp.complete(r)
	}
}

func submitAPIError(err error) *workerAPIError {
	switch {
	case errors.Is(err, engine.ErrTooLong):
		return &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "context_length_exceeded", Message: err.Error()}
	case errors.Is(err, engine.ErrDuplicateID):
		return &workerAPIError{Status: http.StatusConflict, Type: "invalid_request_error", Code: "duplicate_request_id", Message: err.Error()}
	case errors.Is(err, engine.ErrQueueFull):
		return &workerAPIError{Status: http.StatusTooManyRequests, Type: "rate_limit_error", Code: "queue_full", Message: err.Error()}
	case errors.Is(err, engine.ErrStopped):
		return &workerAPIError{Status: http.StatusServiceUnavailable, Type: "server_error", Code: "shutting_down", Message: err.Error()}
	}
	return &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Code: "invalid_value", Message: err.Error()}
}

// choiceState is one engine request of a response (one per batched prompt).
type choiceState struct {
	id       string
	s        *engine.Stream
	text     strings.Builder
	usage    usageOut
	finish   engine.FinishReason
	buf      []engine.Delta
	sentRole bool
}

func (c *choiceState) account(d engine.Delta) {
	c.usage.PromptTokens = d.PromptTokens
	c.usage.PromptTokensDetails.CachedTokens = d.CachedTokens
	if d.HasToken {
		c.usage.CompletionTokens = d.Index + 1
	}
	c.usage.TotalTokens = c.usage.PromptTokens + c.usage.CompletionTokens
	if d.Finish != 0 {
		c.finish = d.Finish
	}
}

// responder relays one request's deliveries to its HTTP response.
type responder struct {
	w       *worker
	rw      http.ResponseWriter
	kind    prompt.Kind
	req     *genRequest
	id      string
	created int64
	choices []*choiceState
	seq     int // Responses API event sequence number
	// stopped: every sequence ends as a stop (sim_stop_after), not by
	// length.
	stopped bool
	// onDone, when set, runs once every choice finished, before the last
	// bytes go out, with the finish reason; it returns a disaggregated
	// prefill's kv_transfer_params (worker_pd.go).
	onDone func(finish string) json.RawMessage
}

// finishReason is OpenAI's finish_reason of a sequence that ended normally.
func (p *responder) finishReason() string {
	if p.stopped {
		return "stop"
	}
	return "length"
}

func (p *responder) chat() bool { return p.kind == prompt.KindChat }

func (p *responder) object(chunk bool) string {
	switch {
	case !p.chat():
		return "text_completion"
	case chunk:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

func (p *responder) respID() string {
	switch p.kind {
	case prompt.KindChat:
		return "chatcmpl-" + p.id
	case prompt.KindResponse:
		return "resp_" + p.id
	}
	return "cmpl-" + p.id
}

// usage sums the choices' usage (a batch reports one usage for all): the
// completion tokens of every sequence, the prompt tokens once per prompt
// however many sequences it has (as vLLM counts n > 1).
func (p *responder) usage() usageOut {
	var u usageOut
	n := max(1, p.req.N)
	for i, c := range p.choices {
		if i%n == 0 {
			u.PromptTokens += c.usage.PromptTokens
			u.PromptTokensDetails.CachedTokens += c.usage.PromptTokensDetails.CachedTokens
		}
		u.CompletionTokens += c.usage.CompletionTokens
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func (p *responder) cancelAll() {
	for _, c := range p.choices {
		p.w.eng.Cancel(c.id)
	}
}

// wait blocks until one of the unfinished choices has deliveries (it
// returns its index) or the client leaves (-1).
func (p *responder) wait(r *http.Request) int {
	cases := make([]reflect.SelectCase, 0, len(p.choices)+1)
	idx := make([]int, 0, len(p.choices))
	cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(r.Context().Done())})
	for i, c := range p.choices {
		if c.finish == 0 {
			cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(c.s.Notify())})
			idx = append(idx, i)
		}
	}
	chosen, _, _ := reflect.Select(cases)
	if chosen == 0 {
		return -1
	}
	return idx[chosen-1]
}

func (p *responder) done() bool {
	for _, c := range p.choices {
		if c.finish == 0 {
			return false
		}
	}
	return true
}

// outcome is the request's result once every choice finished.
func (p *responder) outcome() (string, bool) {
	for _, c := range p.choices {
		if c.finish != engine.FinishLength {
			return "aborted", false
		}
	}
	return "ok", true
}

// complete answers a non-streaming request once every choice finished.
func (p *responder) complete(r *http.Request) string {
	for !p.done() {
		i := p.wait(r)
		if i < 0 {
			p.cancelAll()
			return "cancelled"
		}
		c := p.choices[i]
		c.buf = c.s.Take(c.buf[:0])
		for _, d := range c.buf {
			c.account(d)
			if d.HasToken {
				c.text.WriteString(p.w.piece(p.req.Model, d.Token))
			}
		}
	}
	if outcome, ok := p.outcome(); !ok {
		writeWorkerError(p.rw, &workerAPIError{Status: http.StatusServiceUnavailable, Type: "server_error",
			Code: "aborted", Message: "the worker stopped before the request finished"})
		return outcome
	}
	u := p.usage()
	if p.kind == prompt.KindResponse {
		writeWorkerJSON(p.rw, http.StatusOK, p.responseObject("incomplete", p.choices[0].text.String(), &u))
		return "ok"
	}
	out := responseOut{ID: p.respID(), Object: p.object(false), Created: p.created, Model: p.req.Model, Usage: &u}
	if p.onDone != nil {
		out.KVTransferParams = p.onDone(p.finishReason())
	}
	for i, c := range p.choices {
		fr := p.finishReason()
		co := choiceOut{Index: i, FinishReason: &fr}
		t := c.text.String()
		switch {
		case p.req.ToolCall != "" && p.chat():
			fr = "tool_calls"
			co.Message = &chatContent{Role: "assistant", ToolCalls: []toolCallOut{p.toolCall(i, toolArguments(t))}}
		case p.chat():
			co.Message = &chatContent{Role: "assistant", Content: t}
		default:
			co.Text = &t
		}
		out.Choices = append(out.Choices, co)
	}
	writeWorkerJSON(p.rw, http.StatusOK, out)
	return "ok"
}

// stream relays deliveries as server-sent events.
func (p *responder) stream(r *http.Request) string {
	h := p.rw.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	p.rw.WriteHeader(http.StatusOK)
	flusher, _ := p.rw.(http.Flusher)
	flush := func() {
		if flusher != nil {
			flusher.Flush()
		}
	}
	var out bytes.Buffer
	if p.kind == prompt.KindResponse {
		p.responseStart(&out)
	}
	if _, err := p.rw.Write(out.Bytes()); err != nil {
		p.cancelAll()
		return "cancelled"
	}
	flush()
	for !p.done() {
		i := p.wait(r)
		if i < 0 {
			p.cancelAll()
			return "cancelled"
		}
		c := p.choices[i]
		c.buf = c.s.Take(c.buf[:0])
		out.Reset()
		for _, d := range c.buf {
			c.account(d)
			if d.HasToken {
				p.event(&out, i, c, d)
			}
		}
		if p.done() {
			outcome, ok := p.outcome()
			if ok && p.onDone != nil {
				_ = p.onDone(p.finishReason()) // a streamed prefill (SGLang) answers no parameters
			}
			switch {
			case !ok:
				p.data(&out, map[string]*workerAPIError{"error": {Status: http.StatusServiceUnavailable, Type: "server_error",
					Code: "aborted", Message: "the worker stopped before the request finished"}})
			case p.kind == prompt.KindResponse:
				p.responseEnd(&out)
			default:
				if p.req.IncludeUsage {
					u := p.usage()
					p.data(&out, responseOut{ID: p.respID(), Object: p.object(true), Created: p.created,
						Model: p.req.Model, Choices: []choiceOut{}, Usage: &u})
				}
				out.WriteString("data: [DONE]\n\n")
			}
			if _, err := p.rw.Write(out.Bytes()); err != nil {
				return "cancelled"
			}
			flush()
			return outcome
		}
		if _, err := p.rw.Write(out.Bytes()); err != nil {
			p.cancelAll()
			return "cancelled"
		}
		flush()
	}
	return "ok" // unreachable: the loop returns when the last choice finishes
}

func (p *responder) event(out *bytes.Buffer, i int, c *choiceState, d engine.Delta) {
	piece := p.w.piece(p.req.Model, d.Token)
	c.text.WriteString(piece)
	if p.kind == prompt.KindResponse {
		p.sse(out, "response.output_text.delta", map[string]any{"item_id": "msg_" + p.id, "output_index": 0,
			"content_index": 0, "delta": piece})
		return
	}
	co := choiceOut{Index: i}
	if d.Finish == engine.FinishLength {
		fr := p.finishReason()
		co.FinishReason = &fr
	}
	if p.chat() {
		co.Delta = &chatContent{Content: piece}
		if p.req.ToolCall != "" {
			co.Delta = p.toolCallDelta(i, piece, d.Index == 0, d.Finish != 0)
			if co.FinishReason != nil {
				fr := "tool_calls"
				co.FinishReason = &fr
			}
		}
		if !c.sentRole {
			co.Delta.Role = "assistant"
			c.sentRole = true
		}
	} else {
		co.Text = &piece
	}
	p.data(out, responseOut{ID: p.respID(), Object: p.object(true), Created: p.created, Model: p.req.Model,
		Choices: []choiceOut{co}})
}

func (p *responder) data(out *bytes.Buffer, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // our own types always encode
	}
	out.WriteString("data: ")
	out.Write(b)
	out.WriteString("\n\n")
}

// Responses API shapes (OpenAI's Response object, reduced to what the
// simulated engine produces: one assistant message of output text).

func (p *responder) responseObject(status, text string, u *usageOut) map[string]any {
	msg := map[string]any{"type": "message", "id": "msg_" + p.id, "status": "completed", "role": "assistant",
		"content": []any{map[string]any{"type": "output_text", "text": text, "annotations": []any{}}}}
	if status == "in_progress" {
		msg["status"] = "in_progress"
	}
	obj := map[string]any{"id": p.respID(), "object": "response", "created_at": p.created, "status": status,
		"model": p.req.Model, "output": []any{msg}, "error": nil, "incomplete_details": nil}
	if status == "in_progress" {
		obj["output"] = []any{}
	}
	if status == "incomplete" {
		// The simulated engine has no end-of-sequence token: every answer
		// stops at max_output_tokens.
		obj["incomplete_details"] = map[string]any{"reason": "max_output_tokens"}
	}
	if u != nil {
		obj["usage"] = map[string]any{"input_tokens": u.PromptTokens,
			"input_tokens_details":  map[string]any{"cached_tokens": u.PromptTokensDetails.CachedTokens},
			"output_tokens":         u.CompletionTokens,
			"output_tokens_details": map[string]any{"reasoning_tokens": 0}, "total_tokens": u.TotalTokens}
	} else {
		obj["usage"] = nil
	}
	return obj
}

// sse writes one Responses API event (event: line, then data).
func (p *responder) sse(out *bytes.Buffer, typ string, fields map[string]any) {
	fields["type"] = typ
	fields["sequence_number"] = p.seq
	p.seq++
	b, err := json.Marshal(fields)
	if err != nil {
		return
	}
	out.WriteString("event: ")
	out.WriteString(typ)
	out.WriteString("\ndata: ")
	out.Write(b)
	out.WriteString("\n\n")
}

func (p *responder) responseStart(out *bytes.Buffer) {
	p.sse(out, "response.created", map[string]any{"response": p.responseObject("in_progress", "", nil)})
	p.sse(out, "response.output_item.added", map[string]any{"output_index": 0, "item": map[string]any{
		"type": "message", "id": "msg_" + p.id, "status": "in_progress", "role": "assistant", "content": []any{}}})
	p.sse(out, "response.content_part.added", map[string]any{"item_id": "msg_" + p.id, "output_index": 0, "content_index": 0,
		"part": map[string]any{"type": "output_text", "text": "", "annotations": []any{}}})
}

func (p *responder) responseEnd(out *bytes.Buffer) {
	text := p.choices[0].text.String()
	part := map[string]any{"type": "output_text", "text": text, "annotations": []any{}}
	p.sse(out, "response.output_text.done", map[string]any{"item_id": "msg_" + p.id, "output_index": 0, "content_index": 0, "text": text})
	p.sse(out, "response.content_part.done", map[string]any{"item_id": "msg_" + p.id, "output_index": 0, "content_index": 0, "part": part})
	p.sse(out, "response.output_item.done", map[string]any{"output_index": 0, "item": map[string]any{
		"type": "message", "id": "msg_" + p.id, "status": "completed", "role": "assistant", "content": []any{part}}})
	u := p.usage()
	p.sse(out, "response.incomplete", map[string]any{"response": p.responseObject("incomplete", text, &u)})
}

// handleEmbeddings answers /v1/embeddings with deterministic vectors: each
// a function of the input's token ids alone, so equal inputs embed equally.
func (w *worker) handleEmbeddings(rw http.ResponseWriter, r *http.Request, body []byte) string {
	req, apiErr := w.parse(r, body, prompt.KindEmbedding)
	if apiErr != nil {
		writeWorkerError(rw, apiErr)
		return "bad_request"
	}
	data := make([]map[string]any, len(req.Prompts))
	total := 0
	for i, ids := range req.Prompts {
		total += len(ids)
		vec := embedding(ids)
		var v any = vec
		if req.Base64 {
			buf := make([]byte, 0, 4*len(vec))
			for _, f := range vec {
				buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(f))
			}
			v = base64.StdEncoding.EncodeToString(buf)
		}
		data[i] = map[string]any{"object": "embedding", "index": i, "embedding": v}
	}
	writeWorkerJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": data, "model": req.Model,
		"usage": map[string]any{"prompt_tokens": total, "total_tokens": total}})
	return "ok"
}

// embeddingDims is the simulated embedding size.
const embeddingDims = 32

// embedding is a unit vector derived from ids.
func embedding(ids []uint32) []float32 {
	seed := kvindex.BlockHash(ids, kvindex.BaseSeed)
	out := make([]float32, embeddingDims)
	var norm float64
	for i := range out {
		v := xxh3.HashSeed([]byte{byte(i)}, seed)
		f := float64(int64(v))/math.MaxInt64 + 1e-9
		out[i] = float32(f)
		norm += f * f
	}
	norm = math.Sqrt(norm)
	for i := range out {
		out[i] = float32(float64(out[i]) / norm)
	}
	return out
}

// handleTokenize answers vLLM's POST /tokenize: {"model","prompt"} or
// {"model","messages",...} → {"count","max_model_len","tokens"}, with the
// tokenizer the worker generates with. Routers with no tokenizer of their
// own for the model ask this (prompt's engine path).
func (w *worker) handleTokenize(rw http.ResponseWriter, r *http.Request, body []byte) string {
	var probe struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &probe); err != nil {
		writeWorkerError(rw, workerBadRequest("", "invalid_json", "the body is not valid JSON: "+err.Error()))
		return "bad_request"
	}
	kind := prompt.KindCompletion
	if len(bytes.TrimSpace(probe.Messages)) > 0 {
		kind = prompt.KindChat
	}
	model := probe.Model
	if model == "" {
		model = w.cfg.Model
	}
	if !w.serves(model) {
		writeWorkerError(rw, &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Param: "model",
			Code: "model_not_found", Message: fmt.Sprintf("the model %q does not exist", model)})
		return "bad_request"
	}
	var f prompt.Fields
	_ = json.Unmarshal(body, &f) // the probe above already accepted the document
	in, err := prompt.Parse(kind, &f)
	if err != nil {
		writeWorkerError(rw, promptAPIError(err))
		return "bad_request"
	}
	ids, err := w.tokenize(model, in)
	if err != nil {
		writeWorkerError(rw, promptAPIError(err))
		return "bad_request"
	}
	writeWorkerJSON(rw, http.StatusOK, map[string]any{"count": len(ids[0]), "max_model_len": w.cfg.Engine.MaxModelLen, "tokens": ids[0]})
	return "ok"
}

// DefaultSimTokenizer is the tokenizer of the simulated engine's
// switchyard-sim model, on workers and routers alike: a real encoding that
// ships inside a Go module (github.com/tiktoken-go/tokenizer embeds it), so
// the local cluster routes on real token ids with nothing to download.
// Chats render with ChatML.
const DefaultSimTokenizer = "tiktoken:o200k_base"
