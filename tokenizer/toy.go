package tokenizer

import (
	"strconv"
	"strings"
)

const (
	// FirstID is the smallest id Encode produces; lower ids are reserved.
	FirstID = 256
	// VocabSize bounds every id Encode produces (exclusive).
	VocabSize = 50000
	// maxPiece is the longest piece, in bytes, that becomes one token.
	maxPiece = 4
)

// Tokenizer turns text into token ids. Routers and engines that share an
// implementation agree on KV block hashes.
type Tokenizer interface {
	Encode(text string) []uint32
}

// Default is the deterministic default tokenizer.
type Default struct{}

// Encode returns the token ids of text.
func (Default) Encode(text string) []uint32 { return Encode(text) }

// Encode returns the token ids of text under the default tokenizer.
func Encode(text string) []uint32 {
	return AppendEncode(make([]uint32, 0, len(text)/3+1), text)
}

// AppendEncode appends the token ids of text to dst.
func AppendEncode(dst []uint32, text string) []uint32 {
	for i := 0; i < len(text); {
		j := pieceEnd(text, i)
		dst = append(dst, pieceID(text[i:j]))
		i = j
	}
	return dst
}

// Count returns len(Encode(text)) without allocating.
func Count(text string) int {
	n := 0
	for i := 0; i < len(text); i = pieceEnd(text, i) {
		n++
	}
	return n
}

// pieceEnd returns the end of the piece starting at i. Like BPE vocabularies,
// a single space sticks to the word that follows it.
func pieceEnd(text string, i int) int {
	if text[i] == ' ' && i+1 < len(text) && byteClass(text[i+1]) == classWord {
		i++
	}
	class := byteClass(text[i])
	j := i + 1
	if class == classPunct {
		return j
	}
	for j < len(text) && j-i < maxPiece && byteClass(text[j]) == class {
		j++
	}
	return j
}

const (
	classWord = iota
	classSpace
	classPunct
)

func byteClass(c byte) int {
	switch {
	case c == ' ' || c == '\t' || c == '\n' || c == '\r':
		return classSpace
	case c >= 0x80, c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_':
		return classWord
	default:
		return classPunct
	}
}

// pieceID maps a piece to an id with 32-bit FNV-1a.
func pieceID(p string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(p); i++ {
		h ^= uint32(p[i])
		h *= 16777619
	}
	return FirstID + h%(VocabSize-FirstID)
}

// Piece returns a printable text for id, used by the simulated engine to
// render generated tokens. It is not an inverse of Encode (the default
// tokenizer has no vocabulary); it is stable and one token long under Encode
// only in length terms: every piece is a short word followed by a space.
func Piece(id uint32) string {
	return "t" + strconv.FormatUint(uint64(id%VocabSize), 36) + " "
}

// Message is one chat message after the frontend has flattened its content.
type Message struct {
	Role    string
	Content string
}

// ChatPrompt renders messages with the default chat template, the text both
// router and engine tokenize for /v1/chat/completions:
//
//	<|role|>\ncontent\n ... <|assistant|>\n
func ChatPrompt(msgs []Message) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|")
		b.WriteString(m.Role)
		b.WriteString("|>\n")
		b.WriteString(m.Content)
		b.WriteString("\n")
	}
	b.WriteString("<|assistant|>\n")
	return b.String()
}
