package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/wire"
)

// endpoint is the OpenAI operation a request targets.
type endpoint int

const (
	endpointChat endpoint = iota + 1
	endpointCompletions
	endpointEmbeddings
	endpointResponses
	endpointMessages // Anthropic's Messages API (messages.go)
)

func (e endpoint) path() string {
	switch e {
	case endpointChat:
		return "/v1/chat/completions"
	case endpointEmbeddings:
		return "/v1/embeddings"
	case endpointResponses:
		return "/v1/responses"
	case endpointMessages:
		return "/v1/messages"
	}
	return "/v1/completions"
}

// kind is the prompt form the endpoint carries.
func (e endpoint) kind() prompt.Kind {
	switch e {
	case endpointChat, endpointMessages:
		return prompt.KindChat
	case endpointEmbeddings:
		return prompt.KindEmbedding
	case endpointResponses:
		return prompt.KindResponse
	}
	return prompt.KindCompletion
}

// promptParam is the body field a prompt-length error names.
func (e endpoint) promptParam() string {
	switch e {
	case endpointChat, endpointMessages:
		return "messages"
	case endpointEmbeddings, endpointResponses:
		return "input"
	}
	return "prompt"
}

// Scheduling hint headers (docs/api.md).
const (
	HeaderClass          = "X-Switchyard-Class"
	HeaderPriority       = "X-Switchyard-Priority"
	HeaderDeadlineMS     = "X-Switchyard-Deadline-Ms"
	HeaderWorker         = "X-Switchyard-Worker"
	HeaderAllowedWorkers = "X-Switchyard-Allowed-Workers"
	// HeaderRequestID is set on every response.
	HeaderRequestID = "X-Request-Id"
	// HeaderRoutedWorker names the worker that served the response.
	HeaderRoutedWorker = "X-Switchyard-Routed-Worker"
)

// openAIRequest is the subset of a request the router reads; everything
// else passes through to the worker untouched. The prompt-bearing fields
// (prompt, messages, input, tools, ...) are prompt.Fields, kept raw for
// package prompt to parse.
type openAIRequest struct {
	prompt.Fields
	Model               *string `json:"model"`
	MaxTokens           *int    `json:"max_tokens"`
	MaxCompletionTokens *int    `json:"max_completion_tokens"`
	MaxOutputTokens     *int    `json:"max_output_tokens"`
	Stream              bool    `json:"stream"`
	User                string  `json:"user"`
	// PromptCacheKey is OpenAI's routing hint for prompt caching: a
	// session key (session.go).
	PromptCacheKey string    `json:"prompt_cache_key"`
	Switchyard     *hintBody `json:"switchyard"`
	// N and BestOf are how many sequences the engine generates
	// (max(n, best_of)): booked and charged as that many.
	N             *int           `json:"n"`
	BestOf        *int           `json:"best_of"`
	StreamOptions *streamOptions `json:"stream_options"`
}

// streamOptions is the stream_options object of a streaming request.
type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

// maxSequences bounds n and best_of (OpenAI's own limit for n).
const maxSequences = 128

// hintBody is the "switchyard" object in a request body.
type hintBody struct {
	Class          string   `json:"class"`
	Priority       *int32   `json:"priority"`
	DeadlineMS     *int64   `json:"deadline_ms"`
	Worker         string   `json:"worker"`
	AllowedWorkers []string `json:"allowed_workers"`
}

// hints are the scheduling hints after merging headers over the body.
type hints struct {
	class    string
	priority *int32
	deadline *time.Duration // 0 = explicitly none
	worker   string
	allowed  []string
}

