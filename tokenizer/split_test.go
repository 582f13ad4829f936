package tokenizer

import (
	"slices"
	"testing"
)

func handPieces(h handSplitter, s string) []string {
	var out []string
	for i := 0; i < len(s); {
		j := h.next(s, i)
		if j <= i || j > len(s) {
			return append(out, "<bad end>")
		}
		out = append(out, s[i:j])
		i = j
	}
	return out
}

func TestHandSplittersEqualRegexp2(t *testing.T) {
	patterns := map[string]string{"cl100k/llama3": patternCL100K, "qwen2": patternQwen2, "o200k": patternO200K, "gpt2": patternGPT2}
	texts := append(corpus(corpusSize, 1), asciiCorpus(corpusSize, 1)...)
	for name, pattern := range patterns {
		t.Run(name, func(t *testing.T) {
			re, err := compileSplitRegex(pattern)
			if err != nil {
				t.Fatal(err)
			}
			sp := &splitPre{re: re, behavior: behaviorIsolated}
			h := handSplitterFor(pattern)
			diffs := 0
			for _, s := range texts {
				want := []string{}
				for _, p := range sp.split(nil, piece{s: s}) {
					want = append(want, p.s)
				}
				got := handPieces(h, s)
				if got == nil {
					got = []string{}
				}
				if !slices.Equal(got, want) {
					diffs++
					if diffs <= 5 {
						t.Errorf("%q:\n hand   %q\n regexp2 %q", s, got, want)
					}
				}
			}
			logCorpus(t, name+" hand splitter vs regexp2", len(texts), diffs)
		})
	}
}
