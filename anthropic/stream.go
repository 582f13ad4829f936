package anthropic

import (
	"bytes"
	"encoding/json"
)

// Streamer translates a chat completions stream, one data payload at a
// time, into the Messages event sequence: message_start and a ping at the
// first chunk; content_block_start, content_block_delta (text_delta,
// input_json_delta for tool-call arguments, thinking_delta) and
// content_block_stop per block; at [DONE] message_delta (stop reason and
// usage) and message_stop. Only the first choice is translated (Messages
// has no n).
type Streamer struct {
	stops []string
	// inputTokens is message_start's input_tokens when the first chunk
	// carries no usage (engines send it only in the last one).
	inputTokens int
	started     bool
	ended       bool
	block       string // the open block's type; "" none
	index       int    // the open block's index, else the next one's
	toolID      string // the open tool_use block's id
	finish      *string
	stopRaw     json.RawMessage
	usage       *chatUsage
	buf         []byte
}

// NewStreamer returns a Streamer for a request with stop_sequences stops,
// whose prompt the router counted inputTokens tokens.
func NewStreamer(stops []string, inputTokens int) *Streamer {
	return &Streamer{stops: stops, inputTokens: inputTokens}
}

type chatChunk struct {
	ID      string `json:"id"`
	Model   string `json:"model"`
	Choices []struct {
		Delta struct {
			Content          *string `json:"content"`
			Reasoning        *string `json:"reasoning"`
			ReasoningContent *string `json:"reasoning_content"`
			ToolCalls        []struct {
				Index    int    `json:"index"`
				ID       string `json:"id"`
				Function struct {
					Name      string `json:"name"`
					Arguments string `json:"arguments"`
				} `json:"function"`
			} `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string         `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
	} `json:"choices"`
	Usage *chatUsage      `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// Done reports whether the stream reached message_stop.
func (s *Streamer) Done() bool { return s.ended }

// Chunk translates one data payload (a chunk's JSON, or [DONE]) and returns
// the events it makes, in wire form; the slice is valid until the next
// call. A payload that is not a chunk makes no event; an error payload
// makes an error event.
func (s *Streamer) Chunk(payload []byte) []byte {
	s.buf = s.buf[:0]
	payload = bytes.TrimSpace(payload)
	if s.ended {
		return nil
	}
	if string(payload) == "[DONE]" {
		s.end()
		return s.buf
	}
	var c chatChunk
	if json.Unmarshal(payload, &c) != nil {
		return nil
	}
	if len(c.Error) > 0 && string(c.Error) != "null" {
		s.event("error", ErrorBody(0, c.Error))
		s.ended = true
		return s.buf
	}
	if !s.started {
		s.started = true
		u := Usage{InputTokens: s.inputTokens}
		if c.Usage != nil {
			u = c.Usage.usage()
			u.OutputTokens = 0
		}
		msg := Response{ID: messageID(c.ID), Type: "message", Role: "assistant", Model: c.Model, Content: []ResponseBlock{}, Usage: u}
		s.event("message_start", map[string]any{"type": "message_start", "message": msg})
		s.event("ping", map[string]string{"type": "ping"})
	}
	if c.Usage != nil {
		s.usage = c.Usage
	}
	if len(c.Choices) == 0 {
		return s.buf
	}
	ch := &c.Choices[0]
	if r := firstString(ch.Delta.Reasoning, ch.Delta.ReasoningContent); r != "" {
		s.open(BlockThinking, "", func() any {
			e, sig := "", ""
			return ResponseBlock{Type: BlockThinking, Thinking: &e, Signature: &sig}
		})
		s.delta(map[string]string{"type": "thinking_delta", "thinking": r})
	}
	if t := ch.Delta.Content; t != nil && *t != "" {
		s.open(BlockText, "", func() any {
			e := ""
			return ResponseBlock{Type: BlockText, Text: &e}
		})
		s.delta(map[string]string{"type": "text_delta", "text": *t})
	}
	for _, tc := range ch.Delta.ToolCalls {
		if tc.ID != "" && tc.ID != s.toolID {
			s.open(BlockToolUse, tc.ID, func() any {
				return ResponseBlock{Type: BlockToolUse, ID: tc.ID, Name: tc.Function.Name, Input: json.RawMessage("{}")}
			})
		}
		if tc.Function.Arguments != "" && s.block == BlockToolUse {
			s.delta(map[string]string{"type": "input_json_delta", "partial_json": tc.Function.Arguments})
		}
	}
	if ch.FinishReason != nil {
		s.finish, s.stopRaw = ch.FinishReason, ch.StopReason
	}
	return s.buf
}

// open starts a block of typ (a tool_use block for each new id) unless one
// is open already, closing the open one first.
func (s *Streamer) open(typ, toolID string, block func() any) {
	if s.block == typ && (typ != BlockToolUse || s.toolID == toolID) {
		return
	}
	s.closeBlock()
	s.block, s.toolID = typ, toolID
	s.event("content_block_start", map[string]any{"type": "content_block_start", "index": s.index, "content_block": block()})
}

func (s *Streamer) delta(d map[string]string) {
	s.event("content_block_delta", map[string]any{"type": "content_block_delta", "index": s.index, "delta": d})
}

func (s *Streamer) closeBlock() {
	if s.block == "" {
		return
	}
	s.event("content_block_stop", map[string]any{"type": "content_block_stop", "index": s.index})
	s.block, s.toolID = "", ""
	s.index++
}

func (s *Streamer) end() {
	if !s.started {
		// [DONE] without a chunk: still a well-formed (empty) message.
		s.started = true
		s.event("message_start", map[string]any{"type": "message_start", "message": Response{ID: "msg_", Type: "message",
			Role: "assistant", Content: []ResponseBlock{}, Usage: Usage{InputTokens: s.inputTokens}}})
	}
	s.closeBlock()
	reason, seq := stopReason(s.finish, s.stopRaw, s.stops)
	if reason == nil {
		r := StopEndTurn
		reason = &r
	}
	u := s.usage.usage()
	if s.usage == nil {
		u.InputTokens = s.inputTokens
	}
	s.event("message_delta", map[string]any{"type": "message_delta",
		"delta": map[string]*string{"stop_reason": reason, "stop_sequence": seq}, "usage": u})
	s.event("message_stop", map[string]string{"type": "message_stop"})
	s.ended = true
}

// event appends one SSE event: its name, then its data.
func (s *Streamer) event(name string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		return // our own types always encode
	}
	s.buf = AppendEvent(s.buf, name, b)
}

// AppendEvent appends an SSE event (event: name, data: data) to dst.
func AppendEvent(dst []byte, name string, data []byte) []byte {
	dst = append(dst, "event: "...)
	dst = append(dst, name...)
	dst = append(dst, "\ndata: "...)
	dst = append(dst, data...)
	return append(dst, "\n\n"...)
}
