package tokenizer

import (
	"errors"
	"strings"
	"testing"
)

func TestLoadNamesWhatItDoesNotSupport(t *testing.T) {
	bpe := `"model":{"type":"BPE","vocab":{"a":0},"merges":[]}`
	cases := []struct {
		json, want string
	}{
		{`{"model":{"type":"Unigram","vocab":[["a",0]]}}`, `model type "Unigram" is not supported (supported: BPE)`},
		{`{"model":{"type":"WordLevel","vocab":{"a":0}}}`, `model type "WordLevel" is not supported`},
		{`{"model":{"vocab":{"a":0},"unk_token":"a","continuing_subword_prefix":"##","max_input_chars_per_word":100}}`, `model type "WordPiece"`},
		{`{"normalizer":{"type":"BertNormalizer"},` + bpe + `}`, `normalizer "BertNormalizer" is not supported`},
		{`{"pre_tokenizer":{"type":"Whitespace"},` + bpe + `}`, `pre_tokenizer "Whitespace" is not supported`},
		{`{"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"ByteLevel"},{"type":"Digits"}]},` + bpe + `}`, `ByteLevel followed by another pre-tokenizer`},
		{`{"model":{"type":"BPE","vocab":{"a":0},"merges":[],"dropout":0.1}}`, `dropout`},
	}
	for _, c := range cases {
		_, err := Load([]byte(c.json), nil)
		if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err = %v; want ErrUnsupported containing %q", c.json, err, c.want)
		}
	}
}

func TestLoadReportsMalformedFilesWithATypedError(t *testing.T) {
	for _, s := range []string{
		`{`, `[]`, `{"model":null}`, `{"model":{"type":"BPE","vocab":{},"merges":[]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a a"]}}`,
		`{"model":{"type":"BPE","vocab":{"a":0},"merges":["a"]}}`,
		`{"model":{"type":"BPE","vocab":{"a":"zero"},"merges":[]}}`,
	} {
		if _, err := Load([]byte(s), nil); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v; want ErrMalformed", s, err)
		}
	}
	if _, err := Load([]byte(`{"model":{"type":"BPE","vocab":{"a":0},"merges":[]}}`), []byte(`{`)); !errors.Is(err, ErrMalformed) {
		t.Errorf("malformed tokenizer_config.json: err = %v; want ErrMalformed", err)
	}
}

func TestSpecialTokensComeFromTheConfigAsStringsOrObjects(t *testing.T) {
	cfg := `{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>","pad_token":null,"add_bos_token":false}`
	m, err := Load([]byte(`{"model":{"type":"BPE","vocab":{"a":0,"<s>":1,"</s>":2},"merges":[]}}`), []byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	got := m.SpecialTokens()
	if len(got) != 2 || got["bos_token"] != "<s>" || got["eos_token"] != "</s>" {
		t.Errorf("SpecialTokens = %v", got)
	}
	if m.AddBOS() {
		t.Error("AddBOS = true; the config says add_bos_token false")
	}
}
