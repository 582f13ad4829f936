package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Reference modules: Go module zips whose Hugging Face tokenizer files and
// chat templates the tests check our code against. They are read where `go
// mod download` puts them (offline from the module cache, or through the
// proxy) and never copied into the repository.
const (
	// TokenizersModule carries real tokenizer.json files and the tests
	// with their expected ids (test/data).
	TokenizersModule = "github.com/daulet/tokenizers@v1.24.0"
	// JinjaModule carries chat templates and sample chat requests
	// (testdata/templates, testdata/requests).
	JinjaModule = "github.com/ardanlabs/jinja@v1.8.0"
)

var moduleDirs sync.Map // module@version -> moduleDirResult

type moduleDirResult struct {
	dir string
	err error
}

// ModuleDir returns the directory of module@version as `go mod download
// -json` prints it, once per test binary, and skips t with the reason when
// the module cannot be had.
func ModuleDir(t testing.TB, module string) string {
	t.Helper()
	dir, err := FindModuleDir(module)
	if err != nil {
		t.Skipf("reference module %s is not in the module cache and cannot be downloaded: %v", module, err)
	}
	return dir
}

// FindModuleDir is ModuleDir for callers that have no test to skip (fuzz
// seeding, which just goes without the module's files).
func FindModuleDir(module string) (string, error) {
	r, ok := moduleDirs.Load(module)
	if !ok {
		r, _ = moduleDirs.LoadOrStore(module, downloadModule(module))
	}
	res := r.(moduleDirResult)
	return res.dir, res.err
}

func downloadModule(module string) moduleDirResult {
	out, err := exec.Command("go", "mod", "download", "-json", module).Output()
	var v struct{ Dir, Error string }
	if jerr := json.Unmarshal(out, &v); err == nil && jerr != nil {
		err = jerr
	}
	if err != nil || v.Dir == "" {
		return moduleDirResult{err: fmt.Errorf("go mod download: %v %s", err, v.Error)}
	}
	return moduleDirResult{dir: v.Dir}
}

// Llama3Dir is a model directory holding Meta-Llama-3-8B-Instruct's
// tokenizer.json and tokenizer_config.json from TokenizersModule: symlinks
// in a temporary directory. It skips t when the module cannot be had.
func Llama3Dir(t testing.TB) string {
	t.Helper()
	data := filepath.Join(ModuleDir(t, TokenizersModule), "test", "data")
	dir := t.TempDir()
	for src, dst := range map[string]string{
		"Meta-Llama-3-8B-Instruct.json":                  "tokenizer.json",
		"meta-llama-3-8b-instruct/tokenizer_config.json": "tokenizer_config.json",
	} {
		if err := os.Symlink(filepath.Join(data, src), filepath.Join(dir, dst)); err != nil {
			t.Fatalf("link the Llama 3 tokenizer file %s: %v", src, err)
		}
	}
	return dir
}
