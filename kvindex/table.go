package kvindex

import (
	"math/bits"
	"runtime"
	"sync"
	"sync/atomic"
)

// A shard of the exact index: an open-addressing hash table (linear probing,
// backward-shift deletion) from sequence hash to a packed worker set.
//
// Why not a Go map: a lookup walks up to hundreds of hashes through a table
// of tens of millions of entries, so it is bound by cache misses. A Go map
// costs two to three dependent misses per access (directory, table, group),
// and an RWMutex read lock is an atomic read-modify-write, a full fence on
// x86 that stops the CPU from overlapping one hash's misses with the next.
// Here an access is one miss into a flat slot array, and readers take no
// lock: they read with atomic loads (plain moves on x86) under a sequence
// counter and retry if a writer touched the shard meanwhile (a seqlock).
// Writers serialise on mu and make seq odd around every mutation.
//
// A slot's value packs up to four 16-bit worker ids (0 = empty lane), or,
// with bigTag in the top lane, the id of an interned holder set in the
// index's setStore (sets.go), for hashes held by more workers. A slot is
// empty when its value is 0.
const (
	bigTag = 0xFFFF
	lanes  = 4
	// Grow past 75% load. Linear probing's clusters lengthen steeply with
	// load, and a lookup pays an extra cache miss for every key that has
	// left its home line and the line after it (the two that lookups load
	// ahead): under the former 85% limit, at 78% load, the per-query floor
	// of the fleet benchmark's 256-block lookups had a p99 of 38 µs, at 52%
	// 22 µs (before lookups loaded ahead as they do now). The price: a
	// distinct hash costs 21 to 32 B of slots (was 19 to 28 B).
	loadNum   = 15
	loadDen   = 20
	minSlots  = 16
	lineSlots = 4 // 16-byte slots per 64-byte cache line
	growNum   = 3 // grow by half, so the average load stays near 62%
	growDen   = 2
	fibonacci = 0x9E3779B97F4A7C15
	setIDMask = 1<<48 - 1
)

type slot struct {
	key atomic.Uint64
	val atomic.Uint64
}

type table struct {
	slots []slot
}

type shard struct {
	mu   sync.Mutex // serialises writers
	seq  atomic.Uint64
	tab  atomic.Pointer[table]
	sets *setStore // shared by the index's shards

	// Writer-only state, guarded by mu.
	count int      // occupied slots
	_     [64]byte // keep neighbouring shards' hot fields apart
}

func (s *shard) init(sets *setStore) {
	s.sets = sets
	s.tab.Store(&table{slots: make([]slot, minSlots)})
}

// newSetStore returns a store of sets words wide.
func newSetStore(words int) *setStore {
	st := &setStore{}
	st.init(words)
	return st
}

func isBig(v uint64) bool { return v>>48 == bigTag }

// home is the slot where h's probe starts: the first slot of one of the
// table's 64-byte lines (lineSlots slots; tables are a whole number of
// lines). Fibonacci-mix the hash (the shard already consumed its low bits)
// and map it onto the lines with a multiply, so the count need not be a
// power of two.
//
// Starting every probe at a line's first slot is still plain linear probing
// (find, insertion and backward-shift deletion need nothing else), but a
// key then almost always sits in its home line, so a lookup costs one cache
// line, and get can test the whole line without branching on the keys.
func home(h uint64, n int) int {
	hi, _ := bits.Mul64(h*fibonacci, uint64(n/lineSlots))
	return int(hi) * lineSlots
}

// find returns h's slot, or the empty slot where it would go.
func (t *table) find(h uint64) (int, bool) {
	n := len(t.slots)
	for i := home(h, n); ; {
		sl := &t.slots[i]
		if sl.val.Load() == 0 {
			return i, false
		}
		if sl.key.Load() == h {
			return i, true
		}
		if i++; i == n {
			i = 0
		}
	}
}

