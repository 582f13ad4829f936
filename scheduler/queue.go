package scheduler

import "time"

// entry is one queued request: its hot header, what heap sifts, the DRR
// step and the candidate walk read. Everything the ordering needs is
// computed once at enqueue, so the heaps compare plain fields. Drains are
// bound by these headers, so the header fits one 64-byte cache line
// (TestTheQueuedEntryHeaderFitsOneCacheLine pins it); what only enqueue,
// admission and removal read lives in entryCold.
type entry struct {
	score  float64 // policy score, higher first
	due    int64   // Due in Unix nanoseconds, when hasDue
	seq    uint64  // arrival order within this Core
	cost   int64   // DRR cost max(1, isl − cached), fixed at enqueue
	req    *Request
	cold   *entryCold // allocated with the entry and kept with it in the free list
	strict int32
	qi, di int32 // positions in the class heap and the due heap; -1 = absent
	hasDue bool
}

// entryCold is the part of a queued entry the ordering never reads.
type entryCold struct {
	respond    Responder
	cls        *class
	cached     int // best allowed (or pinned) cached tokens at enqueue
	enqueuedAt time.Time
	// tenants.go: the tenant's accounting (nil without a tenant), its
	// queue in the class and the position there
	tenant *tenantState
	tq     *tenantQueue
	ti     int32
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

// policyScore is a queued entry's policy score, higher served first: FCFS
// favours earlier arrivals, LCFS later ones, WSPT the most (1 + pj) per unit
// of cost; pj, the request's priority jump, raises any of them. offset is
// the arrival offset in seconds from the Core's epoch, taken from the
// request's ingress.
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
func (byQueueOrder) setPos(e *entry, i int) { e.qi = int32(i) }

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
func (byDue) setPos(e *entry, i int) { e.di = int32(i) }
