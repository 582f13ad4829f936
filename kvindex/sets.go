package kvindex

import (
	"sync"
	"sync/atomic"
)

// Holder sets shared between blocks (interned).
//
// A hash held by more than four workers points to a bitset of its holders.
// These used to be one bitset per hash, in its shard's arena. But the
// consecutive blocks of a shared prefix have the same holders (every worker
// that caches block 40 of a system prompt caches its block 39), so at 10,000
// workers a lookup through a 64-block system prompt held by 625 workers
// intersected 64 different 1.5 kB bitsets with its active set: about 100 kB
// of scattered reads, a p50 of 58-86 µs and a per-query floor of 68-112 µs
// against a goal of 10 µs (docs/benchmarks.md §10).
//
// Now a set is immutable once published and shared by every hash with the
// same holders: adding or removing a worker makes (or finds) the set with
// that worker added or removed, copy-on-write. So a lookup whose next block
// points to the same set as the block before knows, by comparing two
// pointers, that the active set does not change, and the walk through a
// shared prefix costs one intersection, not one per block. Sharing also
// divides the bitsets' memory by the length of the runs that share them.
//
// Sets live in one store per index (not per shard: the blocks of a run are
// spread over all shards). Slots refer to a set by its id; a set is freed
// when no slot refers to it and its id is reused for a new *holderSet, never
// by rewriting the old one, so a reader holding a *holderSet reads a
// consistent set. A reader gets a set from a slot under the slot's shard
// seqlock: while that slot refers to the id the set cannot be freed, and any
// change of the slot moves the shard's seq, so the reader retries.
//
// Lock order: shard.mu, then setStore.mu.

// holderSet is one immutable set of worker ids.
type holderSet struct {
	words []uint64
	fp    uint64 // content fingerprint: xor of mixID over the members
	pop   int
	refs  int // slots referring to it; guarded by setStore.mu
	id    uint32
}

type setStore struct {
	mu    sync.Mutex
	words int
	sets  atomic.Pointer[[]atomic.Pointer[holderSet]]
	// byFP finds a set by its fingerprint; a set whose fingerprint is
	// already taken by a different set is simply not registered (a
	// collision costs sharing, never correctness: contents are compared).
	byFP  map[uint64]*holderSet
	free  []uint32
	used  uint32 // ids handed out, free ones included
	bytes int64  // words of live sets, in bytes
	live  int
}

func (st *setStore) init(words int) {
	st.words = words
	st.byFP = make(map[uint64]*holderSet)
	sets := make([]atomic.Pointer[holderSet], 0)
	st.sets.Store(&sets)
}

// get returns set id for readers. It is nil only for an id freed meanwhile
// (the caller's seqlock check then fails and it retries).
func (st *setStore) get(id uint64) *holderSet {
	sets := *st.sets.Load()
	if id >= uint64(len(sets)) {
		return nil
	}
	return sets[id].Load()
}

// mixID is a worker id's contribution to a set's fingerprint (splitmix64).
func mixID(id uint16) uint64 {
	z := uint64(id) + 0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

func (s *holderSet) has(id uint16) bool {
	wi := int(id) / 64
	return wi < len(s.words) && s.words[wi]&(1<<(id%64)) != 0
}

// The methods below take st.mu.

// intern returns a reference to the set whose words are those of base
// (nil: empty) with id flipped, creating it if no equal set exists.
// fp and pop are the result's fingerprint and population.
func (st *setStore) intern(base []uint64, flip uint16, fp uint64, pop int) *holderSet {
	if c := st.byFP[fp]; c != nil && c.pop == pop && equalFlipped(c.words, base, flip) {
		c.refs++
		return c
	}
	words := make([]uint64, st.words)
	copy(words, base)
	words[flip/64] ^= 1 << (flip % 64)
	return st.publish(words, fp, pop)
}

// equalFlipped reports whether a equals b with bit flip toggled.
func equalFlipped(a, b []uint64, flip uint16) bool {
	fw, fb := int(flip)/64, uint64(1)<<(flip%64)
	for i := range a {
		var w uint64
		if i < len(b) {
			w = b[i]
		}
		if i == fw {
			w ^= fb
		}
		if a[i] != w {
			return false
		}
	}
	return true
}

// publish makes words a set with one reference.
func (st *setStore) publish(words []uint64, fp uint64, pop int) *holderSet {
	s := &holderSet{words: words, fp: fp, pop: pop, refs: 1}
	if n := len(st.free); n > 0 {
		s.id = st.free[n-1]
		st.free = st.free[:n-1]
	} else {
		s.id = st.used
		st.used++
		sets := *st.sets.Load()
		if int(st.used) > len(sets) {
			grown := make([]atomic.Pointer[holderSet], max(int(st.used), 2*len(sets), 16))
			for i := range sets {
				grown[i].Store(sets[i].Load())
			}
			st.sets.Store(&grown)
		}
	}
	(*st.sets.Load())[s.id].Store(s)
	if st.byFP[fp] == nil {
		st.byFP[fp] = s
	}
	st.bytes += int64(len(words)) * 8
	st.live++
	return s
}

// fromIDs returns a reference to the set of ids (distinct, non-zero).
func (st *setStore) fromIDs(ids []uint16) *holderSet {
	st.mu.Lock()
	defer st.mu.Unlock()
	var fp uint64
	for _, id := range ids[1:] {
		fp ^= mixID(id)
	}
	words := make([]uint64, st.words)
	for _, id := range ids[1:] {
		words[id/64] |= 1 << (id % 64)
	}
	return st.intern(words, ids[0], fp^mixID(ids[0]), len(ids))
}

// with returns a reference to s ∪ {id} (id not in s). The caller still
// holds its reference to s (shard.swapSet drops it).
func (st *setStore) with(s *holderSet, id uint16) *holderSet {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.intern(s.words, id, s.fp^mixID(id), s.pop+1)
}

// without returns a reference to s \ {id} (id in s), like with.
func (st *setStore) without(s *holderSet, id uint16) *holderSet {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.intern(s.words, id, s.fp^mixID(id), s.pop-1)
}

// release drops one reference to s.
func (st *setStore) release(s *holderSet) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.releaseLocked(s)
}

func (st *setStore) releaseLocked(s *holderSet) {
	if s.refs--; s.refs > 0 {
		return
	}
	if st.byFP[s.fp] == s {
		delete(st.byFP, s.fp)
	}
	(*st.sets.Load())[s.id].Store(nil)
	st.free = append(st.free, s.id)
	st.bytes -= int64(len(s.words)) * 8
	st.live--
}

// memory is the bytes of live sets and of the id table.
func (st *setStore) memory() int64 {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.bytes + int64(len(*st.sets.Load()))*8 + int64(st.live)*64
}
