package chat

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestContentFormatIsOpenAIOnlyForTemplatesThatLoopOverAMessagesContent(t *testing.T) {
	dir := filepath.Join(testenv.ModuleDir(t, testenv.JinjaModule), "testdata", "templates")
	want := map[string]ContentFormat{
		"Qwen3-VL-30B-A3B-Instruct-Q8_0":     ContentOpenAI, // for content in message.content
		"gemma-4-26B-A4B-it-UD-Q8_K_XL":      ContentOpenAI, // for item in message['content']
		"Mistral-Medium-3.5-128B-GGUF":       ContentOpenAI,
		"Ministral-3-14B-Instruct-2512-Q4_0": ContentOpenAI,
		"Qwen3-8B-Q8_0":                      ContentString,
		"Qwen2-Audio-7B.Q8_0":                ContentString,
		"Qwen3.5-35B-A3B-Q8_0":               ContentString, // loops over a macro argument, which vLLM's detection does not follow
	}
	for name, f := range want {
		src, err := os.ReadFile(filepath.Join(dir, name+".jinja"))
		if err != nil {
			t.Fatal(err)
		}
		if got := DetectContentFormat(string(src)); got != f {
			t.Errorf("%s: got %v, want %v", name, got, f)
		}
	}
	if got := llama3Template(t).ContentFormat(); got != ContentString {
		t.Errorf("Llama-3: got %v", got)
	}
	if got := DetectContentFormat("{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m['content'] | selectattr('type') %}{% endfor %}{% endfor %}"); got != ContentOpenAI {
		t.Errorf("a loop over a slice of messages: got %v", got)
	}
	if got := DetectContentFormat("{% for p in messages[0]['content'] %}{% endfor %}"); got != ContentString {
		t.Errorf("messages[0] is not a loop variable for vLLM: got %v", got)
	}
}

func TestVLLMMessagesRebuildsContentAsVLLMDoes(t *testing.T) {
	in := decodeList(t, `[
		{"role": "system", "content": "S", "extra": 1},
		{"role": "user", "name": "ann", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]},
		{"role": "assistant", "content": null, "reasoning": "r", "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
		{"role": "tool", "tool_call_id": "1", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "y"}]}
	]`)
	for _, c := range []struct {
		format ContentFormat
		want   string
	}{
		{ContentString, `[{"role":"system","content":"S"},` +
			`{"role":"user","content":"a\nb","name":"ann"},` +
			`{"role":"assistant","content":"","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}],"reasoning":"r","reasoning_content":"r"},` +
			`{"role":"tool","content":"x\ny","tool_call_id":"1"}]`},
		{ContentOpenAI, `[{"role":"system","content":[{"type":"text","text":"S"}]},` +
			`{"role":"user","content":[{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}],"name":"ann"},` +
			`{"role":"assistant","content":[],"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}],"reasoning":"r","reasoning_content":"r"},` +
			`{"role":"tool","content":"x\ny","tool_call_id":"1"}]`},
	} {
		got, err := json.Marshal(VLLMMessages(in, c.format))
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != c.want {
			t.Errorf("%v:\n got  %s\n want %s", c.format, got, c.want)
		}
	}
}

func TestVLLMToolsFollowsPydanticsFieldOrderWithNulls(t *testing.T) {
	in := decodeList(t, `[{"function": {"parameters": {"type": "object"}, "x-extra": 1, "name": "f"}, "type": "function"}, {"type": "function", "function": {"name": "g", "strict": true}}]`)
	got, err := json.Marshal(VLLMTools(in))
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"type":"function","function":{"name":"f","description":null,"parameters":{"type":"object"},"x-extra":1}},` +
		`{"type":"function","function":{"name":"g","description":null,"parameters":null,"strict":true}}]`
	if string(got) != want {
		t.Errorf("got  %s\nwant %s", got, want)
	}
	if VLLMTools(nil) != nil {
		t.Errorf("no tools must stay nil (None for the template)")
	}
}
