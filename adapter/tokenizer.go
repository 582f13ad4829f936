package adapter

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/switchyard/switchyard/wire"
)

// TokenizerFileNames are the files of a model directory the adapter serves,
// in the order they are advertised and hashed.
var TokenizerFileNames = []string{
	"tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
	"special_tokens_map.json", "generation_config.json",
}

// maxTokenizerFileBytes bounds one served file (large tokenizer.json files
// are ~10-30 MB).
const maxTokenizerFileBytes = 256 << 20

// LoadTokenizerDir reads the tokenizer files present in dir. It needs at
// least tokenizer.json, without which no router could tokenize.
func LoadTokenizerDir(dir string) ([]wire.NamedFile, error) {
	var out []wire.NamedFile
	for _, name := range TokenizerFileNames {
		p := filepath.Join(dir, name)
		st, err := os.Stat(p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("tokenizer dir: %w", err)
		}
		if !st.Mode().IsRegular() || st.Size() > maxTokenizerFileBytes {
			return nil, fmt.Errorf("%w: tokenizer dir: %s is not a regular file of at most %d bytes", ErrInvalidConfig, p, maxTokenizerFileBytes)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, fmt.Errorf("tokenizer dir: %w", err)
		}
		out = append(out, wire.NamedFile{Name: name, Data: b})
	}
	if len(out) == 0 || out[0].Name != "tokenizer.json" {
		return nil, fmt.Errorf("%w: tokenizer dir %s has no tokenizer.json", ErrInvalidConfig, dir)
	}
	return out, nil
}

// tokenizerSource advertises files served under base ("<adapter>/tokenizer").
func tokenizerSource(base string, files []wire.NamedFile) *wire.TokenizerSource {
	names := make([]string, len(files))
	for i, f := range files {
		names[i] = f.Name
	}
	return &wire.TokenizerSource{URL: base, Files: names, SHA256: wire.TokenizerDigest(files)}
}
