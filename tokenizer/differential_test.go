package tokenizer

import (
	"slices"
	"testing"

	pkoukk "github.com/pkoukk/tiktoken-go"
	"github.com/tiktoken-go/tokenizer/codec"
)

// pkoukkEncoder is github.com/pkoukk/tiktoken-go v0.1.8's BPE core (an
// independent Go port of tiktoken) with the given ranks, pattern and
// special tokens, all specials allowed in the text.
func pkoukkEncoder(t testing.TB, ranks map[string]int, specials map[string]int, pattern string) func(string) []uint32 {
	t.Helper()
	core, err := pkoukk.NewCoreBPE(ranks, specials, pattern)
	if err != nil {
		t.Fatal(err)
	}
	set := map[string]any{}
	for k := range specials {
		set[k] = true
	}
	tk := pkoukk.NewTiktoken(core, &pkoukk.Encoding{PatStr: pattern, MergeableRanks: ranks, SpecialTokens: specials}, set)
	return func(s string) []uint32 {
		ids := tk.Encode(s, []string{"all"}, nil)
		out := make([]uint32, len(ids))
		for i, id := range ids {
			out[i] = uint32(id)
		}
		return out
	}
}

// llama3Ranks converts the Llama 3 tokenizer.json vocabulary to tiktoken
// ranks (byte strings, through the inverse byte-to-unicode mapping) and
// its added tokens to specials.
func llama3Ranks(m *Model) (map[string]int, map[string]int) {
	ranks := map[string]int{}
	specials := map[string]int{}
	for tok, id := range m.vocab.All() {
		if int(id) >= 128000 {
			specials[tok] = int(id)
			continue
		}
		b, ok := unByteLevel(tok)
		if !ok {
			panic("Llama 3 vocabulary token outside the byte mapping: " + tok)
		}
		ranks[b] = int(id)
	}
	return ranks, specials
}

func diffEncoders(t *testing.T, what string, texts []string, got, want func(string) []uint32) {
	t.Helper()
	diffs := 0
	for _, s := range texts {
		a, b := got(s), want(s)
		if !slices.Equal(a, b) {
			diffs++
			if diffs <= 5 {
				t.Errorf("%q:\n switchyard %v\n reference  %v", s, a, b)
			}
		}
	}
	logCorpus(t, what, len(texts), diffs)
}

func TestLlama3EqualsTiktokenGoBPECoreOnGeneratedText(t *testing.T) {
	m := llama3(t)
	ranks, specials := llama3Ranks(m)
	ref := pkoukkEncoder(t, ranks, specials, llama3Pattern)
	diffEncoders(t, "Llama 3 (tokenizer.json) vs pkoukk/tiktoken-go BPE core", corpus(corpusSize, 4), m.Encode, ref)
}

// embeddedRanks reads tiktoken-go/tokenizer's embedded ranks through its
// exported Decode, the way LoadTiktoken does, for pkoukk's loader.
type embeddedRanks struct{}

func (embeddedRanks) LoadTiktokenBpe(url string) (map[string]int, error) {
	var c *codec.Codec
	switch url {
	case "https://openaipublic.blob.core.windows.net/encodings/cl100k_base.tiktoken":
		c = codec.NewCl100kBase()
	case "https://openaipublic.blob.core.windows.net/encodings/o200k_base.tiktoken":
		c = codec.NewO200kBase()
	default:
		return nil, errNoRanks(url)
	}
	ranks := map[string]int{}
	// Ranks are dense from 0: Decode fails at the first id past them.
	for id := 0; ; id++ {
		tok, err := c.Decode([]uint{uint(id)})
		if err != nil {
			return ranks, nil //nolint:nilerr // the error marks the end of the ranks
		}
		ranks[tok] = id
	}
}

type errNoRanks string

func (e errNoRanks) Error() string { return "no embedded ranks for " + string(e) }

func TestEmbeddedTiktokenEncodingsEqualTiktokenGoOwnEncodings(t *testing.T) {
	// pkoukk/tiktoken-go downloads ranks; it gets the embedded ones instead,
	// and keeps its own split patterns and special tokens.
	pkoukk.SetBpeLoader(embeddedRanks{})
	defer pkoukk.SetBpeLoader(pkoukk.NewDefaultBpeLoader())
	for _, name := range []string{"cl100k_base", "o200k_base"} {
		t.Run(name, func(t *testing.T) {
			if raceBuild && name == "o200k_base" {
				t.Skip("race build: building the 200k-token o200k vocabulary takes ~20 s under the race detector; this test has no concurrency and the non-race build runs it")
			}
			m, err := LoadTiktoken(name)
			if err != nil {
				t.Fatal(err)
			}
			ref, err := pkoukk.GetEncoding(name)
			if err != nil {
				t.Fatal(err)
			}
			enc := func(s string) []uint32 {
				ids := ref.Encode(s, []string{"all"}, nil)
				out := make([]uint32, len(ids))
				for i, id := range ids {
					out[i] = uint32(id)
				}
				return out
			}
			diffEncoders(t, name+" vs pkoukk/tiktoken-go "+name, corpus(corpusSize/4, 5), m.Encode, enc)
		})
	}
}
