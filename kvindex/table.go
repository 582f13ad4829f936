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
	// load, and a lookup pays an extra, unprefetched cache miss for every
	// probe that leaves its home line: at 78% load (the fleet benchmark's
	// tables under the former 85% limit) the per-query floor of the 256-block
	// lookups reached a p99 of 38 µs, at 52% it is 22 µs. The price: a
	// distinct hash costs 21 to 32 B of slots (was 19 to 28 B); the fleet
	// benchmark, with its prefix sharing, went from 17.9 to 26.7 B per entry.
	loadNum    = 15
	loadDen    = 20
	minSlots   = 16
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

// home is the slot where h's probe starts: Fibonacci-mix the hash (the
// shard already consumed its low bits) and map it onto [0, n) with a
// multiply, so n need not be a power of two.
func home(h uint64, n int) int {
	hi, _ := bits.Mul64(h*fibonacci, uint64(n))
	return int(hi)
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
		t := s.tab.Load()
		i, ok := t.find(h)
		var v uint64
		if ok {
			v = t.slots[i].val.Load()
		}
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
	n := len(old.slots)*growNum/growDen + minSlots
	t := &table{slots: make([]slot, n)}
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
