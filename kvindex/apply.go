package kvindex

import (
	"fmt"
	"sync"
	"sync/atomic"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/wire"
)

// Outcome says what the index did with a batch or a dump.
type Outcome uint8

// Outcomes of ApplyBatch and ApplyDump.
const (
	// OutcomeApplied: the events are in the index.
	OutcomeApplied Outcome = iota + 1
	// OutcomeIgnored: nothing to do (stale replay, unknown dump, removed
	// worker).
	OutcomeIgnored
	// OutcomeBuffered: the worker waits for a dump already requested; the
	// batch is kept and replayed after it.
	OutcomeBuffered
	// OutcomeResync: the worker was reset and needs a dump; the batch is
	// buffered. The Index has kicked ResyncNotify.
	OutcomeResync
)

func (o Outcome) String() string {
	switch o {
	case OutcomeApplied:
		return "applied"
	case OutcomeIgnored:
		return "ignored"
	case OutcomeBuffered:
		return "buffered"
	case OutcomeResync:
		return "resync"
	}
	return fmt.Sprintf("outcome(%d)", uint8(o))
}

// ResetReason says why a worker's entries were dropped and a dump requested.
type ResetReason uint8

// Reasons for a reset, used as the reason label of the gaps counter.
const (
	ResetGap            ResetReason = iota + 1 // an event id was skipped
	ResetUnknownParent                         // a stored chain's parent is not indexed
	ResetInstance                              // the engine restarted mid-stream
	ResetIDBack                                // ids went back within one instance
	ResetOverCapacity                          // more blocks than the engine can hold
	ResetFirstContact                          // first batch of a worker is not id 1
	ResetBufferOverflow                        // too many batches buffered during a dump
)

func (r ResetReason) String() string {
	switch r {
	case ResetGap:
		return "gap"
	case ResetUnknownParent:
		return "unknown_parent"
	case ResetInstance:
		return "instance"
	case ResetIDBack:
		return "id_back"
	case ResetOverCapacity:
		return "over_capacity"
	case ResetFirstContact:
		return "first_contact"
	case ResetBufferOverflow:
		return "buffer_overflow"
	}
	return fmt.Sprintf("reset_reason(%d)", uint8(r))
}

var resetReasons = []ResetReason{ResetGap, ResetUnknownParent, ResetInstance, ResetIDBack,
	ResetOverCapacity, ResetFirstContact, ResetBufferOverflow}

// workerState is one worker's event-application state. mu serialises every
// write of the worker's entries; blocks is also read lock-free.
type workerState struct {
	name string
	// id is the worker's current interned id; it changes (under mu and the
	// registry lock) when its entries are dropped. Read it with ID().
	id atomic.Uint32
	// blocks counts the entries under the current id.
	blocks atomic.Int64
	// batches, stored and resets are cumulative, for telling a dead event
	// path (EventCounts) from a quiet one; lastReset is the ResetReason of
	// the latest reset (0: none yet).
	batches, stored, resets atomic.Uint64
	lastReset               atomic.Uint32
	// sample is the sampling rate the worker's last batch declared
	// (wire.KVEventBatch.Sample; 0: every hash).
	sample atomic.Uint32

	mu        sync.Mutex
	capacity  int
	synced    bool   // instance and lastID describe the indexed entries
	resyncing bool   // entries dropped; waiting for a dump
	instance  uint64 // engine instance of the indexed entries
	lastID    uint64 // id of the last applied event
	buffer    []*wire.KVEventBatch
	removed   bool
	behindID  uint64 // last id a load report claimed while the index lagged it
}

// Digest is one worker's index state, gossiped so a lagging replica sees it
// is behind.
type Digest struct {
	Worker   string
	Instance uint64
	LastID   uint64
	Blocks   int
	// Synced is false while the worker waits for its dump.
	Synced bool
}

// Digest returns worker's digest.
func (ix *Index) Digest(name string) (Digest, bool) {
	w := ix.lookupWorker(name)
	if w == nil {
		return Digest{}, false
	}
	return w.digest(), true
}

// Digests appends every worker's digest to dst.
func (ix *Index) Digests(dst []Digest) []Digest {
	ix.regMu.Lock()
	ws := make([]*workerState, 0, len(ix.byName))
	for _, w := range ix.byName {
		ws = append(ws, w)
	}
	ix.regMu.Unlock()
	for _, w := range ws {
		dst = append(dst, w.digest())
	}
	return dst
}

func (w *workerState) digest() Digest {
	w.mu.Lock()
	defer w.mu.Unlock()
	return Digest{Worker: w.name, Instance: w.instance, LastID: w.lastID,
		Blocks: int(w.blocks.Load()), Synced: w.synced}
}

// EventCounts is what one worker's KV event stream brought the index since
// the worker was first seen: batches received (heartbeats included),
// blocks of stored events applied, and resets with the latest one's reason.
type EventCounts struct {
	Batches, Stored, Resets uint64
	LastReset               string // "" before the first reset
	// Sample is the sampling rate the worker's last batch declared: its
	// publisher sends only about one stored block in Sample (0 or 1:
	// every block).
	Sample int
}

