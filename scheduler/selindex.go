package scheduler

import (
	"math"
	"math/bits"
	"slices"
)

// The selection index lets a decision over a large fleet skip the workers
// whose cost it can know without looking at them one by one. Every
// registered worker is either
//
//   - idle: nothing booked here or elsewhere (local ledger and remote load
//     both zero). Without the prompt's prefix, such a worker's cost depends
//     only on its block size, pool size and calibrated TTFT scale, so idle
//     workers sit in buckets of equal cost (a bitset each): one evaluation
//     per bucket, and a tie among thousands of idle workers resolves to the
//     k-th set bit. Buckets of one (block size, pool) family are kept in
//     ascending scale, which is ascending cost, so a decision stops at the
//     first bucket dearer than the best so far.
//   - loaded: kept in order of a request-independent key such that
//     key + (a term of the request alone) is a lower bound of its cost
//     whenever it holds none of the prompt's prefix (loadedKey,
//     lowerBoundTerm, boundExceeds). The scan stops at the first worker
//     whose bound exceeds the best cost found.
//
// Workers the request reports a prefix on (its Overlaps: few, from the KV
// index) are evaluated exactly, outside both structures. Every cost that
// decides anything is computed by the same functions as the full scan
// (workerCost, ttftCost), and ties resolve over the tied workers in index
// order with the same single random draw, so the choice is the full scan's
// (TestTheIndexedSelectionChoosesWhatTheFullScanChooses checks it on random
// states). The index serves unconstrained requests at temperature 0 without
// spread; pinned and allow-listed requests and sampling keep the full scan,
// which visits only their own candidates or must weigh every worker anyway.
//
// The index is maintained incrementally: a booking, a first token, a
// calibration or a changed remote load re-files one worker (reindex). It is
// rebuilt after SetWorkers and when the selector changes.
type selIndex struct {
	built bool
	sel   Selector // the selector the keys were computed for
	// prune: the TTFT model's costs are monotone enough for lowerBound
	// (ttftPrunable); always true for the blocks selector.
	prune bool

	slots    []slotIndex
	loaded   []loadedEntry // descending (key, idx): see cmpLoaded
	families []*idleFamily
	spare    []*idleBucket
	sizes    []int32 // distinct block sizes of the registered workers

	// queueSum is Σ over registered workers of their booked prefill time
	// (reference ms), the numerator of the TTFT selector's fleet load L.
	queueSum float64
	minSlow  float64 // least ttftSlow of the registered workers
	minDirty bool

	tie     []uint64      // scratch: tied workers as a bitset
	exact   []idxCost     // scratch: exactly evaluated candidates
	buckets []*idleBucket // scratch: idle buckets at the best cost so far
}

type slotIndex struct {
	loaded bool
	key    float64     // while loaded
	bucket *idleBucket // while idle
	slow   float64     // the ledger's ttftSlow when filed
	queue  float64     // booked prefill time, reference ms (ttft only)
}

type loadedEntry struct {
	key float64
	idx int32
}

func (a loadedEntry) less(b loadedEntry) bool {
	return a.key < b.key || (a.key == b.key && a.idx < b.idx)
}

type idxCost struct {
	idx  int
	cost float64
}

// idleFamily is the idle workers of one block size and pool size.
type idleFamily struct {
	blockSize, kvBlocks int32
	buckets             []*idleBucket // ascending slow
}

// idleBucket is the idle workers of one family with one calibrated scale.
type idleBucket struct {
	fam  *idleFamily
	slow float64
	n    int
	bits []uint64 // by worker index
	cost float64  // scratch: this decision's cost
}

func (b *idleBucket) add(i int) {
	b.bits[i>>6] |= 1 << (uint(i) & 63)
	b.n++
}

func (b *idleBucket) remove(i int) {
	b.bits[i>>6] &^= 1 << (uint(i) & 63)
	b.n--
}

