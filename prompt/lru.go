package prompt

import (
	"container/list"
	"sync"
)

// tokenCache is a bounded LRU of token ids by key: the engine path's cache.
// Its size counts the ids' bytes plus a fixed overhead per entry. Safe for
// concurrent use.
type tokenCache struct {
	mu       sync.Mutex
	max, cur int64
	ll       *list.List
	items    map[uint64]*list.Element
}

type cacheEntry struct {
	key    uint64
	tokens []uint32
	total  int
}

const cacheEntryOverhead = 96

func newTokenCache(maxBytes int64) *tokenCache {
	return &tokenCache{max: maxBytes, ll: list.New(), items: map[uint64]*list.Element{}}
}

func (c *tokenCache) get(key uint64) ([]uint32, int, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.items[key]
	if !ok {
		return nil, 0, false
	}
	c.ll.MoveToFront(e)
	ent := e.Value.(*cacheEntry)
	return ent.tokens, ent.total, true
}

func (c *tokenCache) put(key uint64, tokens []uint32, total int) {
	size := int64(len(tokens))*4 + cacheEntryOverhead
	if size > c.max {
		return // larger than the whole cache: keeping it would evict everything
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.items[key]; ok {
		old := e.Value.(*cacheEntry)
		c.cur -= int64(len(old.tokens))*4 + cacheEntryOverhead
		old.tokens, old.total = tokens, total
		c.cur += size
		c.ll.MoveToFront(e)
	} else {
		c.items[key] = c.ll.PushFront(&cacheEntry{key: key, tokens: tokens, total: total})
		c.cur += size
	}
	for c.cur > c.max {
		e := c.ll.Back()
		ent := e.Value.(*cacheEntry)
		c.ll.Remove(e)
		delete(c.items, ent.key)
		c.cur -= int64(len(ent.tokens))*4 + cacheEntryOverhead
	}
}
