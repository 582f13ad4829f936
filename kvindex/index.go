package kvindex

import (
	"fmt"
	"math/bits"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
)

// Layout of the exact index.
//
// Worker names are interned to ids 1..maxWorkerID (uint16) so that a
// (block, worker) entry costs bits, not a string. The index is numShards
// open-addressing tables (table.go) from sequence hash to a worker set; the
// shard is picked by the hash's low bits (xxh3 output is uniform). A set of
// up to four workers lives inline in the slot; a hash held by more workers
// points to an interned bitset shared by every hash with the same holders
// (sets.go). Prefix sharing is what makes the memory work: a system prompt
// of 64 blocks cached on 500 workers costs 64 slots and one bitset, not
// 32,000 entries.
//
// There is deliberately no per-worker list of hashes: it would double the
// memory. Dropping a worker's entries retires its id instead, and
// ClearStale reclaims retired ids with one scan of the shards, O(index
// size), holding one shard's writer lock at a time (readers never wait).
//
// Why 32 shards: writers only meet on a shard's mutex for the few
// nanoseconds of one insertion, so more shards buy little, while fewer,
// larger tables can be backed by 2 MiB pages (hugepage_linux.go), which
// needs whole aligned 2 MiB runs inside a table. With 256 shards the fleet
// benchmark's tables were 1.7 MiB each and got none; with 32 they are about
// 12 MiB. Same code otherwise, alternating runs: lookup p50 8.1-8.4 against
// 8.9-9.4 µs, p99 15.3-16.5 against 17.0-20.0 µs, 24.9 against 26.3 B per
// entry (fewer partly filled tables), ingest the same within noise. The
// price: a writer waits for a whole table's rehash when its shard grows
// (tens of milliseconds at 12 MiB) and for a shard's scan in ClearStale;
// readers never wait.
const (
	numShards   = 32
	maxWorkerID = 0xFFFE
	// demoteAt is the population at which a bitset goes back inline. Lower
	// than the four inline lanes so a hash hovering at the boundary does not
	// flap.
	demoteAt = 2
)

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
	clock clock.Clock
	log   *zap.Logger
	m     *indexMetrics

	shards [numShards]shard
	sets   setStore // holder sets of more than four workers (sets.go)
	// scratch holds lookups' active sets when they are wider than the
	// stack arrays (more than 4096 interned ids).
	scratch sync.Pool

	// regMu guards the worker registry below; names is its
	// copy-on-write id → name table read by Lookup without locks
	// (nameTable).
	regMu   sync.Mutex
	byName  map[string]*workerState
	byID    []*workerState
	freeIDs []uint16
	names   atomic.Pointer[nameTable]
	words   atomic.Int32 // bitset words needed for the highest id in use

	pred predictions

	// Dropping a worker's entries (reset, restart, cleared cache, removal)
	// retires its interned id: the id is masked at once, so lookups stop
	// seeing its entries, and the worker continues under a fresh id. One
	// ClearStale scan later removes the entries of every id retired
	// meanwhile and frees those ids. So the apply path never scans, and a
	// gap storm costs one scan, not one per worker. clearMu serialises
	// scans. Lock order: workerState.mu, clearMu, regMu, maskMu; shard
	// mutexes, then the holder sets' (sets.go), are innermost.
	retired []uint16 // guarded by regMu
	// freed counts the ClearStale calls that freed ids (lookupKept).
	freed   atomic.Uint64
	clearMu sync.Mutex
	maskMu  sync.Mutex
	masked  atomic.Pointer[[]uint64]

	// resync is kicked (non-blocking, size one) whenever a worker starts
	// waiting for a dump, so kvingest fetches it.
	resync chan struct{}
}

