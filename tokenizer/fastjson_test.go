package tokenizer

import (
	"encoding/json"
	"maps"
	"slices"
	"testing"
)

func TestFastVocabAndMergesEqualEncodingJSON(t *testing.T) {
	vocabs := []string{
		`{}`, `{"a":0}`, ` { "a" : 1 , "b":2 } `, `{"\u0120the":5,"\"q\\":6,"\n\t\/":7,"\ud83d\ude00":8,"a":1,"a":2}`,
		`{"é":4294967295}`,
	}
	for _, v := range vocabs {
		var want map[string]uint32
		if err := json.Unmarshal([]byte(v), &want); err != nil {
			t.Fatal(err)
		}
		got := map[string]uint32{}
		if !fastVocab([]byte(v), got) || !maps.Equal(got, want) {
			t.Errorf("%s: fast %v; encoding/json %v", v, got, want)
		}
	}
	// Shapes the scanner leaves to encoding/json.
	for _, v := range []string{`{"a":1.0}`, `{"a":-1}`, `{"a":4294967296}`, `{"\ud800":1}`, "{\"\xff\":1}", `{"a":1,}`, `{"a":01}`, `["a"]`, `{"a":1} x`} {
		if fastVocab([]byte(v), map[string]uint32{}) {
			t.Errorf("%s: fast scanner accepted it", v)
		}
	}
	for _, v := range []string{`[]`, `["a b","\u0120 t"]`, `[["a","b"],["\u0120","t"]]`, ` [ "x y" ] `} {
		lines, pairs, ok := fastMerges([]byte(v))
		var wantLines []string
		var wantPairs [][2]string
		if json.Unmarshal([]byte(v), &wantLines) != nil {
			wantLines = nil
			if err := json.Unmarshal([]byte(v), &wantPairs); err != nil {
				t.Fatal(err)
			}
		}
		if !ok || !slices.Equal(lines, wantLines) || !slices.Equal(pairs, wantPairs) {
			t.Errorf("%s: fast %q %q %v; encoding/json %q %q", v, lines, pairs, ok, wantLines, wantPairs)
		}
	}
	for _, v := range []string{`["a b",["a","b"]]`, `[["a"]]`, `[["a","b","c"]]`, `["a b",]`, `[1]`} {
		if _, _, ok := fastMerges([]byte(v)); ok {
			t.Errorf("%s: fast scanner accepted it", v)
		}
	}
}

func TestFastVocabReadsTheLlama3VocabularyAsEncodingJSONDoes(t *testing.T) {
	raw, err := readFile(dauletFile(t, "Meta-Llama-3-8B-Instruct.json"))
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Model struct {
			Vocab  json.RawMessage `json:"vocab"`
			Merges json.RawMessage `json:"merges"`
		} `json:"model"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		t.Fatal(err)
	}
	var want map[string]uint32
	if err := json.Unmarshal(f.Model.Vocab, &want); err != nil {
		t.Fatal(err)
	}
	got := map[string]uint32{}
	if !fastVocab(f.Model.Vocab, got) || !maps.Equal(got, want) {
		t.Fatalf("vocabularies differ (%d vs %d entries)", len(got), len(want))
	}
	var wantMerges []string
	if err := json.Unmarshal(f.Model.Merges, &wantMerges); err != nil {
		t.Fatal(err)
	}
	lines, _, ok := fastMerges(f.Model.Merges)
	if !ok || !slices.Equal(lines, wantMerges) {
		t.Fatalf("merges differ (%d vs %d)", len(lines), len(wantMerges))
	}
}
