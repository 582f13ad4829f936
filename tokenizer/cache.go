package tokenizer

import (
	"container/list"
	"strings"
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
	items  map[cacheKey]cacheRef
	hits   uint64
	misses uint64
}

type cacheKey struct {
	model *Model
	hash  uint64
	n     int // prefix length in bytes; for EncodeTurns, -1
}

// cacheEntry holds the prefixes (cuts) one call stored, each the first
// count ids of its run. The prefixes of one call leave the cache together.
type cacheEntry struct {
	keys []cacheKey // the keys that point here (see put)
	run  *run
}

// run is an array of ids that successive turns of one conversation share:
// each entry holds a prefix of it, and a call that extends the run's last
// stored prefix writes its new ids after it, in the array's spare room,
// instead of copying the prefix (EncodeTurnsIDs). Ids below used are never
// written again, so a prefix handed out stays valid while later calls
// append. used, refs and memo are guarded by the cache's mutex.
type run struct {
	ids []uint32 // len(ids) == cap(ids): the whole array
	// used is how many ids are written; only a call extending exactly
	// used ids may write after them.
	used int
	// refs counts the cache entries that hold the run: the cache charges
	// the run's array and memo once, while refs > 0.
	refs int
	// memo holds, per block size and seed, values per block over the
	// run's ids (the sequence hashes the caller computes), each depending
	// only on the ids up to its block's end; see IDs.Memo.
	memo []blockMemo
}

type blockMemo struct {
	key  MemoKey
	vals []uint64
}

// maxMemos bounds the block sizes and seeds one run remembers values for.
const maxMemos = 8

// cacheRef is where a prefix's ids are: the first count ids of an entry's
// run.
type cacheRef struct {
	el    *list.Element
	count int
}

// entryOverhead approximates the bytes an entry costs beyond its ids (list
// element, slices, headers); keyOverhead what each key adds (map slot).
const (
	entryOverhead = 128
	keyOverhead   = 64
)

// storeEvery is how many new tokens pass between stored prefixes inside
// one call (the last boundary is always stored). Intermediate prefixes let
// an edit in the middle of a history reuse what precedes it.
const storeEvery = 1024

// NewPrefixCache returns a cache holding at most maxBytes of token ids.
func NewPrefixCache(maxBytes int64) *PrefixCache {
	return &PrefixCache{maxBytes: maxBytes, lru: list.New(), items: map[cacheKey]cacheRef{}}
}

// CacheStats is a snapshot of a PrefixCache's counters.
type CacheStats struct {
	Hits, Misses uint64 // calls that reused a prefix, and those that did not
	Entries      int    // prefixes held
	Bytes        int64
}

// Stats returns the cache's counters.
func (c *PrefixCache) Stats() CacheStats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return CacheStats{Hits: c.hits, Misses: c.misses, Entries: len(c.items), Bytes: c.bytes}
}

func (c *PrefixCache) get(k cacheKey) (*run, int, bool) {
	ref, ok := c.items[k]
	if !ok {
		return nil, 0, false
	}
	c.lru.MoveToFront(ref.el)
	return ref.el.Value.(*cacheEntry).run, ref.count, true
}

// longest finds the longest cached of n prefixes, key(k) naming the k-th
// (longer with k), and counts the hit or miss: it returns the prefix's
// index, its run and its length, or -1 when none is cached.
func (c *PrefixCache) longest(n int, key func(k int) cacheKey) (int, *run, int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k := n - 1; k >= 0; k-- {
		if r, count, ok := c.get(key(k)); ok {
			c.hits++
			return k, r, count
		}
	}
	c.misses++
	return -1, nil, 0
}

// put stores ids with the prefixes keys[i] of counts[i] ids each (counts
// ascending, the last len(ids)). A key already held keeps its entry (the
// ids of one prefix are the same whichever call stored them). ids may be
// the start of a caller's result: the run never writes to it.
func (c *PrefixCache) put(keys []cacheKey, counts []int, ids []uint32) {
	ids = ids[:cap(ids)]
	r := &run{ids: ids, used: len(ids)}
	if runBytes(r)+entryBytes(len(keys)) > c.maxBytes || len(keys) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.putLocked(keys, counts, r)
}