// parsedRequest is a validated request, ready to tokenize, classify and
// admit.
type parsedRequest struct {
	endpoint  endpoint
	model     string
	stream    bool
	maxTokens int // 0 = not set
	// sequences is how many sequences the engine generates for the request
	// (max(n, best_of), at least 1): each is booked and charged.
	sequences int
	user      string
	// promptCacheKey is the body's prompt_cache_key ("": none).
	promptCacheKey string
	input          *prompt.Input
	// promptTokens is the load the request books (every prompt of a
	// batch); the first prompt's ids are hashed where they are tokenized
	// (Server.tokenize, prompt.Result.SequenceHashes).
	promptTokens  int
	longestPrompt int // the longest prompt of a batch, in tokens
	hints         hints
	// forward is the body sent to the worker: the client's bytes, minus the
	// switchyard object when there was one, with include_usage set when
	// injectedUsage.
	forward []byte
	// injectedUsage is set on a stream whose client did not ask for usage:
	// the router asked the engine for it (withStreamUsage) and strips the
	// usage chunk from what the client sees (relayStream).
	injectedUsage bool
	// messages is set for an Anthropic Messages request (messages.go).
	messages *messagesRequest
}

// parseRequest decodes and validates body for ep. It returns an *APIError
// for every client mistake. It takes body over: the forwarded body may be
// built in body's spare capacity, over body's last bytes
// (withStreamUsageAt). Tokenization is the caller's next step
// (tokenize), once the model is known to be served.
func parseRequest(ep endpoint, body []byte, h http.Header) (*parsedRequest, *APIError) {
	if ep == endpointMessages {
		return parseMessages(body, h)
	}
	var req openAIRequest
	var sc bodyScan
	scanned := decodeRequestScan(body, &req, &sc)
	if !scanned {
		req = openAIRequest{}
		if err := json.Unmarshal(body, &req); err != nil {
			return nil, jsonError(err)
		}
	}
	// The body is valid JSON now; the engine must read it as we did. The
	// decode's scan has checked most bodies already.
	if !scanned || !sc.unambiguous {
		if e := checkKeys(body); e != nil {
			return nil, e
		}
	}
	// Valid JSON (either decode validated it) and valid UTF-8 (the scan or
	// checkKeys): the prompt's fields need no second validation.
	req.Validated = true
	if req.Model == nil || *req.Model == "" {
		return nil, badRequest("model", "missing_required_parameter", "you must provide a model parameter")
	}
	p := &parsedRequest{endpoint: ep, model: *req.Model, stream: req.Stream, user: req.User, promptCacheKey: req.PromptCacheKey, forward: body, sequences: 1}
	if ep == endpointChat || ep == endpointCompletions {
		for _, f := range []struct {
			name string
			v    *int
		}{{"n", req.N}, {"best_of", req.BestOf}} {
			if f.v == nil {
				continue
			}
			if *f.v < 1 || *f.v > maxSequences {
				return nil, badRequest(f.name, "invalid_value", fmt.Sprintf("%s must be between 1 and %d, got %d", f.name, maxSequences, *f.v))
			}
			p.sequences = max(p.sequences, *f.v)
		}
	}
	switch {
	case ep == endpointEmbeddings:
		p.stream = false // embeddings never stream
		p.maxTokens = 1  // a pooling request books no decode
	case req.MaxCompletionTokens != nil && ep == endpointChat:
		p.maxTokens = *req.MaxCompletionTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_completion_tokens", "invalid_value", fmt.Sprintf("max_completion_tokens must be at least 1, got %d", p.maxTokens))
		}
	case req.MaxOutputTokens != nil && ep == endpointResponses:
		p.maxTokens = *req.MaxOutputTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_output_tokens", "invalid_value", fmt.Sprintf("max_output_tokens must be at least 1, got %d", p.maxTokens))
		}
	case req.MaxTokens != nil && ep != endpointResponses:
		p.maxTokens = *req.MaxTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_tokens", "invalid_value", fmt.Sprintf("max_tokens must be at least 1, got %d", p.maxTokens))
		}
	}
	in, err := prompt.Parse(ep.kind(), &req.Fields)
	if err != nil {
		return nil, promptError(err)
	}
	p.input = in
	var apiErr *APIError
	if p.hints, apiErr = parseHints(req.Switchyard, h); apiErr != nil {
		return nil, apiErr
	}
	if req.Switchyard != nil {
		fwd, err := stripField(body, "switchyard")
		if err != nil {
			return nil, jsonError(err)
		}
		p.forward = fwd
	}
	// The tenant's tokens are charged what the engine reports: a stream
	// reports it only when asked, so the router always asks.
	if p.stream && (ep == endpointChat || ep == endpointCompletions) &&
		(req.StreamOptions == nil || req.StreamOptions.IncludeUsage == nil || !*req.StreamOptions.IncludeUsage) {
		var fwd []byte
		var err error
		if scanned && req.Switchyard == nil {
			// p.forward is body, whose members the decode has just scanned.
			fwd, err = withStreamUsageAt(body, sc.streamOptions, sc.members > 0)
		} else {
			fwd, err = withStreamUsage(p.forward)
		}
		if err != nil {
			return nil, jsonError(err)
		}
		p.forward, p.injectedUsage = fwd, true
	}
	return p, nil
}

