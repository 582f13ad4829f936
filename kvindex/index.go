package kvindex

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
)

// Layout of the exact index.
//
// Worker names are interned to ids 1..maxWorkerID (uint16) so that a
// (block, worker) entry costs bits, not a string. The index is numShards
// maps from sequence hash to a worker set; the shard is picked by the hash's
// low bits (xxh3 output is uniform). A set of up to four workers lives inline
// in the map value (8 bytes, no pointer, so the GC never scans the big maps);
// a hash held by more workers is promoted to a bitset in the shard's side map
// and its inline value is the bigMark sentinel. Prefix sharing is what makes
// the memory work: a system prompt cached on 500 workers costs one key and a
// 64-byte bitset per block, not 500 entries.
//
// There is deliberately no per-worker list of hashes: it would double the
// memory. Dropping a worker (removal, gap, restart) scans the shards instead;
// that is rare and O(index size), and every scan step holds one shard's lock
// only.
const (
	numShards   = 256
	smallCap    = 4
	bigMark     = 0xFFFF
	maxWorkerID = 0xFFFE
	// demoteAt is the population at which a bitset goes back inline. Lower
	// than smallCap so a hash hovering at the boundary does not flap.
	demoteAt = 2
)

type smallSet [smallCap]uint16

type shard struct {
	mu    sync.RWMutex
	small map[uint64]smallSet
	big   map[uint64][]uint64
	// bigWords counts the words held by big's bitsets, for the memory gauge.
	bigWords int
	_        [64]byte // keep neighbouring shards' locks off one cache line
}

// Match is one worker's matched prefix depth, in blocks.
type Match struct {
	Worker string
	Blocks int
}

// Index maps KV block sequence hashes to the workers that hold them.
//
// Concurrency: Lookup and Predict may be called from any number of
// goroutines, concurrently with event application. Event application is
// serialised per worker by that worker's mutex; different workers apply in
// parallel and only meet on shard locks. Methods never block on I/O.
type Index struct {
	cfg   Config
	clock Clock
	log   *zap.Logger
	m     *indexMetrics

	shards [numShards]shard

	// regMu guards the worker registry below; names is its copy-on-write
	// id → name table read by Lookup without locks.
	regMu   sync.Mutex
	byName  map[string]*workerState
	byID    []*workerState
	freeIDs []uint16
	names   atomic.Pointer[[]string]
	words   atomic.Int32 // bitset words needed for the highest id in use

	pred predictions

	// resync is kicked (non-blocking, size one) whenever a worker starts
	// waiting for a dump, so a Subscriber fetches it.
	resync chan struct{}
}

// New returns an empty index. It starts nothing.
func New(cfg Config, clock Clock, log *zap.Logger, reg prometheus.Registerer) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clock == nil {
		clock = RealClock{}
	}
	if log == nil {
		log = zap.NewNop()
	}
	ix := &Index{
		cfg:    cfg,
		clock:  clock,
		log:    log.Named("kvindex"),
		byName: make(map[string]*workerState),
		byID:   make([]*workerState, 1), // id 0 is never used
		resync: make(chan struct{}, 1),
	}
	for i := range ix.shards {
		ix.shards[i].small = make(map[uint64]smallSet)
		ix.shards[i].big = make(map[uint64][]uint64)
	}
	ix.pred.init()
	empty := make([]string, 1)
	ix.names.Store(&empty)
	ix.m = newIndexMetrics(reg, ix)
	return ix, nil
}

func (ix *Index) shardOf(h uint64) *shard { return &ix.shards[h&(numShards-1)] }

