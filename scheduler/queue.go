package scheduler

import "time"

// entry is one queued request. Everything the ordering needs is computed once
// at enqueue, so the heaps compare plain fields.
type entry struct {
	req     *Request
	respond Responder
	cls     *class

	seq    uint64 // arrival order within this Core
	strict int32
	hasDue bool
	due    int64   // Due in Unix nanoseconds, when hasDue
	score  float64 // policy score, higher first
	cost   int64   // DRR cost max(1, isl − cached), fixed at enqueue
	cached int     // best allowed (or pinned) cached tokens at enqueue

	enqueuedAt time.Time
	qi, di     int // positions in the class heap and the due heap; -1 = absent
}

// before is the within-class order: strict priority desc, due asc with
// no-deadline last, policy score desc, arrival asc.
func (a *entry) before(b *entry) bool {
	if a.strict != b.strict {
		return a.strict > b.strict
	}
	if a.hasDue != b.hasDue {
		return a.hasDue
	}
	if a.hasDue && a.due != b.due {
		return a.due < b.due
	}
	if a.score != b.score {
		return a.score > b.score
	}
	return a.seq < b.seq
}

// policyScore is the score of seed 000 / design §5. offset is the arrival
// offset in seconds from the Core's epoch, taken from the request's ingress.
func policyScore(p Policy, pj, offset float64, cost int64) float64 {
	pj = max(pj, 0)
	switch p {
	case PolicyLCFS:
		return pj + offset
	case PolicyWSPT:
		return (1 + pj) / float64(cost)
	default:
		return pj - offset
	}
}

// entryHeap is a class's binary heap ordered by entry.before.
type entryHeap []*entry

func (h *entryHeap) push(e *entry) {
	e.qi = len(*h)
	*h = append(*h, e)
	h.up(e.qi)
}

func (h *entryHeap) remove(i int) {
	s := *h
	last := len(s) - 1
	e := s[i]
	if i != last {
		s[i] = s[last]
		s[i].qi = i
	}
	s[last] = nil
	*h = s[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	e.qi = -1
}

func (h entryHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].before(h[p]) {
			return
		}
		h[i], h[p] = h[p], h[i]
		h[i].qi, h[p].qi = i, p
		i = p
	}
}

func (h entryHeap) down(i int) bool {
	start := i
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h[r].before(h[l]) {
			m = r
		}
		if !h[m].before(h[i]) {
			break
		}
		h[i], h[m] = h[m], h[i]
		h[i].qi, h[m].qi = i, m
		i = m
	}
	return i > start
}

// dueHeap indexes queued entries that have a deadline, earliest first, so the
// timer sweep touches only expired entries.
type dueHeap []*entry

func (h *dueHeap) push(e *entry) {
	e.di = len(*h)
	*h = append(*h, e)
	h.up(e.di)
}

func (h *dueHeap) remove(i int) {
	s := *h
	last := len(s) - 1
	e := s[i]
	if i != last {
		s[i] = s[last]
		s[i].di = i
	}
	s[last] = nil
	*h = s[:last]
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
	e.di = -1
}

func (h dueHeap) less(i, j int) bool {
	if h[i].due != h[j].due {
		return h[i].due < h[j].due
	}
	return h[i].seq < h[j].seq
}

func (h dueHeap) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			return
		}
		h[i], h[p] = h[p], h[i]
		h[i].di, h[p].di = i, p
		i = p
	}
}

func (h dueHeap) down(i int) bool {
	start := i
	n := len(h)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && h.less(r, l) {
			m = r
		}
		if !h.less(m, i) {
			break
		}
		h[i], h[m] = h[m], h[i]
		h[i].di, h[m].di = i, m
		i = m
	}
	return i > start
}
