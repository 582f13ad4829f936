package adapter

// table is an open-addressing hash table from uint64 to V (linear probing,
// backward-shift deletion, power-of-two size, grown past 1/2 load). The
// mirror's maps churn constantly (every stored block is later removed or
// evicted); Go's maps keep deleted slots as tombstones and pay several
// dependent cache misses per access, and BenchmarkMirror spent most of its
// time in their probing. Here an access is one probe run in a flat array
// and a deletion leaves no tombstone. Key 0 marks an empty slot, so the key
// 0 itself lives beside the array. Not safe for concurrent use.
type table[V any] struct {
	slots   []tslot[V] // key and value side by side: one cache miss per access
	n       int        // keys in the array (not counting key 0)
	bits    uint       // log2(len(slots))
	hasZero bool
	zero    V
}

const tableMinSlots = 16

type tslot[V any] struct {
	key uint64
	val V
}

// slot is where a key lives: an index into the array, or -1 for key 0.
type slot int

func (t *table[V]) home(k uint64) int {
	// Fibonacci hashing: engine hashes need not be uniformly spread.
	return int((k * 0x9E3779B97F4A7C15) >> (64 - t.bits))
}

func bitsFor(n int) uint {
	b := uint(0)
	for 1<<b < n {
		b++
	}
	return b
}

// Len is the number of keys.
func (t *table[V]) Len() int {
	if t.hasZero {
		return t.n + 1
	}
	return t.n
}

// find returns k's slot.
func (t *table[V]) find(k uint64) (slot, bool) {
	if k == 0 {
		return -1, t.hasZero
	}
	if len(t.slots) == 0 {
		return 0, false
	}
	mask := len(t.slots) - 1
	for i := t.home(k); ; i = (i + 1) & mask {
		switch t.slots[i].key {
		case k:
			return slot(i), true
		case 0:
			return slot(i), false
		}
	}
}

// touch loads k's home slot and returns its key, for a caller that wants
// the slot in cache before it looks k up: the load's result decides no
// branch, so several touches' cache misses overlap where lookups' do not
// (a probe loop's exit waits for its load).
func (t *table[V]) touch(k uint64) uint64 {
	if len(t.slots) == 0 {
		return 0
	}
	return t.slots[t.home(k)].key
}

// at is the value in s; valid until the next insertion or deletion.
func (t *table[V]) at(s slot) *V {
	if s < 0 {
		return &t.zero
	}
	return &t.slots[s].val
}

// get returns k's value.
func (t *table[V]) get(k uint64) (V, bool) {
	s, ok := t.find(k)
	if !ok {
		var zero V
		return zero, false
	}
	return *t.at(s), true
}

// upsert returns k's slot, inserting k with the zero value if absent
// (existed false).
func (t *table[V]) upsert(k uint64) (s slot, existed bool) {
	if k == 0 {
		if !t.hasZero {
			var zero V
			t.hasZero, t.zero = true, zero
			return -1, false
		}
		return -1, true
	}
	// Half full at most: linear probing's misses grow as 1/(1-load)², and
	// at 3/4 a miss scanned ~8 slots. Alternating A/B of BenchmarkMirror
	// at 262,144 entries: 0.90-0.94 M blocks/cpu-s at 3/4, 1.11 at 1/2,
	// for twice the slots (16 -> 32 MB at the default bound).
	if (t.n+1)*2 > len(t.slots) {
		t.grow()
	}
	s, ok := t.find(k)
	if ok {
		return s, true
	}
	var zero V
	t.slots[s] = tslot[V]{key: k, val: zero}
	t.n++
	return s, false
}

// deleteAt removes the key in s, shifting later keys of its probe run back
// so lookups never need tombstones.
func (t *table[V]) deleteAt(s slot) {
	if s < 0 {
		var zero V
		t.hasZero, t.zero = false, zero
		return
	}
	mask := len(t.slots) - 1
	i := int(s)
	for j := (i + 1) & mask; t.slots[j].key != 0; j = (j + 1) & mask {
		h := t.home(t.slots[j].key)
		// The key at j may move to the hole at i only if its home is not
		// in the cyclic range (i, j].
		if (j > i && (h <= i || h > j)) || (j < i && h <= i && h > j) {
			t.slots[i] = t.slots[j]
			i = j
		}
	}
	t.slots[i] = tslot[V]{}
	t.n--
}

// delete removes k and reports whether it was there.
func (t *table[V]) delete(k uint64) bool {
	s, ok := t.find(k)
	if ok {
		t.deleteAt(s)
	}
	return ok
}

func (t *table[V]) grow() {
	size := max(2*len(t.slots), tableMinSlots)
	old := t.slots
	t.slots, t.n, t.bits = make([]tslot[V], size), 0, bitsFor(size)
	for _, e := range old {
		if e.key != 0 {
			s, _ := t.find(e.key)
			t.slots[s] = e
			t.n++
		}
	}
}

// clear removes every key, keeping the array.
func (t *table[V]) clear() {
	clear(t.slots)
	t.n = 0
	var zero V
	t.hasZero, t.zero = false, zero
}

// each calls f for every key.
func (t *table[V]) each(f func(k uint64, v V)) {
	if t.hasZero {
		f(0, t.zero)
	}
	for _, e := range t.slots {
		if e.key != 0 {
			f(e.key, e.val)
		}
	}
}