// worker returns the state of name, registering it if needed.
func (ix *Index) worker(name string) (*workerState, error) {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	if w := ix.byName[name]; w != nil {
		return w, nil
	}
	if len(ix.byName) >= ix.cfg.MaxWorkers {
		return nil, fmt.Errorf("%w: registering %s beyond %d", ErrTooManyWorkers, name, ix.cfg.MaxWorkers)
	}
	var id uint16
	if n := len(ix.freeIDs); n > 0 {
		id = ix.freeIDs[n-1]
		ix.freeIDs = ix.freeIDs[:n-1]
	} else {
		id = uint16(len(ix.byID))
		ix.byID = append(ix.byID, nil)
	}
	w := &workerState{id: id, name: name, capacity: ix.cfg.DefaultWorkerBlocks}
	ix.byName[name] = w
	ix.byID[id] = w
	names := make([]string, len(ix.byID))
	copy(names, *ix.names.Load())
	names[id] = name
	ix.names.Store(&names)
	if need := int32(len(ix.byID)+63) / 64; need > ix.words.Load() {
		ix.words.Store(need)
	}
	return w, nil
}

func (ix *Index) lookupWorker(name string) *workerState {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	return ix.byName[name]
}

// RemoveWorker drops every exact and predicted entry of worker and forgets
// it. The app calls it when the registry drops the worker. Batches that
// arrive later register the worker afresh.
func (ix *Index) RemoveWorker(name string) {
	w := ix.lookupWorker(name)
	if w == nil {
		return
	}
	w.mu.Lock()
	ix.clearWorker(w)
	w.removed = true
	w.buffer = nil
	w.mu.Unlock()
	ix.pred.removeWorker(w.id)
	ix.regMu.Lock()
	delete(ix.byName, name)
	ix.byID[w.id] = nil
	names := make([]string, len(ix.byID))
	copy(names, *ix.names.Load())
	names[w.id] = ""
	ix.names.Store(&names)
	// The id is reused only now that no entry refers to it.
	ix.freeIDs = append(ix.freeIDs, w.id)
	ix.regMu.Unlock()
}

// SetCapacity tells the index worker's KV size in blocks
// (wire.WorkerInfo.KVBlocks); more indexed blocks than that (plus
// Config.CapacitySlackPercent) mean missed removals and trigger a resync.
func (ix *Index) SetCapacity(name string, blocks int) error {
	if blocks < 1 {
		return fmt.Errorf("kvindex: capacity %d of %s must be positive", blocks, name)
	}
	w, err := ix.worker(name)
	if err != nil {
		return err
	}
	w.mu.Lock()
	w.capacity = blocks
	w.mu.Unlock()
	return nil
}

// add records that worker id holds h; it reports whether the entry is new.
func (ix *Index) add(h uint64, id uint16) bool {
	s := ix.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.small[h]
	if !ok {
		s.small[h] = smallSet{id}
		return true
	}
	if v[0] == bigMark {
		bs := s.big[h]
		wi := int(id) / 64
		if wi >= len(bs) {
			grown := make([]uint64, wi+1)
			copy(grown, bs)
			s.bigWords += len(grown) - len(bs)
			bs = grown
			s.big[h] = bs
		}
		bit := uint64(1) << (id % 64)
		if bs[wi]&bit != 0 {
			return false
		}
		bs[wi] |= bit
		return true
	}
	free := -1
	for i, x := range v {
		if x == id {
			return false
		}
		if x == 0 && free < 0 {
			free = i
		}
	}
	if free >= 0 {
		v[free] = id
		s.small[h] = v
		return true
	}
	// Promote: the set outgrew its inline slots.
	maxID := id
	for _, x := range v {
		maxID = max(maxID, x)
	}
	bs := make([]uint64, int(maxID)/64+1)
	for _, x := range v {
		bs[x/64] |= 1 << (x % 64)
	}
	bs[id/64] |= 1 << (id % 64)
	s.big[h] = bs
	s.bigWords += len(bs)
	s.small[h] = smallSet{bigMark}
	return true
}

// remove drops worker id from h's set; it reports whether it was there.
func (ix *Index) remove(h uint64, id uint16) bool {
	s := ix.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(h, id)
}

