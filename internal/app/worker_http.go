package app

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/engine"
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
	mux.HandleFunc("POST /v1/completions", w.handleGenerate(false))
	mux.HandleFunc("POST /v1/chat/completions", w.handleGenerate(true))
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
	writeWorkerJSON(rw, http.StatusOK, map[string]any{"object": "list", "data": []map[string]any{
		{"id": w.cfg.Model, "object": "model", "created": 0, "owned_by": "switchyard"},
	}})
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

// genRequest is a validated completions or chat completions request.
type genRequest struct {
	Model        string
	Prompt       []uint32
	MaxTokens    int
	Stream       bool
	IncludeUsage bool
	Priority     int
}

type rawGenRequest struct {
	Model               string          `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int64          `json:"max_tokens"`
	MaxCompletionTokens *int64          `json:"max_completion_tokens"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	N        *int64 `json:"n"`
	Priority *int64 `json:"priority"`
}

// parseGenRequest decodes and validates a request body. maxLen bounds
// prompt plus output; defaultMax applies when no max_tokens is given (capped
// to what fits).
func parseGenRequest(body []byte, chat bool, defaultMax, maxLen int) (*genRequest, *workerAPIError) {
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
	req := &genRequest{Model: raw.Model}
	var apiErr *workerAPIError
	if chat {
		req.Prompt, apiErr = chatPromptTokens(raw.Messages)
	} else {
		req.Prompt, apiErr = promptTokenIDs(raw.Prompt)
	}
	if apiErr != nil {
		return nil, apiErr
	}
	if len(req.Prompt) == 0 {
		return nil, workerBadRequest(map[bool]string{true: "messages", false: "prompt"}[chat], "invalid_value", "the prompt has no tokens")
	}
	if raw.N != nil && *raw.N != 1 {
		return nil, workerBadRequest("n", "invalid_value", "only n=1 is supported")
	}
	mt := raw.MaxTokens
	param := "max_tokens"
	if raw.MaxCompletionTokens != nil {
		mt, param = raw.MaxCompletionTokens, "max_completion_tokens"
	}
	room := maxLen - len(req.Prompt)
	switch {
	case mt == nil:
		req.MaxTokens = min(defaultMax, room)
	case *mt < 1:
		return nil, workerBadRequest(param, "invalid_value", fmt.Sprintf("%s must be at least 1, got %d", param, *mt))
	case *mt > int64(room):
		req.MaxTokens = math.MaxInt32 // reported below as too long
	default:
		req.MaxTokens = int(*mt)
	}
	if room < 1 || req.MaxTokens > room {
		return nil, &workerAPIError{Status: http.StatusBadRequest, Type: "invalid_request_error", Param: param,
			Code: "context_length_exceeded", Message: fmt.Sprintf(
				"this model's maximum context length is %d tokens; the prompt has %d tokens and leaves no room for the requested output",
				maxLen, len(req.Prompt))}
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

// promptTokenIDs accepts a string, an array of one string, or an array of
// token ids. Strings go through the default tokenizer, exactly like the
// router, so both compute the same block hashes.
func promptTokenIDs(raw json.RawMessage) ([]uint32, *workerAPIError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, workerBadRequest("prompt", "missing_required_parameter", "you must provide a prompt")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, workerBadRequest("prompt", "invalid_type", "prompt is not a valid string")
		}
		return tokenizer.Encode(s), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, workerBadRequest("prompt", "invalid_type", "prompt must be a string, an array of strings or an array of token ids")
		}
		if len(items) == 0 {
			return nil, workerBadRequest("prompt", "invalid_value", "prompt must not be an empty array")
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && first[0] == '"' {
			if len(items) != 1 {
				return nil, workerBadRequest("prompt", "invalid_value", "batched prompts are not supported: send one prompt per request")
			}
			return promptTokenIDs(first)
		}
		ids := make([]uint32, len(items))
		for i, it := range items {
			v, err := strconv.ParseUint(string(bytes.TrimSpace(it)), 10, 32)
			if err != nil {
				return nil, workerBadRequest("prompt", "invalid_value", fmt.Sprintf("prompt[%d] is not a token id (an integer in [0, 2^32))", i))
			}
			ids[i] = uint32(v)
		}
		return ids, nil
	}
	return nil, workerBadRequest("prompt", "invalid_type", "prompt must be a string, an array of strings or an array of token ids")
}