// indexable reports whether the index may serve r: the full scan is kept
// for constrained requests (their candidate lists are short: a hard
// session's is its worker) and for sampling and spread (every worker's
// exact cost counts there). A soft session is served: its worker joins
// the exactly evaluated candidates (selectIndexed).
func (c *Core) indexable(r *Request) bool {
	return r.Pinned == "" && len(r.Allowed) == 0 && (!r.Session.Hard || r.Session.Worker == "") && c.cfg.Temperature == 0 &&
		(c.cfg.Selector != SelectorTTFT || c.cfg.TTFT.Spread == 0)
}

// ensureIndex builds the index when it is missing or was built for another
// selector, and refreshes the least scale when it may have risen.
func (c *Core) ensureIndex() {
	ix := &c.ix
	if !ix.built || ix.sel != c.cfg.Selector {
		c.rebuildIndex()
		return
	}
	if ix.minDirty {
		ix.minSlow, ix.minDirty = math.Inf(1), false
		for i := range ix.slots {
			ix.minSlow = min(ix.minSlow, ix.slots[i].slow)
		}
	}
}

func (c *Core) rebuildIndex() {
	ix := &c.ix
	n := len(c.workers)
	for _, f := range ix.families {
		for _, b := range f.buckets {
			clear(b.bits)
			b.n = 0
			ix.spare = append(ix.spare, b)
		}
	}
	ix.families = ix.families[:0]
	ix.loaded = ix.loaded[:0]
	ix.sizes = ix.sizes[:0]
	if cap(ix.slots) < n {
		ix.slots = make([]slotIndex, n)
	}
	ix.slots = ix.slots[:n]
	clear(ix.slots)
	words := (n + 63) >> 6
	if cap(ix.tie) < words {
		ix.tie = make([]uint64, words)
	}
	ix.tie = ix.tie[:words]
	ix.built, ix.sel = true, c.cfg.Selector
	ix.prune = c.cfg.Selector != SelectorTTFT || ttftPrunable(&c.cfg.TTFT)
	ix.queueSum = 0
	ix.minSlow, ix.minDirty = math.Inf(1), false
	for i := range c.workers {
		if bs := c.workers[i].blockSize; !slices.Contains(ix.sizes, bs) {
			ix.sizes = append(ix.sizes, bs)
		}
		c.file(i)
	}
}

// ledgerChanged re-files the ledger's worker after its load or scale
// changed.
func (c *Core) ledgerChanged(l *workerLedger) {
	if c.ix.built && l.slot >= 0 {
		c.reindex(int(l.slot))
	}
}

// reindex moves worker i to where its current load and scale put it.
func (c *Core) reindex(i int) {
	ix := &c.ix
	st := &ix.slots[i]
	if st.loaded {
		e := loadedEntry{st.key, int32(i)}
		j, _ := slices.BinarySearchFunc(ix.loaded, e, cmpLoaded)
		ix.loaded = slices.Delete(ix.loaded, j, j+1)
	} else if b := st.bucket; b != nil {
		b.remove(i)
		if b.n == 0 {
			c.dropBucket(b)
		}
	}
	ix.queueSum -= st.queue
	old := st.slow
	c.file(i)
	switch {
	case st.slow < ix.minSlow:
		ix.minSlow = st.slow
	case old == ix.minSlow && st.slow > old:
		ix.minDirty = true
	}
}

// cmpLoaded orders the loaded workers by descending (key, idx): a scan
// walks from the end, and the workers booked and freed most often, the
// cheap ones, sit there, where inserting and deleting moves least.
func cmpLoaded(a, b loadedEntry) int {
	switch {
	case b.less(a):
		return -1
	case a.less(b):
		return 1
	}
	return 0
}