// New returns an empty index. It starts nothing. Predicted entries expire
// by clk (nil: wall time).
func New(cfg Config, clk clock.Clock, log *zap.Logger, reg prometheus.Registerer) (*Index, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if clk == nil {
		clk = clock.Real{}
	}
	if log == nil {
		log = zap.NewNop()
	}
	ix := &Index{
		cfg:    cfg,
		clock:  clk,
		log:    log.Named("kvindex"),
		byName: make(map[string]*workerState),
		byID:   make([]*workerState, 1), // id 0 is never used
		resync: make(chan struct{}, 1),
	}
	ix.sets.init(idWords(cfg))
	for i := range ix.shards {
		ix.shards[i].init(&ix.sets)
	}
	ix.pred.init()
	noMask := make([]uint64, idWords(cfg))
	ix.masked.Store(&noMask)
	empty := make(nameTable, 1)
	ix.names.Store(&empty)
	ix.m = newIndexMetrics(reg, ix)
	return ix, nil
}

func (ix *Index) shardOf(h uint64) *shard { return &ix.shards[h&(numShards-1)] }

// idSpace is the number of interned ids: MaxWorkers plus a quarter for ids
// retired and not yet reclaimed by ClearStale.
func idSpace(cfg Config) int { return min(cfg.MaxWorkers+cfg.MaxWorkers/4+1, maxWorkerID) }

// idWords is the width of worker bitsets in 64-bit words (id 0 unused).
func idWords(cfg Config) int { return (idSpace(cfg) + 1 + 63) / 64 }

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
	w := &workerState{name: name, capacity: ix.cfg.DefaultWorkerBlocks}
	id, ok := ix.allocIDLocked()
	if !ok {
		return nil, fmt.Errorf("%w: no free id for %s until retired ids are cleared", ErrTooManyWorkers, name)
	}
	ix.byName[name] = w
	ix.bindLocked(w, id)
	return w, nil
}

// allocIDLocked takes a free interned id. The caller holds regMu.
func (ix *Index) allocIDLocked() (uint16, bool) {
	if n := len(ix.freeIDs); n > 0 {
		id := ix.freeIDs[n-1]
		ix.freeIDs = ix.freeIDs[:n-1]
		return id, true
	}
	if len(ix.byID) > idSpace(ix.cfg) {
		return 0, false
	}
	ix.byID = append(ix.byID, nil)
	if need := int32(len(ix.byID)+63) / 64; need > ix.words.Load() {
		ix.words.Store(need)
	}
	return uint16(len(ix.byID) - 1), true
}

// bindLocked gives w the id. The caller holds regMu (and w.mu if w is
// already visible to other goroutines).
func (ix *Index) bindLocked(w *workerState, id uint16) {
	ix.byID[id] = w
	w.id.Store(uint32(id))
	ix.setNameLocked(id, w.name)
}

// nameTable is the id → name table lookups read without a lock ("" for
// an id with no worker). It is copy-on-write, with one exception that
// makes registration O(1) amortised: binding a fresh id, one past the
// table's end, writes into the spare capacity of the table's array and
// publishes a header one longer. No published header covers that slot, so
// no reader can see the write; the array doubles when full. Copying the
// whole table on every bind made registering n workers O(n²) (10,000
// workers: 1.0 s and 0.8 GB of copies).
//
// Changing a slot a header covers (retiring an id, or binding an id
// ClearStale freed) still copies, so a lookup keeps the table it loaded:
// it never names a worker bound after it started. Its names stay inline,
// as the walk reads them once per match (a pointer per slot, written in
// place, cost the fleet lookup benchmark's tail a dereference per match).
type nameTable []string

// name returns id's worker, or "" for an id with none.
func (t nameTable) name(id int) string {
	if id >= len(t) {
		return ""
	}
	return t[id]
}

// setNameLocked binds id to name ("": none). The caller holds regMu.
func (ix *Index) setNameLocked(id uint16, name string) {
	t := *ix.names.Load()
	n := int(id) + 1
	if n <= len(t) {
		c := make(nameTable, len(t), cap(t))
		copy(c, t)
		c[id] = name
		ix.names.Store(&c)
		return
	}
	if n > cap(t) {
		c := make(nameTable, len(t), min(max(2*cap(t), n), maxWorkerID+1))
		copy(c, t)
		t = c
	}
	t = t[:n] // the slots between are "": fresh arrays, never published
	t[id] = name
	ix.names.Store(&t)
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
	defer w.mu.Unlock()
	w.removed = true
	w.buffer = nil
	ix.regMu.Lock()
	defer ix.regMu.Unlock()
	if ix.byName[name] == w {
		delete(ix.byName, name)
	}
	ix.retireLocked(w)
	w.blocks.Store(0)
	ix.kick()
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
	return s.addLocked(h, id)
}