type chatMessageIn struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

// chatPromptTokens renders messages with the shared chat template. Content
// is a string or an array of text parts, concatenated without separators
// (the router flattens the same way), and null for content-less turns.
func chatPromptTokens(raw json.RawMessage) ([]uint32, *workerAPIError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, workerBadRequest("messages", "missing_required_parameter", "you must provide messages")
	}
	var msgs []chatMessageIn
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, workerBadRequest("messages", "invalid_type", "messages must be an array of {role, content} objects")
	}
	if len(msgs) == 0 {
		return nil, workerBadRequest("messages", "invalid_value", "messages must not be empty")
	}
	flat := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, workerBadRequest(fmt.Sprintf("messages[%d].role", i), "missing_required_parameter", "every message needs a role")
		}
		param := fmt.Sprintf("messages[%d].content", i)
		c := bytes.TrimSpace(m.Content)
		var text string
		switch {
		case len(c) == 0 || bytes.Equal(c, []byte("null")):
		case c[0] == '"':
			if err := json.Unmarshal(c, &text); err != nil {
				return nil, workerBadRequest(param, "invalid_type", "content is not a valid string")
			}
		case c[0] == '[':
			var parts []struct {
				Type string `json:"type"`
				Text string `json:"text"`
			}
			if err := json.Unmarshal(c, &parts); err != nil {
				return nil, workerBadRequest(param, "invalid_type", "content must be a string or an array of text parts")
			}
			var b strings.Builder
			for j, p := range parts {
				if p.Type != "text" {
					return nil, workerBadRequest(fmt.Sprintf("%s[%d].type", param, j), "invalid_value",
						fmt.Sprintf("content part type %q is not supported (only text)", p.Type))
				}
				b.WriteString(p.Text)
			}
			text = b.String()
		default:
			return nil, workerBadRequest(param, "invalid_type", "content must be a string or an array of text parts")
		}
		flat[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return tokenizer.Encode(tokenizer.ChatPrompt(flat)), nil
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
	Role    string `json:"role,omitempty"`
	Content string `json:"content"`
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
}

