package engine

// pool is the paged KV cache: NumBlocks blocks, each either in use (ref > 0)
// or free. Free blocks sit on an intrusive doubly linked list whose head is
// evicted first. A free block that still holds a cached full block (hashed)
// stays findable through cached until it is reallocated: that reallocation is
// the eviction and emits a removed event.
//
// Eviction order is "leaves first, then least recently used": a finished or
// preempted sequence releases its blocks last-to-first onto the tail, so a
// chain's leaf always sits nearer the head than its parent, and a parent
// touched alone later moves behind its children. Unhashed free blocks (partial
// blocks, duplicates) carry no value and go to the head.
//
// The pool is materialised lazily: a block exists (has an entry in blocks)
// from its first allocation on. A fleet of simulated engines is mostly
// idle (10,000 engines at the simulator's 54,400 blocks were 13 GB up
// front), and an engine that fills its pool ends where it would have
// started. The order is the eager pool's to the block: that pool's free
// list was every block in id order, and a never-used block is free and
// unhashed, so it only ever left the list from the head, in id order,
// once the unhashed blocks freed to the head were gone and before any
// block freed to the tail. So the free list here is two lists with the
// never-used blocks between them: front (blocks freed to the head), the
// ids len(blocks) to n-1, then back (blocks freed to the tail).
type pool struct {
	blocks []block // ids 0..len(blocks)-1, the blocks used at least once
	n      int     // the pool's size in blocks; ids from len(blocks) on are unused
	front  freeList
	back   freeList
	nFree  int              // free blocks, the never-used ones included
	cached map[uint64]int32 // sequence hash → block
	// evicted is called with the hash of a cached block being reallocated.
	evicted func(hash uint64)
}

// freeList is an intrusive doubly linked list of blocks through their prev
// and next (-1: none).
type freeList struct{ head, tail int32 }

type block struct {
	hash       uint64
	hashed     bool
	on         onList // the free list holding it, if free
	ref        int32
	prev, next int32
}

// onList says which free list holds a block: it is free and on front or
// back, or in use.
type onList uint8

const (
	inUse onList = iota
	onFront
	onBack
)

func newPool(n int, evicted func(uint64)) *pool {
	return &pool{
		n:       n,
		front:   freeList{head: -1, tail: -1},
		back:    freeList{head: -1, tail: -1},
		nFree:   n,
		cached:  make(map[uint64]int32),
		evicted: evicted,
	}
}

func (p *pool) used() int { return p.n - p.nFree }

func (p *pool) list(on onList) *freeList {
	if on == onFront {
		return &p.front
	}
	return &p.back
}

func (p *pool) unlink(id int32) {
	b := &p.blocks[id]
	l := p.list(b.on)
	if b.prev >= 0 {
		p.blocks[b.prev].next = b.next
	} else {
		l.head = b.next
	}
	if b.next >= 0 {
		p.blocks[b.next].prev = b.prev
	} else {
		l.tail = b.prev
	}
	b.prev, b.next, b.on = -1, -1, inUse
	p.nFree--
}

// pushTail frees id behind every other free block.
func (p *pool) pushTail(id int32) {
	b := &p.blocks[id]
	l := &p.back
	b.prev, b.next, b.on = l.tail, -1, onBack
	if l.tail >= 0 {
		p.blocks[l.tail].next = id
	} else {
		l.head = id
	}
	l.tail = id
	p.nFree++
}

// pushHead frees id ahead of every other free block.
func (p *pool) pushHead(id int32) {
	b := &p.blocks[id]
	l := &p.front
	b.prev, b.next, b.on = -1, l.head, onFront
	if l.head >= 0 {
		p.blocks[l.head].prev = id
	} else {
		l.tail = id
	}
	l.head = id
	p.nFree++
}

// materialise makes the lowest never-used block exist, in use, and returns
// it. Its slice grows by doubling, up to the pool's size.
func (p *pool) materialise() int32 {
	if len(p.blocks) == cap(p.blocks) {
		grown := make([]block, len(p.blocks), min(max(2*cap(p.blocks), 256), p.n))
		copy(grown, p.blocks)
		p.blocks = grown
	}
	p.blocks = append(p.blocks, block{prev: -1, next: -1})
	p.nFree--
	return int32(len(p.blocks) - 1)
}

// allocate takes the head of the free list, evicting its cached content.
// The caller has checked nFree > 0.
func (p *pool) allocate() int32 {
	var id int32
	switch {
	case p.front.head >= 0:
		id = p.front.head
	case len(p.blocks) < p.n:
		id = p.materialise()
		p.blocks[id].ref = 1
		return id
	default:
		id = p.back.head
	}
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
func (p *pool) lookup(hash uint64) (int32, bool) {
	id, ok := p.cached[hash]
	return id, ok
}

// touch takes one more reference on a block, reviving it if free.
func (p *pool) touch(id int32) {
	b := &p.blocks[id]
	if b.ref == 0 {
		p.unlink(id)
	}
	b.ref++
}

// release drops one reference; the last one frees the block.
func (p *pool) release(id int32) {
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
func (p *pool) releaseAll(ids []int32) {
	for i := len(ids) - 1; i >= 0; i-- {
		p.release(ids[i])
	}
}

// commit makes an in-use block findable under hash. It reports false when
// another block already holds that hash (two sequences computed the same
// block concurrently); the duplicate stays private, as in vLLM.
func (p *pool) commit(id int32, hash uint64) bool {
	if _, dup := p.cached[hash]; dup {
		return false
	}
	b := &p.blocks[id]
	b.hash, b.hashed = hash, true
	p.cached[hash] = id
	return true
}

// clear forgets every cached hash. The caller guarantees no block is in use.
func (p *pool) clear() {
	for h, id := range p.cached {
		p.blocks[id].hashed = false
		delete(p.cached, h)
	}
}