// file puts worker i (not in any structure) where it belongs.
func (c *Core) file(i int) {
	ix := &c.ix
	s := &c.workers[i]
	st := &ix.slots[i]
	l := s.ledger
	st.slow = l.ttftSlow
	ix.minSlow = min(ix.minSlow, st.slow)
	if l.active == 0 && l.load() == (WorkerLoad{}) && s.remote == (WorkerLoad{}) && !s.engine.on {
		st.loaded, st.key, st.queue = false, 0, 0
		st.bucket = c.bucketFor(s.blockSize, s.kvBlocks, max(st.slow, 0)) // keyed as ttftCost prices it
		st.bucket.add(i)
		return
	}
	st.bucket = nil
	st.loaded = true
	st.key, st.queue = c.loadedKey(s)
	if math.IsNaN(st.key) {
		st.key = math.Inf(-1) // never pruned
	}
	ix.queueSum += st.queue
	e := loadedEntry{st.key, int32(i)}
	j, _ := slices.BinarySearchFunc(ix.loaded, e, cmpLoaded)
	ix.loaded = slices.Insert(ix.loaded, j, e)
}

func (c *Core) bucketFor(blockSize, kvBlocks int32, slow float64) *idleBucket {
	ix := &c.ix
	var f *idleFamily
	for _, x := range ix.families {
		if x.blockSize == blockSize && x.kvBlocks == kvBlocks {
			f = x
			break
		}
	}
	if f == nil {
		f = &idleFamily{blockSize: blockSize, kvBlocks: kvBlocks}
		ix.families = append(ix.families, f)
	}
	j, found := slices.BinarySearchFunc(f.buckets, slow, func(b *idleBucket, s float64) int {
		switch {
		case b.slow < s:
			return -1
		case b.slow > s:
			return 1
		}
		return 0
	})
	if found {
		return f.buckets[j]
	}
	var b *idleBucket
	if k := len(ix.spare); k > 0 {
		b = ix.spare[k-1]
		ix.spare = ix.spare[:k-1]
	} else {
		b = new(idleBucket)
	}
	words := (len(c.workers) + 63) >> 6
	if cap(b.bits) < words {
		b.bits = make([]uint64, words)
	}
	b.bits = b.bits[:words]
	b.fam, b.slow, b.n = f, slow, 0
	f.buckets = slices.Insert(f.buckets, j, b)
	return b
}

// dropBucket returns an empty bucket to the spares (its bits are all
// clear again).
func (c *Core) dropBucket(b *idleBucket) {
	f := b.fam
	if j := slices.Index(f.buckets, b); j >= 0 {
		f.buckets = slices.Delete(f.buckets, j, j+1)
	}
	b.fam = nil
	c.ix.spare = append(c.ix.spare, b)
}

// loadedKey is a loaded worker's key (see lowerBound) and, for the TTFT
// selector, its booked prefill time.
func (c *Core) loadedKey(s *workerSlot) (key, queue float64) {
	load := s.costLoad()
	if c.cfg.Selector != SelectorTTFT {
		// cost = PS·max(0, (P + isl)/B − credit·ovl) + D + blocks − held + priv
		//      ≥ PS·P/B + D  +  PS·isl/B + priv     (ovl = 0, held ≤ blocks)
		return c.cfg.PrefillScale*float64(load.PrefillTokens)*s.invB + float64(load.DecodeBlocks), 0
	}
	m := &c.cfg.TTFT
	p, d := max(0, load.PrefillTokens), max(0, load.ActiveRequests)
	u := 0.0
	if s.kvBlocks > 0 {
		u = min(1, max(0, float64(load.DecodeBlocks)/float64(s.kvBlocks)))
	}
	queue = m.prefillTime(p, d, u)
	if p == 0 {
		return 0, queue
	}
	extra := 0.0
	if d > 0 {
		extra = m.decodeMs(u) - m.Decode[2]
	}
	return (1 + s.ledger.ttftSlow) * (queue - m.prefillMs(d) - extra), queue
}

