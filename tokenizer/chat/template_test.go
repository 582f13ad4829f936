package chat

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func TestATemplateThatDoesNotParseIsAnErrorNamingIt(t *testing.T) {
	_, err := ParseNamed("broken", "{% for m in messages %}{{ m.content }}")
	if !errors.Is(err, ErrTemplate) {
		t.Fatalf("want ErrTemplate, got %v", err)
	}
	if !strings.Contains(err.Error(), "broken") {
		t.Errorf("error %q does not name the template", err)
	}
	if _, err := Parse("{{ 'unterminated }}"); !errors.Is(err, ErrTemplate) {
		t.Errorf("unterminated string: want ErrTemplate, got %v", err)
	}
}

func TestRaiseExceptionFailsTheRenderWithItsMessage(t *testing.T) {
	tmpl, err := ParseNamed("strict", "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}ok")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(Input{Messages: []any{map[string]any{"role": "assistant", "content": "hi"}}})
	var re *RaisedError
	if !errors.As(err, &re) || !errors.Is(err, ErrRaised) {
		t.Fatalf("want a *RaisedError matching ErrRaised, got %v", err)
	}
	if re.Message != "first message must be from the user" || re.Template != "strict" {
		t.Errorf("got %+v", re)
	}
	if errors.Is(err, ErrTemplate) {
		t.Errorf("a raised exception is the template's verdict on the input, not a template error")
	}
	out, err := tmpl.Render(Input{Messages: []any{map[string]any{"role": "user", "content": "hi"}}})
	if err != nil || out != "ok" {
		t.Errorf("accepted input: got %q, %v", out, err)
	}
}

func TestARenderErrorNamesTheTemplateAndTheCause(t *testing.T) {
	tmpl, err := ParseNamed("needs-len", "{{ messages[0].content | length }}")
	if err != nil {
		t.Fatal(err)
	}
	_, err = tmpl.Render(Input{Messages: []any{map[string]any{"role": "user", "content": nil}}})
	if !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "needs-len") || !strings.Contains(err.Error(), "has no len()") {
		t.Errorf("got %v", err)
	}
}

func TestToolCallArgumentsGivenAsJSONStringsReachTheTemplateAsObjects(t *testing.T) {
	tmpl, err := Parse("{% for m in messages %}{% for c in m.tool_calls %}{% for k, v in c.function.arguments.items() %}{{ k }}={{ v }};{% endfor %}|{% endfor %}{{ m.tool_calls is defined }}{% endfor %}")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []any{
		map[string]any{"role": "assistant", "tool_calls": []any{
			map[string]any{"function": map[string]any{"name": "f", "arguments": `{"b": 1, "a": "x"}`}},
			map[string]any{"function": map[string]any{"name": "g", "arguments": "not json"}},
			map[string]any{"function": map[string]any{"name": "h", "arguments": nil}},
		}},
		map[string]any{"role": "assistant", "tool_calls": []any{}},
	}
	out, err := tmpl.Render(Input{Messages: msgs})
	if err != nil {
		t.Fatal(err)
	}
	// Arguments keep the order of their JSON text; invalid or missing
	// arguments become {}; an empty tool_calls list is dropped (vLLM).
	if want := "b=1;a=x;|||TrueFalse"; out != want {
		t.Errorf("got %q, want %q", out, want)
	}
	args := msgs[0].(map[string]any)["tool_calls"].([]any)[0].(map[string]any)["function"].(map[string]any)["arguments"]
	if args != `{"b": 1, "a": "x"}` {
		t.Errorf("the caller's messages were modified: arguments = %#v", args)
	}
	if _, ok := msgs[1].(map[string]any)["tool_calls"]; !ok {
		t.Errorf("the caller's empty tool_calls was removed from its message")
	}
}

func TestTemplatesCannotModifyTheirInputs(t *testing.T) {
	tmpl, err := Parse("{% set _ = messages[0].update({'content': 'changed'}) %}{{ messages | length }}")
	if err != nil {
		t.Fatal(err)
	}
	msgs := []any{map[string]any{"role": "user", "content": "original"}}
	if _, err := tmpl.Render(Input{Messages: msgs}); !errors.Is(err, ErrTemplate) || !strings.Contains(err.Error(), "unsafe") {
		t.Errorf("a mutating method must fail the render as in the sandbox, got %v", err)
	}
	if len(msgs) != 1 || msgs[0].(map[string]any)["content"] != "original" {
		t.Errorf("messages were modified: %#v", msgs)
	}
}