// includeUsage is the stream_options the router forwards for a client that
// did not ask for usage: usage in the last chunk only (continuous usage
// stats, meaningful only with include_usage, are dropped).
var includeUsage = []byte(`{"include_usage":true}`)

// withStreamUsage returns body (a JSON object checkKeys passed) with
// stream_options.include_usage set to true, re-encoding only that member:
// the rest of the body goes out as the client wrote it.
func withStreamUsage(body []byte) ([]byte, error) {
	members, ok := prompt.ScanObject(body, nil)
	if !ok {
		return nil, errors.New("the body is not a JSON object")
	}
	for _, m := range members {
		key := string(m.Key)
		if m.Escaped {
			if json.Unmarshal(append(append([]byte{'"'}, m.Key...), '"'), &key) != nil {
				continue
			}
		}
		if key == "stream_options" {
			return withStreamUsageAt(body, m.Value, true)
		}
	}
	return withStreamUsageAt(body, nil, len(members) > 0)
}

// withStreamUsageAt is withStreamUsage for a body whose top-level
// stream_options value is opts (a slice of body; nil when the body has
// none) and which has members (any member at all).
//
// A body without stream_options gets the member appended after its last
// one, in body's spare capacity when it has enough (readBody leaves room):
// the bytes before the closing brace stay where they are, so the strings
// the parse aliased into them stay valid, and the 4k chat's 18 kB are not
// copied. body's bytes from its closing brace on are then overwritten: the
// caller gives body up.
func withStreamUsageAt(body, opts []byte, members bool) ([]byte, error) {
	if opts != nil {
		value := includeUsage
		if string(opts) != "null" {
			var m map[string]json.RawMessage
			if err := json.Unmarshal(opts, &m); err != nil {
				return nil, err
			}
			m["include_usage"] = json.RawMessage("true")
			delete(m, "continuous_usage_stats")
			var err error
			if value, err = json.Marshal(m); err != nil {
				return nil, err
			}
		}
		// opts aliases body: its offset is where their capacities differ.
		off := cap(body) - cap(opts)
		out := make([]byte, 0, len(body)+len(value))
		out = append(out, body[:off]...)
		out = append(out, value...)
		return append(out, body[off+len(opts):]...), nil
	}
	end := bytes.LastIndexByte(body, '}')
	if end < 0 {
		return nil, errors.New("the body is not a JSON object")
	}
	add := len(usageMember)
	if members {
		add++
	}
	var out []byte
	if n := len(body) + add; n <= cap(body) {
		out = body[:n]
		copy(out[end+add:], body[end:]) // the closing brace and what follows
	} else {
		out = make([]byte, n)
		copy(out, body[:end])
		copy(out[end+add:], body[end:])
	}
	at := end
	if members {
		out[at] = ','
		at++
	}
	copy(out[at:], usageMember)
	return out, nil
}

// usageMember is the stream_options member withStreamUsageAt adds.
var usageMember = []byte(`"stream_options":{"include_usage":true}`)

// streamUsageRoom is the spare capacity readBody leaves after a body, so
// that withStreamUsageAt can add usageMember (and a comma) in place.
const streamUsageRoom = 64

// promptError maps a prompt package error to the OpenAI error shape: a
// malformed prompt names its field; a template that failed on the request
// is a 400 carrying the template's message.
func promptError(err error) *APIError {
	var re *prompt.RequestError
	if errors.As(err, &re) {
		return badRequest(re.Param, re.Code, re.Message)
	}
	if errors.Is(err, prompt.ErrRender) {
		return badRequest("messages", "invalid_value", "the model's chat template failed on these messages: "+err.Error())
	}
	return &APIError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error", Message: err.Error(), err: err}
}

