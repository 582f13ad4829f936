package engine

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTheLazyPoolAllocatesAndEvictsExactlyAsAnEagerOne is the differential
// test of the lazily materialised pool: random allocations, references,
// commits, releases (leaf first, and of single blocks, hashed or not) and
// clears drive it and eagerPool, the pool as it was when it built every
// block up front, and every allocated id, every eviction and every count
// must agree.
func TestTheLazyPoolAllocatesAndEvictsExactlyAsAnEagerOne(t *testing.T) {
	for seed := range uint64(200) {
		rng := rand.New(rand.NewPCG(seed, 29))
		n := 1 + rng.IntN(64)
		var lazyEv, eagerEv []uint64
		lazy := newPool(n, func(h uint64) { lazyEv = append(lazyEv, h) })
		eager := newEagerPool(n, func(h uint64) { eagerEv = append(eagerEv, h) })
		var held []int32 // one entry per reference
		for step := range 400 {
			switch op := rng.IntN(10); {
			case op < 4 && eager.nFree > 0:
				id := eager.allocate()
				require.Equal(t, id, lazy.allocate(), "seed %d step %d: allocated block", seed, step)
				held = append(held, id)
			case op < 6 && len(held) > 0:
				// Commit a held block under one of few hashes, so
				// duplicates and hits happen.
				id, h := held[rng.IntN(len(held))], uint64(1+rng.IntN(3*n))
				require.Equal(t, eager.commit(id, h), lazy.commit(id, h), "seed %d step %d: commit", seed, step)
			case op < 7:
				h := uint64(1 + rng.IntN(3*n))
				id, ok := eager.lookup(h)
				lid, lok := lazy.lookup(h)
				require.Equal(t, ok, lok, "seed %d step %d: lookup", seed, step)
				require.Equal(t, id, lid, "seed %d step %d: lookup", seed, step)
				if ok {
					eager.touch(id)
					lazy.touch(id)
					held = append(held, id)
				}
			case op < 9 && len(held) > 0:
				k := rng.IntN(len(held))
				eager.release(held[k])
				lazy.release(held[k])
				held = append(held[:k], held[k+1:]...)
			case op < 10 && len(held) > 0 && rng.IntN(8) == 0:
				// Free everything, leaf first, sometimes forgetting
				// every hash after (a cleared cache).
				eager.releaseAll(held)
				lazy.releaseAll(held)
				held = held[:0]
				if rng.IntN(2) == 0 {
					eager.clear()
					lazy.clear()
				}
			}
			require.Equal(t, eager.nFree, lazy.nFree, "seed %d step %d: free blocks", seed, step)
			require.Equal(t, eager.used(), lazy.used())
			require.Equal(t, len(eager.cached), len(lazy.cached))
			require.Equal(t, eagerEv, lazyEv, "seed %d step %d: evictions", seed, step)
		}
	}
}

func TestAPoolNobodyUsedHoldsNoBlocks(t *testing.T) {
	p := newPool(1<<20, func(uint64) {})
	require.Empty(t, p.blocks)
	require.Equal(t, 1<<20, p.nFree)
	require.Zero(t, p.used())
	require.Equal(t, int32(0), p.allocate())
	require.LessOrEqual(t, cap(p.blocks), 256, "the first allocation materialises a few blocks, not the pool")
}

// eagerPool is the pool as it was before it was materialised lazily, kept
// as the model of TestTheLazyPoolAllocatesAndEvictsExactlyAsAnEagerOne.
type eagerPool struct {
	blocks []eagerBlock
	head   int32 // next block to evict, or -1
	tail   int32
	nFree  int
	cached map[uint64]int32 // sequence hash → block
	// evicted is called with the hash of a cached block being reallocated.
	evicted func(hash uint64)
}

type eagerBlock struct {
	hash       uint64
	hashed     bool
	ref        int32
	prev, next int32
}

func newEagerPool(n int, evicted func(uint64)) *eagerPool {
	p := &eagerPool{
		blocks:  make([]eagerBlock, n),
		head:    -1,
		tail:    -1,
		cached:  make(map[uint64]int32),
		evicted: evicted,
	}
	for i := range p.blocks {
		p.blocks[i].prev, p.blocks[i].next = -1, -1
		p.pushTail(int32(i))
	}
	return p
}

func (p *eagerPool) used() int { return len(p.blocks) - p.nFree }

func (p *eagerPool) unlink(id int32) {
	b := &p.blocks[id]
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		p.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		p.tail = b.prev
	}
	b.prev, b.next = -1, -1
	p.nFree--
}

func (p *eagerPool) pushTail(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = p.tail, -1
	if p.tail >= 0 {
		p.blocks[p.tail].next = id
	} else {
		p.head = id
	}
	p.tail = id
	p.nFree++
}

func (p *eagerPool) pushHead(id int32) {
	b := &p.blocks[id]
	b.prev, b.next = -1, p.head
	if p.head >= 0 {
		p.blocks[p.head].prev = id
	} else {
		p.tail = id
	}
	p.head = id
	p.nFree++
}

// allocate takes the head of the free list, evicting its cached content.
// The caller has checked nFree > 0.
func (p *eagerPool) allocate() int32 {
	id := p.head
	p.unlink(id)
	b := &p.blocks[id]
	if b.hashed {
		delete(p.cached, b.hash)
		b.hashed = false
		p.evicted(b.hash)
	}
	b.ref = 1
	return id
}

// lookup finds the cached block holding hash.
func (p *eagerPool) lookup(hash uint64) (int32, bool) {
	id, ok := p.cached[hash]
	return id, ok
}

// touch takes one more reference on a block, reviving it if free.
func (p *eagerPool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// release drops one reference; the last one frees the block.
func (p *eagerPool) release(id int32) {
	b := &p.blocks[id]
	b.ref--
	if b.ref > 0 {
		return
	}
	if b.hashed {
		p.pushTail(id)
	} else {
		p.pushHead(id)
	}
}

// releaseAll frees a sequence's blocks leaf first (see the type comment).
func (p *eagerPool) releaseAll(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		p.release(ids[i])
	}
}

// commit makes an in-use block findable under hash. It reports false when
// another block already holds that hash (two sequences computed the same
// block concurrently); the duplicate stays private, as in vLLM.
func (p *eagerPool) commit(id int32, hash uint64) bool {
	if _, dup := p.cached[hash]; dup {
		return false
	}
	b := &p.blocks[id]
	b.hash, b.hashed = hash, true
	p.cached[hash] = id
	return true
}

// clear forgets every cached hash. The caller guarantees no block is in use.
func (p *eagerPool) clear() {
	for h, id := range p.cached {
		p.blocks[id].hashed = false
		delete(p.cached, h)
	}
}
