package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// byteLevelJSON builds a byte-level tokenizer.json with the 256 byte
// tokens (id = byte value), no merges, and the given added tokens from id
// 256 on, so the expected ids of a text can be read off its bytes.
func byteLevelJSON(t testing.TB, normalizer any, added ...map[string]any) []byte {
	t.Helper()
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteRune[b])] = b
	}
	for i, a := range added {
		a["id"] = 256 + i
	}
	f := map[string]any{
		"added_tokens":  added,
		"normalizer":    normalizer,
		"pre_tokenizer": map[string]any{"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
		"model":         map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}},
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func tok(content string, flags ...string) map[string]any {
	a := map[string]any{"content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}
	for _, f := range flags {
		a[f] = true
	}
	return a
}

func bytesThen(s string, rest ...uint32) []uint32 {
	out := make([]uint32, 0, len(s)+len(rest))
	for i := 0; i < len(s); i++ {
		out = append(out, uint32(s[i]))
	}
	return append(out, rest...)
}

func cat(parts ...[]uint32) []uint32 { return slices.Concat(parts...) }

// The expectations follow Hugging Face's AddedVocabulary: lstrip takes the
// whitespace before the token into it, rstrip the whitespace after, and a
// single_word token next to a word character is not a match.
func TestAddedTokensHonourLstripRstripSingleWordAndLongestMatch(t *testing.T) {
	m, err := Load(byteLevelJSON(t, nil,
		tok("<mask>", "lstrip"), // 256
		tok("[X]", "rstrip"),    // 257
		tok("word", "single_word"),
		tok("<m"),         // 259, a prefix of <mask>: the longer one wins
		tok("<mask>more"), // 260
	), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		text string
		want []uint32
	}{
		{"hi  <mask> there", cat(bytesThen("hi", 256), bytesThen(" there"))},
		{"[X]  \n y", cat([]uint32{257}, bytesThen("y"))},
		{"aword b", bytesThen("aword b")},
		{"a word b", cat(bytesThen("a ", 258), bytesThen(" b"))},
		{"word_", bytesThen("word_")},
		{"<mx", cat([]uint32{259}, bytesThen("x"))},
		{"<mask>more!", cat([]uint32{260}, bytesThen("!"))},
		{"<mask>mor", cat([]uint32{256}, bytesThen("mor"))},
	}
	for _, c := range cases {
		if got := m.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v; want %v", c.text, got, c.want)
		}
	}
}

func TestNormalizedAddedTokensMatchAfterNormalization(t *testing.T) {
	norm := map[string]any{"type": "Replace", "pattern": map[string]any{"String": "A"}, "content": "a"}
	raw := tok("<A>")
	normd := tok("<A>")
	normd["normalized"] = true
	mRaw, err := Load(byteLevelJSON(t, norm, raw), nil)
	if err != nil {
		t.Fatal(err)
	}
	mNorm, err := Load(byteLevelJSON(t, norm, normd), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Raw: matched before the normalizer turns A into a.
	if got, want := mRaw.Encode("x<A>A"), cat(bytesThen("x", 256), bytesThen("a")); !slices.Equal(got, want) {
		t.Errorf("raw: %v; want %v", got, want)
	}
	// Normalized: the pattern is the normalized content "<a>", so both
	// spellings match.
	if got, want := mNorm.Encode("<a><A>"), []uint32{256, 256}; !slices.Equal(got, want) {
		t.Errorf("normalized: %v; want %v", got, want)
	}
}

func TestOpenAcceptsADirectoryAFileAndATiktokenName(t *testing.T) {
	dir := t.TempDir()
	// Links, not copies: the files stay in the module cache.
	if err := os.Symlink(dauletFile(t, "Meta-Llama-3-8B-Instruct.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(dauletFile(t, "meta-llama-3-8b-instruct/tokenizer_config.json"), filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	for _, spec := range []string{dir, filepath.Join(dir, "tokenizer.json")} {
		m, err := Open(spec)
		if err != nil {
			t.Fatalf("Open(%q): %v", spec, err)
		}
		if got := m.Encode("brown fox jumps over the lazy dog"); !slices.Equal(got, llamaFox) || m.EOSToken() != "<|eot_id|>" {
			t.Errorf("Open(%q): ids %v, EOS %q", spec, got, m.EOSToken())
		}
	}
	m, err := Open("tiktoken:cl100k_base")
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "tiktoken:cl100k_base" || m.VocabSize() != 100277 {
		t.Errorf("cl100k_base: name %q, vocab size %d; want 100277", m.Name(), m.VocabSize())
	}
	if got := m.Encode("<|endoftext|>"); !slices.Equal(got, []uint32{100257}) {
		t.Errorf("<|endoftext|> = %v; want [100257]", got)
	}
	if _, err := Open("tiktoken:nope"); err == nil {
		t.Error("Open(tiktoken:nope) succeeded")
	}
	if _, err := Open(filepath.Join(dir, "missing")); err == nil {
		t.Error("Open of a missing path succeeded")
	}
}