// ttftPrunable reports whether the TTFT model's cost is bounded below by
// lowerBound: the decode step time must not fall as KV use grows (so more
// use never makes a step cheaper), and decode(1) must not be negative (the
// KV-wait term). The prefill polynomial is increasing and convex by
// TTFTModel.Validate. Under these, with the worker's D decoders, KV use u
// and booked prefill P, and f(n) = prefillTime(n, D, u):
//
//	f(P + x) ≥ f(P) − prefillMs(D) − extra(u) + prefillTime(x, 0, 0)
//
// (convexity: merging two partial steps costs at least their sum minus one
// step's fixed part; the decoders only add to every step), and f(P) −
// prefillMs(D) − extra(u) grows with u, so the worker's key at its own KV
// use (without the request's blocks) bounds it.
func ttftPrunable(m *TTFTModel) bool {
	return m.Decode[1] >= 0 && 2*m.Decode[0]+m.Decode[1] >= 0 && m.decodeMs(1) >= 0
}

// lowerBoundTerm is the request's part of every loaded worker's lower
// bound (key + term ≤ cost for a worker without the prompt's prefix).
func (c *Core) lowerBoundTerm(r *Request) float64 {
	if c.cfg.Selector != SelectorTTFT {
		t := math.Inf(1)
		for _, bs := range c.ix.sizes {
			t = min(t, c.cfg.PrefillScale*float64(r.PromptTokens)/float64(bs)+float64(r.privateBlocks(int(bs))))
		}
		return t
	}
	// cost = scale × (total + (PS − 1 + ext·L)·work + stall + kv_wait) with
	// total ≥ key/scale + work, stall ≥ 0 and kv_wait ≥ 0.
	m := &c.cfg.TTFT
	w := max(0, m.PrefillScale+m.Externality*c.ttft.load)
	return (1 + c.ix.minSlow) * w * m.prefillTime(max(1, r.PromptTokens), 0, 0)
}

// boundExceeds reports whether key + term, less a margin for rounding, is
// above best: the worker cannot cost best or less.
func boundExceeds(key, term, best float64) bool {
	lb := key + term
	return lb-1e-9*(math.Abs(key)+math.Abs(term)+math.Abs(best)+1) > best
}

// selectIndexed is selectWorker for an indexable request. c.ovl holds the
// request's overlaps (c.touched their indices, and the session's worker
// sess when there is one, else -1); the caller resets them.
func (c *Core) selectIndexed(r *Request, cfg *ClassConfig, sess int) (int, bool) {
	ix := &c.ix
	best := math.Inf(1)
	sessCost, sessOK := 0.0, false
	consider := func(i int, cost float64) {
		if i == sess {
			sessCost, sessOK = cost, true
		}
		if cost < best {
			best = cost
		}
		if cost <= best {
			ix.exact = append(ix.exact, idxCost{i, cost})
		}
	}
	// 1. The workers holding a prefix of the prompt, exactly.
	c.stamp++
	ix.exact = ix.exact[:0]
	for _, i := range c.touched {
		if c.allow[i] == c.stamp {
			continue
		}
		c.allow[i] = c.stamp
		s := &c.workers[i]
		if cost, ok := c.costOf(r, cfg, s, int(c.ovl[i]), r.privateBlocks(int(s.blockSize))); ok {
			consider(i, cost)
		}
	}
	// 2. Idle buckets, cheapest scale first within each family. A bucket's
	// members cost the same, so one stands for them all and ties are drawn
	// among the buckets later; with the herd band (the same for every
	// bucket: their members hold no prefix) they differ by their draws,
	// and the one with the least stands for the bucket, exactly.
	ix.buckets = ix.buckets[:0]
	herd := c.herdDraws(0)
	for _, f := range ix.families {
		priv := r.privateBlocks(int(f.blockSize))
		for _, b := range f.buckets {
			var rep int
			if herd {
				rep = c.bucketRepHerd(b)
			} else {
				rep = c.bucketRep(b)
			}
			if rep < 0 {
				continue
			}
			cost, ok := c.costOf(r, cfg, &c.workers[rep], 0, priv)
			if !ok {
				continue
			}
			if !(cost <= best) {
				// Later buckets of the family cost more (before their draws).
				if ix.prune && (herd && boundExceeds(cost-c.herdOffset(&c.workers[rep]), 0, best) || !herd && cost > best) {
					break
				}
				continue
			}
			if herd {
				consider(rep, cost)
				continue
			}
			best = cost
			b.cost = cost
			ix.buckets = append(ix.buckets, b)
		}
	}
	// 3. Loaded workers, in ascending key, until the bound passes the best.
	term := c.lowerBoundTerm(r)
	for j := len(ix.loaded) - 1; j >= 0; j-- {
		e := ix.loaded[j]
		if ix.prune && boundExceeds(e.key, term, best) {
			break
		}
		i := int(e.idx)
		if c.allow[i] == c.stamp {
			continue // holds a prefix: done in 1.
		}
		s := &c.workers[i]
		if cost, ok := c.costOf(r, cfg, s, 0, r.privateBlocks(int(s.blockSize))); ok {
			consider(i, cost)
		}
	}
	// best is the least eligible cost, the full scan's least: the session
	// sticks as it would there, before any draw.
	if sessOK && r.Session.sticks(sessCost, best) {
		return sess, true
	}
	return c.pickTied(best)
}