// jsonError explains a JSON decoding failure, naming the field when the
// failure is a type mismatch.
func jsonError(err error) *APIError {
	var typeErr *json.UnmarshalTypeError
	if errors.As(err, &typeErr) && typeErr.Field != "" {
		return badRequest(typeErr.Field, "invalid_type",
			fmt.Sprintf("%s must be of type %s, got %s", typeErr.Field, goTypeName(typeErr.Type.String()), typeErr.Value))
	}
	return badRequest("", "invalid_json", "the body is not valid JSON: "+err.Error())
}

func goTypeName(t string) string {
	switch {
	case strings.Contains(t, "int"):
		return "integer"
	case strings.Contains(t, "float"):
		return "number"
	case t == "string" || t == "*string":
		return "string"
	case t == "bool" || t == "*bool":
		return "boolean"
	case strings.HasPrefix(t, "[]"):
		return "array"
	}
	return "object"
}

// parseHints merges body hints with header hints; headers win.
func parseHints(body *hintBody, h http.Header) (hints, *APIError) {
	var out hints
	if body != nil {
		out.class, out.worker = body.Class, body.Worker
		out.priority = body.Priority
		out.allowed = body.AllowedWorkers
		if body.DeadlineMS != nil {
			if *body.DeadlineMS < 0 {
				return out, badRequest("switchyard.deadline_ms", "invalid_value", fmt.Sprintf("deadline_ms must be >= 0, got %d", *body.DeadlineMS))
			}
			// Bounded before the multiplication, which would otherwise wrap
			// (18446744073710 ms became a 448 µs deadline).
			if *body.DeadlineMS > int64(24*time.Hour/time.Millisecond) {
				return out, badRequest("switchyard.deadline_ms", "invalid_value", fmt.Sprintf("deadline_ms must be at most 24h (86400000), got %d", *body.DeadlineMS))
			}
			d := time.Duration(*body.DeadlineMS) * time.Millisecond
			out.deadline = &d
		}
	}
	if v := h.Get(HeaderClass); v != "" {
		out.class = v
	}
	if v := h.Get(HeaderPriority); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 32)
		if err != nil {
			return out, badRequest(strings.ToLower(HeaderPriority), "invalid_value", fmt.Sprintf("priority must be an integer, got %q", v))
		}
		p := int32(n)
		out.priority = &p
	}
	if v := h.Get(HeaderDeadlineMS); v != "" {
		n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
		if err != nil || n < 0 || n > math.MaxInt64/int64(time.Millisecond) {
			return out, badRequest(strings.ToLower(HeaderDeadlineMS), "invalid_value", fmt.Sprintf("deadline must be a non-negative integer of milliseconds, got %q", v))
		}
		d := time.Duration(n) * time.Millisecond
		out.deadline = &d
	}
	if v := h.Get(HeaderWorker); v != "" {
		out.worker = strings.TrimSpace(v)
	}
	if v := h.Get(HeaderAllowedWorkers); v != "" {
		out.allowed = out.allowed[:0:0]
		for _, w := range strings.Split(v, ",") {
			if w = strings.TrimSpace(w); w != "" {
				out.allowed = append(out.allowed, w)
			}
		}
	}
	if out.worker != "" && !wire.ValidName(out.worker) {
		return out, badRequest(strings.ToLower(HeaderWorker), "invalid_value", fmt.Sprintf("%q is not a worker id", out.worker))
	}
	for _, w := range out.allowed {
		if !wire.ValidName(w) {
			return out, badRequest(strings.ToLower(HeaderAllowedWorkers), "invalid_value", fmt.Sprintf("%q is not a worker id", w))
		}
	}
	if out.deadline != nil && *out.deadline > 0 && *out.deadline > 24*time.Hour {
		return out, badRequest(strings.ToLower(HeaderDeadlineMS), "invalid_value", "deadline must be at most 24h")
	}
	return out, nil
}

// stripField removes a top-level key from a JSON object, keeping the rest as
// the client sent it (key order may change; values are untouched bytes).
func stripField(body []byte, key string) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, err
	}
	delete(m, key)
	return json.Marshal(m)
}
