package prompt

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// TestBuiltinChatMLFastPathRendersAsTheTemplate: for every chat the fast
// path takes, its text is the Jinja rendering of the built-in ChatML
// template, byte for byte, over random chats that mix plain messages with
// ones it leaves to the template (parts, null content, extra keys, tools).
func TestBuiltinChatMLFastPathRendersAsTheTemplate(t *testing.T) {
	m, err := OpenSpec("tiktoken:o200k_base", 0)
	require.NoError(t, err)
	ct := m.Template.(*chatTemplate)
	require.True(t, ct.builtinChatML)
	fast := checkFastPath(t, ct, ct.renderChatML, 14)
	require.Greater(t, fast, 2000/4, "the fast path should take most plain chats")
}

// TestLlama3FastPathRendersAsTheTemplate: for every chat the Llama 3 fast
// path takes, its text is the Jinja rendering of Meta-Llama-3-8B-Instruct's
// own template, byte for byte, over random chats (contents padded with
// every kind of whitespace Python's strip removes, and some it keeps).
func TestLlama3FastPathRendersAsTheTemplate(t *testing.T) {
	m, err := OpenSpec(testenv.Llama3Dir(t), 0)
	require.NoError(t, err)
	ct := m.Template.(*chatTemplate)
	require.NotNil(t, ct.llama3BOS, "the Llama 3 template is recognised")
	fast := checkFastPath(t, ct, ct.renderLlama3, 3)
	require.Greater(t, fast, 2000/4, "the fast path should take most plain chats")
}

// checkFastPath renders 2,000 random chats, a mix of plain messages and
// ones a fast path must leave to the template (parts, null content, extra
// keys, tools), with render and with the Jinja template, and requires equal
// text whenever render takes a chat. It returns how many it took.
func checkFastPath(t *testing.T, ct *chatTemplate, render func(*Input) (string, bool), seed uint64) int {
	t.Helper()
	pieces := []string{"hello", " ", "\n", "{{ x }}", "{% if %}", "<b>&amp;</b>", "'\"", "\\", "\t", "héllo ✓ 🦊",
		"<|im_start|>", "<|im_end|>", "<|eot_id|>", "<|start_header_id|>", "  ", "", "}}", "{#", "\u2028", "a\r\nb",
		"\u00a0", "\u0085", "\u3000", "\x1c", "\x1f", "\u200b", "\ufeff", "\v\f", " \t\n "}
	roles := []string{"system", "user", "assistant", "tool", "developer", "x y"}
	rng := rand.New(rand.NewPCG(seed, 1))
	fast := 0
	const n = 2000
	for range n {
		var msgs []map[string]any
		for range 1 + rng.IntN(6) {
			var c strings.Builder
			for range rng.IntN(8) {
				c.WriteString(pieces[rng.IntN(len(pieces))])
			}
			msg := map[string]any{"role": roles[rng.IntN(len(roles))], "content": c.String()}
			switch rng.IntN(12) {
			case 0:
				msg["content"] = []any{map[string]any{"type": "text", "text": c.String()}, map[string]any{"type": "text", "text": "b"}}
			case 1:
				msg["content"] = nil
			case 2:
				msg["name"] = "n"
			}
			msgs = append(msgs, msg)
		}
		body := map[string]any{"messages": msgs, "add_generation_prompt": rng.IntN(2) == 0}
		if rng.IntN(10) == 0 {
			body["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": "f"}}}
		}
		raw, err := json.Marshal(body)
		require.NoError(t, err)
		var f Fields
		require.NoError(t, json.Unmarshal(raw, &f))
		in, err := Parse(KindChat, &f)
		require.NoError(t, err)
		want, wantErr := ct.renderJinja(in)
		if got, ok := render(in); ok {
			fast++
			require.NoError(t, wantErr, "%s", raw)
			require.Equal(t, want, got, "%s", raw)
		}
	}
	t.Logf("the fast path rendered %d of %d chats, all equal to the template's rendering", fast, n)
	return fast
}
