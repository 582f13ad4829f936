package tokenizer

import (
	"errors"
	"os"
	"slices"
	"strings"
	"testing"

	"golang.org/x/text/unicode/norm"
)

func readFile(p string) ([]byte, error) { return os.ReadFile(p) }

// The expected ids below are those of daulet/tokenizers v1.24.0's
// tokenizer_test.go, which computes them with Hugging Face's tokenizers
// (Rust) through its C binding.

// llamaFox is "brown fox jumps over the lazy dog" under Llama 3
// (BenchmarkEncodeNTimes, BenchmarkDecodeNTimes).
var llamaFox = []uint32{0x10019, 0x9bff, 0x89ec, 0x39f, 0x117, 0x3eb5, 0x162f}

// llama3Pattern is the split pattern daulet's tests pass to FromTiktoken for
// Llama 3 (from meta-llama/llama3's tokenizer.py).
const llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`

// kimiPattern is the one TestFromTiktoken passes for Kimi-K2.
var kimiPattern = strings.Join([]string{
	`[\p{Han}]+`,
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?`,
	`\p{N}{1,3}`,
	` ?[^\s\p{L}\p{N}]+[\r\n]*`,
	`\s*[\r\n]+`,
	`\s+(?!\S)`,
	`\s+`,
}, "|")

func TestLlama3TokenizerJSONGivesTheReferenceIDs(t *testing.T) {
	m := llama3(t)
	if got := m.Encode("brown fox jumps over the lazy dog"); !slices.Equal(got, llamaFox) {
		t.Fatalf("Encode = %v; want %v", got, llamaFox)
	}
	if got := m.Decode(llamaFox); got != "brown fox jumps over the lazy dog" {
		t.Fatalf("Decode = %q", got)
	}
	if m.VocabSize() != 128256 {
		t.Errorf("VocabSize = %d; want 128256", m.VocabSize())
	}
	if !m.AddBOS() || m.BOSToken() != "<|begin_of_text|>" || m.EOSToken() != "<|eot_id|>" {
		t.Errorf("AddBOS %v BOS %q EOS %q; want true <|begin_of_text|> <|eot_id|>", m.AddBOS(), m.BOSToken(), m.EOSToken())
	}
	if got, want := m.EncodeWithSpecialTokens("brown fox jumps over the lazy dog"), append([]uint32{128000}, llamaFox...); !slices.Equal(got, want) {
		t.Errorf("EncodeWithSpecialTokens = %v; want %v", got, want)
	}
	// Special tokens written in the text are recognised (HF's default).
	got := m.Encode("<|start_header_id|>user<|end_header_id|>\n\nbrown fox jumps over the lazy dog<|eot_id|>")
	want := append(append([]uint32{128006, 882, 128007, 271}, llamaFox...), 128009)
	if !slices.Equal(got, want) {
		t.Errorf("chat turn = %v; want %v", got, want)
	}
	if id, ok := m.TokenID("<|eot_id|>"); !ok || id != 128009 {
		t.Errorf("TokenID(<|eot_id|>) = %d, %v", id, ok)
	}
}