func (w *worker) handleGenerate(chat bool) http.HandlerFunc {
	endpoint := "completions"
	if chat {
		endpoint = "chat_completions"
	}
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
			count("cancelled")
			return // the client went away while sending
		}
		req, apiErr := parseGenRequest(body, chat, w.cfg.DefaultMaxTokens, w.cfg.Engine.MaxModelLen)
		if apiErr == nil && req.Model != w.cfg.Model {
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
		if apiErr != nil {
			count("bad_request")
			writeWorkerError(rw, apiErr)
			return
		}
		id := fmt.Sprintf("%s-%d", w.cfg.ID, w.nextID.Add(1))
		if v := r.Header.Get("x-request-id"); v != "" && len(v) <= 128 {
			id = v // a caller-chosen id makes the synthetic output reproducible
		}
		stream, err := w.eng.Submit(&engine.Request{ID: id, Prompt: req.Prompt, MaxTokens: req.MaxTokens, Priority: req.Priority})
		if err != nil {
			count("rejected")
			writeWorkerError(rw, submitAPIError(err))
			return
		}
		resp := &responder{w: w, rw: rw, chat: chat, req: req, id: id, created: time.Now().Unix()}
		if req.Stream {
			count(resp.stream(r, stream))
		} else {
			count(resp.complete(r, stream))
		}
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

// responder relays one request's deliveries to its HTTP response.
type responder struct {
	w       *worker
	rw      http.ResponseWriter
	chat    bool
	req     *genRequest
	id      string
	created int64
	usage   usageOut
}

func (p *responder) object(chunk bool) string {
	switch {
	case !p.chat:
		return "text_completion"
	case chunk:
		return "chat.completion.chunk"
	}
	return "chat.completion"
}

func (p *responder) respID() string {
	if p.chat {
		return "chatcmpl-" + p.id
	}
	return "cmpl-" + p.id
}

func (p *responder) account(d engine.Delta) {
	p.usage.PromptTokens = d.PromptTokens
	p.usage.PromptTokensDetails.CachedTokens = d.CachedTokens
	if d.HasToken {
		p.usage.CompletionTokens = d.Index + 1
	}
	p.usage.TotalTokens = p.usage.PromptTokens + p.usage.CompletionTokens
}

// complete answers a non-streaming request once it finishes.
func (p *responder) complete(r *http.Request, s *engine.Stream) string {
	var text strings.Builder
	var buf []engine.Delta
	for {
		select {
		case <-r.Context().Done():
			p.w.eng.Cancel(p.id)
			return "cancelled"
		case <-s.Notify():
		}
		buf = s.Take(buf[:0])
		for _, d := range buf {
			p.account(d)
			if d.HasToken {
				text.WriteString(tokenizer.Piece(d.Token))
			}
			switch d.Finish {
			case 0:
				continue
			case engine.FinishLength:
				fr := "length"
				c := choiceOut{FinishReason: &fr}
				t := text.String()
				if p.chat {
					c.Message = &chatContent{Role: "assistant", Content: t}
				} else {
					c.Text = &t
				}
				u := p.usage
				writeWorkerJSON(p.rw, http.StatusOK, responseOut{ID: p.respID(), Object: p.object(false), Created: p.created,
					Model: p.req.Model, Choices: []choiceOut{c}, Usage: &u})
				return "ok"
			default:
				writeWorkerError(p.rw, &workerAPIError{Status: http.StatusServiceUnavailable, Type: "server_error",
					Code: "aborted", Message: "the worker stopped before the request finished"})
				return "aborted"
			}
		}
	}
}

// stream relays deliveries as server-sent events.
func (p *responder) stream(r *http.Request, s *engine.Stream) string {
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
	flush()
	var out bytes.Buffer
	var buf []engine.Delta
	for {
		select {
		case <-r.Context().Done():
			p.w.eng.Cancel(p.id)
			return "cancelled"
		case <-s.Notify():
		}
		buf = s.Take(buf[:0])
		out.Reset()
		finish := engine.FinishReason(0)
		for _, d := range buf {
			p.account(d)
			if d.HasToken {
				p.event(&out, d)
			}
			if d.Finish != 0 {
				finish = d.Finish
			}
		}
		switch finish {
		case engine.FinishLength:
			if p.req.IncludeUsage {
				u := p.usage
				p.data(&out, responseOut{ID: p.respID(), Object: p.object(true), Created: p.created,
					Model: p.req.Model, Choices: []choiceOut{}, Usage: &u})
			}
			out.WriteString("data: [DONE]\n\n")
		case engine.FinishAborted, engine.FinishCancelled:
			p.data(&out, map[string]*workerAPIError{"error": {Status: http.StatusServiceUnavailable, Type: "server_error",
				Code: "aborted", Message: "the worker stopped before the request finished"}})
		}
		if _, err := p.rw.Write(out.Bytes()); err != nil {
			p.w.eng.Cancel(p.id)
			return "cancelled"
		}
		flush()
		switch finish {
		case 0:
		case engine.FinishLength:
			return "ok"
		default:
			return "aborted"
		}
	}
}

func (p *responder) event(out *bytes.Buffer, d engine.Delta) {
	piece := tokenizer.Piece(d.Token)
	c := choiceOut{}
	if d.Finish == engine.FinishLength {
		fr := "length"
		c.FinishReason = &fr
	}
	if p.chat {
		c.Delta = &chatContent{Content: piece}
		if d.Index == 0 {
			c.Delta.Role = "assistant"
		}
	} else {
		c.Text = &piece
	}
	p.data(out, responseOut{ID: p.respID(), Object: p.object(true), Created: p.created, Model: p.req.Model,
		Choices: []choiceOut{c}})
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