// EventCounts returns worker's counts (zero for a worker never seen).
func (ix *Index) EventCounts(name string) EventCounts {
	w := ix.lookupWorker(name)
	if w == nil {
		return EventCounts{}
	}
	c := EventCounts{Batches: w.batches.Load(), Stored: w.stored.Load(), Resets: w.resets.Load(),
		Sample: int(w.sample.Load())}
	if r := w.lastReset.Load(); r > 0 {
		c.LastReset = ResetReason(r).String()
	}
	return c
}

// ID returns the worker's current interned id.
func (w *workerState) ID() uint16 { return uint16(w.id.Load()) }

// ResyncNotify is kicked whenever some worker starts waiting for a dump.
// kvingest's repair loop waits on it, then asks NeedingDump.
func (ix *Index) ResyncNotify() <-chan struct{} { return ix.resync }

// NeedingDump appends the workers waiting for a dump to dst.
func (ix *Index) NeedingDump(dst []string) []string {
	ix.regMu.Lock()
	ws := make([]*workerState, 0, len(ix.byName))
	for _, w := range ix.byName {
		ws = append(ws, w)
	}
	ix.regMu.Unlock()
	for _, w := range ws {
		w.mu.Lock()
		if w.resyncing && !w.removed {
			dst = append(dst, w.name)
		}
		w.mu.Unlock()
	}
	return dst
}

// NeedsDump reports whether worker waits for a dump.
func (ix *Index) NeedsDump(name string) bool {
	w := ix.lookupWorker(name)
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.resyncing && !w.removed
}

// ApplyBatch applies one engine batch. Batches of one worker must be passed
// in arrival order by one goroutine at a time per worker (kvingest's
// apply shards); batches of different workers may be applied concurrently.
//
// A batch that does not continue the applied stream (gap, unknown parent,
// new instance not starting at id 1, id going back) resets the worker,
// buffers the batch and returns OutcomeResync: the caller (kvingest)
// fetches a dump and passes it to ApplyDump, which replays the buffer.
func (ix *Index) ApplyBatch(b *wire.KVEventBatch) (Outcome, error) {
	if b.FirstID == 0 {
		return OutcomeIgnored, fmt.Errorf("%w: batch of %s has event id 0", wire.ErrMalformed, b.Worker)
	}
	w, err := ix.worker(b.Worker)
	if err != nil {
		return OutcomeIgnored, err
	}
	w.batches.Add(1)
	w.sample.Store(uint32(max(0, b.Sample)))
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.removed {
		return OutcomeIgnored, nil
	}
	if w.resyncing {
		return ix.bufferLocked(w, b), nil
	}
	return ix.applyLocked(w, b, false), nil
}

// bufferLocked keeps b for the replay after the pending dump.
func (ix *Index) bufferLocked(w *workerState, b *wire.KVEventBatch) Outcome {
	if len(w.buffer) >= ix.cfg.MaxBufferedBatches {
		// The replay will see the hole and ask for another dump.
		w.buffer = w.buffer[:0]
		ix.m.bufferDrops.Inc()
	}
	w.buffer = append(w.buffer, b)
	return OutcomeBuffered
}

// applyLocked applies b to a worker that is not waiting for a dump. replay
// is true while draining the buffer after a dump, where batches at or before
// the dump's AsOfID are expected and skipped.
func (ix *Index) applyLocked(w *workerState, b *wire.KVEventBatch, replay bool) Outcome {
	if replay && w.synced && b.Instance != w.instance && b.FirstID != 1 {
		// Buffered before the dump, from the engine's previous life (or a
		// later one whose start we missed: its next live batch resets the
		// worker again). Skipping it cannot loop the way a reset could.
		return OutcomeIgnored
	}
	if !w.synced || b.Instance != w.instance {
		reason := ResetFirstContact
		if w.synced {
			reason = ResetInstance
		}
		if b.FirstID != 1 {
			return ix.resetLocked(w, b, reason)
		}
		// The engine's first batch: the stream from id 1 is complete, so an
		// empty index plus this batch is exact without a dump.
		if w.synced {
			ix.dropEntries(w)
			ix.m.gaps[reason].Inc()
			ix.log.Info("worker restarted", zap.String("worker", w.name),
				zap.Uint64("old_instance", w.instance), zap.Uint64("instance", b.Instance))
		}
		w.synced, w.instance, w.lastID = true, b.Instance, 0
	}
	last := b.LastID() // FirstID-1 for an empty batch: a heartbeat
	switch {
	case last <= w.lastID && (replay || len(b.Events) == 0):
		return OutcomeIgnored
	case b.FirstID <= w.lastID && !replay:
		return ix.resetLocked(w, b, ResetIDBack)
	case b.FirstID > w.lastID+1:
		return ix.resetLocked(w, b, ResetGap)
	}
	skip := int(w.lastID + 1 - b.FirstID) // > 0 only when replaying
	limit := int64(w.capacity) + int64(w.capacity)*int64(ix.cfg.CapacitySlackPercent)/100
	var stored, removed, cleared int
	id := w.ID()
	for i := skip; i < len(b.Events); i++ {
		e := &b.Events[i]
		switch e.Kind {
		case wire.KVStored:
			// Under sampling an unsampled parent was never indexed, so
			// only a sampled one can be checked.
			if e.HasParent && ix.keeps(e.Parent) && !ix.holds(e.Parent, id) {
				ix.m.count(stored, removed, cleared)
				return ix.resetLocked(w, b, ResetUnknownParent)
			}
			added := 0
			for _, h := range e.Hashes {
				if ix.keeps(h) && ix.add(h, id) {
					added++
				}
			}
			if w.blocks.Add(int64(added)) > limit {
				ix.m.count(stored, removed, cleared)
				return ix.resetLocked(w, b, ResetOverCapacity)
			}
			// Raw blocks, sampled or not: EventCounts.Stored is compared
			// with the blocks the worker computed (kvingest.Silence).
			stored += len(e.Hashes)
			w.stored.Add(uint64(len(e.Hashes)))
		case wire.KVRemoved:
			gone := 0
			for _, h := range e.Hashes {
				if ix.keeps(h) && ix.remove(h, id) {
					gone++
				}
			}
			w.blocks.Add(int64(-gone))
			removed += len(e.Hashes)
		case wire.KVCleared:
			ix.dropEntries(w)
			id = w.ID()
			cleared++
		}
		w.lastID = b.FirstID + uint64(i)
	}
	ix.m.count(stored, removed, cleared)
	return OutcomeApplied
}

