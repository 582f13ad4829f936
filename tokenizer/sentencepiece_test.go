package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// spTokenizerJSON builds a small SentencePiece-style BPE tokenizer.json in
// the layout of Llama 2 / Mistral v0.1 files: <unk> <s> </s>, the 256
// <0xNN> byte tokens (ids 3..258), then a few pieces and their merges.
// normalizer and preTokenizer are given as JSON (or nil).
func spTokenizerJSON(t testing.TB, byteFallback bool, normalizer, preTokenizer any) []byte {
	t.Helper()
	vocab := map[string]int{"<unk>": 0, "<s>": 1, "</s>": 2}
	for b := 0; b < 256; b++ {
		vocab[fmt.Sprintf("<0x%02X>", b)] = 3 + b
	}
	for i, p := range []string{"▁", "h", "e", "l", "o", "w", "r", "d", "he", "ll", "▁he", "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world"} {
		vocab[p] = 259 + i
	}
	added := []map[string]any{}
	for i, c := range []string{"<unk>", "<s>", "</s>"} {
		added = append(added, map[string]any{"id": i, "content": c, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})
	}
	f := map[string]any{
		"version":       "1.0",
		"added_tokens":  added,
		"normalizer":    normalizer,
		"pre_tokenizer": preTokenizer,
		"post_processor": map[string]any{
			"type":           "TemplateProcessing",
			"single":         []any{map[string]any{"SpecialToken": map[string]any{"id": "<s>", "type_id": 0}}, map[string]any{"Sequence": map[string]any{"id": "A", "type_id": 0}}},
			"special_tokens": map[string]any{"<s>": map[string]any{"id": "<s>", "ids": []int{1}, "tokens": []string{"<s>"}}},
		},
		"decoder": map[string]any{"type": "Sequence", "decoders": []any{
			map[string]any{"type": "Replace", "pattern": map[string]any{"String": "▁"}, "content": " "},
			map[string]any{"type": "ByteFallback"},
			map[string]any{"type": "Fuse"},
			map[string]any{"type": "Strip", "content": " ", "start": 1, "stop": 0},
		}},
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": "<unk>", "continuing_subword_prefix": nil, "end_of_word_suffix": nil,
			"fuse_unk": true, "byte_fallback": byteFallback, "ignore_merges": false, "vocab": vocab,
			"merges": []string{"h e", "l l", "▁ he", "ll o", "▁he llo", "▁ w", "o r", "▁w or", "l d", "▁wor ld"},
		},
	}
	b, err := json.Marshal(f)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var llama2Normalizer = map[string]any{"type": "Sequence", "normalizers": []any{
	map[string]any{"type": "Prepend", "prepend": "▁"},
	map[string]any{"type": "Replace", "pattern": map[string]any{"String": " "}, "content": "▁"},
}}

// The expected ids are derived by hand from the merges: "▁hello▁world" is
// one word (no pre-tokenizer), merged in rank order to ▁hello ▁world.
func TestSentencePieceBPEWithByteFallbackGivesHandDerivedIDs(t *testing.T) {
	m, err := Load(spTokenizerJSON(t, true, llama2Normalizer, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		text string
		want []uint32
	}{
		{"hello world", []uint32{271, 276}},
		{"hello wé", []uint32{271, 272, 3 + 0xC3, 3 + 0xA9}}, // é is not a piece: <0xC3><0xA9>
		{"<s>hi", []uint32{1, 259, 260, 3 + 'i'}},            // the segment after <s> is prefixed too (Prepend)
		{"he", []uint32{269}},
	}
	for _, c := range cases {
		if got := m.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v; want %v", c.text, got, c.want)
		}
	}
	if got := m.Decode([]uint32{271, 272, 3 + 0xC3, 3 + 0xA9}); got != "hello wé" {
		t.Errorf("Decode = %q; want %q", got, "hello wé")
	}
	if got := m.EncodeWithSpecialTokens("hello world"); !slices.Equal(got, []uint32{1, 271, 276}) {
		t.Errorf("EncodeWithSpecialTokens = %v; want [1 271 276]", got)
	}
	if !m.AddBOS() || m.BOSToken() != "<s>" {
		t.Errorf("AddBOS %v BOSToken %q; want true <s>", m.AddBOS(), m.BOSToken())
	}
}

func TestSentencePieceBPEWithoutByteFallbackFusesUnknownCharacters(t *testing.T) {
	m, err := Load(spTokenizerJSON(t, false, llama2Normalizer, nil), nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Encode("hello xyz"); !slices.Equal(got, []uint32{271, 259, 0}) {
		t.Errorf("Encode = %v; want [271 259 0] (x, y and z fused into one <unk>)", got)
	}
}

func TestMetaspacePreTokenizerSplitsOnTheReplacementAndHonoursPrependScheme(t *testing.T) {
	for _, c := range []struct {
		scheme string
		text   string
		want   []uint32
	}{
		{"first", "hello world", []uint32{271, 276}},
		{"first", "<s>hello", []uint32{1, 267, 270}}, // not at the start: no ▁, so he llo
		{"always", "<s>hello", []uint32{1, 271}},
		{"never", "hello world", []uint32{267, 270, 276}},
	} {
		pre := map[string]any{"type": "Metaspace", "replacement": "▁", "prepend_scheme": c.scheme, "split": true}
		m, err := Load(spTokenizerJSON(t, true, nil, pre), nil)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.Encode(c.text); !slices.Equal(got, c.want) {
			t.Errorf("prepend_scheme %s: Encode(%q) = %v; want %v", c.scheme, c.text, got, c.want)
		}
	}
}
