package tokenizer

import (
	"bytes"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
	"unsafe"
)

// Joint is a place where a model's encoding provably splits: between any
// text ending in its left string and any text starting with its right one
// (see Model.Joint). Chat templates that render message by message write
// such a joint between every two messages, so a conversation's next turn
// can be encoded message by message (EncodeTurns) without rendering,
// scanning or hashing the history again.
type Joint struct {
	m           *Model
	left, right string
}

// Joint returns the joint between texts ending in left and texts starting
// with right, when the model's encoding provably splits there: for every
// text A ending in left and B starting with right (each may follow other
// text), the ids of A+B are A's ids then B's, B encoded as text that does
// not start the input. ok is false when that cannot be shown; callers then
// encode whole texts.
//
// Two arguments are accepted, both on top of conditions on the added tokens
// matched in the raw text (no token can match across the joint, none that
// lstrip or single_word would read across it, right not starting with
// whitespace that rstrip would absorb):
//
//   - left ends in "\n" and right starts with "<", and the model's
//     pre-tokenization splits there in any text (chatMLTurns: cl100k's,
//     Qwen 2's and o200k's split, byte-level, no normalizer) — ChatML's
//     "<|im_end|>\n" | "<|im_start|>";
//   - left ends in an added token's content that the scan provably matches
//     there (no token can match across its start, none longer that could
//     start there, not single_word), so the joint is the end of an added
//     token, where Hugging Face tokenizes either side on its own — Llama
//     3's "<|eot_id|>" | "<|start_header_id|>".
func (m *Model) Joint(left, right string) (Joint, bool) {
	if left == "" || right == "" {
		return Joint{}, false
	}
	last, _ := utf8.DecodeLastRuneInString(left)
	first, _ := utf8.DecodeRuneInString(right)
	if unicode.IsSpace(first) {
		return Joint{}, false // rstrip of a token ending at the joint would read across it
	}
	toks := m.rawTokens()
	for _, t := range toks {
		c := t.content
		for i := 1; i < len(c); i++ {
			if compatSuffix(c[:i], left) && compatPrefix(c[i:], right) {
				return Joint{}, false // a token could match across the joint
			}
		}
		if t.singleWord && (isWordRune(last) || isWordRune(first)) {
			return Joint{}, false
		}
		if t.lstrip && unicode.IsSpace(last) && compatPrefix(c, right) {
			return Joint{}, false // it could start at the joint and take left's whitespace
		}
	}
	j := Joint{m: m, left: left, right: right}
	if m.chatMLTurns() && strings.HasSuffix(left, "\n") && right[0] == '<' {
		return j, true
	}
	for _, t := range toks {
		if t.content != "" && strings.HasSuffix(left, t.content) && m.matchedAtEnd(t, right) {
			return j, true
		}
	}
	return Joint{}, false
}

// matchedAtEnd reports whether the raw scan of any text ending in t's
// content, followed by text starting with right, matches t there: no token
// can match across t's start (whatever precedes it), none longer than t
// can start where t does, and t is not single_word (whose match depends on
// the text before it). Its first rune is no whitespace, which a token
// before it with rstrip would absorb.
func (m *Model) matchedAtEnd(t addedToken, right string) bool {
	r, _ := utf8.DecodeRuneInString(t.content)
	if t.singleWord || unicode.IsSpace(r) {
		return false
	}
	after := t.content + right
	for _, c := range m.rawTokens() {
		if c.content == t.content && c.singleWord {
			return false // of duplicate contents the matcher keeps the first
		}
		for i := 1; i < len(c.content); i++ {
			if compatPrefix(c.content[i:], after) {
				return false
			}
		}
		if len(c.content) > len(t.content) && compatPrefix(c.content, after) {
			return false
		}
	}
	return true
}

func (m *Model) rawTokens() []addedToken {
	if m.rawAdded == nil {
		return nil
	}
	return m.rawAdded.toks
}

// compatSuffix reports whether s can be the end of a text ending in left.
func compatSuffix(s, left string) bool {
	return strings.HasSuffix(left, s) || strings.HasSuffix(s, left)
}

// compatPrefix reports whether s can be the start of a text starting with
// right.
func compatPrefix(s, right string) bool {
	return strings.HasPrefix(right, s) || strings.HasPrefix(s, right)
}

// EncodeTurns is EncodeTurnsIDs with the ids in one slice, which may share
// its memory with the cache (read only, as EncodeCached's).
func (m *Model) EncodeTurns(c *PrefixCache, j Joint, keys []uint64, turn func(i int, dst []byte) []byte, tail string) ([]uint32, bool) {
	x, ok := m.EncodeTurnsIDs(c, j, keys, turn, tail)
	if !ok {
		return nil, false
	}
	return x.Slice(), true
}

