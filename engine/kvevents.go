package engine

import (
	"slices"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// commitBlocks makes s's newly computed full blocks findable and records
// them as stored events: one event per contiguous run, parented on the block
// before it.
func (e *Engine) commitBlocks(s *seq) {
	bs := e.cfg.BlockSize
	full := s.computed / bs
	for len(s.hashes) < full {
		i := len(s.hashes)
		h := kvindex.BlockHash(s.tokens[i*bs:(i+1)*bs], s.seed)
		if i > 0 {
			h = kvindex.ChainHash(s.hashes[i-1], h, s.seed)
		}
		s.hashes = append(s.hashes, h)
	}
	runStart := -1
	for i := s.nCommitted; i < full; i++ {
		if e.pool.commit(s.blocks[i], s.hashes[i]) {
			if runStart < 0 {
				runStart = i
			}
			continue
		}
		if runStart >= 0 {
			e.stored(s, runStart, i)
			runStart = -1
		}
	}
	if runStart >= 0 {
		e.stored(s, runStart, full)
	}
	s.nCommitted = full
}

func (e *Engine) stored(s *seq, from, to int) {
	ev := wire.KVEvent{Kind: wire.KVStored, Hashes: slices.Clone(s.hashes[from:to])}
	if from > 0 {
		ev.Parent, ev.HasParent = s.hashes[from-1], true
	}
	e.emit(ev)
	if e.tokenSink != nil {
		bs := e.cfg.BlockSize
		e.pendingToks[len(e.pendingToks)-1] = slices.Clone(s.tokens[from*bs : to*bs])
	}
}

func (e *Engine) evicted(h uint64) {
	e.st.BlocksEvicted++
	if e.host != nil {
		e.host.put(h)
	}
	if n := len(e.pending); n > 0 && e.pending[n-1].Kind == wire.KVRemoved {
		e.pending[n-1].Hashes = append(e.pending[n-1].Hashes, h)
		return
	}
	e.emit(wire.KVEvent{Kind: wire.KVRemoved, Hashes: []uint64{h}})
}

func (e *Engine) emit(ev wire.KVEvent) {
	e.lastEventID++
	if len(e.pending) == 0 {
		e.pendingFirst = e.lastEventID
	}
	e.pending = append(e.pending, ev)
	if e.tokenSink != nil {
		e.pendingToks = append(e.pendingToks, nil)
	}
	e.st.EventsEmitted++
}

func (e *Engine) flush() {
	if e.host != nil {
		e.host.flush(e.cfg.Events)
	}
	if len(e.pending) == 0 {
		return
	}
	b := &wire.KVEventBatch{Worker: e.cfg.WorkerID, Instance: e.instance, FirstID: e.pendingFirst, Events: e.pending}
	e.pending = nil // the sink may keep the batch
	if e.tokenSink != nil {
		toks := e.pendingToks
		e.pendingToks = nil
		e.tokenSink.PublishKVEventsWithTokens(b, toks)
		return
	}
	if e.cfg.Events != nil {
		e.cfg.Events.PublishKVEvents(b)
	}
}

// ResetPrefixCache forgets every cached block and emits a cleared event. It
// fails with ErrBusy while requests run (their blocks could not be
// described consistently afterwards).
func (e *Engine) ResetPrefixCache() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.running) > 0 || e.inflight || len(e.pulls) > 0 || e.landed > 0 {
		return ErrBusy
	}
	e.pool.clear()
	if e.host != nil {
		e.host.clear()
	}
	e.emit(wire.KVEvent{Kind: wire.KVCleared})
	e.flush()
	return nil
}