// bucketRep is a member of b that holds no prefix of the request, or -1.
func (c *Core) bucketRep(b *idleBucket) int {
	for w, word := range b.bits {
		for word != 0 {
			i := w<<6 | bits.TrailingZeros64(word)
			if c.allow[i] != c.stamp {
				return i
			}
			word &= word - 1
		}
	}
	return -1
}

// bucketRepHerd is the member of b holding no prefix of the request with
// the least herd draw, or -1. It compares the draws' integer form
// (herdRank).
func (c *Core) bucketRepHerd(b *idleBucket) int {
	rep, least := -1, uint64(0)
	for w, word := range b.bits {
		for word != 0 {
			i := w<<6 | bits.TrailingZeros64(word)
			word &= word - 1
			if c.allow[i] == c.stamp {
				continue
			}
			if u := c.herdRank(&c.workers[i]); rep < 0 || u < least {
				rep, least = i, u
			}
		}
	}
	return rep
}

// pickTied draws among every worker at cost best, in worker index order,
// as the full scan does: none, the only one, or ties[rng.IntN(len)].
func (c *Core) pickTied(best float64) (int, bool) {
	ix := &c.ix
	ties := c.ties[:0]
	for _, x := range ix.exact {
		if x.cost == best {
			ties = append(ties, x.idx)
		}
	}
	c.ties = ties
	var groups bool
	for _, b := range ix.buckets {
		if b.cost == best {
			groups = true
			break
		}
	}
	if !groups {
		switch len(ties) {
		case 0:
			return -1, false
		case 1:
			return ties[0], true
		}
		slices.Sort(ties)
		return ties[c.rng.IntN(len(ties))], true
	}
	tie := ix.tie
	clear(tie)
	for _, b := range ix.buckets {
		if b.cost == best {
			for w, word := range b.bits {
				tie[w] |= word
			}
		}
	}
	for _, i := range c.touched { // evaluated exactly: in ties if tied
		tie[i>>6] &^= 1 << (uint(i) & 63)
	}
	for _, i := range ties {
		tie[i>>6] |= 1 << (uint(i) & 63)
	}
	n := 0
	for _, word := range tie {
		n += bits.OnesCount64(word)
	}
	k := 0
	if n > 1 {
		k = c.rng.IntN(n)
	}
	for w, word := range tie {
		if m := bits.OnesCount64(word); k >= m {
			k -= m
			continue
		}
		for ; k > 0; k-- {
			word &= word - 1
		}
		return w<<6 | bits.TrailingZeros64(word), true
	}
	return -1, false // unreachable: n > 0
}

// costOf is the configured selector's cost of r on s.
func (c *Core) costOf(r *Request, cfg *ClassConfig, s *workerSlot, ovl, priv int) (float64, bool) {
	if c.cfg.Selector == SelectorTTFT {
		return c.ttftCost(r, cfg, s, ovl, priv)
	}
	return c.workerCost(r, cfg, s, ovl, priv)
}
