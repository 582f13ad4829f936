package tokenizer

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// Reference files are read from Go module zips in the module cache (never
// copied into the repository): github.com/daulet/tokenizers carries real
// Hugging Face tokenizer files and the tests with their expected ids.
const daulet = "github.com/daulet/tokenizers@v1.24.0"

var (
	modDirMu sync.Mutex
	modDirs  = map[string]string{}
)

// moduleDir returns the directory of module@version as `go mod download
// -json` prints it (offline from the module cache, or via the proxy), and
// skips the test when it cannot be had.
func moduleDir(t testing.TB, mod string) string {
	t.Helper()
	modDirMu.Lock()
	defer modDirMu.Unlock()
	if d, ok := modDirs[mod]; ok {
		if d == "" {
			t.Skipf("reference module %s is not available, so its tokenizer files cannot be loaded", mod)
		}
		return d
	}
	out, err := exec.Command("go", "mod", "download", "-json", mod).Output()
	var v struct{ Dir, Error string }
	if err == nil {
		err = json.Unmarshal(out, &v)
	}
	if err != nil || v.Dir == "" {
		modDirs[mod] = ""
		t.Skipf("reference module %s is not available (go mod download: %v %s), so its tokenizer files cannot be loaded", mod, err, v.Error)
	}
	modDirs[mod] = v.Dir
	return v.Dir
}

func dauletFile(t testing.TB, rel string) string {
	return filepath.Join(moduleDir(t, daulet), "test", "data", rel)
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
	dir := moduleDir(t, daulet)
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
