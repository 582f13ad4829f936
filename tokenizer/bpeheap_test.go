package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func TestHeapMergeEqualsScanMergeOnLongWords(t *testing.T) {
	m := llama3(t)
	rng := rand.New(rand.NewPCG(9, 9))
	alphabets := []string{"ab", "abcdefghijklmnopqrstuvwxyz", "-=", "e\u0301", "0123456789", "aaaaab ", "th", "😀"}
	words := 1000
	if raceBuild {
		words = 100
	}
	for i := 0; i < words; i++ {
		alpha := []rune(alphabets[rng.IntN(len(alphabets))])
		var b strings.Builder
		for n := 2 + rng.IntN(400); b.Len() < n; {
			b.WriteRune(alpha[rng.IntN(len(alpha))])
		}
		w := b.String()
		syms := make([]uint32, len(w))
		for k := 0; k < len(w); k++ {
			syms[k] = m.byteID[w[k]]
		}
		scan := m.mergeScan(slices.Clone(syms), &scratch{})
		heap := m.mergeHeap(slices.Clone(syms))
		if !slices.Equal(scan, heap) {
			t.Fatalf("%q: scan %v, heap %v", w, scan, heap)
		}
	}
}
