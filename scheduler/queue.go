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

// entryHeap is a class's queue, ordered by entry.before.
type entryHeap = indexedHeap[*entry, byQueueOrder]

type byQueueOrder struct{}

func (byQueueOrder) less(a, b *entry) bool  { return a.before(b) }
func (byQueueOrder) setPos(e *entry, i int) { e.qi = i }

// dueHeap indexes queued entries that have a deadline, earliest first, so the
// timer sweep touches only expired entries.
type dueHeap = indexedHeap[*entry, byDue]

type byDue struct{}

func (byDue) less(a, b *entry) bool {
	if a.due != b.due {
		return a.due < b.due
	}
	return a.seq < b.seq
}
func (byDue) setPos(e *entry, i int) { e.di = i }
