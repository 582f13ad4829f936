package engine

import (
	"container/heap"
	"fmt"
	"slices"

	"github.com/zeebo/xxh3"

	"github.com/switchyard/switchyard/kvindex"
)

// Submit queues a request. The returned Stream receives its deliveries
// (unless req.OnDelta is set).
func (e *Engine) Submit(req *Request) (*Stream, error) {
	switch {
	case req.ID == "":
		return nil, fmt.Errorf("%w: empty id", ErrInvalidRequest)
	case len(req.Prompt) == 0:
		return nil, fmt.Errorf("%w: empty prompt", ErrInvalidRequest)
	case req.MaxTokens <= 0:
		return nil, fmt.Errorf("%w: max_tokens %d must be positive", ErrInvalidRequest, req.MaxTokens)
	case req.Transfer != nil && (req.Transfer.Tokens < 0 || req.Transfer.Delay < 0):
		return nil, fmt.Errorf("%w: transfer of %d tokens in %v", ErrInvalidRequest, req.Transfer.Tokens, req.Transfer.Delay)
	}
	total := len(req.Prompt) + req.MaxTokens
	if total > e.cfg.MaxModelLen {
		return nil, fmt.Errorf("%w: %d prompt + %d output tokens exceed max model length %d",
			ErrTooLong, len(req.Prompt), req.MaxTokens, e.cfg.MaxModelLen)
	}
	if e.blocksFor(total)+e.watermark > e.cfg.NumBlocks {
		return nil, fmt.Errorf("%w: %d tokens need more than the %d-block KV pool",
			ErrTooLong, total, e.cfg.NumBlocks)
	}
	seed := req.HashSeed
	if seed == 0 {
		seed = kvindex.BaseSeed
	}
	s := &seq{
		req:     *req,
		tokens:  make([]uint32, len(req.Prompt), total),
		nPrompt: len(req.Prompt),
		seed:    seed,
		state:   stateWaiting,
		outBase: xxh3.HashStringSeed(req.ID, e.cfg.Seed),
	}
	if req.Transfer != nil && req.Transfer.Tokens > 0 {
		t := *req.Transfer
		s.req.Transfer, s.pull = &t, pullPending
	}
	copy(s.tokens, req.Prompt)
	s.req.Prompt = nil // the engine keeps its own copy
	s.hashes = kvindex.AppendSequenceHashes(make([]uint64, 0, total/e.cfg.BlockSize), s.tokens, e.cfg.BlockSize, seed)
	if req.OnDelta == nil {
		s.stream = newStream(req.ID)
	}

	e.mu.Lock()
	defer e.mu.Unlock()
	switch {
	case e.stopped:
		return nil, ErrStopped
	case e.seqs[req.ID] != nil:
		return nil, fmt.Errorf("%w: %q", ErrDuplicateID, req.ID)
	case e.cfg.MaxWaiting > 0 && e.waiting.Len() >= e.cfg.MaxWaiting:
		return nil, fmt.Errorf("%w: %d waiting", ErrQueueFull, e.waiting.Len())
	}
	e.nextSeqNo++
	s.seqNo = e.nextSeqNo
	e.seqs[req.ID] = s
	heap.Push(&e.waiting, s)
	e.st.Submitted++
	e.st.PeakLive = max(e.st.PeakLive, len(e.seqs))
	signal(e.wake)
	signal(e.changed)
	if s.stream == nil {
		return newStream(req.ID), nil // an inert handle: deliveries go to OnDelta
	}
	return s.stream, nil
}

// Cancel ends a request and frees its blocks. It reports whether the request
// was live. The request receives a final delivery with FinishCancelled.
func (e *Engine) Cancel(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.seqs[id]
	if s == nil {
		return false
	}
	e.end(s, Delta{Time: e.clock.Now(), Finish: FinishCancelled})
	e.st.Cancelled++
	signal(e.changed)
	return true
}

// Stop aborts every live request (each gets FinishAborted) and makes Submit
// fail with ErrStopped. Run calls it when its context ends.
func (e *Engine) Stop() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return
	}
	e.stopped = true
	now := e.clock.Now()
	live := make([]*seq, 0, len(e.seqs))
	for _, s := range e.seqs {
		live = append(live, s)
	}
	slices.SortFunc(live, func(a, b *seq) int { return cmpU64(a.seqNo, b.seqNo) })
	for _, s := range live {
		e.end(s, Delta{Time: now, Finish: FinishAborted})
	}
	e.inflight = false
	e.batch = e.batch[:0]
	e.flush()
	signal(e.changed)
}

// end removes s from wherever it is, frees its blocks and delivers d.
func (e *Engine) end(s *seq, d Delta) {
	switch s.state {
	case stateWaiting:
		heap.Remove(&e.waiting, s.heapIdx)
		if len(s.blocks) > 0 { // a landed transfer's
			e.landed--
			e.pool.releaseAll(s.blocks)
			s.blocks = s.blocks[:0]
		}
	case statePulling:
		e.dropPull(s)
	case stateRunning:
		e.removeRunning(s)
		e.pool.releaseAll(s.blocks)
		s.blocks = s.blocks[:0]
	}
	s.state = stateDone
	s.inBatch = 0
	delete(e.seqs, s.req.ID)
	d.PromptTokens, d.CachedTokens, d.HostCachedTokens, d.DiskCachedTokens = s.nPrompt, s.cached, s.hostCached, s.diskCached
	d.TransferredTokens = s.transferred
	e.deliver(s, d)
}

func (e *Engine) deliver(s *seq, d Delta) {
	if s.req.OnDelta != nil {
		s.req.OnDelta(d)
		return
	}
	s.stream.push(d)
}
