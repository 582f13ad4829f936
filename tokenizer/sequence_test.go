package tokenizer

import (
	"encoding/json"
	"slices"
	"testing"
)

// pretokenize runs m's pre-tokenizer steps on s, for tests.
func (m *Model) pretokenize(s string) []string {
	pieces := []piece{{s: s, first: true}}
	for _, p := range m.pre {
		var next []piece
		for _, pc := range pieces {
			next = p.split(next, pc)
		}
		pieces = next
	}
	out := []string{}
	for _, p := range pieces {
		out = append(out, p.s)
	}
	return out
}

// DeepSeek-V3's pre-tokenizer is a Sequence of three Splits and a
// ByteLevel without regex (patterns as published in its tokenizer.json; no
// such file is in the module cache, so the expected pieces here are derived
// by hand from the patterns: each Split cuts every piece of the previous).
func TestASequenceOfSplitsAppliesEachToEveryPieceOfThePrevious(t *testing.T) {
	split := func(re string) map[string]any {
		return map[string]any{"type": "Split", "pattern": map[string]any{"Regex": re}, "behavior": "Isolated", "invert": false}
	}
	pre := map[string]any{"type": "Sequence", "pretokenizers": []any{
		split(`\p{N}{1,3}`),
		split(`[一-龥぀-ゟ゠-ヿ]+`),
		split("[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"),
		map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false},
	}}
	vocab := map[string]int{}
	for b := 0; b < 256; b++ {
		vocab[string(byteRune[b])] = b
	}
	raw, err := json.Marshal(map[string]any{"pre_tokenizer": pre, "model": map[string]any{"type": "BPE", "vocab": vocab, "merges": []string{}}})
	if err != nil {
		t.Fatal(err)
	}
	m, err := Load(raw, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := m.pretokenize("abc 1234567 你好world.foo!!\n")
	want := []string{"abc", " ", "123", "456", "7", " ", "你好", "world", ".foo", "!!\n"}
	if !slices.Equal(got, want) {
		t.Errorf("pieces %q; want %q", got, want)
	}
	if d := m.Decode(m.Encode("abc 1234567 你好world")); d != "abc 1234567 你好world" {
		t.Errorf("round trip gave %q", d)
	}
}

func TestSplitBehaviorsCutAsHuggingFaceDocumentsThem(t *testing.T) {
	// The examples of tokenizers' SplitDelimiterBehavior docs, delimiter "-".
	for _, c := range []struct {
		b    behavior
		want []string
	}{
		{behaviorRemoved, []string{"the", "final", "countdown"}},
		{behaviorIsolated, []string{"the", "-", "final", "-", "-", "countdown"}},
		{behaviorMergedWithPrevious, []string{"the-", "final-", "-", "countdown"}},
		{behaviorMergedWithNext, []string{"the", "-final", "-", "-countdown"}},
		{behaviorContiguous, []string{"the", "-", "final", "--", "countdown"}},
	} {
		sp := &splitPre{literal: "-", behavior: c.b}
		var got []string
		for _, p := range sp.split(nil, piece{s: "the-final--countdown"}) {
			got = append(got, p.s)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("behavior %d: %q; want %q", c.b, got, c.want)
		}
	}
}
