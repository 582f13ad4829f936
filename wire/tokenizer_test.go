package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTokenizerDigestIsSHA256OverNameNULLengthAndBytesOfEachFileInOrder(t *testing.T) {
	files := []NamedFile{{Name: "tokenizer.json", Data: []byte(`{"a":1}`)}, {Name: "chat_template.jinja", Data: []byte("{{x}}")}}
	// Spelled out byte by byte from TokenizerSource's comment.
	var want []byte
	want = append(want, "tokenizer.json"...)
	want = append(want, 0, 7, 0, 0, 0, 0, 0, 0, 0)
	want = append(want, `{"a":1}`...)
	want = append(want, "chat_template.jinja"...)
	want = append(want, 0, 5, 0, 0, 0, 0, 0, 0, 0)
	want = append(want, "{{x}}"...)
	sum := sha256.Sum256(want)
	got := TokenizerDigest(files)
	assert.Equal(t, hex.EncodeToString(sum[:]), got)
	assert.Len(t, got, 64, "what WorkerInfo.Validate expects")
}

func TestTokenizerDigestChangesWhenBytesMoveBetweenFilesOrFilesSwap(t *testing.T) {
	a := TokenizerDigest([]NamedFile{{Name: "a", Data: []byte("xy")}, {Name: "b", Data: []byte("z")}})
	moved := TokenizerDigest([]NamedFile{{Name: "a", Data: []byte("x")}, {Name: "b", Data: []byte("yz")}})
	swapped := TokenizerDigest([]NamedFile{{Name: "b", Data: []byte("z")}, {Name: "a", Data: []byte("xy")}})
	assert.NotEqual(t, a, moved)
	assert.NotEqual(t, a, swapped)
	assert.Equal(t, a, TokenizerDigest([]NamedFile{{Name: "a", Data: []byte("xy")}, {Name: "b", Data: []byte("z")}}))
}
