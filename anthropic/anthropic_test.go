package anthropic

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const agentTurn = `{
  "model": "m", "max_tokens": 64, "stop_sequences": ["END"], "temperature": 0.5,
  "system": [{"type": "text", "text": "x-anthropic-billing-header: cc=1"}, {"type": "text", "text": "You are terse."}],
  "tools": [{"name": "get_weather", "description": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
  "tool_choice": {"type": "any"},
  "messages": [
    {"role": "user", "content": [
      {"type": "text", "text": "Weather in Paris?"},
      {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
      {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]},
    {"role": "assistant", "content": [
      {"type": "thinking", "thinking": "look it up", "signature": "s"},
      {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
    {"role": "user", "content": [
      {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "sunny"}, {"type": "text", "text": "21C"}]},
      {"type": "text", "text": "And tomorrow?"}]}
  ]}`

func TestAnAgentTurnTranslatesToTheChatFormVLLMBuilds(t *testing.T) {
	r, err := Decode([]byte(agentTurn), false)
	require.NoError(t, err)
	c, err := ToChat(r)
	require.NoError(t, err)
	var got map[string]any
	require.NoError(t, json.Unmarshal(c.Body, &got))
	want := `{
	  "model": "m", "max_tokens": 64, "stop": ["END"], "temperature": 0.5, "tool_choice": "required",
	  "tools": [{"type": "function", "function": {"name": "get_weather", "description": "weather",
	             "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}],
	  "messages": [
	    {"role": "system", "content": "You are terse."},
	    {"role": "user", "content": [
	      {"type": "text", "text": "Weather in Paris?"},
	      {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}},
	      {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}}]},
	    {"role": "assistant", "reasoning": "look it up",
	     "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
	    {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny\n21C"},
	    {"role": "user", "content": "And tomorrow?"}
	  ]}`
	var w map[string]any
	require.NoError(t, json.Unmarshal([]byte(want), &w))
	assert.Equal(t, w, got)
	assert.JSONEq(t, string(mustMarshal(t, w["messages"])), string(c.Messages), "Messages is the body's messages array")
	assert.JSONEq(t, string(mustMarshal(t, w["tools"])), string(c.Tools))
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

func TestAStreamingRequestAsksTheEngineForUsageAndANamedToolChoiceNamesTheFunction(t *testing.T) {
	r, err := Decode([]byte(`{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}],
		"tools":[{"name":"f","input_schema":{"type":"object"}}],"tool_choice":{"type":"tool","name":"f"}}`), false)
	require.NoError(t, err)
	c, err := ToChat(r)
	require.NoError(t, err)
	var got struct {
		Stream        bool            `json:"stream"`
		StreamOptions map[string]bool `json:"stream_options"`
		ToolChoice    json.RawMessage `json:"tool_choice"`
	}
	require.NoError(t, json.Unmarshal(c.Body, &got))
	assert.True(t, got.Stream)
	assert.Equal(t, map[string]bool{"include_usage": true}, got.StreamOptions)
	assert.JSONEq(t, `{"type":"function","function":{"name":"f"}}`, string(got.ToolChoice))
}

func TestBadRequestsAreRefusedNamingTheField(t *testing.T) {
	for _, tc := range []struct{ body, param string }{
		{`{"model":`, ""},
		{`{"max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`, "model"},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{`{"model":"m","max_tokens":0,"messages":[{"role":"user","content":"hi"}]}`, "max_tokens"},
		{`{"model":"m","max_tokens":4,"messages":[]}`, "messages"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"system","content":"hi"}]}`, "messages.0.role"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"hologram"}]}]}`, "messages.0.content.0.type"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"file","file_id":"f"}}]}]}`, "messages.0.content.0.source.type"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]}]}`, "messages.0.content.0"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"a"}]}]}`, "messages.0.content.0"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"web_search_20250305","name":"web_search"}]}`, "tools.0.type"},
		{`{"model":"m","max_tokens":4,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"tool"}}`, "tool_choice.name"},
		{`{"model":"m","max_tokens":4,"system":[{"type":"image"}],"messages":[{"role":"user","content":"hi"}]}`, "system.0"},
	} {
		_, err := Decode([]byte(tc.body), false)
		var re *RequestError
		require.True(t, errors.As(err, &re), "%s: %v", tc.body, err)
		assert.ErrorIs(t, err, ErrBadRequest)
		assert.Equal(t, tc.param, re.Param, tc.body)
	}
	_, err := Decode([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]}`), true)
	assert.NoError(t, err, "count_tokens has no max_tokens")
}

func TestAChatCompletionBecomesAMessageWithAnthropicsStopReasonsAndUsage(t *testing.T) {
	for _, tc := range []struct {
		finish, vllmStop, reason string
		seq                      *string
	}{
		{"stop", "null", StopEndTurn, nil},
		{"length", "null", StopMaxTokens, nil},
		{"tool_calls", "null", StopToolUse, nil},
		{"stop", `"END"`, StopStopSequence, ptr("END")},
		{"stop", `"OTHER"`, StopEndTurn, nil},
	} {
		body := `{"id":"chatcmpl-7","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"hi",
			"tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},
			"finish_reason":"` + tc.finish + `","stop_reason":` + tc.vllmStop + `}],
			"usage":{"prompt_tokens":30,"completion_tokens":5,"prompt_tokens_details":{"cached_tokens":16}}}`
		m, err := FromChat([]byte(body), []string{"END"})
		require.NoError(t, err)
		assert.Equal(t, "msg_7", m.ID)
		require.NotNil(t, m.StopReason)
		assert.Equal(t, tc.reason, *m.StopReason, tc.finish+" "+tc.vllmStop)
		assert.Equal(t, tc.seq, m.StopSequence)
		assert.Equal(t, Usage{InputTokens: 14, OutputTokens: 5, CacheReadInputTokens: 16}, m.Usage)
		require.Len(t, m.Content, 2)
		assert.Equal(t, "hi", *m.Content[0].Text)
		assert.Equal(t, ResponseBlock{Type: BlockToolUse, ID: "call_1", Name: "f", Input: json.RawMessage(`{"a":1}`)}, m.Content[1])
	}
	_, err := FromChat([]byte(`{"object":"list"}`), nil)
	assert.ErrorIs(t, err, ErrNotChat)
}

func ptr(s string) *string { return &s }

type event struct {
	name string
	data map[string]any
}

func parseEvents(t *testing.T, b []byte) []event {
	t.Helper()
	var out []event
	sc := bufio.NewScanner(bytes.NewReader(b))
	var name string
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "event: "):
			name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			var d map[string]any
			require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &d), line)
			require.Equal(t, name, d["type"], "the event name is the data's type")
			out = append(out, event{name, d})
		}
	}
	return out
}

func TestAChatStreamBecomesTheMessagesEventSequence(t *testing.T) {
	chunks := []string{
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"reasoning":"hmm"}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"content":"Let me "}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"content":"check."}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"f","arguments":"{\"ci"}}]}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"ty\":1}"}}]}}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"g","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
		`{"id":"chatcmpl-9","model":"m","choices":[],"usage":{"prompt_tokens":10,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":4}}}`,
		`[DONE]`,
	}
	s := NewStreamer(nil, 10)
	var out []byte
	for _, c := range chunks {
		out = append(out, s.Chunk([]byte(c))...)
	}
	assert.True(t, s.Done())
	evs := parseEvents(t, out)
	var names []string
	for _, e := range evs {
		names = append(names, e.name)
	}
	assert.Equal(t, []string{"message_start", "ping",
		"content_block_start", "content_block_delta", "content_block_stop", // thinking
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", // text
		"content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", // tool call a
		"content_block_start", "content_block_delta", "content_block_stop", // tool call b
		"message_delta", "message_stop"}, names)
	assert.Equal(t, "msg_9", evs[0].data["message"].(map[string]any)["id"])
	assert.InDelta(t, 10, evs[0].data["message"].(map[string]any)["usage"].(map[string]any)["input_tokens"], 0)
	assert.Equal(t, map[string]any{"type": "thinking_delta", "thinking": "hmm"}, evs[3].data["delta"])
	assert.Equal(t, map[string]any{"type": "text_delta", "text": "Let me "}, evs[6].data["delta"])
	start := evs[9].data["content_block"].(map[string]any)
	assert.Equal(t, map[string]any{"type": "tool_use", "id": "call_a", "name": "f", "input": map[string]any{}}, start)
	assert.Equal(t, map[string]any{"type": "input_json_delta", "partial_json": `{"ci`}, evs[10].data["delta"])
	assert.InDelta(t, 3, evs[13].data["index"], 0, "each call is a block of its own")
	md := evs[16].data
	assert.Equal(t, "tool_use", md["delta"].(map[string]any)["stop_reason"])
	assert.Equal(t, map[string]any{"input_tokens": 6.0, "output_tokens": 7.0, "cache_creation_input_tokens": 0.0, "cache_read_input_tokens": 4.0}, md["usage"])
	assert.Empty(t, s.Chunk([]byte(`[DONE]`)), "nothing after message_stop")
}