// resetLocked drops w's entries, buffers b and asks for a dump.
func (ix *Index) resetLocked(w *workerState, b *wire.KVEventBatch, reason ResetReason) Outcome {
	ix.dropEntries(w)
	w.synced, w.resyncing = false, true
	w.buffer = append(w.buffer[:0], b)
	ix.m.gaps[reason].Inc()
	w.resets.Add(1)
	w.lastReset.Store(uint32(reason))
	ix.log.Info("worker reset, dump needed", zap.String("worker", w.name),
		zap.Stringer("reason", reason), zap.Uint64("instance", b.Instance),
		zap.Uint64("first_id", b.FirstID), zap.Uint64("last_applied_id", w.lastID))
	ix.kick()
	return OutcomeResync
}

// Dump is a worker's whole block set as of event AsOfID of Instance.
type Dump struct {
	Worker   string
	Instance uint64
	AsOfID   uint64
	Hashes   []uint64
}

// ApplyDump replaces worker's entries with d and replays the batches
// buffered since the reset (only events after d.AsOfID). It returns
// OutcomeIgnored when the worker is not waiting for a dump, OutcomeResync
// when the replay found another hole (a new dump is needed), and
// OutcomeApplied otherwise.
func (ix *Index) ApplyDump(d *Dump) Outcome {
	w := ix.lookupWorker(d.Worker)
	if w == nil {
		return OutcomeIgnored
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.resyncing || w.removed {
		return OutcomeIgnored
	}
	ix.dropEntries(w) // normally none: the reset dropped them
	limit := w.capacity + w.capacity*ix.cfg.CapacitySlackPercent/100
	added := 0
	id := w.ID()
	for _, h := range d.Hashes {
		if !ix.keeps(h) {
			continue
		}
		if added >= limit {
			ix.m.dumpTruncated.Inc()
			break
		}
		if ix.add(h, id) {
			added++
		}
	}
	w.blocks.Add(int64(added))
	w.synced, w.resyncing = true, false
	w.instance, w.lastID = d.Instance, d.AsOfID
	buf := w.buffer
	w.buffer = nil
	for i, b := range buf {
		if o := ix.applyLocked(w, b, true); o == OutcomeResync {
			// resetLocked buffered b; keep the rest behind it.
			w.buffer = append(w.buffer, buf[i+1:]...)
			return OutcomeResync
		}
	}
	return OutcomeApplied
}

// NoteLastEventID compares the last event id a worker says it published
// (wire.LoadReport.LastEventID) with the last one applied, to catch a lost
// trailing batch that no later batch would reveal. One report is not proof:
// reports travel on another subject and may overtake the batch they count.
// When two reports name the same id and the index is still behind it, the
// worker is reset and a dump requested (OutcomeResync).
func (ix *Index) NoteLastEventID(worker string, instance, lastID uint64) Outcome {
	w := ix.lookupWorker(worker)
	if w == nil {
		return OutcomeIgnored
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.removed || w.resyncing || !w.synced || instance != w.instance || lastID <= w.lastID {
		w.behindID = 0
		return OutcomeIgnored
	}
	if w.behindID != lastID {
		w.behindID = lastID
		return OutcomeIgnored
	}
	w.behindID = 0
	// A heartbeat at the reported position stands for the lost events.
	return ix.resetLocked(w, &wire.KVEventBatch{Worker: worker, Instance: instance, FirstID: lastID + 1}, ResetGap)
}
