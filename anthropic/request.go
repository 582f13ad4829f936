package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// ErrBadRequest marks a Messages request the API refuses (HTTP 400). Every
// *RequestError wraps it.
var ErrBadRequest = errors.New("anthropic: bad request")

// RequestError is a client mistake in a Messages request: Param names the
// offending field (JSON path), Message says what is wrong.
type RequestError struct {
	Param   string
	Code    string
	Message string
}

func (e *RequestError) Error() string {
	if e.Param == "" {
		return "anthropic: " + e.Message
	}
	return "anthropic: " + e.Param + ": " + e.Message
}

// Unwrap returns ErrBadRequest.
func (e *RequestError) Unwrap() error { return ErrBadRequest }

func bad(param, code, format string, args ...any) *RequestError {
	return &RequestError{Param: param, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Request is a Messages request (POST /v1/messages) as far as it is read
// or translated; a request forwarded to an engine that serves the API
// itself goes out as the client sent it.
type Request struct {
	Model         string          `json:"model"`
	MaxTokens     *int            `json:"max_tokens"`
	System        json.RawMessage `json:"system"`
	Messages      []Message       `json:"messages"`
	Tools         []Tool          `json:"tools"`
	ToolChoice    *ToolChoice     `json:"tool_choice"`
	StopSequences []string        `json:"stop_sequences"`
	Stream        bool            `json:"stream"`
	Temperature   *float64        `json:"temperature"`
	TopP          *float64        `json:"top_p"`
	TopK          *int            `json:"top_k"`
	Metadata      *struct {
		UserID string `json:"user_id"`
	} `json:"metadata"`
	// ChatTemplateKwargs is vLLM's extension, passed to the chat template.
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
}

// UserID is metadata.user_id ("" when absent).
func (r *Request) UserID() string {
	if r.Metadata == nil {
		return ""
	}
	return r.Metadata.UserID
}

// Message is one turn: its content is a string or an array of blocks.
type Message struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// Blocks is Content decoded (a string content is one text block).
	Blocks []Block `json:"-"`
}

// Block is one content block of a message. Which fields are set depends on
// Type.
type Block struct {
	Type string `json:"type"`
	// Text of a text block.
	Text *string `json:"text,omitempty"`
	// Source of an image block.
	Source *ImageSource `json:"source,omitempty"`
	// ID, Name and Input of a tool_use block.
	ID    string          `json:"id,omitempty"`
	Name  string          `json:"name,omitempty"`
	Input json.RawMessage `json:"input,omitempty"`
	// ToolUseID, Content and IsError of a tool_result block; Content is a
	// string or an array of text and image blocks.
	ToolUseID string          `json:"tool_use_id,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	IsError   bool            `json:"is_error,omitempty"`
	// Thinking and Signature of a thinking block; Data of a
	// redacted_thinking block.
	Thinking  *string `json:"thinking,omitempty"`
	Signature string  `json:"signature,omitempty"`
	Data      string  `json:"data,omitempty"`
}

// ImageSource is where an image block's bytes are: inline base64 data of a
// media type, or a URL.
type ImageSource struct {
	Type      string `json:"type"`
	MediaType string `json:"media_type,omitempty"`
	Data      string `json:"data,omitempty"`
	URL       string `json:"url,omitempty"`
}

// Tool is a client tool definition. Server tools (web search, code
// execution: types other than "custom") are Anthropic's own and have no
// chat completions form.
type Tool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// ToolChoice is auto, any, tool (with Name) or none.
type ToolChoice struct {
	Type string `json:"type"`
	Name string `json:"name"`
}

// Block types of requests.
const (
	BlockText             = "text"
	BlockImage            = "image"
	BlockToolUse          = "tool_use"
	BlockToolResult       = "tool_result"
	BlockThinking         = "thinking"
	BlockRedactedThinking = "redacted_thinking"
)

// Decode parses and validates a Messages request body. counting is set for
// a count_tokens body, which has no max_tokens. Errors are *RequestError.
func Decode(body []byte, counting bool) (*Request, error) {
	var r Request
	if err := json.Unmarshal(body, &r); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return nil, bad(te.Field, "invalid_type", "%s: wrong type (%s)", te.Field, te.Value)
		}
		return nil, bad("", "invalid_json", "the body is not valid JSON: %v", err)
	}
	if r.Model == "" {
		return nil, bad("model", "missing_required_parameter", "model: Field required")
	}
	if !counting {
		if r.MaxTokens == nil {
			return nil, bad("max_tokens", "missing_required_parameter", "max_tokens: Field required")
		}
		if *r.MaxTokens < 1 {
			return nil, bad("max_tokens", "invalid_value", "max_tokens: must be at least 1, got %d", *r.MaxTokens)
		}
	}
	if len(r.Messages) == 0 {
		return nil, bad("messages", "missing_required_parameter", "messages: at least one message is required")
	}
	if _, err := systemText(r.System); err != nil {
		return nil, err
	}
	for i := range r.Messages {
		if err := r.Messages[i].decode(i); err != nil {
			return nil, err
		}
	}
	for i, t := range r.Tools {
		p := fmt.Sprintf("tools.%d", i)
		if t.Type != "" && t.Type != "custom" {
			return nil, bad(p+".type", "unsupported_value", "tool type %q is an Anthropic server tool; only client tools (\"custom\") are served here", t.Type)
		}
		if t.Name == "" {
			return nil, bad(p+".name", "missing_required_parameter", "%s.name: Field required", p)
		}
		if s := bytes.TrimSpace(t.InputSchema); len(s) == 0 || s[0] != '{' {
			return nil, bad(p+".input_schema", "invalid_type", "%s.input_schema must be a JSON schema object", p)
		}
	}
	if tc := r.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto", "any", "none":
		case "tool":
			if tc.Name == "" {
				return nil, bad("tool_choice.name", "missing_required_parameter", "tool_choice.name: Field required for type \"tool\"")
			}
		default:
			return nil, bad("tool_choice.type", "invalid_value", "tool_choice.type must be auto, any, tool or none, got %q", tc.Type)
		}
	}
	return &r, nil
}

// decode parses m's content into Blocks and validates them.
func (m *Message) decode(i int) error {
	p := fmt.Sprintf("messages.%d", i)
	if m.Role != "user" && m.Role != "assistant" {
		return bad(p+".role", "invalid_value", "%s.role must be \"user\" or \"assistant\", got %q", p, m.Role)
	}
	c := bytes.TrimSpace(m.Content)
	switch {
	case len(c) == 0 || string(c) == "null":
		return bad(p+".content", "missing_required_parameter", "%s.content: Field required", p)
	case c[0] == '"':
		var s string
		if err := json.Unmarshal(c, &s); err != nil {
			return bad(p+".content", "invalid_type", "%s.content is not a valid string", p)
		}
		m.Blocks = []Block{{Type: BlockText, Text: &s}}
		return nil
	case c[0] != '[':
		return bad(p+".content", "invalid_type", "%s.content must be a string or an array of content blocks", p)
	}
	if err := json.Unmarshal(c, &m.Blocks); err != nil {
		return bad(p+".content", "invalid_type", "%s.content: %v", p, err)
	}
	for j := range m.Blocks {
		if err := m.Blocks[j].validate(fmt.Sprintf("%s.content.%d", p, j), m.Role); err != nil {
			return err
		}
	}
	return nil
}

func (b *Block) validate(p, role string) error {
	switch b.Type {
	case BlockText:
		if b.Text == nil {
			return bad(p+".text", "missing_required_parameter", "%s.text: Field required", p)
		}
	case BlockImage:
		if err := b.Source.validate(p + ".source"); err != nil {
			return err
		}
	case BlockToolUse:
		if role != "assistant" {
			return bad(p, "invalid_value", "%s: tool_use blocks belong to assistant messages", p)
		}
		if b.ID == "" || b.Name == "" {
			return bad(p, "missing_required_parameter", "%s: a tool_use block needs an id and a name", p)
		}
		if in := bytes.TrimSpace(b.Input); len(in) > 0 && in[0] != '{' {
			return bad(p+".input", "invalid_type", "%s.input must be an object", p)
		}
	case BlockToolResult:
		if role != "user" {
			return bad(p, "invalid_value", "%s: tool_result blocks belong to user messages", p)
		}
		if b.ToolUseID == "" {
			return bad(p+".tool_use_id", "missing_required_parameter", "%s.tool_use_id: Field required", p)
		}
		if _, _, err := toolResultContent(b.Content, p+".content"); err != nil {
			return err
		}
	case BlockThinking:
		if b.Thinking == nil {
			return bad(p+".thinking", "missing_required_parameter", "%s.thinking: Field required", p)
		}
	case BlockRedactedThinking:
	case "":
		return bad(p+".type", "missing_required_parameter", "%s.type: Field required", p)
	default:
		return bad(p+".type", "invalid_value", "%s.type: unknown or unsupported content block type %q", p, b.Type)
	}
	return nil
}

func (s *ImageSource) validate(p string) error {
	switch {
	case s == nil:
		return bad(p, "missing_required_parameter", "%s: Field required", p)
	case s.Type == "base64":
		if s.MediaType == "" || s.Data == "" {
			return bad(p, "missing_required_parameter", "%s: a base64 source needs media_type and data", p)
		}
	case s.Type == "url":
		if s.URL == "" {
			return bad(p+".url", "missing_required_parameter", "%s.url: Field required", p)
		}
	default:
		return bad(p+".type", "invalid_value", "%s.type must be base64 or url, got %q", p, s.Type)
	}
	return nil
}

// url is the image as a chat image_url: a data URI for inline bytes.
func (s *ImageSource) url() string {
	if s.Type == "url" {
		return s.URL
	}
	return "data:" + s.MediaType + ";base64," + s.Data
}

// systemText joins a system prompt (a string or text blocks) into one
// string, as vLLM does (no separator). Claude Code's billing header block
// carries a per-request hash: vLLM drops it so prefixes stay shared, and
// so does this.
func systemText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", bad("system", "invalid_type", "system is not a valid string")
		}
		return s, nil
	}
	var blocks []Block
	if raw[0] != '[' || json.Unmarshal(raw, &blocks) != nil {
		return "", bad("system", "invalid_type", "system must be a string or an array of text blocks")
	}
	var sb strings.Builder
	for i, b := range blocks {
		if b.Type != BlockText || b.Text == nil {
			return "", bad(fmt.Sprintf("system.%d", i), "invalid_value", "system blocks must be text blocks")
		}
		if strings.HasPrefix(*b.Text, "x-anthropic-billing-header") {
			continue
		}
		sb.WriteString(*b.Text)
	}
	return sb.String(), nil
}

// toolResultContent is a tool_result's content as text (text blocks joined
// by newlines) and image URLs.
func toolResultContent(raw json.RawMessage, p string) (string, []string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil, nil
	}
	if raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", nil, bad(p, "invalid_type", "%s is not a valid string", p)
		}
		return s, nil, nil
	}
	var blocks []Block
	if raw[0] != '[' || json.Unmarshal(raw, &blocks) != nil {
		return "", nil, bad(p, "invalid_type", "%s must be a string or an array of content blocks", p)
	}
	var texts, images []string
	for i, b := range blocks {
		bp := fmt.Sprintf("%s.%d", p, i)
		switch b.Type {
		case BlockText:
			if b.Text == nil {
				return "", nil, bad(bp+".text", "missing_required_parameter", "%s.text: Field required", bp)
			}
			texts = append(texts, *b.Text)
		case BlockImage:
			if err := b.Source.validate(bp + ".source"); err != nil {
				return "", nil, err
			}
			images = append(images, b.Source.url())
		default:
			return "", nil, bad(bp+".type", "invalid_value", "%s.type: unsupported block type %q in a tool result", bp, b.Type)
		}
	}
	return strings.Join(texts, "\n"), images, nil
}
