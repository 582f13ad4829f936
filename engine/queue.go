package engine

import "slices"

func (e *Engine) insertRunning(s *seq) {
	i, _ := slices.BinarySearchFunc(e.running, s, cmpSeq)
	e.running = slices.Insert(e.running, i, s)
}

func (e *Engine) removeRunning(s *seq) {
	if i := slices.Index(e.running, s); i >= 0 {
		e.running = slices.Delete(e.running, i, i+1)
	}
}

// cmpSeq orders by priority descending, then arrival ascending.
func cmpSeq(a, b *seq) int {
	if a.req.Priority != b.req.Priority {
		if a.req.Priority > b.req.Priority {
			return -1
		}
		return 1
	}
	return cmpU64(a.seqNo, b.seqNo)
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// seqHeap is the waiting queue: priority descending, then arrival (a
// preempted request keeps its arrival, so it resumes ahead of later ones).
type seqHeap []*seq

func (h seqHeap) Len() int           { return len(h) }
func (h seqHeap) Less(i, j int) bool { return cmpSeq(h[i], h[j]) < 0 }
func (h seqHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIdx, h[j].heapIdx = i, j
}
func (h *seqHeap) Push(x any) {
	s := x.(*seq)
	s.heapIdx = len(*h)
	*h = append(*h, s)
}
func (h *seqHeap) Pop() any {
	old := *h
	s := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	s.heapIdx = -1
	return s
}
