package chat

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/switchyard/switchyard/internal/testenv"
)

const (
	python = "/usr/bin/python3"
)

type refTemplate struct {
	name   string
	source string
	vars   map[string]any
}

// referenceTemplates are every template of ardanlabs/jinja's testdata, the
// Llama-3 template of daulet/tokenizers' Meta-Llama-3-8B-Instruct
// tokenizer_config.json, and the built-in ChatML.
func referenceTemplates(t testing.TB) []refTemplate {
	t.Helper()
	dir := testenv.ModuleDir(t, testenv.JinjaModule)
	files, err := filepath.Glob(filepath.Join(dir, "testdata", "templates", "*.jinja"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no templates in %s: %v", dir, err)
	}
	sort.Strings(files)
	generic := map[string]any{"bos_token": "<s>", "eos_token": "</s>"}
	var out []refTemplate
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, refTemplate{name: strings.TrimSuffix(filepath.Base(f), ".jinja"), source: string(src), vars: generic})
	}
	cfg := llama3Config(t)
	var c struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil || c.ChatTemplate == "" {
		t.Fatalf("Llama-3 tokenizer_config.json has no chat_template: %v", err)
	}
	vars, err := SpecialTokens(cfg)
	if err != nil {
		t.Fatal(err)
	}
	out = append(out, refTemplate{name: "Meta-Llama-3-8B-Instruct", source: c.ChatTemplate, vars: vars})
	out = append(out, refTemplate{name: "ChatML", source: ChatMLSource(), vars: map[string]any{}})
	return out
}

func llama3Config(t testing.TB) []byte {
	t.Helper()
	dir := testenv.ModuleDir(t, testenv.TokenizersModule)
	cfg, err := os.ReadFile(filepath.Join(dir, "test", "data", "meta-llama-3-8b-instruct", "tokenizer_config.json"))
	if err != nil {
		t.Skipf("Llama-3 tokenizer_config.json missing from %s: %v", testenv.TokenizersModule, err)
	}
	return cfg
}

func llama3Template(t testing.TB) *Template {
	t.Helper()
	tmpl, err := FromTokenizerConfig(llama3Config(t), nil)
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

func qwen3Template(t testing.TB) *Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join(testenv.ModuleDir(t, testenv.JinjaModule), "testdata", "templates", "Qwen3-8B-Q8_0.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	tmpl, err := ParseNamed("Qwen3-8B", string(src))
	if err != nil {
		t.Fatal(err)
	}
	return tmpl
}

// pyCase is one rendering for scripts/render_chat_template.py. Messages and
// tools travel as the same JSON bytes the Go side decodes.
type pyCase struct {
	ID                  string          `json:"id"`
	Template            string          `json:"template"`
	Messages            json.RawMessage `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Vars                map[string]any  `json:"vars"`
	Kwargs              json.RawMessage `json:"kwargs"`
	Now                 string          `json:"now"`
}

type pyResult struct {
	ID     string `json:"id"`
	OK     bool   `json:"ok"`
	Text   string `json:"text"`
	Raised bool   `json:"raised"`
	Error  string `json:"error"`
}

// renderPython runs the reference renderer over cases, skipping the test
// when Debian's python3 or its jinja2 is missing.
func renderPython(t testing.TB, cases []pyCase) []pyResult {
	t.Helper()
	if _, err := os.Stat(python); err != nil {
		t.Skipf("%s is missing: the reference renderer needs Debian's python3 with python3-jinja2", python)
	}
	if err := exec.Command(python, "-c", "import jinja2").Run(); err != nil {
		t.Skipf("%s cannot import jinja2 (install python3-jinja2): %v", python, err)
	}
	in, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(python, filepath.Join("..", "..", "scripts", "render_chat_template.py"))
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("reference renderer failed: %v\n%s", err, stderr.String())
	}
	var res []pyResult
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("reference renderer output: %v", err)
	}
	if len(res) != len(cases) {
		t.Fatalf("reference renderer returned %d results for %d cases", len(res), len(cases))
	}
	return res
}
