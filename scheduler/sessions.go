package scheduler

import (
	"container/list"
	"sync"
	"time"
)

// SessionAffinity is what a request carries about its session: the worker
// the session's previous turn ran on and how strongly to prefer it. The
// zero value (no Worker) changes nothing.
//
// Soft affinity keeps the session on Worker while its cost is within the
// margin of the best worker's: cost(Worker) ≤ best + |best|·MarginRatio +
// MarginCost (MarginCost is in the selector's cost unit: milliseconds of
// predicted TTFT under SelectorTTFT, blocks under SelectorBlocks). Past
// that, the worker counts as saturated and the request goes where the
// selector says. A worker that is full or busy for the class is never
// chosen by affinity.
//
// Hard affinity runs the request on Worker only, waiting for it when it is
// full, while Worker is registered and allowed; otherwise the request is
// routed as if it had no session (a pin that falls back when the worker
// leaves).
type SessionAffinity struct {
	Worker      string
	Hard        bool
	MarginRatio float64
	MarginCost  float64
}

// sessionWorker returns the index of r's session worker when the selector
// should consider it (registered and allowed), else -1.
func (c *Core) sessionWorker(r *Request) int {
	if r.Session.Worker == "" || r.Pinned != "" {
		return -1
	}
	i, ok := c.workerIdx[r.Session.Worker]
	if !ok || !r.Allows(r.Session.Worker) {
		return -1
	}
	return i
}

// sticks reports whether soft affinity keeps a session on a worker of cost
// own when the best worker costs best.
func (a SessionAffinity) sticks(own, best float64) bool {
	return own <= best+max(best, -best)*a.MarginRatio+a.MarginCost
}

// SessionTable is a bounded map from session ids to the worker the
// session's latest turn was routed to: soft state, each entry expiring TTL
// after its last routing, the least recently routed evicted beyond Max.
// Entries from other replicas (gossip) merge by their routing time, the
// later decision winning. Safe for concurrent use.
type SessionTable struct {
	max int
	ttl time.Duration

	mu       sync.Mutex
	lru      *list.List // of *sessionEntry, most recently routed first
	byID     map[uint64]*list.Element
	byWorker map[string]map[uint64]struct{}
	evicted  uint64
}

type sessionEntry struct {
	id      uint64
	worker  string
	at      int64 // routing time, unix ns: the later decision wins a merge
	expires int64 // unix ns
}

// NewSessionTable builds a table of at most max sessions (at least one),
// each living ttl after its last routing.
func NewSessionTable(max int, ttl time.Duration) *SessionTable {
	if max < 1 {
		max = 1
	}
	return &SessionTable{max: max, ttl: ttl, lru: list.New(), byID: map[uint64]*list.Element{}, byWorker: map[string]map[uint64]struct{}{}}
}

// TTL is how long an entry lives after its last routing.
func (t *SessionTable) TTL() time.Duration { return t.ttl }

// Lookup returns the worker of session id, or false when the table has no
// live entry for it (an expired one is removed).
func (t *SessionTable) Lookup(id uint64, now time.Time) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	el, ok := t.byID[id]
	if !ok {
		return "", false
	}
	e := el.Value.(*sessionEntry)
	if e.expires <= now.UnixNano() {
		t.removeLocked(el)
		return "", false
	}
	return e.worker, true
}

// Record notes that session id was routed to worker at time at, living
// until expires. An entry routed later than at is kept (a stale gossip
// copy loses); it reports whether the table changed.
func (t *SessionTable) Record(id uint64, worker string, at, expires time.Time) bool {
	if worker == "" {
		return false
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byID[id]; ok {
		e := el.Value.(*sessionEntry)
		if e.at > at.UnixNano() {
			return false
		}
		if e.worker != worker {
			t.unindexLocked(e)
			e.worker = worker
			t.indexLocked(e)
		}
		e.at, e.expires = at.UnixNano(), expires.UnixNano()
		t.lru.MoveToFront(el)
		return true
	}
	e := &sessionEntry{id: id, worker: worker, at: at.UnixNano(), expires: expires.UnixNano()}
	t.byID[id] = t.lru.PushFront(e)
	t.indexLocked(e)
	for t.lru.Len() > t.max {
		t.removeLocked(t.lru.Back())
		t.evicted++
	}
	return true
}

// Forget removes session id's entry, if any.
func (t *SessionTable) Forget(id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if el, ok := t.byID[id]; ok {
		t.removeLocked(el)
	}
}

// DropWorker removes every session routed to worker (it left the fleet)
// and returns how many there were.
func (t *SessionTable) DropWorker(worker string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	ids := t.byWorker[worker]
	n := len(ids)
	for id := range ids {
		t.removeLocked(t.byID[id])
	}
	return n
}

// Sweep removes the entries expired at now and returns how many.
func (t *SessionTable) Sweep(now time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	ns := now.UnixNano()
	for el := t.lru.Back(); el != nil; {
		prev := el.Prev()
		if el.Value.(*sessionEntry).expires <= ns {
			t.removeLocked(el)
			n++
		}
		el = prev
	}
	return n
}

// Len is the number of entries, expired ones not yet swept included.
func (t *SessionTable) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.lru.Len()
}

// Evicted is how many entries the size bound has removed.
func (t *SessionTable) Evicted() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.evicted
}

// PerWorker returns how many sessions each worker holds.
func (t *SessionTable) PerWorker() map[string]int {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make(map[string]int, len(t.byWorker))
	for w, ids := range t.byWorker {
		out[w] = len(ids)
	}
	return out
}

func (t *SessionTable) indexLocked(e *sessionEntry) {
	ids := t.byWorker[e.worker]
	if ids == nil {
		ids = map[uint64]struct{}{}
		t.byWorker[e.worker] = ids
	}
	ids[e.id] = struct{}{}
}

func (t *SessionTable) unindexLocked(e *sessionEntry) {
	ids := t.byWorker[e.worker]
	delete(ids, e.id)
	if len(ids) == 0 {
		delete(t.byWorker, e.worker)
	}
}

func (t *SessionTable) removeLocked(el *list.Element) {
	e := t.lru.Remove(el).(*sessionEntry)
	delete(t.byID, e.id)
	t.unindexLocked(e)
}
