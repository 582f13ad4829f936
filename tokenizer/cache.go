package tokenizer

import (
	"container/list"
	"sync"

	"github.com/zeebo/xxh3"
)

// PrefixCache keeps the token ids of text prefixes so that a conversation,
// which resends its whole history every turn, is tokenized in work
// proportional to what is new. It is bounded in bytes with LRU eviction and
// safe for concurrent use; one cache may serve several models (entries are
// keyed by model too).
//
// Prefixes are cut only where tokenization provably splits: at the end of
// an occurrence of a raw-matched added token (special tokens such as
// <|eot_id|>), where Hugging Face tokenizes the text on either side
// independently. The occurrences come from scanning the new text itself, so
// a prefix ends exactly where the full encoding has a boundary, and an
// entry is reused only when the xxh3 hash and length of the new text's
// prefix equal the entry's.
type PrefixCache struct {
	maxBytes int64

	mu     sync.Mutex
	bytes  int64
	lru    *list.List // of *cacheEntry, most recent first
	items  map[cacheKey]*list.Element
	hits   uint64
	misses uint64
}

type cacheKey struct {
	model *Model
	hash  uint64
	n     int // prefix length in bytes
}

type cacheEntry struct {
	key cacheKey
	ids []uint32
}

// entryOverhead approximates the bytes an entry costs beyond its ids (list
// element, map slot, headers).
const entryOverhead = 128

// storeEvery is how many new tokens pass between stored prefixes inside
// one call (the last boundary is always stored). Intermediate entries let an
// edit in the middle of a history reuse what precedes it.
const storeEvery = 1024

// NewPrefixCache returns a cache holding at most maxBytes of token ids.
func NewPrefixCache(maxBytes int64) *PrefixCache {
	return &PrefixCache{maxBytes: maxBytes, lru: list.New(), items: map[cacheKey]*list.Element{}}
}

// CacheStats is a snapshot of a PrefixCache's counters.
type CacheStats struct {
	Hits, Misses uint64 // calls that reused a prefix, and those that did not
	Entries      int
	Bytes        int64
}

// Stats returns the cache's counters.
func (c *PrefixCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits, Misses: c.misses, Entries: c.lru.Len(), Bytes: c.bytes}
}

func (c *PrefixCache) get(k cacheKey) ([]uint32, bool) {
	el, ok := c.items[k]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*cacheEntry).ids, true
}

func (c *PrefixCache) put(k cacheKey, ids []uint32) {
	size := int64(len(ids))*4 + entryOverhead
	if size > c.maxBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.items[k]; ok {
		c.lru.MoveToFront(el)
		return
	}
	c.items[k] = c.lru.PushFront(&cacheEntry{key: k, ids: ids})
	c.bytes += size
	for c.bytes > c.maxBytes {
		el := c.lru.Back()
		e := el.Value.(*cacheEntry)
		c.lru.Remove(el)
		delete(c.items, e.key)
		c.bytes -= int64(len(e.ids))*4 + entryOverhead
	}
}

// EncodeCached returns m.Encode(text), reusing the ids of the longest
// prefix of text that c holds and storing prefixes of text for later
// calls. A nil cache encodes in full.
func (m *Model) EncodeCached(c *PrefixCache, text string) []uint32 {
	if c == nil {
		return m.Encode(text)
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.matches = m.rawAdded.find(text, sc.matches[:0])
	matches := sc.matches

	hashes := make([]uint64, len(matches))
	h := xxh3.New()
	prev := 0
	for k, mt := range matches {
		_, _ = h.WriteString(text[prev:mt.stop])
		hashes[k] = h.Sum64()
		prev = mt.stop
	}

	best := -1
	var cached []uint32
	c.mu.Lock()
	for k := len(matches) - 1; k >= 0; k-- {
		if ids, ok := c.get(cacheKey{m, hashes[k], matches[k].stop}); ok {
			best, cached = k, ids
			break
		}
	}
	if best >= 0 {
		c.hits++
	} else {
		c.misses++
	}
	c.mu.Unlock()

	prev = 0
	if best >= 0 {
		prev = matches[best].stop
	}
	// Room for what is left at about four bytes a token, with slack for
	// text that tokenizes denser: growing a 4k-token result by appends
	// doubled its allocation.
	rest := len(text) - prev
	out := make([]uint32, len(cached), len(cached)+rest/3+8)
	copy(out, cached)
	lastStored := len(out)
	for k := best + 1; k < len(matches); k++ {
		mt := matches[k]
		out = m.appendSegment(out, text[prev:mt.start], prev == 0, sc)
		out = append(out, mt.id)
		prev = mt.stop
		if k == len(matches)-1 || len(out)-lastStored >= storeEvery {
			c.put(cacheKey{m, hashes[k], mt.stop}, append([]uint32(nil), out...))
			lastStored = len(out)
		}
	}
	out = m.appendSegment(out, text[prev:], prev == 0, sc)
	return out
}
