package engine

import (
	"container/heap"
	"time"

	"github.com/switchyard/switchyard/tokenizer"
)

func (s *seq) decoding() bool { return s.nOut > 0 && s.computed == len(s.tokens)-1 }

func (e *Engine) schedule(now time.Time) {
	e.batch = e.batch[:0]
	e.landPulls(now)
	budget := e.cfg.MaxNumBatchedTokens
	var load time.Duration // of blocks copied back from the host tier

	// 1. Decodes of running requests, one token each, starting at a rotating
	// position so that a budget smaller than the running set serves everyone
	// in turn.
	cands := e.scratch[:0]
	if n := len(e.running); n > 0 {
		start := e.cursor % n
		for i := 0; i < n; i++ {
			if s := e.running[(start+i)%n]; s.decoding() {
				cands = append(cands, s)
			}
		}
		served := 0
		for _, s := range cands {
			if budget == 0 {
				break
			}
			if s.state != stateRunning || s.inBatch != 0 {
				continue // preempted by an earlier candidate
			}
			served++
			if e.reserve(s, 1, &budget) {
				e.add(s, 1, true)
				budget--
			}
		}
		e.cursor = start + served
	}

	// 2. Chunks of running prefills (including recomputes), oldest first.
	cands = append(cands[:0], e.running...)
	for _, s := range cands {
		if budget == 0 {
			break
		}
		if s.state != stateRunning || s.inBatch != 0 || s.decoding() {
			continue
		}
		n := min(len(s.tokens)-s.computed, budget)
		if e.reserve(s, n, &budget) {
			e.add(s, n, false)
			budget -= n
		}
	}
	clear(cands)
	e.scratch = cands[:0]

	// 3. Admit waiting requests while budget, sequence slots and free blocks
	// (above the watermark) allow. A head that does not fit blocks the queue:
	// that is the engine's backpressure; admission never preempts.
	for budget > 0 && len(e.running) < e.cfg.MaxNumSeqs && e.waiting.Len() > 0 {
		s := e.waiting[0]
		if len(s.blocks) > 0 { // a landed transfer: its blocks are held
			if !e.admitLanded(s, &budget) {
				break
			}
			continue
		}
		bs := e.cfg.BlockSize
		maxHit := (len(s.tokens) - 1) / bs // always compute at least one token
		hits, hitFree := 0, 0
		for hits < maxHit && hits < len(s.hashes) {
			id, ok := e.pool.lookup(s.hashes[hits])
			if !ok {
				break
			}
			if e.pool.blocks[id].ref == 0 {
				hitFree++
			}
			hits++
		}
		if s.pull == pullPending {
			parked, blocked := e.admitPull(s, now, hits, hitFree)
			if blocked {
				break
			}
			if parked {
				continue
			}
		}
		host := e.hostHits(s, hits, maxHit)
		cached := (hits + host) * bs
		n := min(len(s.tokens)-cached, budget)
		need := e.blocksFor(cached+n) - hits
		if e.pool.nFree-hitFree < need+e.watermark {
			break
		}
		heap.Pop(&e.waiting)
		e.takeBlocks(s, hits, need)
		s.computed, s.nCommitted = cached, hits
		if host > 0 {
			load += e.loadFromHost(s, hits, host)
			e.commitBlocks(s)
		}
		if !s.started {
			s.started = true
			s.cached = cached // loadFromHost split its offloaded part
			e.st.PromptTokens += uint64(s.nPrompt)
			e.st.CachedTokens += uint64(cached)
		}
		s.state = stateRunning
		e.insertRunning(s)
		e.st.PeakRunning = max(e.st.PeakRunning, len(e.running))
		e.add(s, n, false)
		budget -= n
	}

	var shape StepShape
	for _, be := range e.batch {
		switch {
		case be.n == 0:
		case be.decode:
			shape.DecodeTokens++
		default:
			shape.PrefillTokens += be.n
		}
	}
	if shape.DecodeTokens == 0 && shape.PrefillTokens == 0 {
		e.batch = e.batch[:0]
		if e.unlandStuck() {
			e.schedule(now) // once: no landed transfer is left
		}
		return
	}
	shape.KVUsage = float64(e.pool.used()) / float64(e.cfg.NumBlocks)
	d := e.timing.StepTime(shape) + load
	if d <= 0 {
		d = 1
	}
	e.inflight = true
	e.batchEnd = now.Add(d)
	e.st.Steps++
	e.st.BusyTime += d
	e.st.PrefillTokens += uint64(shape.PrefillTokens)
	e.st.DecodeTokens += uint64(shape.DecodeTokens)
}