func TestObjectsKeepTheirKeyOrderAndMapsAreSorted(t *testing.T) {
	tmpl, err := Parse("{{ tools[0] | tojson }}")
	if err != nil {
		t.Fatal(err)
	}
	ordered, err := DecodeJSON([]byte(`[{"type": "function", "function": {"name": "f", "description": "d"}}]`))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(Input{Tools: ordered.([]any)})
	if err != nil || out != `{"type": "function", "function": {"name": "f", "description": "d"}}` {
		t.Errorf("ordered: got %q, %v", out, err)
	}
	var plain []any
	if err := json.Unmarshal([]byte(`[{"type": "function", "function": {"name": "f", "description": "d"}}]`), &plain); err != nil {
		t.Fatal(err)
	}
	out, err = tmpl.Render(Input{Tools: plain})
	if err != nil || out != `{"function": {"description": "d", "name": "f"}, "type": "function"}` {
		t.Errorf("map: got %q, %v", out, err)
	}
}

func TestNilToolsAreNoneAndAnEmptyListIsAList(t *testing.T) {
	tmpl, err := Parse("{{ tools is none }} {{ tools is iterable }}")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		tools []any
		want  string
	}{{nil, "True False"}, {[]any{}, "False True"}} {
		out, err := tmpl.Render(Input{Tools: c.tools})
		if err != nil || out != c.want {
			t.Errorf("tools=%#v: got %q, %v; want %q", c.tools, out, err, c.want)
		}
	}
}

func TestKwargsWinOverSpecialTokensAndStrftimeNowUsesTheInjectedClock(t *testing.T) {
	tmpl, err := Parse("{{ bos_token }}|{{ enable_thinking }}|{{ strftime_now('%d %b %Y') }}")
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(Input{
		Vars:   map[string]any{"bos_token": "<s>", "enable_thinking": true},
		Kwargs: map[string]any{"enable_thinking": false},
		Now:    func() time.Time { return time.Date(2024, 2, 9, 23, 0, 0, 0, time.UTC) },
	})
	if err != nil || out != "<s>|False|09 Feb 2024" {
		t.Errorf("got %q, %v", out, err)
	}
}

func TestFromTokenizerConfigPicksTheTemplateAsTransformersDoes(t *testing.T) {
	single := []byte(`{"chat_template": "single:{{ messages | length }}", "bos_token": "<s>"}`)
	named := []byte(`{"chat_template": [{"name": "default", "template": "default"}, {"name": "tool_use", "template": "tools:{{ tools | length }}"}]}`)
	in := Input{Messages: []any{map[string]any{"role": "user", "content": "x"}}}
	withTools := in
	withTools.Tools = []any{}

	for _, c := range []struct {
		name        string
		cfg, jinja  []byte
		in          Input
		want        string
		wantErr     error
		wantNameHas string
	}{
		{name: "string", cfg: single, in: in, want: "single:1", wantNameHas: "tokenizer_config.json"},
		{name: "jinja file wins", cfg: single, jinja: []byte("file"), in: in, want: "file", wantNameHas: "chat_template.jinja"},
		{name: "named default", cfg: named, in: in, want: "default", wantNameHas: "[default]"},
		{name: "named tool_use when tools are given", cfg: named, in: withTools, want: "tools:0", wantNameHas: "[default]"},
		{name: "no template", cfg: []byte(`{"bos_token": "<s>"}`), wantErr: ErrNoTemplate},
		{name: "no default", cfg: []byte(`{"chat_template": [{"name": "tool_use", "template": "x"}]}`), wantErr: ErrNoTemplate},
		{name: "malformed", cfg: []byte(`{"chat_template": 5}`), wantErr: ErrTemplate},
		{name: "not JSON", cfg: []byte(`{`), wantErr: ErrTemplate},
	} {
		t.Run(c.name, func(t *testing.T) {
			tmpl, err := FromTokenizerConfig(c.cfg, c.jinja)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("want %v, got %v", c.wantErr, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(tmpl.Name(), c.wantNameHas) {
				t.Errorf("name %q does not contain %q", tmpl.Name(), c.wantNameHas)
			}
			out, err := tmpl.Render(c.in)
			if err != nil || out != c.want {
				t.Errorf("got %q, %v; want %q", out, err, c.want)
			}
		})
	}
}

func TestSpecialTokensReadsStringsAndAddedTokens(t *testing.T) {
	got, err := SpecialTokens([]byte(`{"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false}, "pad_token": null, "unk_token": 3, "additional_special_tokens": ["<a>", {"content": "<b>"}], "model_max_length": 5}`))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"bos_token": "<s>", "eos_token": "</s>", "additional_special_tokens": []any{"<a>", "<b>"}}
	if gj, wj := mustJSON(t, got), mustJSON(t, want); gj != wj {
		t.Errorf("got %s, want %s", gj, wj)
	}
	llama, err := SpecialTokens(llama3Config(t))
	if err != nil {
		t.Fatal(err)
	}
	if llama["bos_token"] != "<|begin_of_text|>" || llama["eos_token"] != "<|eot_id|>" {
		t.Errorf("Llama-3 special tokens: %v", llama)
	}
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestLlama3RendersTheKnownPromptLayout(t *testing.T) {
	tmpl := llama3Template(t)
	vars, err := SpecialTokens(llama3Config(t))
	if err != nil {
		t.Fatal(err)
	}
	out, err := tmpl.Render(Input{
		Messages:            []any{map[string]any{"role": "system", "content": "Be brief."}, map[string]any{"role": "user", "content": " Hi "}},
		AddGenerationPrompt: true,
		Vars:                vars,
	})
	want := "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>" +
		"<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	if err != nil || out != want {
		t.Errorf("got %q, %v\nwant %q", out, err, want)
	}
}