// remove drops worker id from h's set; it reports whether it was there.
func (ix *Index) remove(h uint64, id uint16) bool {
	s := ix.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.removeLocked(h, id)
}

// holds reports whether worker id holds h.
func (ix *Index) holds(h uint64, id uint16) bool {
	s := ix.shardOf(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.holdsLocked(h, id)
}

// dropEntries makes all of w's entries vanish at once: its id is retired
// (masked, reclaimed by the next ClearStale) and w continues under a fresh
// one. The caller holds w.mu. If no id is free it falls back to removing the
// entries now, with a scan.
func (ix *Index) dropEntries(w *workerState) {
	if w.blocks.Load() == 0 {
		return
	}
	ix.regMu.Lock()
	id, ok := ix.allocIDLocked()
	if ok {
		ix.retireLocked(w)
		ix.bindLocked(w, id)
	}
	ix.regMu.Unlock()
	if !ok {
		ix.clearNow(w)
		return
	}
	w.blocks.Store(0)
	ix.kick()
}

// retireLocked masks w's current id and queues it for ClearStale. The
// caller holds w.mu and regMu.
func (ix *Index) retireLocked(w *workerState) {
	old := w.ID()
	if ix.byID[old] == w {
		ix.byID[old] = nil
		ix.setNameLocked(old, "")
	}
	ix.setMask(old, true)
	ix.retired = append(ix.retired, old)
}

// clearNow removes w's entries by scanning every shard. The caller holds
// w.mu.
func (ix *Index) clearNow(w *workerState) {
	ix.clearMu.Lock()
	defer ix.clearMu.Unlock()
	id := w.ID()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		s.clearLocked(id)
		s.mu.Unlock()
	}
	w.blocks.Store(0)
}

// kick wakes kvingest's repair loop (non-blocking, size one).
func (ix *Index) kick() {
	select {
	case ix.resync <- struct{}{}:
	default: // a kick is pending; the loop handles everything it finds
	}
}

func (ix *Index) setMask(id uint16, on bool) {
	ix.maskMu.Lock()
	defer ix.maskMu.Unlock()
	old := *ix.masked.Load()
	bit := uint64(1) << (id % 64)
	if (old[id/64]&bit != 0) == on {
		return
	}
	m := make([]uint64, len(old))
	copy(m, old)
	m[id/64] ^= bit
	ix.masked.Store(&m)
}

// ClearStale removes the entries (exact and predicted) of every id retired
// since the last call, in one scan of the index, frees those ids and
// returns how many entries it removed. kvingest's repair loop calls
// it whenever it is kicked.
func (ix *Index) ClearStale() int {
	ix.clearMu.Lock()
	defer ix.clearMu.Unlock()
	ix.regMu.Lock()
	ids := ix.retired
	ix.retired = nil
	ix.regMu.Unlock()
	if len(ids) == 0 {
		return 0
	}
	mask := make([]uint64, len(*ix.masked.Load()))
	for _, id := range ids {
		mask[id/64] |= 1 << (id % 64)
	}
	counts := make([]int64, len(mask)*64)
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		s.clearSetLocked(mask, counts)
		s.mu.Unlock()
	}
	ix.pred.filter(func(e pred) bool { return mask[e.id/64]&(1<<(e.id%64)) == 0 })
	total := int64(0)
	for _, id := range ids {
		total += counts[id]
		// Unmask before freeing: once free, the id may be bound and
		// retired again, and its mask bit is then no longer ours.
		ix.setMask(id, false)
	}
	ix.regMu.Lock()
	ix.freed.Add(1) // before any of ids can change hands (lookupKept)
	ix.freeIDs = append(ix.freeIDs, ids...)
	ix.regMu.Unlock()
	return int(total)
}

