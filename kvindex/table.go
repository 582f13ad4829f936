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
// with bigTag in the top lane, the index of a fixed-width bitset in the
// shard's arena, for hashes held by more workers. A slot is empty when its
// value is 0.
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
	loadNum    = 15
	loadDen    = 20
	minSlots   = 16
	lineSlots  = 4 // 16-byte slots per 64-byte cache line
	growNum    = 3 // grow by half, so the average load stays near 62%
	growDen    = 2
	fibonacci  = 0x9E3779B97F4A7C15
	arenaIndex = 1<<48 - 1
)

type slot struct {
	key atomic.Uint64
	val atomic.Uint64
}

type table struct {
	slots []slot
}

type shard struct {
	mu    sync.Mutex // serialises writers
	seq   atomic.Uint64
	tab   atomic.Pointer[table]
	arena atomic.Pointer[[]atomic.Uint64]

	// Writer-only state, guarded by mu.
	words     int // bitset width in words, fixed per index
	count     int // occupied slots
	arenaUsed int // bitsets handed out (free ones included)
	free      []uint64
	_         [64]byte // keep neighbouring shards' hot fields apart
}

func (s *shard) init(words int) {
	s.words = words
	s.tab.Store(&table{slots: make([]slot, minSlots)})
	arena := make([]atomic.Uint64, 0)
	s.arena.Store(&arena)
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
	for spins := 0; ; spins++ {
		v1 := s.seq.Load()
		if v1&1 != 0 {
			if spins > 16 {
				runtime.Gosched() // the writer may have been preempted
			}
			continue
		}
		for i := lo; i <= hi; i++ {
			out[i] = 0
		}
		v := s.tab.Load().get(h)
		ok := v != 0
		if ok && isBig(v) {
			arena := *s.arena.Load()
			base := int(v&arenaIndex) * s.words
			if base+s.words > len(arena) {
				continue // a newer arena than we loaded; retry
			}
			top := min(hi, s.words-1)
			for wi := lo; wi <= top; wi++ {
				w := arena[base+wi].Load()
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
			return ok
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
			arena := *s.arena.Load()
			base := int(v&arenaIndex) * s.words
			if base+s.words > len(arena) {
				continue // a newer arena than we loaded; retry
			}
			for k := 0; k < n; k++ {
				id := ids[k]
				if arena[base+int(id)/64].Load()&(1<<(id%64)) != 0 {
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
		arena := *s.arena.Load()
		w := arena[int(v&arenaIndex)*s.words+int(id)/64].Load()
		return w&(1<<(id%64)) != 0
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
		arena := *s.arena.Load()
		w := &arena[int(v&arenaIndex)*s.words+int(id)/64]
		bit := uint64(1) << (id % 64)
		old := w.Load()
		if old&bit != 0 {
			return false
		}
		s.begin()
		w.Store(old | bit)
		s.end()
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
	// Promote the set to a bitset.
	idx := s.allocBitset()
	arena := *s.arena.Load()
	base := int(idx) * s.words
	s.begin()
	for l := 0; l < lanes; l++ {
		x := uint16(v >> (16 * l))
		w := &arena[base+int(x)/64]
		w.Store(w.Load() | 1<<(x%64))
	}
	w := &arena[base+int(id)/64]
	w.Store(w.Load() | 1<<(id%64))
	sl.val.Store(bigTag<<48 | idx)
	s.end()
	return true
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
	idx := v & arenaIndex
	arena := *s.arena.Load()
	base := int(idx) * s.words
	w := &arena[base+int(id)/64]
	bit := uint64(1) << (id % 64)
	if w.Load()&bit == 0 {
		return false
	}
	s.begin()
	w.Store(w.Load() &^ bit)
	// Demote when few enough remain; below the promotion point so a set
	// hovering there does not flap.
	pop := 0
	for wi := 0; wi < s.words && pop <= demoteAt; wi++ {
		pop += bits.OnesCount64(arena[base+wi].Load())
	}
	if pop <= demoteAt {
		var nv uint64
		l := 0
		for wi := 0; wi < s.words; wi++ {
			word := arena[base+wi].Swap(0)
			for word != 0 {
				b := bits.TrailingZeros64(word)
				word &= word - 1
				nv |= uint64(wi*64+b) << (16 * l)
				l++
			}
		}
		s.free = append(s.free, idx)
		if nv == 0 {
			s.deleteAt(t, i)
		} else {
			sl.val.Store(nv)
		}
	}
	s.end()
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

// allocBitset returns a zeroed bitset index, growing the arena if needed.
func (s *shard) allocBitset() uint64 {
	if n := len(s.free); n > 0 {
		idx := s.free[n-1]
		s.free = s.free[:n-1]
		return idx
	}
	idx := uint64(s.arenaUsed)
	s.arenaUsed++
	arena := *s.arena.Load()
	if need := s.arenaUsed * s.words; need > len(arena) {
		grown := make([]atomic.Uint64, max(need, len(arena)*2))
		for i := range arena {
			grown[i].Store(arena[i].Load())
		}
		s.begin()
		s.arena.Store(&grown)
		s.end()
	}
	return idx
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

// bytes is the shard's memory: slots and bitset arena.
func (s *shard) bytes() int64 {
	return int64(len(s.tab.Load().slots))*16 + int64(len(*s.arena.Load()))*8
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
	arena := *s.arena.Load()
	base := int(v&arenaIndex) * s.words
	for wi := 0; wi < s.words && wi < len(mask); wi++ {
		if hit := arena[base+wi].Load() & mask[wi]; hit != 0 {
			return uint16(wi*64 + bits.TrailingZeros64(hit)), true
		}
	}
	return 0, false
}
