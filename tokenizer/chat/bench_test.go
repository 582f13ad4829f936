package chat

import (
	"fmt"
	"testing"
)

// conversation30 is a 30-turn chat: a system prompt, then alternating user
// and assistant messages of a few sentences each.
func conversation30() []any {
	msgs := []any{map[string]any{"role": "system", "content": "You are a helpful assistant. Answer precisely and cite sources when you can."}}
	for i := range 30 {
		role := "user"
		if i%2 == 1 {
			role = "assistant"
		}
		msgs = append(msgs, map[string]any{"role": role, "content": fmt.Sprintf(
			"Turn %d: here is a paragraph of ordinary prose with some code `x := f(%d)` and a list: one, two, three. "+
				"It goes on for a couple of sentences so the template has real text to copy, as chats do.", i, i)})
	}
	return msgs
}

// BenchmarkRender renders a 30-turn conversation with the Llama-3 and Qwen3
// templates; the ChatML row is the baseline of a minimal template.
func BenchmarkRender(b *testing.B) {
	vars, err := SpecialTokens(llama3Config(b))
	if err != nil {
		b.Fatal(err)
	}
	msgs := conversation30()
	for _, c := range []struct {
		name string
		tmpl *Template
		vars map[string]any
	}{
		{"template=llama3", llama3Template(b), vars},
		{"template=qwen3", qwen3Template(b), map[string]any{"bos_token": "", "eos_token": "<|im_end|>"}},
		{"template=chatml", ChatML(), nil},
	} {
		b.Run(c.name, func(b *testing.B) {
			in := Input{Messages: msgs, AddGenerationPrompt: true, Vars: c.vars}
			out, err := c.tmpl.Render(in)
			if err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(len(out)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.tmpl.Render(in); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
