package prompt

import (
	"fmt"
	"strings"

	"github.com/switchyard/switchyard/tokenizer"
)

// BuiltinSpec reports whether spec names a tokenizer compiled into the
// binary, which a worker may advertise by name.
func BuiltinSpec(spec string) bool {
	return spec == "toy"
}

// OpenSpec loads a tokenizer spec.
func OpenSpec(spec string, prefixCacheBytes int64) (*Model, error) {
	if spec == "toy" {
		return &Model{Spec: spec, Encode: tokenizer.Encode, Decode: decodeToy, Template: PlainChat{}, Describe: "toy"}, nil
	}
	return nil, fmt.Errorf("%w: %q", ErrBadSpec, spec)
}

// OpenFiles loads fetched tokenizer files.
func OpenFiles(files map[string][]byte, prefixCacheBytes int64) (*Model, error) {
	return nil, fmt.Errorf("%w: no loader", ErrBadSpec)
}

func decodeToy(ids []uint32) string {
	var b strings.Builder
	for _, id := range ids {
		b.WriteString(tokenizer.Piece(id))
	}
	return b.String()
}
