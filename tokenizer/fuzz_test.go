package tokenizer

import (
	"errors"
	"testing"
	"unicode/utf8"
)

func FuzzLoad(f *testing.F) {
	sp := spTokenizerJSON(f, true, llama2Normalizer, nil)
	f.Add(sp)
	f.Add(sp[:len(sp)/2])
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"model":{"type":"WordPiece","vocab":{"a":0}}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":[["a","b"]]},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"(a"},"behavior":"Isolated"}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]},"post_processor":{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":"x"}}],"special_tokens":{"x":{"ids":[99999]}}}}`))
	f.Add([]byte(`{"model":{"type":"BPE","vocab":{"a":4294967295},"merges":[]}}`))
	f.Add([]byte(`{"added_tokens":[{"id":3,"content":"<x>","lstrip":true,"rstrip":true,"single_word":true}],"model":{"type":"BPE","vocab":{"a":0," ":1},"merges":[]},"pre_tokenizer":{"type":"ByteLevel"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := Load(data, nil)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("error %v is neither ErrMalformed nor ErrUnsupported", err)
			}
			return
		}
		for _, s := range []string{"", "a", "ab a <x>  b", "héllo wörld 123 <s></s>", string(data)} {
			for _, id := range m.EncodeWithSpecialTokens(s) {
				if int(id) >= m.VocabSize() {
					t.Fatalf("id %d >= vocab size %d", id, m.VocabSize())
				}
			}
			_ = m.Decode(m.Encode(s))
		}
	})
}

func FuzzEncode(f *testing.F) {
	for _, s := range []string{"", "hello", "<|eot_id|>x", "\xff\xfe", "a\x80b", "don't 'LL 123456", "  \r\n\t ", "😀👍🏽", "中文", string(make([]byte, 300))} {
		f.Add(s)
	}
	// Loaded before fuzzing: a worker that spends its first input loading
	// the vocabulary looks hung to the fuzzing coordinator.
	m := llama3(f)
	f.Fuzz(func(t *testing.T, s string) {
		ids := m.Encode(s)
		for _, id := range ids {
			if int(id) >= m.VocabSize() {
				t.Fatalf("id %d >= vocab size %d", id, m.VocabSize())
			}
		}
		if d := m.Decode(ids); d != s {
			t.Fatalf("Decode(Encode(%q)) = %q (valid UTF-8: %v)", s, d, utf8.ValidString(s))
		}
		if c := m.EncodeCached(nil, s); len(c) != len(ids) {
			t.Fatalf("EncodeCached(nil) gave %d ids; Encode %d", len(c), len(ids))
		}
	})
}
