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
type pool struct {
	blocks []block
	head   int32 // next block to evict, or -1
	tail   int32
	nFree  int
	cached map[uint64]int32 // sequence hash → block
	// evicted is called with the hash of a cached block being reallocated.
	evicted func(hash uint64)
}

type block struct {
	hash       uint64
	hashed     bool
	ref        int32
	prev, next int32
}

func newPool(n int, evicted func(uint64)) *pool {
	p := &pool{
		blocks:  make([]block, n),
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

func (p *pool) used() int { return len(p.blocks) - p.nFree }

func (p *pool) unlink(id int32) {
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

func (p *pool) pushTail(id int32) {
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

func (p *pool) pushHead(id int32) {
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
func (p *pool) allocate() int32 {
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