// EncodeTurnsIDs returns m.Encode of the text made of len(keys) turns and
// a tail, turn i's text being what turn(i, dst) appends to dst, reusing the
// ids of the longest run of leading turns that c holds and storing the
// turns it encodes. keys[i] must identify turns 0 to i together (a chain
// hash of what renders them): only the turns after the cached run are
// rendered. Every turn must end in j's left string and every turn after the
// first, and a non-empty tail, start with its right one; ok is false when a
// rendered turn does not (the caller then encodes the whole text) or when
// j is not m's.
//
// The result's Head is the turns' ids, Tail the tail's. A call whose turns
// are all cached gets the cached ids as Head, uncopied; a call that
// extends the last turns stored in a cached array writes its new turns'
// ids into the array's spare room (one call only: the others copy), so a
// conversation's next turn does not copy its history either. The Head is
// shared with the cache and other calls: read only.
func (m *Model) EncodeTurnsIDs(c *PrefixCache, j Joint, keys []uint64, turn func(i int, dst []byte) []byte, tail string) (IDs, bool) {
	if c == nil || j.m != m || len(keys) == 0 || (tail != "" && !strings.HasPrefix(tail, j.right)) {
		return IDs{}, false
	}
	best, from, base := c.longest(len(keys), func(k int) cacheKey { return cacheKey{m, keys[k], -1} })

	sc := scratchPool.Get().(*scratch)
	defer scratchPool.Put(sc)
	out, text := sc.ids[:0], sc.text[:0]
	lastStored := base
	storeKeys, counts := sc.keys[:0], sc.counts[:0]
	ok := true
	for i := best + 1; i < len(keys); i++ {
		text = turn(i, text[:0])
		if !bytes.HasSuffix(text, []byte(j.left)) || (i > 0 && !bytes.HasPrefix(text, []byte(j.right))) {
			ok = false
			break
		}
		// The ids keep no reference to the text: the buffer is reused.
		out = m.appendEncodeFrom(out, unsafe.String(unsafe.SliceData(text), len(text)), i == 0, sc)
		if i == len(keys)-1 || base+len(out)-lastStored >= storeEvery {
			storeKeys = append(storeKeys, cacheKey{m, keys[i], -1})
			counts = append(counts, base+len(out))
			lastStored = base + len(out)
		}
	}
	var res IDs
	if ok {
		turns := len(out)
		out = m.appendEncodeFrom(out, tail, false, sc)
		res = c.extend(from, base, out[:turns], len(keys)-best-1, storeKeys, counts)
		if rest := out[len(res.Head)-base:]; len(rest) > 0 {
			res.Tail = append([]uint32(nil), rest...)
		}
	}
	if cap(out) <= maxScratchIDs {
		sc.ids = out[:0]
	} else {
		sc.ids = nil
	}
	if cap(text) <= maxScratchText {
		sc.text = text[:0]
	} else {
		sc.text = nil
	}
	sc.keys, sc.counts = storeKeys[:0], counts[:0]
	return res, ok
}

// extend returns as Head the first base ids of from (nil: none) followed
// by more, the ids of turns new turns, and stores its prefixes keys[i] of
// counts[i] ids each (none: nothing to store, more is empty). The ids go
// after from's in place when from's array has room and no call has written
// past base yet (the winner of two calls extending the same prefix); else
// into a new array with room to grow, which the cache keeps — except for
// one new turn after a prefix that another call extended already (the
// next turns of one history, a shared system prompt's first questions):
// those are neither copied nor stored, and Head is only from's base ids
// (the caller puts more in the Tail). Should such a conversation go on,
// its next request encodes that turn again, once, and stores it.
func (c *PrefixCache) extend(from *run, base int, more []uint32, turns int, keys []cacheKey, counts []int) IDs {
	if len(more) == 0 && len(keys) == 0 {
		if from == nil {
			return IDs{}
		}
		return IDs{Head: from.ids[:base:base], c: c, run: from}
	}
	n := base + len(more)
	c.mu.Lock()
	if from != nil && from.refs > 0 && from.used == base && n <= len(from.ids) {
		copy(from.ids[base:n], more)
		from.used = n
		if len(keys) > 0 {
			c.putLocked(keys, counts, from)
		}
		c.mu.Unlock()
		return IDs{Head: from.ids[:n:n], c: c, run: from}
	}
	if from != nil && from.refs > 0 && from.used != base && turns == 1 {
		c.mu.Unlock()
		return IDs{Head: from.ids[:base:base], c: c, run: from}
	}
	var memo [maxMemos]blockMemo
	var memos []blockMemo
	if from != nil {
		// The values of from's blocks inside the prefix hold for the new
		// array's too (they depend on those ids only); below their length
		// they are never written again, so they are copied unlocked.
		memos = memo[:0]
		for _, m := range from.memo {
			if k := min(len(m.vals), base/m.key.Block); k > 0 {
				memos = append(memos, blockMemo{key: m.key, vals: m.vals[:k:k]})
			}
		}
	}
	c.mu.Unlock()
	// A new array, with room for the turns of a few more requests: append
	// grows it by about a quarter (and zeroes only the room), so the copy
	// of the cached prefix is amortised over the turns that fill the room.
	room := max(n/4, min(n, 512))
	var ids []uint32
	if from != nil {
		ids = append(from.ids[:base:base], more...)
	} else {
		ids = append(make([]uint32, 0, n+room), more...)
	}
	if cap(ids)-n < room {
		ids = slices.Grow(ids, room)
	}
	ids = ids[:cap(ids)]
	r := &run{ids: ids, used: n}
	for _, m := range memos {
		r.memo = append(r.memo, blockMemo{key: m.key, vals: slices.Clone(m.vals)})
	}
	if len(keys) > 0 && runBytes(r)+entryBytes(len(keys)) <= c.maxBytes {
		c.mu.Lock()
		c.putLocked(keys, counts, r)
		c.mu.Unlock()
	}
	return IDs{Head: ids[:n:n], c: c, run: r}
}

// maxScratchText bounds the turn buffer a pooled scratch keeps (64 kB).
const maxScratchText = 64 << 10

// appendEncodeFrom is appendEncode for text that starts the input when
// first is set, and follows other text otherwise.
func (m *Model) appendEncodeFrom(dst []uint32, text string, first bool, sc *scratch) []uint32 {
	sc.matches = m.rawAdded.find(text, sc.matches[:0])
	matches := sc.matches
	prev := 0
	for k := range matches {
		mt := matches[k]
		dst = m.appendSegment(dst, text[prev:mt.start], first && prev == 0, sc)
		dst = append(dst, mt.id)
		prev = mt.stop
	}
	return m.appendSegment(dst, text[prev:], first && prev == 0, sc)
}
