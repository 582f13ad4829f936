package chat

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

// randomText mixes what breaks renderers: Jinja delimiters, quotes and
// backslashes, whitespace runs and newlines, non-ASCII, emoji, strings that
// look like special tokens.
func randomText(r *rand.Rand) string {
	pieces := []string{"hello", " world", "  ", "\n", "\n\n", "\t", "{{ x }}", "{% if %}", "{#", "'", "\"", "\\", "\\n",
		"é", "日本語", "😀", "👍🏽", "<|eot_id|>", "<|im_start|>", "</s>", "\u2028", "1.5", "None", "true", "&lt;", "<b>", "  trailing  "}
	var sb strings.Builder
	for range 1 + r.IntN(8) {
		sb.WriteString(pieces[r.IntN(len(pieces))])
	}
	return sb.String()
}

func randomConversation(r *rand.Rand) (messages, tools []any) {
	if r.IntN(3) == 0 {
		tools = []any{Object{{Key: "type", Value: "function"}, {Key: "function", Value: Object{
			{Key: "name", Value: "lookup"}, {Key: "description", Value: randomText(r)},
			{Key: "parameters", Value: Object{{Key: "type", Value: "object"}, {Key: "properties", Value: Object{
				{Key: "q", Value: Object{{Key: "type", Value: "string"}, {Key: "description", Value: randomText(r)}}},
				{Key: "n", Value: Object{{Key: "type", Value: "integer"}}}}}}}}}}}
	}
	if r.IntN(2) == 0 {
		messages = append(messages, Object{{Key: "role", Value: "system"}, {Key: "content", Value: randomText(r)}})
	}
	turns := 1 + r.IntN(6)
	for i := range turns {
		messages = append(messages, Object{{Key: "role", Value: "user"}, {Key: "content", Value: randomContent(r)}})
		if i == turns-1 && r.IntN(2) == 0 {
			break
		}
		if tools != nil && r.IntN(2) == 0 {
			args, _ := json.Marshal(map[string]any{"q": randomText(r), "n": r.IntN(100)})
			messages = append(messages,
				Object{{Key: "role", Value: "assistant"}, {Key: "content", Value: nil}, {Key: "tool_calls", Value: []any{Object{
					{Key: "id", Value: fmt.Sprintf("call_%d", i)}, {Key: "type", Value: "function"},
					{Key: "function", Value: Object{{Key: "name", Value: "lookup"}, {Key: "arguments", Value: string(args)}}}}}}},
				Object{{Key: "role", Value: "tool"}, {Key: "tool_call_id", Value: fmt.Sprintf("call_%d", i)}, {Key: "content", Value: randomText(r)}})
		}
		messages = append(messages, Object{{Key: "role", Value: "assistant"}, {Key: "content", Value: randomText(r)}})
	}
	return messages, tools
}

func randomContent(r *rand.Rand) any {
	if r.IntN(4) != 0 {
		return randomText(r)
	}
	var parts []any
	for range 1 + r.IntN(3) {
		if r.IntN(3) == 0 {
			parts = append(parts, Object{{Key: "type", Value: "image_url"}, {Key: "image_url", Value: Object{{Key: "url", Value: "https://example.com/a.png"}}}})
		} else {
			parts = append(parts, Object{{Key: "type", Value: "text"}, {Key: "text", Value: randomText(r)}})
		}
	}
	return parts
}

// TestRandomConversationsRenderAsPythonJinja2 renders generated
// conversations (hostile text, tools and calls, parts, both as sent and as
// vLLM rebuilds them) with every reference template, in Go and in
// python3-jinja2.
func TestRandomConversationsRenderAsPythonJinja2(t *testing.T) {
	templates := referenceTemplates(t)
	r := rand.New(rand.NewPCG(14, 2026))
	type rc struct {
		tmpl *Template
		in   Input
	}
	var cases []rc
	var pys []pyCase
	for _, rt := range templates {
		tmpl, err := ParseNamed(rt.name, rt.source)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 80 {
			msgs, tools := randomConversation(r)
			if i%2 == 1 {
				msgs, tools = VLLMMessages(msgs, tmpl.ContentFormat()), VLLMTools(tools)
			}
			in := Input{Messages: msgs, Tools: tools, AddGenerationPrompt: r.IntN(2) == 0, Vars: rt.vars, Now: func() time.Time { return fixedNow }}
			pc := pyCase{ID: fmt.Sprintf("%s/random-%d", rt.name, i), Template: rt.source, Messages: mustMarshal(t, msgs),
				AddGenerationPrompt: in.AddGenerationPrompt, Vars: rt.vars, Now: fixedNowISO}
			if tools != nil {
				pc.Tools = mustMarshal(t, tools)
			}
			cases = append(cases, rc{tmpl, in})
			pys = append(pys, pc)
		}
	}
	results := renderPython(t, pys)
	identical, rejected := 0, 0
	for i, c := range cases {
		want := results[i]
		got, err := c.tmpl.Render(c.in)
		switch {
		case want.OK && err != nil:
			t.Errorf("%s: python rendered, Go failed: %v", want.ID, err)
		case want.OK && got != want.Text:
			t.Errorf("%s: %s", want.ID, firstDifference(got, want.Text))
		case !want.OK && err == nil:
			t.Errorf("%s: python rejected the input (%s), Go rendered it", want.ID, want.Error)
		case !want.OK && want.Raised && !errors.Is(err, ErrRaised):
			t.Errorf("%s: python raised %q, Go failed otherwise: %v", want.ID, want.Error, err)
		case want.OK:
			identical++
		default:
			rejected++
		}
	}
	t.Logf("random conversations: cases=%d identical=%d both-rejected=%d differing=%d", len(cases), identical, rejected, len(cases)-identical-rejected)
}
