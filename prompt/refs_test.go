package prompt

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

const dauletModule = "github.com/daulet/tokenizers@v1.24.0"

var (
	modDirOnce sync.Once
	modDir     string
	modErr     string
)

// llama3Dir is a model directory holding Meta-Llama-3-8B-Instruct's
// tokenizer.json and tokenizer_config.json from the daulet/tokenizers
// module zip (go mod download, offline from the module cache): symlinks in
// a temporary directory, so nothing is copied into the repository. The test
// skips when the module cannot be had.
func llama3Dir(t testing.TB) string {
	t.Helper()
	modDirOnce.Do(func() {
		out, err := exec.Command("go", "mod", "download", "-json", dauletModule).Output()
		var v struct{ Dir, Error string }
		if err == nil {
			err = json.Unmarshal(out, &v)
		}
		if err != nil || v.Dir == "" {
			modErr = "go mod download " + dauletModule + ": " + v.Error
			if err != nil {
				modErr += " " + err.Error()
			}
			return
		}
		modDir = v.Dir
	})
	if modDir == "" {
		t.Skipf("the reference module is not available (%s), so the Llama 3 tokenizer cannot be loaded", modErr)
	}
	dir := t.TempDir()
	data := filepath.Join(modDir, "test", "data")
	require.NoError(t, os.Symlink(filepath.Join(data, "Meta-Llama-3-8B-Instruct.json"), filepath.Join(dir, "tokenizer.json")))
	require.NoError(t, os.Symlink(filepath.Join(data, "meta-llama-3-8b-instruct", "tokenizer_config.json"), filepath.Join(dir, "tokenizer_config.json")))
	return dir
}
