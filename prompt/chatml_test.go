package prompt

import (
	"encoding/json"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
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
	pieces := []string{"hello", " ", "\n", "{{ x }}", "{% if %}", "<b>&amp;</b>", "'\"", "\\", "\t", "héllo ✓ 🦊",
		"<|im_start|>", "<|im_end|>", "  ", "", "}}", "{#", "\u2028", "a\r\nb"}
	roles := []string{"system", "user", "assistant", "tool", "developer", "x y"}
	rng := rand.New(rand.NewPCG(14, 1))
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
		want, err := ct.renderJinja(in)
		require.NoError(t, err)
		if got, ok := ct.renderChatML(in); ok {
			fast++
			require.Equal(t, want, got, "%s", raw)
		}
	}
	t.Logf("the fast path rendered %d of %d chats, all equal to the template's rendering", fast, n)
	require.Greater(t, fast, n/4, "the fast path should take most plain chats")
}
