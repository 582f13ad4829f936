package anthropic

import (
	"encoding/json"
	"errors"
	"testing"
)

// FuzzDecodeAndTranslate feeds arbitrary bodies to the decoder: each is
// refused with a *RequestError or translates to a chat request that is
// valid JSON, and a chat completion or stream chunk made of the same bytes
// translates without panicking.
func FuzzDecodeAndTranslate(f *testing.F) {
	f.Add([]byte(agentTurn))
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add([]byte(`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"image","source":{"type":"url","url":"u"}}]}]}]}`))
	f.Add([]byte(`{"id":"chatcmpl-1","choices":[{"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"nope"}}]},"finish_reason":"stop","stop_reason":"X"}]}`))
	f.Add([]byte(`{"choices":[{"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]}}]}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, counting := range []bool{false, true} {
			r, err := Decode(body, counting)
			if err != nil {
				var re *RequestError
				if !errors.As(err, &re) {
					t.Fatalf("Decode error %T is not a *RequestError: %v", err, err)
				}
				continue
			}
			c, err := ToChat(r)
			if err != nil {
				t.Fatalf("a decoded request fails to translate: %v", err)
			}
			if !json.Valid(c.Body) || !json.Valid(c.Messages) {
				t.Fatalf("the chat form is not JSON: %s", c.Body)
			}
		}
		if m, err := FromChat(body, []string{"X"}); err == nil {
			if _, err := json.Marshal(m); err != nil {
				t.Fatalf("a translated message does not encode: %v", err)
			}
		}
		s := NewStreamer([]string{"X"}, 1)
		_ = s.Chunk(body)
		_ = s.Chunk([]byte("[DONE]"))
		if !s.Done() {
			t.Fatal("[DONE] does not end the stream")
		}
	})
}