// Lookup appends to dst, in no particular order, every worker whose cache
// holds a prefix of seqHashes, with the number of leading blocks it holds
// (the larger of its exact and predicted depth). It walks the hashes in order
// and stops as soon as no worker remains. With a dst of sufficient capacity
// it does not allocate for up to 4096 interned ids.
//
// With Config.Sample n > 1 it walks only the sampled positions (Sampled): a
// worker's depth is the position of the last sampled hash it matched plus
// one, and the first sampled position it misses ends its walk. The depth is
// still in blocks but may fall short of the exact one by up to the gap to the
// next sampled position; a prompt with no sampled position matches nothing.
func (ix *Index) Lookup(seqHashes []uint64, dst []Match) []Match {
	if len(seqHashes) == 0 {
		return dst
	}
	if n := ix.cfg.Sample; n > 1 {
		return ix.lookupSampled(seqHashes, dst, n)
	}
	return ix.lookupKept(seqHashes, dst)
}

// sampledOnStack is how many sampled positions a lookup keeps on the stack:
// a 64k-token prompt of 16-token blocks at Sample 16. Longer prompts
// allocate.
const sampledOnStack = 256

// lookupSampled is Lookup at sampling rate n: it walks the sampled hashes of
// seqHashes and maps each matched depth back to a depth in blocks.
func (ix *Index) lookupSampled(seqHashes []uint64, dst []Match, n int) []Match {
	var hsStack [sampledOnStack]uint64
	var posStack [sampledOnStack]int32
	hs, pos := hsStack[:0], posStack[:0]
	for i, h := range seqHashes {
		if Sampled(h, n) {
			hs = append(hs, h)
			pos = append(pos, int32(i))
		}
	}
	if len(hs) == 0 {
		return dst
	}
	start := len(dst)
	dst = ix.lookupKept(hs, dst)
	for i := start; i < len(dst); i++ {
		dst[i].Blocks = int(pos[dst[i].Blocks-1]) + 1
	}
	return dst
}

// keeps reports whether the index keeps hash h (Config.Sample).
func (ix *Index) keeps(h uint64) bool { return ix.cfg.Sample <= 1 || Sampled(h, ix.cfg.Sample) }

// Sample returns the index's sampling rate (Config.Sample).
func (ix *Index) Sample() int { return ix.cfg.Sample }

// lookupKept is Lookup over hashes that are all kept by the index.
//
// A lookup during which ClearStale freed ids starts again: a freed id may
// have been bound to another worker and stored entries under it while the
// walk ran, and the table the walk loaded names the id's previous worker
// (nameTable). The walk is microseconds and ClearStale a scan of the whole
// index, so a lookup starts again at most once in practice.
func (ix *Index) lookupKept(seqHashes []uint64, dst []Match) []Match {
	start := len(dst)
	for {
		freed := ix.freed.Load()
		names := *ix.names.Load()
		dst = ix.lookupExact(seqHashes, names, dst)
		if ix.pred.count.Load() > 0 {
			dst = ix.pred.lookup(seqHashes, ix.clock.Now().UnixNano(), names, dst, start)
		}
		if ix.freed.Load() == freed {
			return dst
		}
		dst = dst[:start]
	}
}

