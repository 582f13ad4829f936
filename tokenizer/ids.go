package tokenizer

// IDs is a token list in two parts, Head then Tail, as EncodeTurnsIDs
// returns it: Head may be a prefix shared with a PrefixCache (and with
// other callers' results), so it is read only; Tail is the caller's. A next
// turn of a cached conversation gets the cached ids as Head without a copy.
//
// Values computed per block of the ids and chained from the start (the
// block sequence hashes of kvindex) can be remembered beside the cached
// prefix (Memo, Remember), so that the next turn computes only the blocks
// past the cached ones.
type IDs struct {
	Head, Tail []uint32
	c          *PrefixCache
	run        *run // Head is run.ids[:len(Head)] when set
}

// Len is the number of ids.
func (x IDs) Len() int { return len(x.Head) + len(x.Tail) }

// At returns the i-th id.
func (x IDs) At(i int) uint32 {
	if i < len(x.Head) {
		return x.Head[i]
	}
	return x.Tail[i-len(x.Head)]
}

// AppendTo appends the ids to dst.
func (x IDs) AppendTo(dst []uint32) []uint32 {
	return append(append(dst, x.Head...), x.Tail...)
}

// Slice returns the ids as one slice: Head itself when Tail is empty (read
// only, as Head), else a new slice.
func (x IDs) Slice() []uint32 {
	if len(x.Tail) == 0 {
		return x.Head
	}
	return x.AppendTo(make([]uint32, 0, x.Len()))
}

// MemoKey names a sequence of per-block values: the block size and the
// seed they were computed with.
type MemoKey struct {
	Block int
	Seed  uint64
}

// Memo returns the values remembered under k for Head's leading full
// blocks (at most len(Head)/k.Block of them; none when Head is not from a
// cache). The slice is shared: read only.
func (x IDs) Memo(k MemoKey) []uint64 {
	if x.run == nil || k.Block <= 0 || len(x.Head) < k.Block {
		return nil
	}
	x.c.mu.Lock()
	defer x.c.mu.Unlock()
	for i := range x.run.memo {
		if m := &x.run.memo[i]; m.key == k {
			return m.vals[:min(len(m.vals), len(x.Head)/k.Block):min(len(m.vals), len(x.Head)/k.Block)]
		}
	}
	return nil
}

// Remember keeps vals under k beside Head's cached run, for later calls
// whose Head shares it: vals[i] must be the value of block i of k.Block
// ids, computed from the ids up to that block's end only (a chained hash
// does). Only the blocks inside Head are kept; values already remembered
// are not replaced (they are the same). It does nothing when Head is not
// from a cache that still holds it, and charges the values to the cache.
func (x IDs) Remember(k MemoKey, vals []uint64) {
	if x.run == nil || k.Block <= 0 {
		return
	}
	vals = vals[:min(len(vals), len(x.Head)/k.Block)]
	if len(vals) == 0 {
		return
	}
	c := x.c
	c.mu.Lock()
	defer c.mu.Unlock()
	r := x.run
	if r.refs == 0 {
		return
	}
	i := 0
	for i < len(r.memo) && r.memo[i].key != k {
		i++
	}
	if i == len(r.memo) {
		if len(r.memo) == maxMemos {
			return
		}
		r.memo = append(r.memo, blockMemo{key: k})
	}
	m := &r.memo[i]
	if len(vals) <= len(m.vals) {
		return
	}
	before := int64(cap(m.vals)) * 8
	// Appending never writes below len(m.vals): a reader holding an
	// earlier slice of the memo reads only those.
	m.vals = append(m.vals, vals[len(m.vals):]...)
	c.bytes += int64(cap(m.vals))*8 - before
	c.evictLocked()
}
