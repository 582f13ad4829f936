package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/testenv"
)

// fixedNow is strftime_now's clock on both sides of the differential test.
var fixedNow = time.Date(2026, 7, 26, 9, 5, 3, 0, time.UTC)

const fixedNowISO = "2026-07-26T09:05:03"

type conversation struct {
	name     string
	messages string // JSON
	tools    string // JSON, "" for none
	kwargs   string // JSON, "" for none
}

const weatherTool = `[{"type": "function", "function": {"name": "get_weather", "description": "Current weather for a city <b>&amp;</b>", "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "City name, e.g. Zürich"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}, "days": {"type": "integer", "minimum": 1, "maximum": 7.5}}, "required": ["city"]}}}]`

// ourConversations cover what the sample requests do not: system prompts,
// several turns, tools with a call and a result, content as parts, an image,
// non-ASCII, an empty assistant message, with and without the generation
// prompt.
var ourConversations = []conversation{
	{name: "system-and-user", messages: `[{"role": "system", "content": "You are a terse assistant."}, {"role": "user", "content": "What is the capital of France?"}]`},
	{name: "multi-turn", messages: `[{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hi!"}, {"role": "assistant", "content": "Hello. How can I help?"}, {"role": "user", "content": "Tell me a joke."}, {"role": "assistant", "content": "Why did the chicken cross the road?"}, {"role": "user", "content": "Why?"}]`},
	{name: "tool-call-and-result", tools: weatherTool, messages: `[{"role": "system", "content": "Use tools when needed."}, {"role": "user", "content": "Weather in Zürich?"}, {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Zürich\", \"unit\": \"celsius\", \"days\": 2}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21.5, \"sky\": \"clear\"}"}]`},
	{name: "tool-call-object-arguments", tools: weatherTool, messages: `[{"role": "user", "content": "Weather in Oslo and Rome?"}, {"role": "assistant", "content": "", "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}, {"id": "call_b", "type": "function", "function": {"name": "get_weather", "arguments": "not json"}}]}, {"role": "tool", "tool_call_id": "call_a", "content": "cold"}, {"role": "tool", "tool_call_id": "call_b", "content": "warm"}, {"role": "assistant", "content": "Oslo is cold, Rome is warm."}, {"role": "user", "content": "Thanks"}]`},
	{name: "tools-without-calls", tools: weatherTool, messages: `[{"role": "user", "content": "Is it raining in Lima?"}]`},
	{name: "content-parts", messages: `[{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second part."}]}]`},
	{name: "image-part", messages: `[{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]`},
	{name: "non-ascii-emoji", messages: `[{"role": "system", "content": "Réponds en français 🇫🇷."}, {"role": "user", "content": "日本語で答えて 😀 — «ça va?» \u2028 tab\there"}, {"role": "assistant", "content": "はい 👍"}, {"role": "user", "content": "Ελληνικά; 🙂"}]`},
	{name: "empty-assistant", messages: `[{"role": "user", "content": "Say nothing."}, {"role": "assistant", "content": ""}, {"role": "user", "content": "Now say something."}]`},
	{name: "thinking-disabled", kwargs: `{"enable_thinking": false}`, messages: `[{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]`},
}

type diffCase struct {
	template refTemplate
	tmpl     *Template
	conv     string
	py       pyCase
	in       Input
}

