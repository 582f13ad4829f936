package engine

import "slices"

// Dump is the engine's cached block set as of event AsOfID: applying it and
// then the events after AsOfID reproduces the engine's cache.
type Dump struct {
	Worker   string
	Instance uint64
	AsOfID   uint64
	Hashes   []uint64 // sorted ascending
}

// Dump returns the current cached block set.
func (e *Engine) Dump() Dump {
	e.mu.Lock()
	defer e.mu.Unlock()
	hs := make([]uint64, 0, len(e.pool.cached))
	for h := range e.pool.cached {
		hs = append(hs, h)
	}
	slices.Sort(hs)
	return Dump{Worker: e.cfg.WorkerID, Instance: e.instance, AsOfID: e.lastEventID, Hashes: hs}
}

// Stats returns a snapshot of the engine's state and counters.
func (e *Engine) Stats() Stats {
	e.mu.Lock()
	defer e.mu.Unlock()
	s := e.st
	s.Instance = e.instance
	s.Running = len(e.running)
	s.Waiting = e.waiting.Len()
	s.KVBlocksUsed = e.pool.used()
	s.KVBlocksTotal = e.cfg.NumBlocks
	s.KVUsage = float64(s.KVBlocksUsed) / float64(s.KVBlocksTotal)
	s.CachedBlocks = len(e.pool.cached)
	s.LastEventID = e.lastEventID
	if s.PromptTokens > 0 {
		s.PrefixHitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	return s
}
