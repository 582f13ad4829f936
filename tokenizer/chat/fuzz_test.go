package chat

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/testenv"
)

// FuzzParse feeds arbitrary template sources: parsing, and rendering what
// parses, returns a value or a typed error and never panics.
func FuzzParse(f *testing.F) {
	for _, s := range snippets {
		f.Add(s.src)
	}
	f.Add(chatMLSource)
	f.Add("{{ {'a': {'b': 1}} }}")
	f.Add("{% raw %}{{ x }}")
	f.Add("{{ 'a\\")
	f.Add("{%- for x in y -%}{{ x | tojson(indent=2) }}{%- endfor %}")
	f.Add("{{ x | sort(attribute='a.0') | length }}{{ none | trim }}")
	if dir, err := jinjaTemplatesDir(); err == nil {
		files, _ := filepath.Glob(filepath.Join(dir, "*.jinja"))
		for _, file := range files {
			if src, err := os.ReadFile(file); err == nil {
				f.Add(string(src))
			}
		}
	}
	msgs := []any{map[string]any{"role": "user", "content": "hi"}, map[string]any{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"function": map[string]any{"name": "f", "arguments": "{}"}}}}}
	f.Fuzz(func(t *testing.T, src string) {
		tmpl, err := Parse(src)
		if err != nil {
			if !errors.Is(err, ErrTemplate) {
				t.Fatalf("parse error is not ErrTemplate: %v", err)
			}
			return
		}
		_, err = tmpl.Render(Input{Messages: msgs, Tools: []any{}, AddGenerationPrompt: true, Now: func() time.Time { return fixedNow }})
		if err != nil && !errors.Is(err, ErrTemplate) && !errors.Is(err, ErrRaised) {
			t.Fatalf("render error is untyped: %v", err)
		}
	})
}

// jinjaTemplatesDir finds ardanlabs/jinja's templates for seeding; the
// corpus just lacks them when the module is absent.
func jinjaTemplatesDir() (string, error) {
	dir, err := testenv.FindModuleDir(testenv.JinjaModule)
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, "testdata", "templates"), nil
}

// FuzzRender renders arbitrary message JSON with the Llama-3 template: the
// decoder and the render return a value or a typed error, never panic.
func FuzzRender(f *testing.F) {
	for _, c := range ourConversations {
		f.Add([]byte(c.messages), []byte(c.tools))
	}
	f.Add([]byte(`[{"role": 1, "content": {"a": [1, 2.5e300, null]}}]`), []byte(`null`))
	f.Add([]byte(`[[], "x", null, {"role": "assistant", "tool_calls": "x"}]`), []byte(`{}`))
	f.Add([]byte(`[{"role": "user", "content": "\ud800"}]`), []byte(``))
	tmpl := llama3Template(f)
	vars, err := SpecialTokens(llama3Config(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, messages, tools []byte) {
		in := Input{Vars: vars, AddGenerationPrompt: true}
		mv, err := DecodeJSON(messages)
		if err != nil {
			if !errors.Is(err, ErrJSON) {
				t.Fatalf("decode error is not ErrJSON: %v", err)
			}
			return
		}
		l, ok := mv.([]any)
		if !ok {
			return
		}
		in.Messages = l
		if tv, err := DecodeJSON(tools); err == nil {
			if tl, ok := tv.([]any); ok {
				in.Tools = tl
			}
		}
		if _, err := tmpl.Render(in); err != nil && !errors.Is(err, ErrTemplate) && !errors.Is(err, ErrRaised) {
			t.Fatalf("render error is untyped: %v", err)
		}
	})
}