func llama3Tiktoken(t testing.TB) *Model {
	t.Helper()
	cfg, err := readFile(dauletFile(t, "meta-llama-3-8b-instruct/tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	specials, err := TiktokenSpecialsFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadTiktokenFile(dauletFile(t, "meta-llama-3-8b-instruct/tiktoken.model"), llama3Pattern, specials)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestLlama3TiktokenFileGivesTheReferenceIDsAndRoundTripsReplacementCharacters(t *testing.T) {
	m := llama3Tiktoken(t)
	if got := m.Encode("brown fox jumps over the lazy dog"); !slices.Equal(got, llamaFox) {
		t.Fatalf("Encode = %v; want %v", got, llamaFox)
	}
	// TestTiktokenReplacementCharacter: non-empty ids that decode back.
	for _, s := range []string{"Hello world", "Hello �world", "Test � multiple � chars", "�", "\xEF\xBF\xBD"} {
		ids := m.Encode(s)
		if len(ids) == 0 || m.Decode(ids) != s {
			t.Errorf("%q: ids %v decode to %q", s, ids, m.Decode(ids))
		}
	}
	if m.VocabSize() != 128256 {
		t.Errorf("VocabSize = %d; want 128256", m.VocabSize())
	}
}

func TestLlama3TiktokenFileEqualsTokenizerJSONOnTheCorpus(t *testing.T) {
	hf, tk := llama3(t), llama3Tiktoken(t)
	texts := corpus(corpusSize/4, 2)
	diffs := 0
	for _, s := range texts {
		if a, b := hf.Encode(s), tk.Encode(s); !slices.Equal(a, b) {
			diffs++
			if diffs <= 3 {
				t.Errorf("%q: tokenizer.json %v, tiktoken.model %v", s, a, b)
			}
		}
	}
	logCorpus(t, "Llama 3 tokenizer.json vs tiktoken.model", len(texts), diffs)
}

func TestKimiK2TiktokenGivesTheReferenceIDs(t *testing.T) {
	cfg, err := readFile(dauletFile(t, "kimi-k2-instruct/tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	specials, err := TiktokenSpecialsFromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := LoadTiktokenFile(dauletFile(t, "kimi-k2-instruct/tiktoken.model"), kimiPattern, specials)
	if err != nil {
		t.Fatal(err)
	}
	text := "Hello, world! 你好，世界！"
	want := []uint32{19180, 11, 2695, 0, 220, 33845, 378, 2243, 856}
	if got := m.Encode(text); !slices.Equal(got, want) {
		t.Errorf("Encode(%q) = %v; want %v", text, got, want)
	}
	if got := m.Decode(want); got != text {
		t.Errorf("Decode = %q; want %q", got, text)
	}
	text = "<|im_middle|>Hello, world! 你好，世界！<|im_end|>"
	want = []uint32{163601, 19180, 11, 2695, 0, 220, 33845, 378, 2243, 856, 163586}
	if got := m.Encode(text); !slices.Equal(got, want) {
		t.Errorf("Encode(%q) = %v; want %v", text, got, want)
	}
	if got := m.Decode(want); got != text {
		t.Errorf("Decode = %q; want %q", got, text)
	}
	if m.VocabSize() != 163840 {
		t.Errorf("VocabSize = %d; want 163840", m.VocabSize())
	}
}

func TestWordPieceTokenizersFailToLoadNamingTheModelType(t *testing.T) {
	for _, f := range []string{"bert-base-uncased.json", "all-minilm-l6-v2.json", "sentence-transformers-labse.json"} {
		_, err := LoadFile(dauletFile(t, f))
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), `model type "WordPiece" is not supported (supported: BPE)`) {
			t.Errorf("%s: err = %v; want ErrUnsupported naming WordPiece", f, err)
		}
	}
}

func TestCohereByteLevelTokenizerLoadsWithNFCAndItsTemplate(t *testing.T) {
	m, err := LoadFile(dauletFile(t, "cohere-tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	// TestDecodeInvalidString decodes id 196 with skip_special_tokens and
	// gets "" through the C binding: the token is byte 0x00 (U+0100 in
	// byte-level form), and a C string ends at NUL. Decode keeps the byte.
	if got := m.Decode([]uint32{196}); got != "\x00" {
		t.Errorf("Decode([196]) = %q; want NUL", got)
	}
	ids := m.Encode("e\u0301") // NFC composes it to é before BPE
	if !slices.Equal(ids, m.Encode("é")) {
		t.Errorf("NFC: %v vs %v", ids, m.Encode("é"))
	}
	if !m.AddBOS() {
		t.Error("AddBOS = false; the post-processor starts with <BOS_TOKEN>")
	}
	got := m.EncodeWithSpecialTokens("hi")
	if len(got) < 3 || got[0] != 5 || got[len(got)-1] != 7 {
		t.Errorf("EncodeWithSpecialTokens = %v; want <BOS_TOKEN>(5) ... <EOP_TOKEN>(7)", got)
	}
	texts := corpus(corpusSize/10, 3)
	for _, s := range texts {
		if d := m.Decode(m.Encode(s)); d != norm.NFC.String(s) {
			t.Fatalf("round trip of %q gave %q", s, d)
		}
	}
}
