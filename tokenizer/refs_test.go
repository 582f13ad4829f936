package tokenizer

import (
	"path/filepath"
	"sync"
	"testing"

	"github.com/switchyard/switchyard/internal/testenv"
)

// Reference files are read from Go module zips in the module cache (never
// copied into the repository): github.com/daulet/tokenizers carries real
// Hugging Face tokenizer files and the tests with their expected ids.

func dauletFile(t testing.TB, rel string) string {
	return filepath.Join(testenv.ModuleDir(t, testenv.TokenizersModule), "test", "data", rel)
}

var (
	llamaOnce sync.Once
	llama     *Model
	llamaErr  error
)

// llama3 loads Meta-Llama-3-8B-Instruct's tokenizer.json with its
// tokenizer_config.json, once per test binary.
func llama3(t testing.TB) *Model {
	t.Helper()
	dir := testenv.ModuleDir(t, testenv.TokenizersModule)
	llamaOnce.Do(func() {
		tj, err := readFile(filepath.Join(dir, "test/data/Meta-Llama-3-8B-Instruct.json"))
		if err != nil {
			llamaErr = err
			return
		}
		cfg, err := readFile(filepath.Join(dir, "test/data/meta-llama-3-8b-instruct/tokenizer_config.json"))
		if err != nil {
			llamaErr = err
			return
		}
		llama, llamaErr = Load(tj, cfg)
	})
	if llamaErr != nil {
		t.Fatalf("load Llama 3 tokenizer: %v", llamaErr)
	}
	return llama
}
