package tokenizer

// heapThreshold is the word length above which merge switches from
// scanning all pairs per merge (quadratic, fastest for the short words
// regex pre-tokenizers produce) to a heap over a linked list (n log n, for
// long runs of punctuation and for SentencePiece files without a
// pre-tokenizer, where a whole paragraph is one word).
const heapThreshold = 128

type mergeCand struct {
	rank        uint32
	left, right int32 // node indices; left orders ties (leftmost first)
	merged      uint32
	lid, rid    uint32 // the symbols the pair was built from, to detect stale entries
}

type candHeap []mergeCand

func (h candHeap) less(i, j int) bool {
	if h[i].rank != h[j].rank {
		return h[i].rank < h[j].rank
	}
	return h[i].left < h[j].left
}

func (h *candHeap) push(c mergeCand) {
	*h = append(*h, c)
	s := *h
	for i := len(s) - 1; i > 0; {
		p := (i - 1) / 2
		if !s.less(i, p) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *candHeap) pop() mergeCand {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	for i := 0; ; {
		l, r, small := 2*i+1, 2*i+2, i
		if l < n && s.less(l, small) {
			small = l
		}
		if r < n && s.less(r, small) {
			small = r
		}
		if small == i {
			break
		}
		s[i], s[small] = s[small], s[i]
		i = small
	}
	*h = s
	return top
}

// mergeHeap is merge for long words; it gives the same result.
func (m *Model) mergeHeap(syms []uint32) []uint32 {
	n := len(syms)
	prev := make([]int32, n)
	next := make([]int32, n)
	alive := make([]bool, n)
	for i := range syms {
		prev[i], next[i], alive[i] = int32(i-1), int32(i+1), true
	}
	next[n-1] = -1
	h := make(candHeap, 0, n)
	add := func(l, r int32) {
		if l < 0 || r < 0 {
			return
		}
		if v := m.pair(syms[l], syms[r]); v != noMerge {
			h.push(mergeCand{rank: uint32(v >> 32), left: l, right: r, merged: uint32(v), lid: syms[l], rid: syms[r]})
		}
	}
	for i := 0; i+1 < n; i++ {
		add(int32(i), int32(i+1))
	}
	for len(h) > 0 {
		c := h.pop()
		if !alive[c.left] || !alive[c.right] || next[c.left] != c.right || syms[c.left] != c.lid || syms[c.right] != c.rid {
			continue
		}
		syms[c.left] = c.merged
		alive[c.right] = false
		nr := next[c.right]
		next[c.left] = nr
		if nr >= 0 {
			prev[nr] = c.left
		}
		add(prev[c.left], c.left)
		add(c.left, nr)
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}