// lookupExact is Lookup over the exact index. It walks with the set of
// workers still matching as a bitset while that set is large (a shared
// system prompt), and as a list of at most four ids once it is small, which
// is most of a long prompt's blocks: the list makes a block's step a few
// compares instead of a pass over the bitset's words.
func (ix *Index) lookupExact(seqHashes []uint64, names nameTable, dst []Match) []Match {
	nw := int(ix.words.Load())
	var stackA, stackB [64]uint64
	var active, next []uint64
	if nw <= len(stackA) {
		active, next = stackA[:nw], stackB[:nw]
	} else {
		// Beyond 4096 ids, pooled scratch: allocating two 1.5 kB sets
		// per lookup at 10,000 workers was a sixth of the lookup's CPU
		// once sets were interned (makeslice and memclr in the profile).
		sc, _ := ix.scratch.Get().(*[]uint64)
		if sc == nil || len(*sc) < 2*nw {
			b := make([]uint64, 2*nw)
			sc = &b
		}
		defer ix.scratch.Put(sc)
		active, next = (*sc)[:nw], (*sc)[nw:2*nw] // readSet clears active
	}
	lo, hi := 0, -1 // range of possibly non-zero words of active
	pl := preloader{hs: seqHashes}
	pl.at(ix, 0)
	// last is the interned set active was last intersected with: a block
	// that points to the same set leaves active as it is (sets.go), so a
	// shared prefix costs one intersection, not one per block.
	present, last, _ := ix.shardOf(seqHashes[0]).readSet(seqHashes[0], active, nil, 0, nw-1, nil)
	if present {
		masked := *ix.masked.Load()
		for wi := range active {
			active[wi] &^= masked[wi]
		}
		lo, hi = trim(active, 0, nw-1)
	}
	depth := 1
	for ; depth < len(seqHashes) && lo <= hi; depth++ {
		if ids, n, ok := few(active, lo, hi); ok {
			return ix.walkFew(&pl, depth, ids, n, names, dst)
		}
		pl.at(ix, depth)
		h := seqHashes[depth]
		_, set, same := ix.shardOf(h).readSet(h, next, active, lo, hi, last)
		if same {
			continue
		}
		last = set
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
	return dst
}

// few returns the ids of the set bits of a[lo..hi] if there are at most
// lanes of them.
func few(a []uint64, lo, hi int) (ids [lanes]uint16, n int, ok bool) {
	for wi := lo; wi <= hi; wi++ {
		w := a[wi]
		if n+bits.OnesCount64(w) > lanes {
			return ids, 0, false
		}
		for w != 0 {
			ids[n] = uint16(wi*64 + bits.TrailingZeros64(w))
			w &= w - 1
			n++
		}
	}
	return ids, n, true
}

// walkFew continues a lookup from depth with the n (1..lanes) workers ids
// still matching.
func (ix *Index) walkFew(pl *preloader, depth int, ids [lanes]uint16, n int, names nameTable, dst []Match) []Match {
	hs := pl.hs
	all := uint8(1)<<n - 1
	for ; depth < len(hs); depth++ {
		pl.at(ix, depth)
		h := hs[depth]
		s := ix.shardOf(h)
		if n == 1 {
			// The common case, a prompt only one worker still matches,
			// without the call and loops of holding, which remains the
			// fallback. Alternating binaries with and without it, three
			// runs each: p50 8.2-8.4 against 8.5-8.6 µs, p99 15.1-16.2
			// against 16.5-17.3 µs.
			v1 := s.seq.Load()
			v := s.tab.Load().get(h)
			if v1&1 == 0 && !isBig(v) && laneHolds(v, ids[0]) && s.seq.Load() == v1 {
				continue
			}
		}
		held := s.holding(h, &ids, n)
		if held == all {
			continue
		}
		m := 0
		for k := 0; k < n; k++ {
			if held&(1<<k) != 0 {
				ids[m] = ids[k]
				m++
			} else {
				dst = appendMatch(dst, names, int(ids[k]), depth)
			}
		}
		if n = m; n == 0 {
			return dst
		}
		all = uint8(1)<<n - 1
	}
	for k := 0; k < n; k++ {
		dst = appendMatch(dst, names, int(ids[k]), len(hs))
	}
	return dst
}

func appendMatch(dst []Match, names nameTable, id, depth int) []Match {
	name := names.name(id)
	if name == "" {
		return dst // removed while we looked
	}
	return append(dst, Match{Worker: name, Blocks: depth})
}

// A lookup loads the lines of its hashes ahead of its walk: first
// firstLoad of them (a prompt that matches nothing stops after one), then
// nextLoad at a time. Measured on the fleet benchmark, batches of 16 then
// 128 beat 8/32, 16/32 and 16/64 by 0.5 to 1 µs at p99.
const (
	firstLoad = 16
	nextLoad  = 128
)

// preloader tracks how far ahead of a lookup's walk the hashes' lines have
// been loaded.
type preloader struct {
	hs     []uint64
	loaded int
}

// at makes sure the lines of hs[depth] have been loaded.
func (p *preloader) at(ix *Index, depth int) {
	if depth < p.loaded {
		return
	}
	n := nextLoad
	if depth == 0 {
		n = firstLoad
	}
	end := min(depth+n, len(p.hs))
	ix.preload(p.hs[depth:end])
	p.loaded = end
}

// preload loads the home line of each hash in hs (at most nextLoad), and
// the line after it, so that their cache and TLB misses overlap instead of
// being paid one after the other by the walk: the index is far larger than
// the caches and a lookup is bound by its misses.
//
//   - It first computes every line's address and only then loads them, in
//     a loop of nothing but independent loads, so the CPU keeps as many
//     misses in flight as it can. Interleaving the two, as a first version
//     did, took 7.7 µs for a 256-block prompt's lines; split, 3.1 µs.
//   - It loads the next line too because the slowest lookups were those
//     with many keys pushed out of their home line: keys stored last, when
//     their home lines were already full, are the ones displaced (linear
//     probing keeps the earlier keys in place), so a prompt stored shortly
//     before a table grows has up to a quarter of its blocks one line on
//     (the mean is 7%). Each was a miss paid alone. The adjacent line is on
//     the same page, so it costs no second TLB miss; loading it took the
//     p99 over queries of each query's fastest run from 15.2 to 12.4 µs.
//     (Robin Hood insertion does not help: displaced keys share a home
//     bucket, and Robin Hood keeps them in arrival order.)
func (ix *Index) preload(hs []uint64) {
	var lines, nexts [nextLoad]*slot
	hs = hs[:min(len(hs), nextLoad)]
	for k, h := range hs {
		t := ix.shardOf(h).tab.Load()
		i := home(h, len(t.slots))
		j := i + lineSlots
		if j == len(t.slots) {
			j = 0
		}
		lines[k], nexts[k] = &t.slots[i], &t.slots[j]
	}
	for k := range hs {
		_ = lines[k].val.Load()
		_ = nexts[k].val.Load()
	}
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
// tests and diagnostics; routing uses Lookup. A hash the index does not
// keep (Config.Sample) is never held.
func (ix *Index) Held(name string, h uint64) bool {
	w := ix.lookupWorker(name)
	return w != nil && ix.keeps(h) && ix.holds(h, w.ID())
}

// HeldDepth returns how many leading blocks of seqHashes worker holds
// exactly, at the index's resolution: with Config.Sample 1 the number of
// leading hashes it holds, otherwise the position of the last sampled hash
// it holds before the first sampled one it lacks, plus one (what Lookup
// reports from exact entries). Callers use it instead of counting Held
// hashes, which under sampling stops at the first unsampled block.
func (ix *Index) HeldDepth(name string, seqHashes []uint64) int {
	w := ix.lookupWorker(name)
	if w == nil {
		return 0
	}
	id := w.ID()
	d := 0
	for i, h := range seqHashes {
		if !ix.keeps(h) {
			continue
		}
		if !ix.holds(h, id) {
			break
		}
		d = i + 1
	}
	return d
}

// WorkerHashes appends every exact hash worker holds to dst, by scanning the
// whole index (under Config.Sample, only the kept ones). It is for tests and diagnostics, not the request path.
func (ix *Index) WorkerHashes(name string, dst []uint64) []uint64 {
	w := ix.lookupWorker(name)
	if w == nil {
		return dst
	}
	w.mu.Lock() // the id must not change under the scan
	defer w.mu.Unlock()
	id := w.ID()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		t := s.tab.Load()
		for j := range t.slots {
			if v := t.slots[j].val.Load(); v != 0 && s.valHolds(v, id) {
				dst = append(dst, t.slots[j].key.Load())
			}
		}
		s.mu.Unlock()
	}
	return dst
}

// Memory returns the bytes held by the exact index's tables and holder sets.
func (ix *Index) Memory() int64 {
	n := ix.sets.memory()
	for i := range ix.shards {
		s := &ix.shards[i]
		s.mu.Lock()
		n += s.bytes()
		s.mu.Unlock()
	}
	return n
}
