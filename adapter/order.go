package adapter

import "math/bits"

// order keeps the engine hashes of the mirror's map in insertion order, for
// eviction at the map's bound. Each entry carries its insertion number
// (gen); the hash sits in a ring at gen & mask and a bit says whether it is
// still live, so a removal only clears a bit it can compute from the entry
// it already holds, and finding the oldest live entry scans bits, not the
// map. (It replaced a FIFO of (hash, gen) whose periodic compaction looked
// every item up in the map: about two random map lookups per stored block,
// 7% of BenchmarkAdapterThroughput's profile.)
//
// The ring spans the gens from the oldest live entry to the newest, so an
// entry that outlives many later ones (a hot prefix the engine keeps)
// stretches it. It grows up to twice the live entries plus 1024, like the
// FIFO it replaced; beyond that the oldest live entry is renewed: given a
// new gen at the ring's tail, as if stored again. Eviction is therefore
// oldest-first by insertion, where an entry that outlived a ring's worth
// of later stores counts as inserted anew: it is evidently hot.
type order struct {
	ring []uint64 // engine hash by gen & mask
	live []uint64 // bit gen & mask: ring holds a live entry there
	head uint64   // no live entry has a gen below head
	next uint64   // the gen the next entry gets
}

func (o *order) mask() uint64 { return uint64(len(o.ring) - 1) }

// reset forgets every entry, keeping the memory.
func (o *order) reset() {
	clear(o.live)
	o.head = o.next
}

func (o *order) isLive(g uint64) bool {
	i := g & o.mask()
	return o.live[i>>6]&(1<<(i&63)) != 0
}

// drop marks the entry of gen g gone. g may be given by its low 32 bits
// only: the ring is far smaller than 2^32 slots.
func (o *order) drop(g uint64) {
	i := g & o.mask()
	o.live[i>>6] &^= 1 << (i & 63)
}

// skipDead advances head past gens whose entries are gone, a word of bits
// at a time where it can.
func (o *order) skipDead() {
	for o.head < o.next {
		i := o.head & o.mask()
		w := o.live[i>>6] >> (i & 63)
		if w != 0 {
			o.head += uint64(bits.TrailingZeros64(w))
			return
		}
		o.head += 64 - i&63
	}
	o.head = o.next
}

// oldest returns the oldest live entry's hash and gen.
func (o *order) oldest() (h, gen uint64, ok bool) {
	o.skipDead()
	if o.head >= o.next {
		return 0, 0, false
	}
	return o.ring[o.head&o.mask()], o.head, true
}

// full reports whether the ring has no room for the next gen.
func (o *order) full() bool { return o.next-o.head >= uint64(len(o.ring)) }

// push appends h and returns its gen. The caller makes room first (see
// Mirror.orderRoomLocked): push must not be called when full.
func (o *order) push(h uint64) uint64 {
	g := o.next
	o.next++
	i := g & o.mask()
	o.ring[i] = h
	o.live[i>>6] |= 1 << (i & 63)
	return g
}

// grow doubles the ring (at least 1024 slots), keeping every gen's entry.
func (o *order) grow() {
	size := max(2*len(o.ring), 1024)
	ring, live := make([]uint64, size), make([]uint64, size/64)
	nm := uint64(size - 1)
	for g := o.head; g < o.next; g++ {
		if o.isLive(g) {
			i := g & nm
			ring[i] = o.ring[g&o.mask()]
			live[i>>6] |= 1 << (i & 63)
		}
	}
	o.ring, o.live = ring, live
}