func (s *shard) removeLocked(h uint64, id uint16) bool {
	v, ok := s.small[h]
	if !ok {
		return false
	}
	if v[0] != bigMark {
		found, left := false, 0
		for i, x := range v {
			if x == id {
				v[i] = 0
				found = true
			} else if x != 0 {
				left++
			}
		}
		if !found {
			return false
		}
		if left == 0 {
			delete(s.small, h)
		} else {
			s.small[h] = v
		}
		return true
	}
	bs := s.big[h]
	wi := int(id) / 64
	bit := uint64(1) << (id % 64)
	if wi >= len(bs) || bs[wi]&bit == 0 {
		return false
	}
	bs[wi] &^= bit
	s.demoteIfSmall(h, bs)
	return true
}

// demoteIfSmall moves a bitset of at most demoteAt workers back inline.
func (s *shard) demoteIfSmall(h uint64, bs []uint64) {
	pop := 0
	for _, w := range bs {
		pop += bits.OnesCount64(w)
		if pop > demoteAt {
			return
		}
	}
	var v smallSet
	n := 0
	for wi, w := range bs {
		for w != 0 {
			b := bits.TrailingZeros64(w)
			w &= w - 1
			v[n] = uint16(wi*64 + b)
			n++
		}
	}
	delete(s.big, h)
	s.bigWords -= len(bs)
	if n == 0 {
		delete(s.small, h)
	} else {
		s.small[h] = v
	}
}

// holds reports whether worker id holds h.
func (ix *Index) holds(h uint64, id uint16) bool {
	s := ix.shardOf(h)
	s.mu.RLock()
	defer s.mu.RUnlock()
	v, ok := s.small[h]
	if !ok {
		return false
	}
	if v[0] != bigMark {
		for _, x := range v {
			if x == id {
				return true
			}
		}
		return false
	}
	bs := s.big[h]
	wi := int(id) / 64
	return wi < len(bs) && bs[wi]&(1<<(id%64)) != 0
}

// clearWorker removes every exact entry of w by scanning all shards. The
// caller holds w.mu.
func (ix *Index) clearWorker(w *workerState) {
	if w.blocks.Load() == 0 {
		return
	}
	id := w.id
	removed := 0
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		for h, v := range s.small {
			if v[0] == bigMark {
				if s.removeLocked(h, id) {
					removed++
				}
				continue
			}
			for _, x := range v {
				if x == id {
					s.removeLocked(h, id)
					removed++
					break
				}
			}
		}
		s.mu.Unlock()
	}
	w.blocks.Add(int64(-removed))
}

// Lookup appends to dst, in no particular order, every worker whose cache
// holds a prefix of seqHashes, with the number of leading blocks it holds
// (the larger of its exact and predicted depth). It walks the hashes in order
// and stops as soon as no worker remains. With a dst of sufficient capacity
// it does not allocate for up to 4096 workers.
func (ix *Index) Lookup(seqHashes []uint64, dst []Match) []Match {
	if len(seqHashes) == 0 {
		return dst
	}
	start := len(dst)
	names := *ix.names.Load()
	nw := int(ix.words.Load())
	var stackA, stackB [64]uint64
	var active, next []uint64
	if nw <= len(stackA) {
		active, next = stackA[:nw], stackB[:nw]
	} else {
		active, next = make([]uint64, nw), make([]uint64, nw)
	}
	lo, hi := 0, -1 // range of possibly non-zero words of active
	if ix.readInto(seqHashes[0], active, nil, 0, nw-1) {
		lo, hi = trim(active, 0, nw-1)
	}
	depth := 1
	for ; depth < len(seqHashes) && lo <= hi; depth++ {
		ix.readInto(seqHashes[depth], next, active, lo, hi)
		for wi := lo; wi <= hi; wi++ {
			gone := active[wi] &^ next[wi]
			for gone != 0 {
				b := bits.TrailingZeros64(gone)
				gone &= gone - 1
				dst = appendMatch(dst, names, wi*64+b, depth)
			}
			active[wi] = next[wi]
		}
		lo, hi = trim(active, lo, hi)
	}
	for wi := lo; wi <= hi; wi++ {
		w := active[wi]
		for w != 0 {
			b := bits.TrailingZeros64(w)
			w &= w - 1
			dst = appendMatch(dst, names, wi*64+b, depth)
		}
	}
	if ix.pred.count.Load() > 0 {
		dst = ix.pred.lookup(seqHashes, ix.clock.Now().UnixNano(), names, dst, start)
	}
	return dst
}