// get returns h's value, 0 when h is absent. It is the readers' probe: it
// loads h's home line whole and picks the value with conditional moves, not
// branches. A lookup walks hundreds of hashes whose probe lengths are
// random, and a branch per probe step mispredicts often enough to cost more
// than the memory reads (measured: 256 cached probes took 4.1 µs through
// find's loop with a cold predictor, 1.8 µs with a trained one). Only when
// the home line is full and does not hold h does it continue, with find's
// loop.
func (t *table) get(h uint64) uint64 {
	n := len(t.slots)
	i := home(h, n)
	b := (*[lineSlots]slot)(t.slots[i : i+lineSlots])
	v0, v1, v2, v3 := b[0].val.Load(), b[1].val.Load(), b[2].val.Load(), b[3].val.Load()
	var v uint64
	if b[0].key.Load() == h {
		v |= v0
	}
	if b[1].key.Load() == h {
		v |= v1
	}
	if b[2].key.Load() == h {
		v |= v2
	}
	if b[3].key.Load() == h {
		v |= v3
	}
	if v != 0 || min(v0, v1, v2, v3) == 0 {
		// Found, or the line has an empty slot before which h would be.
		// Occupied keys are distinct, so at most one occupied slot
		// matches; an empty slot's key is 0 and may match h == 0, but
		// its value 0 adds nothing to the OR.
		return v
	}
	for i += lineSlots; ; {
		if i >= n {
			i -= n
		}
		sl := &t.slots[i]
		if v := sl.val.Load(); v == 0 || sl.key.Load() == h {
			return v
		}
		i++
	}
}

func (s *shard) begin() { s.seq.Add(1) }
func (s *shard) end()   { s.seq.Add(1) }

// readInto sets out[lo..hi] to h's worker set (intersected with mask when it
// is non-nil) without locking, and reports whether h is present.
func (s *shard) readInto(h uint64, out, mask []uint64, lo, hi int) bool {
	ok, _, _ := s.readSet(h, out, mask, lo, hi, nil)
	return ok
}

// readSet is readInto that also returns h's interned set (nil when h has
// at most four holders or is absent). When that set is prev it leaves out
// untouched and reports same: the caller already has the set's words.
func (s *shard) readSet(h uint64, out, mask []uint64, lo, hi int, prev *holderSet) (ok bool, set *holderSet, same bool) {
	for spins := 0; ; spins++ {
		v1 := s.seq.Load()
		if v1&1 != 0 {
			if spins > 16 {
				runtime.Gosched() // the writer may have been preempted
			}
			continue
		}
		v := s.tab.Load().get(h)
		ok = v != 0
		set = nil
		if ok && isBig(v) {
			if set = s.sets.get(v & setIDMask); set == nil {
				continue // freed after we read the slot: the slot moved on
			}
			if set == prev {
				if s.seq.Load() == v1 {
					return true, set, true
				}
				continue
			}
		}
		for i := lo; i <= hi; i++ {
			out[i] = 0
		}
		if set != nil {
			top := min(hi, len(set.words)-1)
			for wi := lo; wi <= top; wi++ {
				w := set.words[wi]
				if mask != nil {
					w &= mask[wi]
				}
				out[wi] = w
			}
		} else if ok {
			for l := 0; l < lanes; l++ {
				x := int(v >> (16 * l) & 0xFFFF)
				wi := x / 64
				if x == 0 || wi < lo || wi > hi {
					continue
				}
				bit := uint64(1) << (x % 64)
				if mask == nil || mask[wi]&bit != 0 {
					out[wi] |= bit
				}
			}
		}
		if s.seq.Load() == v1 {
			return ok, set, false
		}
	}
}

// holding reports which of the n workers ids hold h: bit k is set when
// ids[k] does. Like readInto it takes no lock.
func (s *shard) holding(h uint64, ids *[lanes]uint16, n int) uint8 {
	for spins := 0; ; spins++ {
		v1 := s.seq.Load()
		if v1&1 != 0 {
			if spins > 16 {
				runtime.Gosched()
			}
			continue
		}
		v := s.tab.Load().get(h)
		var held uint8
		if isBig(v) {
			set := s.sets.get(v & setIDMask)
			if set == nil {
				continue // freed after we read the slot: the slot moved on
			}
			for k := 0; k < n; k++ {
				if set.has(ids[k]) {
					held |= 1 << k
				}
			}
		} else if v != 0 {
			for k := 0; k < n; k++ {
				if laneHolds(v, ids[k]) {
					held |= 1 << k
				}
			}
		}
		if s.seq.Load() == v1 {
			return held
		}
	}
}