// putLocked stores r's prefixes keys[i] of counts[i] ids each.
func (c *PrefixCache) putLocked(keys []cacheKey, counts []int, r *run) {
	e := &cacheEntry{run: r}
	var el *list.Element
	for i, k := range keys {
		if ref, ok := c.items[k]; ok {
			c.lru.MoveToFront(ref.el)
			continue
		}
		if el == nil {
			el = c.lru.PushFront(e)
		}
		c.items[k] = cacheRef{el: el, count: counts[i]}
		e.keys = append(e.keys, k)
	}
	if el == nil {
		return // every prefix was held already
	}
	if r.refs == 0 {
		c.bytes += runBytes(r)
	}
	r.refs++
	c.bytes += entryBytes(len(e.keys)) // the keys held already are charged to their own entries
	c.evictLocked()
}

// evictLocked removes the least recently used entries until the cache is
// within its bound.
func (c *PrefixCache) evictLocked() {
	for c.bytes > c.maxBytes && c.lru.Len() > 0 {
		last := c.lru.Back()
		old := last.Value.(*cacheEntry)
		c.lru.Remove(last)
		for _, k := range old.keys {
			delete(c.items, k)
		}
		c.bytes -= entryBytes(len(old.keys))
		if old.run.refs--; old.run.refs == 0 {
			c.bytes -= runBytes(old.run)
			old.run.memo = nil // nothing remembers into a run the cache no longer holds
		}
	}
}

// entryBytes is what an entry holding keys prefixes is charged beyond its
// run.
func entryBytes(keys int) int64 {
	return entryOverhead + int64(keys)*keyOverhead
}

// runBytes is what a run is charged while entries hold it: its whole array
// (the spare room included) and its memo.
func runBytes(r *run) int64 {
	n := int64(cap(r.ids)) * 4
	for _, m := range r.memo {
		n += int64(cap(m.vals)) * 8
	}
	return n
}

// EncodeCached returns m.Encode(text), reusing the ids of the longest
// prefix of text that c holds and storing prefixes of text for later
// calls. A nil cache encodes in full. The result may share its memory with
// the cache: a caller may append to it but must not change its ids.
//
// Prefixes end where the encoding provably splits: just after a raw-matched
// added token, and, for models whose pre-tokenization is only the cl100k,
// Qwen 2 or o200k split (no normalizer), between a "\n" and a following
// "<|im_start|>" (see chatMLTurns), which ChatML writes between turns but
// o200k_base and cl100k_base do not know as special tokens.
func (m *Model) EncodeCached(c *PrefixCache, text string) []uint32 {
	if c == nil {
		return m.Encode(text)
	}
	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	sc.matches = m.rawAdded.find(text, sc.matches[:0])
	cuts := sc.matches
	if m.chatMLTurns() {
		sc.cuts = appendTurnCuts(sc.cuts[:0], text, cuts)
		cuts = sc.cuts
	}

	hashes := sc.hashes[:0]
	h := xxh3.New()
	prev := 0
	for _, cut := range cuts {
		_, _ = h.WriteString(text[prev:cut.stop])
		hashes = append(hashes, h.Sum64())
		prev = cut.stop
	}
	sc.hashes = hashes

	best, r, count := c.longest(len(cuts), func(k int) cacheKey { return cacheKey{m, hashes[k], cuts[k].stop} })
	var cached []uint32
	if r != nil {
		cached = r.ids[:count]
	}

	prev = 0
	if best >= 0 {
		prev = cuts[best].stop
	}
	// The new ids are built in the scratch's buffer; the result is
	// allocated once, at its final length, and receives the cached ids and
	// the new ones: that copy is both the result and what the cache keeps.
	// (Built in a fresh slice, a 4k-token chat's ids were allocated at an
	// estimate of their count, then copied again for the cache; gathered
	// in the scratch first, a next turn's cached ids were copied twice.)
	base := len(cached)
	out := sc.ids[:0]
	lastStored := base
	keys, counts := sc.keys[:0], sc.counts[:0]
	for k := best + 1; k < len(cuts); k++ {
		cut := cuts[k]
		out = m.appendSegment(out, text[prev:cut.start], prev == 0, sc)
		if cut.stop > cut.start { // an added token; a turn cut has no width
			out = append(out, cut.id)
		}
		prev = cut.stop
		if k == len(cuts)-1 || base+len(out)-lastStored >= storeEvery {
			keys = append(keys, cacheKey{m, hashes[k], cut.stop})
			counts = append(counts, base+len(out))
			lastStored = base + len(out)
		}
	}
	out = m.appendSegment(out, text[prev:], prev == 0, sc)
	res := make([]uint32, base+len(out))
	copy(res, cached)
	copy(res[base:], out)
	if cap(out) <= maxScratchIDs {
		sc.ids = out[:0]
	} else {
		sc.ids = nil // one huge prompt does not pin its buffer in the pool
	}
	if len(keys) > 0 {
		// One copy for every prefix stored: a copy each was 2.5 times a
		// fresh 4k chat's ids in garbage.
		c.put(keys, counts, res[:counts[len(counts)-1]])
	}
	sc.keys, sc.counts = keys[:0], counts[:0]
	return res
}