func appendMatch(dst []Match, names []string, id, depth int) []Match {
	if id >= len(names) || names[id] == "" {
		return dst // removed while we looked
	}
	return append(dst, Match{Worker: names[id], Blocks: depth})
}

// readInto sets out[lo..hi] to the set of h, intersected with mask when mask
// is non-nil. It reports whether h is present at all.
func (ix *Index) readInto(h uint64, out, mask []uint64, lo, hi int) bool {
	for i := lo; i <= hi; i++ {
		out[i] = 0
	}
	s := ix.shardOf(h)
	s.mu.RLock()
	v, ok := s.small[h]
	if ok && v[0] == bigMark {
		bs := s.big[h]
		top := min(hi, len(bs)-1)
		for i := lo; i <= top; i++ {
			out[i] = bs[i]
			if mask != nil {
				out[i] &= mask[i]
			}
		}
	}
	s.mu.RUnlock()
	if !ok || v[0] == bigMark {
		return ok
	}
	for _, x := range v {
		if x == 0 {
			continue
		}
		wi := int(x) / 64
		if wi < lo || wi > hi {
			continue
		}
		bit := uint64(1) << (x % 64)
		if mask == nil || mask[wi]&bit != 0 {
			out[wi] |= bit
		}
	}
	return true
}

// trim narrows [lo, hi] to the non-zero words of a (hi < lo when none).
func trim(a []uint64, lo, hi int) (int, int) {
	for lo <= hi && a[lo] == 0 {
		lo++
	}
	for hi >= lo && a[hi] == 0 {
		hi--
	}
	return lo, hi
}

// Blocks returns the number of exact entries held for worker.
func (ix *Index) Blocks(name string) int {
	w := ix.lookupWorker(name)
	if w == nil {
		return 0
	}
	return int(w.blocks.Load())
}

// TotalBlocks returns the number of exact (block, worker) entries.
func (ix *Index) TotalBlocks() int {
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	n := 0
	for _, w := range ix.byName {
		n += int(w.blocks.Load())
	}
	return n
}

// Held reports whether worker holds the sequence hash h exactly. It is for
// tests and diagnostics; routing uses Lookup.
func (ix *Index) Held(name string, h uint64) bool {
	w := ix.lookupWorker(name)
	return w != nil && ix.holds(h, w.id)
}

// WorkerHashes appends every exact hash worker holds to dst, by scanning the
// whole index. It is for tests and diagnostics, not the request path.
func (ix *Index) WorkerHashes(name string, dst []uint64) []uint64 {
	w := ix.lookupWorker(name)
	if w == nil {
		return dst
	}
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		for h := range s.small {
			if ix.holdsLocked(s, h, w.id) {
				dst = append(dst, h)
			}
		}
		s.mu.RUnlock()
	}
	return dst
}

func (ix *Index) holdsLocked(s *shard, h uint64, id uint16) bool {
	v := s.small[h]
	if v[0] != bigMark {
		for _, x := range v {
			if x == id {
				return true
			}
		}
		return false
	}
	bs := s.big[h]
	wi := int(id) / 64
	return wi < len(bs) && bs[wi]&(1<<(id%64)) != 0
}

// Memory estimates the bytes held by the exact index: map slots (16-byte
// key+value, one control byte, Go's swiss tables at ~70% average load) plus
// the bitsets of shared hashes. BenchmarkIndexMemory measures the real figure.
func (ix *Index) Memory() int64 {
	const slotBytes = (16 + 1) * 10 / 7
	var n int64
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.RLock()
		n += int64(len(s.small))*slotBytes + int64(len(s.big))*(24+slotBytes) + int64(s.bigWords)*8
		s.mu.RUnlock()
	}
	return n
}
