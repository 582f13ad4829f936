package anthropic

import (
	"encoding/json"
	"fmt"
)

// Chat is a Messages request in the chat completions form.
type Chat struct {
	// Body is the whole chat completions request (a stream asks for usage
	// in its last chunk: message_delta reports it).
	Body []byte
	// Messages and Tools are Body's messages and tools arrays (Tools nil
	// when there are none): what the model's chat template renders, and
	// so what a router tokenizes.
	Messages json.RawMessage
	Tools    json.RawMessage
}

// chatMessage is one chat message; its keys go out in vLLM's order (a
// template that dumps a message sees the same text either way).
type chatMessage struct {
	Role       string         `json:"role"`
	ToolCallID string         `json:"tool_call_id,omitempty"`
	Content    any            `json:"content,omitempty"`
	ToolCalls  []chatToolCall `json:"tool_calls,omitempty"`
	Reasoning  string         `json:"reasoning,omitempty"`
}

type chatPart struct {
	Type     string     `json:"type"`
	Text     string     `json:"text,omitempty"`
	ImageURL *chatImage `json:"image_url,omitempty"`
}

type chatImage struct {
	URL string `json:"url"`
}

type chatToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"`
	Function chatFunction `json:"function"`
}

type chatFunction struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

type chatTool struct {
	Type     string       `json:"type"`
	Function chatToolSpec `json:"function"`
}

type chatToolSpec struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters"`
}

type chatRequest struct {
	Model              string          `json:"model"`
	Messages           json.RawMessage `json:"messages"`
	Tools              json.RawMessage `json:"tools,omitempty"`
	ToolChoice         any             `json:"tool_choice,omitempty"`
	MaxTokens          *int            `json:"max_tokens,omitempty"`
	Stop               []string        `json:"stop,omitempty"`
	Temperature        *float64        `json:"temperature,omitempty"`
	TopP               *float64        `json:"top_p,omitempty"`
	TopK               *int            `json:"top_k,omitempty"`
	Stream             bool            `json:"stream,omitempty"`
	StreamOptions      *streamOptions  `json:"stream_options,omitempty"`
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs,omitempty"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

// ToChat translates r (validated by Decode) into a chat completions
// request, as vLLM's Messages front end does: the system prompt is the
// first message; a user turn's tool_result blocks become tool messages
// ahead of the rest of that turn; an assistant turn's tool_use blocks its
// tool_calls (input as a JSON string) and its thinking its reasoning;
// images become image_url parts (base64 as a data URI); tools become
// functions with input_schema as parameters; tool_choice any is required
// and tool a named function; stop_sequences are stop.
func ToChat(r *Request) (*Chat, error) {
	var msgs []chatMessage
	sys, err := systemText(r.System)
	if err != nil {
		return nil, err
	}
	if sys != "" {
		msgs = append(msgs, chatMessage{Role: "system", Content: sys})
	}
	for i := range r.Messages {
		if msgs, err = appendTurn(msgs, &r.Messages[i], i); err != nil {
			return nil, err
		}
	}
	c := &Chat{}
	if c.Messages, err = json.Marshal(msgs); err != nil {
		return nil, err
	}
	req := chatRequest{Model: r.Model, Messages: c.Messages, MaxTokens: r.MaxTokens, Stop: r.StopSequences,
		Temperature: r.Temperature, TopP: r.TopP, TopK: r.TopK, Stream: r.Stream, ChatTemplateKwargs: r.ChatTemplateKwargs}
	if r.Stream {
		req.StreamOptions = &streamOptions{IncludeUsage: true}
	}
	if len(r.Tools) > 0 {
		tools := make([]chatTool, len(r.Tools))
		for i, t := range r.Tools {
			tools[i] = chatTool{Type: "function", Function: chatToolSpec{Name: t.Name, Description: t.Description, Parameters: t.InputSchema}}
		}
		if c.Tools, err = json.Marshal(tools); err != nil {
			return nil, err
		}
		req.Tools = c.Tools
		req.ToolChoice = "auto"
	}
	if tc := r.ToolChoice; tc != nil {
		switch tc.Type {
		case "auto":
			req.ToolChoice = "auto"
		case "any":
			req.ToolChoice = "required"
		case "none":
			req.ToolChoice = "none"
		case "tool":
			req.ToolChoice = map[string]any{"type": "function", "function": map[string]string{"name": tc.Name}}
		}
	}
	if c.Body, err = json.Marshal(req); err != nil {
		return nil, err
	}
	return c, nil
}

// appendTurn appends message i's chat form to msgs.
func appendTurn(msgs []chatMessage, m *Message, i int) ([]chatMessage, error) {
	out := chatMessage{Role: m.Role}
	var parts []chatPart
	var reasoning string
	for j := range m.Blocks {
		b := &m.Blocks[j]
		switch b.Type {
		case BlockText:
			parts = append(parts, chatPart{Type: "text", Text: *b.Text})
		case BlockImage:
			parts = append(parts, chatPart{Type: "image_url", ImageURL: &chatImage{URL: b.Source.url()}})
		case BlockThinking:
			reasoning += *b.Thinking
		case BlockToolUse:
			args := "{}"
			if len(b.Input) > 0 {
				args = string(b.Input)
			}
			out.ToolCalls = append(out.ToolCalls, chatToolCall{ID: b.ID, Type: "function", Function: chatFunction{Name: b.Name, Arguments: args}})
		case BlockToolResult:
			text, images, err := toolResultContent(b.Content, fmt.Sprintf("messages.%d.content.%d.content", i, j))
			if err != nil {
				return nil, err
			}
			msgs = append(msgs, chatMessage{Role: "tool", ToolCallID: b.ToolUseID, Content: text})
			if len(images) > 0 {
				img := make([]chatPart, len(images))
				for k, u := range images {
					img[k] = chatPart{Type: "image_url", ImageURL: &chatImage{URL: u}}
				}
				msgs = append(msgs, chatMessage{Role: "user", Content: img})
			}
		}
	}
	out.Reasoning = reasoning
	switch {
	case len(parts) == 1 && parts[0].Type == "text":
		out.Content = parts[0].Text
	case len(parts) > 0:
		out.Content = parts
	case len(out.ToolCalls) == 0 && reasoning == "":
		// Only tool results (already appended) or nothing at all.
		if m.Role == "user" {
			return msgs, nil
		}
		out.Content = ""
	}
	return append(msgs, out), nil
}
