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
	"unicode/utf8"

	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/wire"
)

// endpoint is the OpenAI operation a request targets.
type endpoint int

const (
	endpointChat endpoint = iota + 1
	endpointCompletions
)

func (e endpoint) path() string {
	if e == endpointChat {
		return "/v1/chat/completions"
	}
	return "/v1/completions"
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

// openAIRequest is the subset of a (chat) completion request the router
// reads; everything else passes through to the worker untouched.
type openAIRequest struct {
	Model               *string         `json:"model"`
	Prompt              json.RawMessage `json:"prompt"`
	Messages            json.RawMessage `json:"messages"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	Stream              bool            `json:"stream"`
	User                string          `json:"user"`
	Switchyard          *hintBody       `json:"switchyard"`
}

// hintBody is the "switchyard" object in a request body.
type hintBody struct {
	Class          string   `json:"class"`
	Priority       *int32   `json:"priority"`
	DeadlineMS     *int64   `json:"deadline_ms"`
	Worker         string   `json:"worker"`
	AllowedWorkers []string `json:"allowed_workers"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// hints are the scheduling hints after merging headers over the body.
type hints struct {
	class    string
	priority *int32
	deadline *time.Duration // 0 = explicitly none
	worker   string
	allowed  []string
}

// parsedRequest is a validated request, ready to classify and admit.
type parsedRequest struct {
	endpoint  endpoint
	model     string
	stream    bool
	maxTokens int // 0 = not set
	user      string
	tokens    []uint32
	hints     hints
	// forward is the body sent to the worker: the client's bytes, minus the
	// switchyard object when there was one.
	forward []byte
}

// parseRequest decodes and validates body for ep, tokenizing the prompt with
// tok. It returns an *APIError for every client mistake.
func parseRequest(ep endpoint, body []byte, h http.Header, tok Tokenizer, maxPromptTokens int) (*parsedRequest, *APIError) {
	var req openAIRequest
	if err := json.Unmarshal(body, &req); err != nil {
		return nil, jsonError(err)
	}
	if req.Model == nil || *req.Model == "" {
		return nil, badRequest("model", "missing_required_parameter", "you must provide a model parameter")
	}
	p := &parsedRequest{endpoint: ep, model: *req.Model, stream: req.Stream, user: req.User, forward: body}
	switch {
	case req.MaxCompletionTokens != nil && ep == endpointChat:
		p.maxTokens = *req.MaxCompletionTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_completion_tokens", "invalid_value", fmt.Sprintf("max_completion_tokens must be at least 1, got %d", p.maxTokens))
		}
	case req.MaxTokens != nil:
		p.maxTokens = *req.MaxTokens
		if p.maxTokens <= 0 {
			return nil, badRequest("max_tokens", "invalid_value", fmt.Sprintf("max_tokens must be at least 1, got %d", p.maxTokens))
		}
	}
	var apiErr *APIError
	if ep == endpointChat {
		p.tokens, apiErr = chatTokens(req.Messages, tok)
	} else {
		p.tokens, apiErr = promptTokens(req.Prompt, tok)
	}
	if apiErr != nil {
		return nil, apiErr
	}
	if len(p.tokens) > maxPromptTokens {
		param := "prompt"
		if ep == endpointChat {
			param = "messages"
		}
		return nil, badRequest(param, "context_length_exceeded",
			fmt.Sprintf("the prompt has %d tokens, more than the maximum of %d", len(p.tokens), maxPromptTokens))
	}
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
	return p, nil
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
	case t == "bool":
		return "boolean"
	case strings.HasPrefix(t, "[]"):
		return "array"
	}
	return "object"
}