// admitLanded moves s, whose transfer landed, into the running set to
// prefill the rest of its prompt, or reports false when the pool cannot
// hold the blocks of its first chunk.
func (e *Engine) admitLanded(s *seq, budget *int) bool {
	n := min(len(s.tokens)-s.computed, *budget)
	need := e.blocksFor(s.computed+n) - len(s.blocks)
	if e.pool.nFree < need+e.watermark {
		return false
	}
	heap.Pop(&e.waiting)
	e.landed--
	for i := 0; i < need; i++ {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
	s.state = stateRunning
	e.insertRunning(s)
	e.st.PeakRunning = max(e.st.PeakRunning, len(e.running))
	e.add(s, n, false)
	*budget -= n
	return true
}

func (e *Engine) add(s *seq, n int, decode bool) {
	e.batch = append(e.batch, batchEntry{s: s, n: n, decode: decode})
	s.inBatch = len(e.batch)
}

// reserve makes sure s has blocks for n more tokens, preempting the newest
// lowest-priority running requests as needed. It reports false when s itself
// had to be preempted.
func (e *Engine) reserve(s *seq, n int, budget *int) bool {
	need := e.blocksFor(s.computed+n) - len(s.blocks)
	for e.pool.nFree < need {
		victim := e.running[len(e.running)-1]
		e.preempt(victim, budget)
		if victim == s {
			return false
		}
	}
	for i := 0; i < need; i++ {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
	return true
}

// preempt moves a running request back to the waiting queue, releasing its
// blocks (cached full blocks stay findable, so its recompute may hit them).
// Its generated tokens are kept: the recompute prefills prompt and output.
func (e *Engine) preempt(v *seq, budget *int) {
	if v.inBatch != 0 {
		be := &e.batch[v.inBatch-1]
		*budget += be.n
		be.n = 0
		v.inBatch = 0
	}
	e.removeRunning(v)
	e.pool.releaseAll(v.blocks)
	v.blocks = v.blocks[:0]
	v.computed, v.nCommitted = 0, 0
	v.state = stateWaiting
	heap.Push(&e.waiting, v)
	e.st.Preemptions++
}

func (e *Engine) complete(end time.Time) {
	for i, be := range e.batch {
		s := be.s
		// Skip entries refunded by a preemption and requests cancelled or
		// preempted (and possibly re-admitted under a newer entry) meanwhile.
		if be.n == 0 || s.state != stateRunning || s.inBatch != i+1 {
			continue
		}
		s.inBatch = 0
		s.computed += be.n
		e.commitBlocks(s)
		if s.computed < len(s.tokens) {
			continue // mid-prefill chunk: no token yet
		}
		tok := outputToken(s.outBase, s.nOut)
		s.tokens = append(s.tokens, tok)
		s.nOut++
		e.st.OutputTokens++
		d := Delta{Time: end, Token: tok, HasToken: true, Index: s.nOut - 1,
			PromptTokens: s.nPrompt, CachedTokens: s.cached, HostCachedTokens: s.hostCached,
			DiskCachedTokens: s.diskCached, TransferredTokens: s.transferred}
		if s.nOut >= s.req.MaxTokens {
			e.st.Finished++
			d.Finish = FinishLength
			e.end(s, d)
			continue
		}
		e.deliver(s, d)
	}
	e.batch = e.batch[:0]
}

// outputToken is the k-th synthetic token of a request: a splitmix64 of the
// request's base hash and k, mapped into the default tokenizer's id range.
func outputToken(base uint64, k int) uint32 {
	z := base + uint64(k+1)*0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	z ^= z >> 31
	return tokenizer.FirstID + uint32(z%uint64(tokenizer.VocabSize-tokenizer.FirstID))
}

// takeBlocks gives s, just popped from the waiting queue, its first hits
// prompt blocks from the cache (touched, so they are not evicted) and need
// newly allocated ones after them.
func (e *Engine) takeBlocks(s *seq, hits, need int) {
	for i := 0; i < hits; i++ {
		id, _ := e.pool.lookup(s.hashes[i])
		e.pool.touch(id)
		s.blocks = append(s.blocks, id)
	}
	for i := 0; i < need; i++ {
		s.blocks = append(s.blocks, e.pool.allocate())
	}
}