func buildDiffCases(t *testing.T) []diffCase {
	t.Helper()
	templates := referenceTemplates(t)
	var convs []conversation
	reqDir := filepath.Join(testenv.ModuleDir(t, testenv.JinjaModule), "testdata", "requests")
	reqFiles, err := filepath.Glob(filepath.Join(reqDir, "*.json"))
	if err != nil || len(reqFiles) == 0 {
		t.Fatalf("no sample requests in %s: %v", reqDir, err)
	}
	sort.Strings(reqFiles)
	for _, f := range reqFiles {
		raw, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		// A request body as a server receives it: messages and tools are
		// taken byte for byte, enable_thinking is a template kwarg.
		var req struct {
			Messages       json.RawMessage `json:"messages"`
			Tools          json.RawMessage `json:"tools"`
			EnableThinking *bool           `json:"enable_thinking"`
		}
		if err := json.Unmarshal(raw, &req); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		c := conversation{name: strings.TrimSuffix(filepath.Base(f), ".json"), messages: string(req.Messages), tools: string(req.Tools)}
		if req.EnableThinking != nil {
			c.kwargs = fmt.Sprintf(`{"enable_thinking": %t}`, *req.EnableThinking)
		}
		convs = append(convs, c)
	}
	convs = append(convs, ourConversations...)

	var cases []diffCase
	for _, rt := range templates {
		tmpl, err := ParseNamed(rt.name, rt.source)
		if err != nil {
			t.Fatalf("template %s does not parse: %v", rt.name, err)
		}
		for _, c := range convs {
			for _, agp := range []bool{true, false} {
				dc := diffCase{template: rt, tmpl: tmpl, conv: fmt.Sprintf("%s/agp=%t", c.name, agp)}
				dc.py = pyCase{
					ID: rt.name + "/" + dc.conv, Template: rt.source, Messages: json.RawMessage(c.messages),
					AddGenerationPrompt: agp, Vars: rt.vars, Now: fixedNowISO,
				}
				msgs := decodeList(t, c.messages)
				dc.in = Input{Messages: msgs, AddGenerationPrompt: agp, Vars: rt.vars, Now: func() time.Time { return fixedNow }}
				if c.tools != "" && c.tools != "null" {
					dc.py.Tools = json.RawMessage(c.tools)
					dc.in.Tools = decodeList(t, c.tools)
				}
				if c.kwargs != "" {
					dc.py.Kwargs = json.RawMessage(c.kwargs)
					kw, err := DecodeJSON([]byte(c.kwargs))
					if err != nil {
						t.Fatal(err)
					}
					dc.in.Kwargs = map[string]any{}
					for _, m := range kw.(Object) {
						dc.in.Kwargs[m.Key] = m.Value
					}
				}
				cases = append(cases, dc)

				// The same conversation as a vLLM engine rebuilds it for this
				// template (content format, message keys, tool fields).
				vc := dc
				vc.conv = "vllm-" + dc.conv
				vc.py.ID = rt.name + "/" + vc.conv
				vc.in.Messages = VLLMMessages(dc.in.Messages, tmpl.ContentFormat())
				vc.in.Tools = VLLMTools(dc.in.Tools)
				vc.py.Messages = mustMarshal(t, vc.in.Messages)
				if vc.in.Tools != nil {
					vc.py.Tools = mustMarshal(t, vc.in.Tools)
				}
				cases = append(cases, vc)
			}
		}
	}
	return cases
}

func mustMarshal(t *testing.T, v any) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decodeList(t *testing.T, s string) []any {
	t.Helper()
	v, err := DecodeJSON([]byte(s))
	if err != nil {
		t.Fatalf("decode %q: %v", s, err)
	}
	l, ok := v.([]any)
	if !ok {
		t.Fatalf("%q is not a JSON array", s)
	}
	return l
}

// TestRenderingEqualsPythonJinja2 renders every reference template over
// every sample request and our own conversations, in Go and with
// python3-jinja2 in transformers' environment, and requires the same bytes,
// or that both reject the input (the same message when the template called
// raise_exception).
func TestRenderingEqualsPythonJinja2(t *testing.T) {
	cases := buildDiffCases(t)
	pys := make([]pyCase, len(cases))
	for i := range cases {
		pys[i] = cases[i].py
	}
	results := renderPython(t, pys)

	type tally struct{ cases, identical, bothRejected, raised, differing int }
	perTemplate := map[string]*tally{}
	var order []string
	total := tally{}
	for i, c := range cases {
		want := results[i]
		tl := perTemplate[c.template.name]
		if tl == nil {
			tl = &tally{}
			perTemplate[c.template.name] = tl
			order = append(order, c.template.name)
		}
		tl.cases++
		got, err := c.tmpl.Render(c.in)
		var problem string
		switch {
		case want.OK && err != nil:
			problem = fmt.Sprintf("python rendered, Go failed: %v", err)
		case want.OK && got != want.Text:
			problem = "rendering differs:\n" + firstDifference(got, want.Text)
		case !want.OK && err == nil:
			problem = fmt.Sprintf("python rejected the input (%s), Go rendered it", want.Error)
		case !want.OK && want.Raised && !errors.Is(err, ErrRaised):
			problem = fmt.Sprintf("python raised %q, Go failed otherwise: %v", want.Error, err)
		case !want.OK && want.Raised && err.(*RaisedError).Message != want.Error:
			problem = fmt.Sprintf("python raised %q, Go raised %q", want.Error, err.(*RaisedError).Message)
		}
		if problem != "" {
			tl.differing++
			t.Errorf("%s: %s", want.ID, problem)
			continue
		}
		switch {
		case want.OK:
			tl.identical++
		case want.Raised:
			tl.raised++
			tl.bothRejected++
		default:
			tl.bothRejected++
		}
	}
	for _, name := range order {
		tl := perTemplate[name]
		t.Logf("%-36s cases=%d identical=%d both-rejected=%d (same raise_exception message: %d) differing=%d", name, tl.cases, tl.identical, tl.bothRejected, tl.raised, tl.differing)
		total.cases += tl.cases
		total.identical += tl.identical
		total.bothRejected += tl.bothRejected
		total.raised += tl.raised
		total.differing += tl.differing
	}
	t.Logf("templates=%d cases=%d identical=%d both-rejected=%d (same raise_exception message: %d) differing=%d", len(order), total.cases, total.identical, total.bothRejected, total.raised, total.differing)
}

// firstDifference shows where two renderings part.
func firstDifference(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-80)
	return fmt.Sprintf("at byte %d\n  go:     %q\n  python: %q", i, got[lo:min(len(got), i+80)], want[lo:min(len(want), i+80)])
}