func TestAnErrorInAChatStreamBecomesAnErrorEvent(t *testing.T) {
	s := NewStreamer(nil, 0)
	out := s.Chunk([]byte(`{"id":"x","model":"m","choices":[{"index":0,"delta":{"content":"a"}}]}`))
	out = append(out, s.Chunk([]byte(`{"error":{"message":"the worker's stream broke off","type":"server_error","code":"upstream_failed"}}`))...)
	evs := parseEvents(t, out)
	last := evs[len(evs)-1]
	assert.Equal(t, "error", last.name)
	assert.Equal(t, map[string]any{"type": "api_error", "message": "the worker's stream broke off", "code": "upstream_failed"}, last.data["error"])
	assert.True(t, s.Done())
}

func TestErrorStatusesMapToAnthropicsErrorTypes(t *testing.T) {
	for status, typ := range map[int]string{400: ErrInvalidRequest, 401: ErrAuthentication, 403: ErrPermission, 404: ErrNotFound,
		413: ErrTooLarge, 429: ErrRateLimit, 500: ErrAPI, 502: ErrAPI, 503: ErrOverloaded, 529: ErrOverloaded, 504: ErrTimeout} {
		assert.Equal(t, typ, ErrorType(status), status)
	}
	got := ConvertError(429, []byte(`{"error":{"message":"over quota","type":"rate_limit_error","param":null,"code":"quota_exceeded"}}`))
	assert.JSONEq(t, `{"type":"error","error":{"type":"rate_limit_error","message":"over quota","code":"quota_exceeded"}}`, string(got))
	native := []byte(`{"type":"error","error":{"type":"overloaded_error","message":"busy"}}`)
	assert.Equal(t, native, ConvertError(503, native), "an engine's own Messages error passes")
	assert.JSONEq(t, `{"type":"error","error":{"type":"api_error","message":"plain text"}}`, string(ConvertError(500, []byte("plain text\n"))))
}