// laneHolds reports whether one of v's four 16-bit lanes is id (id != 0),
// without a loop: a lane of v^id·0x0001… is zero exactly where v holds id,
// and (x-0x0001…) & ^x & 0x8000… is non-zero exactly when x has a zero lane.
func laneHolds(v uint64, id uint16) bool {
	const ones, highs = 0x0001_0001_0001_0001, 0x8000_8000_8000_8000
	x := v ^ uint64(id)*ones
	return (x-ones)&^x&highs != 0
}

// The methods below are for writers: the caller holds s.mu.

// holdsLocked reports whether id is in h's set.
func (s *shard) holdsLocked(h uint64, id uint16) bool {
	t := s.tab.Load()
	i, ok := t.find(h)
	if !ok {
		return false
	}
	return s.valHolds(t.slots[i].val.Load(), id)
}

func (s *shard) valHolds(v uint64, id uint16) bool {
	if isBig(v) {
		return s.sets.get(v & setIDMask).has(id)
	}
	for l := 0; l < lanes; l++ {
		if uint16(v>>(16*l)) == id {
			return true
		}
	}
	return false
}

// addLocked puts id into h's set and reports whether it was new.
func (s *shard) addLocked(h uint64, id uint16) bool {
	t := s.tab.Load()
	i, ok := t.find(h)
	if !ok {
		if (s.count+1)*loadDen > len(t.slots)*loadNum {
			t = s.grow(t)
			i, _ = t.find(h)
		}
		s.begin()
		t.slots[i].key.Store(h)
		t.slots[i].val.Store(uint64(id))
		s.end()
		s.count++
		return true
	}
	sl := &t.slots[i]
	v := sl.val.Load()
	if isBig(v) {
		old := s.sets.get(v & setIDMask)
		if old.has(id) {
			return false
		}
		s.swapSet(sl, old, s.sets.with(old, id))
		return true
	}
	free := -1
	for l := 0; l < lanes; l++ {
		x := uint16(v >> (16 * l))
		if x == id {
			return false
		}
		if x == 0 && free < 0 {
			free = l
		}
	}
	if free >= 0 {
		s.begin()
		sl.val.Store(v | uint64(id)<<(16*free))
		s.end()
		return true
	}
	// Promote to an interned set.
	ids := [lanes + 1]uint16{id, uint16(v), uint16(v >> 16), uint16(v >> 32), uint16(v >> 48)}
	s.swapSet(sl, nil, s.sets.fromIDs(ids[:]))
	return true
}

// swapSet points sl to the set n (a reference the caller took) and then
// drops the slot's reference to old (nil: the slot held inline ids).
// Releasing only after the slot has moved on matters: a released set's id
// may be reused by another shard's writer at once, and a reader of this
// shard must not find the reused id here with this shard's seq unchanged.
func (s *shard) swapSet(sl *slot, old, n *holderSet) {
	s.begin()
	sl.val.Store(bigTag<<48 | uint64(n.id))
	s.end()
	if old != nil {
		s.sets.release(old)
	}
}

// removeLocked takes id out of h's set and reports whether it was there.
func (s *shard) removeLocked(h uint64, id uint16) bool {
	t := s.tab.Load()
	i, ok := t.find(h)
	if !ok {
		return false
	}
	return s.removeAt(t, i, id)
}