// maxScratchIDs bounds the ids buffer a pooled scratch keeps (256 kB).
const maxScratchIDs = 64 << 10

// chatMLTurn is the text ChatML starts every turn with.
const chatMLTurn = "<|im_start|>"

// chatMLTurns reports whether the encoding provably splits between a "\n"
// and a following "<|im_start|>" in text between added tokens, for any text
// around them. It does when the text reaches the split pattern unchanged
// (byte-level, no normalizer, no normalized added tokens) and the pattern
// is cl100k's (Llama 3's), Qwen 2's or o200k's. The argument, for T = A+B
// where A ends in "\n" and B starts with "<":
//
//  1. No match of the pattern in T contains both that "\n" and that "<".
//     The word alternatives ([^\r\n\p{L}\p{N}]?\p{L}+ and o200k's two, and
//     the contractions) contain no "\n"; \p{N}{1,3} neither; the symbol
//     run ' ?[^\s\p{L}\p{N}]+[\r\n/]*' can hold a "\n" only in its
//     trailing [\r\n/]*, which "<" cannot follow inside it; the three
//     whitespace alternatives hold no "<". Every character starts some
//     match, so one match ends exactly at len(A).
//  2. Matches from len(A) on are B's own: the pattern has no look-behind
//     and no anchors, so a match at q depends on T[q:] only.
//  3. Matches before len(A) are A's own. A match at q < len(A) ends at
//     most at len(A) (by 1), so each alternative has the same candidate
//     matches in T as in A, which differ only in what follows, except
//     where a look-ahead reads T[len(A)]: \s+(?!\S) ending at len(A) holds
//     in A (end of text) and fails in T ("<" is \S). But such a candidate
//     spans whitespace ending in A's "\n", which \s*[\r\n]+, an earlier
//     alternative, matches with the same end in both, so the backtracking
//     order picks the same match in both.
//
// BPE then runs on each piece alone, so Encode(A+B) = Encode(A) ++
// Encode(B). GPT-2's pattern fails 3 (it has no \s*[\r\n]+: "x\n\n<"
// splits "\n\n" alone but "\n", "\n" before "<"), so it gets no turn cuts;
// TestEncodeCachedEqualsEncodeAcrossChatMLTurns checks the result against
// Encode over generated conversations, hostile contents included.
func (m *Model) chatMLTurns() bool {
	if !m.byteLevel || m.norm != nil || m.normAdded != nil {
		return false
	}
	switch m.fast.(type) {
	case cl100kSplitter, o200kSplitter:
		return true
	}
	return false
}

// appendTurnCuts merges into the added-token matches (in order) a cut of
// no width at every position p inside the text between them where
// text[p-1] is "\n" and text[p:] starts with "<|im_start|>".
func appendTurnCuts(dst []addedMatch, text string, matches []addedMatch) []addedMatch {
	prev := 0
	gap := func(end int) {
		for at := prev; at < end; {
			i := strings.Index(text[at:end], "\n"+chatMLTurn)
			if i < 0 {
				break
			}
			p := at + i + 1
			dst = append(dst, addedMatch{start: p, stop: p})
			at = p
		}
	}
	for _, mt := range matches {
		gap(mt.start)
		dst = append(dst, mt)
		prev = mt.stop
	}
	gap(len(text))
	return dst
}