func TestTheWriterTranslatesAChatHandlersAnswersAndErrors(t *testing.T) {
	rec := httptest.NewRecorder()
	w := NewWriter(rec, nil, 3, true)
	w.Header().Set("X-Request-Id", "r1")
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write([]byte(`{"id":"chatcmpl-1","model":"m","choices":[{"message":{"content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`))
	w.Finish()
	assert.Equal(t, "r1", rec.Header().Get("request-id"))
	assert.JSONEq(t, `{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[{"type":"text","text":"ok"}],
		"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":3,"output_tokens":1,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`, rec.Body.String())

	rec = httptest.NewRecorder()
	w = NewWriter(rec, nil, 0, false)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusUnauthorized)
	_, _ = w.Write([]byte(`{"error":{"message":"the API key is not valid","type":"invalid_request_error","code":"invalid_api_key"}}`))
	w.Finish()
	assert.Equal(t, http.StatusUnauthorized, rec.Code)
	assert.JSONEq(t, `{"type":"error","error":{"type":"authentication_error","message":"the API key is not valid","code":"invalid_api_key"}}`, rec.Body.String())

	rec = httptest.NewRecorder()
	w = NewWriter(rec, nil, 0, true)
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(http.StatusOK)
	for _, part := range []string{"data: {\"id\":\"a\",\"model\":\"m\",\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n", "\n", "data: [DO", "NE]\n\n"} {
		_, _ = w.Write([]byte(part)) // a line may arrive in pieces
	}
	w.Finish()
	var names []string
	for _, e := range parseEvents(t, rec.Body.Bytes()) {
		names = append(names, e.name)
	}
	assert.Equal(t, []string{"message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop"}, names)
}