// promptTokens accepts a string, an array of one string, or an array of token
// ids (OpenAI's completions prompt forms, minus batching).
func promptTokens(raw json.RawMessage, tok Tokenizer) ([]uint32, *APIError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("prompt", "missing_required_parameter", "you must provide a prompt")
	}
	switch raw[0] {
	case '"':
		s, ok := plainString(raw)
		if !ok {
			if err := json.Unmarshal(raw, &s); err != nil {
				return nil, badRequest("prompt", "invalid_type", "prompt is not a valid string")
			}
		}
		return tok.Encode(s), nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, badRequest("prompt", "invalid_type", "prompt must be a string, an array of strings or an array of token ids")
		}
		if len(items) == 0 {
			return nil, badRequest("prompt", "invalid_value", "prompt must not be an empty array")
		}
		if first := bytes.TrimSpace(items[0]); len(first) > 0 && first[0] == '"' {
			if len(items) != 1 {
				return nil, badRequest("prompt", "invalid_value", "batched prompts are not supported: send one prompt per request")
			}
			return promptTokens(first, tok)
		}
		tokens := make([]uint32, len(items))
		for i, it := range items {
			v, err := strconv.ParseInt(string(bytes.TrimSpace(it)), 10, 64)
			if err != nil || v < 0 || v > math.MaxUint32 {
				return nil, badRequest("prompt", "invalid_value", fmt.Sprintf("prompt[%d] is not a token id (a non-negative integer)", i))
			}
			tokens[i] = uint32(v)
		}
		return tokens, nil
	}
	return nil, badRequest("prompt", "invalid_type", "prompt must be a string, an array of strings or an array of token ids")
}

// chatTokens flattens messages (string or text-part content) with the
// default chat template and tokenizes the result.
func chatTokens(raw json.RawMessage, tok Tokenizer) ([]uint32, *APIError) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return nil, badRequest("messages", "missing_required_parameter", "you must provide messages")
	}
	var msgs []chatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("messages", "invalid_type", "messages must be an array of {role, content} objects")
	}
	if len(msgs) == 0 {
		return nil, badRequest("messages", "invalid_value", "messages must not be empty")
	}
	flat := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		if m.Role == "" {
			return nil, badRequest(fmt.Sprintf("messages[%d].role", i), "missing_required_parameter", "every message needs a role")
		}
		text, apiErr := messageText(m.Content, i)
		if apiErr != nil {
			return nil, apiErr
		}
		flat[i] = tokenizer.Message{Role: m.Role, Content: text}
	}
	return tok.Encode(tokenizer.ChatPrompt(flat)), nil
}

func messageText(raw json.RawMessage, i int) (string, *APIError) {
	raw = bytes.TrimSpace(raw)
	param := fmt.Sprintf("messages[%d].content", i)
	if len(raw) == 0 || bytes.Equal(raw, []byte("null")) {
		return "", nil // assistant turns with tool calls carry no content
	}
	switch raw[0] {
	case '"':
		s, ok := plainString(raw)
		if !ok {
			if err := json.Unmarshal(raw, &s); err != nil {
				return "", badRequest(param, "invalid_type", "content is not a valid string")
			}
		}
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", badRequest(param, "invalid_type", "content must be a string or an array of text parts")
		}
		var b strings.Builder
		for j, part := range parts {
			if part.Type != "text" {
				return "", badRequest(fmt.Sprintf("%s[%d].type", param, j), "invalid_value",
					fmt.Sprintf("content part type %q is not supported (only text)", part.Type))
			}
			b.WriteString(part.Text)
		}
		return b.String(), nil
	}
	return "", badRequest(param, "invalid_type", "content must be a string or an array of text parts")
}

// plainString returns the text of a JSON string literal that needs no
// unescaping: no backslash and valid UTF-8, so json.Unmarshal would return
// exactly the bytes between the quotes. raw must come from a document that
// json.Unmarshal already accepted (no raw control characters or stray
// quotes inside). Prompts are the request's largest field, and this saves
// validating and decoding them a second time.
func plainString(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	in := raw[1 : len(raw)-1]
	if bytes.IndexByte(in, '\\') >= 0 || !utf8.Valid(in) {
		return "", false
	}
	return string(in), true
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