func (s *shard) removeAt(t *table, i int, id uint16) bool {
	sl := &t.slots[i]
	v := sl.val.Load()
	if !isBig(v) {
		nv := v
		for l := 0; l < lanes; l++ {
			if uint16(v>>(16*l)) == id {
				nv &^= 0xFFFF << (16 * l)
			}
		}
		if nv == v {
			return false
		}
		s.begin()
		if nv == 0 {
			s.deleteAt(t, i)
		} else {
			sl.val.Store(nv)
		}
		s.end()
		return true
	}
	old := s.sets.get(v & setIDMask)
	if !old.has(id) {
		return false
	}
	if old.pop-1 > demoteAt {
		s.swapSet(sl, old, s.sets.without(old, id))
		return true
	}
	// Demote when few enough remain; below the promotion point so a set
	// hovering there does not flap.
	var nv uint64
	l := 0
	for wi, word := range old.words {
		if wi == int(id)/64 {
			word &^= 1 << (id % 64)
		}
		for word != 0 {
			b := bits.TrailingZeros64(word)
			word &= word - 1
			nv |= uint64(wi*64+b) << (16 * l)
			l++
		}
	}
	s.begin()
	if nv == 0 {
		s.deleteAt(t, i)
	} else {
		sl.val.Store(nv)
	}
	s.end()
	s.sets.release(old)
	return true
}

// deleteAt empties slot i with backward-shift deletion, so probes need no
// tombstones. Inside begin/end.
func (s *shard) deleteAt(t *table, i int) {
	n := len(t.slots)
	for j := i; ; {
		if j++; j == n {
			j = 0
		}
		v := t.slots[j].val.Load()
		if v == 0 {
			break
		}
		k := home(t.slots[j].key.Load(), n)
		// Slot j may move to i unless its home lies cyclically in (i, j].
		if i <= j {
			if i < k && k <= j {
				continue
			}
		} else if i < k || k <= j {
			continue
		}
		t.slots[i].key.Store(t.slots[j].key.Load())
		t.slots[i].val.Store(v)
		i = j
	}
	t.slots[i].val.Store(0)
	t.slots[i].key.Store(0)
	s.count--
}

// grow rehashes into a table half again as large and publishes it. Readers
// still on the old table see seq move and retry.
func (s *shard) grow(old *table) *table {
	n := (len(old.slots)*growNum/growDen + minSlots) &^ (lineSlots - 1)
	t := &table{slots: make([]slot, n)}
	adviseHugePages(t.slots)
	for i := range old.slots {
		if v := old.slots[i].val.Load(); v != 0 {
			h := old.slots[i].key.Load()
			j, _ := t.find(h)
			t.slots[j].key.Store(h)
			t.slots[j].val.Store(v)
		}
	}
	s.begin()
	s.tab.Store(t)
	s.end()
	return t
}

// clearLocked removes id from every set of the shard and returns how many
// it was in.
func (s *shard) clearLocked(id uint16) int {
	t := s.tab.Load()
	removed := 0
	for i := 0; i < len(t.slots); {
		v := t.slots[i].val.Load()
		if v != 0 && s.valHolds(v, id) {
			s.removeAt(t, i, id)
			removed++
			continue // a later slot may have shifted into i: look again
		}
		i++
	}
	return removed
}

// bytes is the shard's memory: its slots (the sets are the store's).
func (s *shard) bytes() int64 {
	return int64(len(s.tab.Load().slots)) * 16
}

// clearSetLocked removes every worker whose bit is set in mask from every
// set of the shard, adding to counts[id] per removed entry.
func (s *shard) clearSetLocked(mask []uint64, counts []int64) {
	t := s.tab.Load()
	for i := 0; i < len(t.slots); {
		v := t.slots[i].val.Load()
		if v == 0 {
			i++
			continue
		}
		id, ok := s.firstMasked(v, mask)
		if !ok {
			i++
			continue
		}
		s.removeAt(t, i, id)
		counts[id]++
		// Look at slot i again: it may hold more masked workers, or a later
		// slot shifted into it.
	}
}

// firstMasked returns a worker of value v whose bit is set in mask.
func (s *shard) firstMasked(v uint64, mask []uint64) (uint16, bool) {
	if !isBig(v) {
		for l := 0; l < lanes; l++ {
			x := uint16(v >> (16 * l))
			if x != 0 && int(x/64) < len(mask) && mask[x/64]&(1<<(x%64)) != 0 {
				return x, true
			}
		}
		return 0, false
	}
	set := s.sets.get(v & setIDMask)
	for wi := 0; wi < len(set.words) && wi < len(mask); wi++ {
		if hit := set.words[wi] & mask[wi]; hit != 0 {
			return uint16(wi*64 + bits.TrailingZeros64(hit)), true
		}
	}
	return 0, false
}