func TestChatMLLaysOutEachMessageAndTheGenerationPrompt(t *testing.T) {
	out, err := ChatML().Render(Input{
		Messages: []any{
			map[string]any{"role": "system", "content": "S"},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": "a"}, map[string]any{"type": "image_url", "image_url": map[string]any{"url": "x"}}, map[string]any{"type": "text", "text": "b"}}},
		},
		AddGenerationPrompt: true,
	})
	want := "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nab<|im_end|>\n<|im_start|>assistant\n"
	if err != nil || out != want {
		t.Errorf("got %q, %v; want %q", out, err, want)
	}
}

func TestDecodeJSONKeepsOrderNumbersAndRejectsGarbage(t *testing.T) {
	v, err := DecodeJSON([]byte(` {"b": 1, "a": [1.0, 2, "x", null, true], "b": 3} `))
	if err != nil {
		t.Fatal(err)
	}
	obj := v.(Object)
	if len(obj) != 2 || obj[0].Key != "b" || obj[0].Value != json.Number("3") || obj[1].Key != "a" {
		t.Errorf("got %#v", obj)
	}
	b, err := json.Marshal(obj)
	if err != nil || string(b) != `{"b":3,"a":[1.0,2,"x",null,true]}` {
		t.Errorf("MarshalJSON: %s, %v", b, err)
	}
	for _, bad := range []string{``, `{`, `{"a" 1}`, `[1,]`, `1 2`, `{1: 2}`, strings.Repeat("[", 200) + strings.Repeat("]", 200)} {
		if _, err := DecodeJSON([]byte(bad)); !errors.Is(err, ErrJSON) {
			t.Errorf("%q: want ErrJSON, got %v", bad, err)
		}
	}
}

func TestPyFloatReprMatchesPython(t *testing.T) {
	for f, want := range map[float64]string{
		1: "1.0", 0.1: "0.1", 1234567.5: "1234567.5", 1e16: "1e+16", 1e15: "1000000000000000.0",
		0.0001: "0.0001", 0.00001: "1e-05", -2.5e-7: "-2.5e-07", 1.5e300: "1.5e+300", 123.456: "123.456",
	} {
		if got := pyFloatRepr(f); got != want {
			t.Errorf("repr(%v) = %q, want %q", f, got, want)
		}
	}
}

func TestUnboundedRecursionIsATypedErrorNotACrash(t *testing.T) {
	for name, src := range map[string]string{
		"macro":          "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
		"recursive-loop": "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}",
	} {
		tmpl, err := ParseNamed(name, src)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		_, err = tmpl.Render(Input{Messages: []any{map[string]any{"role": "user"}}})
		if !errors.Is(err, ErrTemplate) {
			t.Errorf("%s: want ErrTemplate, got %v", name, err)
		}
	}
}

func TestATemplateRendersConcurrently(t *testing.T) {
	tmpl := qwen3Template(t)
	msgs := conversation30()
	want, err := tmpl.Render(Input{Messages: msgs, AddGenerationPrompt: true})
	if err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, 8)
	for range 8 {
		go func() {
			for range 20 {
				got, err := tmpl.Render(Input{Messages: msgs, AddGenerationPrompt: true})
				if err == nil && got != want {
					err = errors.New("a concurrent render differs")
				}
				if err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range 8 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
