package anthropic

import (
	"bytes"
	"encoding/json"
	"errors"
	"slices"
	"strings"
)

// Response is a Messages response (a non-streaming answer, and the
// message of a stream's message_start event).
type Response struct {
	ID           string          `json:"id"`
	Type         string          `json:"type"`
	Role         string          `json:"role"`
	Model        string          `json:"model"`
	Content      []ResponseBlock `json:"content"`
	StopReason   *string         `json:"stop_reason"`
	StopSequence *string         `json:"stop_sequence"`
	Usage        Usage           `json:"usage"`
}

// ResponseBlock is one content block of an answer.
type ResponseBlock struct {
	Type      string          `json:"type"`
	Text      *string         `json:"text,omitempty"`
	ID        string          `json:"id,omitempty"`
	Name      string          `json:"name,omitempty"`
	Input     json.RawMessage `json:"input,omitempty"`
	Thinking  *string         `json:"thinking,omitempty"`
	Signature *string         `json:"signature,omitempty"`
}

// Usage is a Messages usage object. cache_read_input_tokens is the chat
// usage's prompt_tokens_details.cached_tokens (the engine's prefix-cache
// hits); Anthropic counts them apart from input_tokens, the engines count
// them inside prompt_tokens, so input_tokens here is prompt_tokens less
// the cached ones.
type Usage struct {
	InputTokens              int `json:"input_tokens"`
	OutputTokens             int `json:"output_tokens"`
	CacheCreationInputTokens int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     int `json:"cache_read_input_tokens"`
}

// Stop reasons.
const (
	StopEndTurn      = "end_turn"
	StopMaxTokens    = "max_tokens"
	StopToolUse      = "tool_use"
	StopStopSequence = "stop_sequence"
)

// chatUsage is the usage of a chat completion or of a stream's last chunk.
type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u *chatUsage) usage() Usage {
	if u == nil {
		return Usage{}
	}
	out := Usage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens}
	if d := u.PromptTokensDetails; d != nil && d.CachedTokens > 0 && d.CachedTokens <= u.PromptTokens {
		out.CacheReadInputTokens = d.CachedTokens
		out.InputTokens -= d.CachedTokens
	}
	return out
}

type chatCompletion struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Message struct {
			Content          *string `json:"content"`
			Reasoning        *string `json:"reasoning"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				ID       string       `json:"id"`
				Function chatFunction `json:"function"`
			} `json:"tool_calls"`
		} `json:"message"`
		FinishReason *string `json:"finish_reason"`
		// StopReason is vLLM's extension: the stop string (or token id)
		// that ended the choice, null at EOS.
		StopReason json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// ErrNotChat marks an engine answer that is not a chat completion.
var ErrNotChat = errors.New("anthropic: the engine's answer is not a chat completion")

// FromChat translates a chat completion into a Messages response. stops
// are the request's stop_sequences: a choice vLLM says a stop string ended
// reports stop_sequence with that string.
func FromChat(body []byte, stops []string) (*Response, error) {
	var cc chatCompletion
	if err := json.Unmarshal(body, &cc); err != nil || len(cc.Choices) == 0 {
		return nil, ErrNotChat
	}
	ch := &cc.Choices[0]
	out := &Response{ID: messageID(cc.ID), Type: "message", Role: "assistant", Model: cc.Model,
		Content: []ResponseBlock{}, Usage: cc.Usage.usage()}
	if r := firstString(ch.Message.Reasoning, ch.Message.ReasoningContent); r != "" {
		sig := ""
		out.Content = append(out.Content, ResponseBlock{Type: BlockThinking, Thinking: &r, Signature: &sig})
	}
	if c := ch.Message.Content; c != nil && *c != "" {
		out.Content = append(out.Content, ResponseBlock{Type: BlockText, Text: c})
	}
	for _, tc := range ch.Message.ToolCalls {
		out.Content = append(out.Content, ResponseBlock{Type: BlockToolUse, ID: tc.ID, Name: tc.Function.Name, Input: toolInput(tc.Function.Arguments)})
	}
	out.StopReason, out.StopSequence = stopReason(ch.FinishReason, ch.StopReason, stops)
	return out, nil
}

func firstString(ss ...*string) string {
	for _, s := range ss {
		if s != nil && *s != "" {
			return *s
		}
	}
	return ""
}

// toolInput is a tool call's arguments as the tool_use input object: an
// engine's arguments that are not a JSON object (a model's malformed call)
// are kept as a string under "arguments" rather than dropped.
func toolInput(args string) json.RawMessage {
	a := bytes.TrimSpace([]byte(args))
	if len(a) == 0 {
		return json.RawMessage("{}")
	}
	if a[0] == '{' && json.Valid(a) {
		return a
	}
	b, _ := json.Marshal(map[string]string{"arguments": args}) // a string: cannot fail
	return b
}

// stopReason maps a chat finish_reason to Anthropic's: stop is end_turn
// (or stop_sequence when vLLM names one of the request's stop strings),
// length max_tokens, tool_calls tool_use; nil stays nil.
func stopReason(finish *string, vllmStop json.RawMessage, stops []string) (reason, seq *string) {
	if finish == nil {
		return nil, nil
	}
	r := StopEndTurn
	switch *finish {
	case "length":
		r = StopMaxTokens
	case "tool_calls", "function_call":
		r = StopToolUse
	case "stop":
		var s string
		if len(vllmStop) > 0 && vllmStop[0] == '"' && json.Unmarshal(vllmStop, &s) == nil && slices.Contains(stops, s) {
			r = StopStopSequence
			return &r, &s
		}
	}
	return &r, nil
}

// messageID is a chat completion id as a message id.
func messageID(id string) string {
	if strings.HasPrefix(id, "msg_") {
		return id
	}
	return "msg_" + strings.TrimPrefix(id, "chatcmpl-")
}
