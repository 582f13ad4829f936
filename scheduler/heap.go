package scheduler

// heapOrder is how an indexedHeap orders its items and where each item keeps
// its own position. Implementations are empty structs, so the order costs no
// space in the heap.
type heapOrder[T any] interface {
	less(a, b T) bool
	setPos(x T, i int) // -1 when x leaves the heap
}

// indexedHeap is a binary min-heap whose items know their position, so any
// item can be removed or re-sifted in O(log n). The class queues, the due
// index and the booking expiry heap are all one: they differ only in order
// and position field.
type indexedHeap[T any, O heapOrder[T]] []T

func (h indexedHeap[T, O]) len() int { return len(h) }

func (h *indexedHeap[T, O]) push(x T) {
	var o O
	o.setPos(x, len(*h))
	*h = append(*h, x)
	h.up(len(*h) - 1)
}

// remove takes the item at position i out of the heap.
func (h *indexedHeap[T, O]) remove(i int) {
	var o O
	s := *h
	last := len(s) - 1
	x := s[i]
	if i != last {
		s.swap(i, last)
	}
	var zero T
	s[last] = zero
	*h = s[:last]
	if i != last {
		h.fix(i)
	}
	o.setPos(x, -1)
}

// fix restores the order after the item at i changed its key.
func (h indexedHeap[T, O]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h indexedHeap[T, O]) swap(i, j int) {
	var o O
	h[i], h[j] = h[j], h[i]
	o.setPos(h[i], i)
	o.setPos(h[j], j)
}

func (h indexedHeap[T, O]) up(i int) {
	var o O
	for i > 0 {
		p := (i - 1) / 2
		if !o.less(h[i], h[p]) {
			return
		}
		h.swap(i, p)
		i = p
	}
}

// down sifts the item at i down and reports whether it moved.
func (h indexedHeap[T, O]) down(i int) bool {
	var o O
	start := i
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && o.less(h[r], h[l]) {
			m = r
		}
		if !o.less(h[m], h[i]) {
			break
		}
		h.swap(i, m)
		i = m
	}
	return i > start
}
