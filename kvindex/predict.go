package kvindex

import (
	"sync"
	"sync/atomic"
	"time"
)

// Predicted entries record where a request was just routed, before the
// engine's stored event arrives (or for engines that publish none). They sit
// beside the exact index and expire: lazily (lookups ignore expired entries)
// and by SweepPredictions, which kvingest calls periodically.
const predShards = 64

type pred struct {
	id  uint16
	exp int64 // unix nanos by the index clock
}

type predShard struct {
	mu sync.Mutex
	m  map[uint64][]pred
	_  [64]byte
}

type predictions struct {
	shards  [predShards]predShard
	count   atomic.Int64 // live (hash, worker) entries, expired included until swept
	dropped atomic.Int64
	// scratch holds *predScratch for lookups of a prefix predicted on
	// more than predScanActive workers. Lookups run concurrently, so each
	// takes its own; a pool rather than one per Index.
	scratch sync.Pool
}

// predScratch is the working memory of a lookup of a widely predicted
// prefix: allocating it per lookup (an 8 KiB bitset, a map and the id
// lists) was most of that lookup's allocation. Between lookups marks is all
// zero and at is empty.
type predScratch struct {
	active []uint16
	ends   []predEnd
	marks  []uint64 // one bit per interned id
	at     map[string]int
}

func (p *predictions) init() {
	for i := range p.shards {
		p.shards[i].m = make(map[uint64][]pred)
	}
}

func (p *predictions) shardOf(h uint64) *predShard {
	// Use other bits than the exact index so both spread independently.
	return &p.shards[(h>>8)&(predShards-1)]
}

// Predict records that worker will hold seqHashes (a prefix chain from the
// prompt's start) for ttl.
func (ix *Index) Predict(worker string, seqHashes []uint64, ttl time.Duration) error {
	return ix.PredictUntil(worker, seqHashes, ix.clock.Now().Add(ttl))
}

// PredictUntil is Predict with an absolute expiry, for predictions received
// by gossip. An existing entry's expiry only moves later.
func (ix *Index) PredictUntil(worker string, seqHashes []uint64, expires time.Time) error {
	w, err := ix.worker(worker)
	if err != nil {
		return err
	}
	// Hold the worker's lock so that its id cannot be retired (and, after
	// ClearStale, handed to another worker) while entries are added under it.
	w.mu.Lock()
	defer w.mu.Unlock()
	id := w.ID()
	exp := expires.UnixNano()
	if exp <= ix.clock.Now().UnixNano() {
		return nil
	}
	p := &ix.pred
	limit := int64(ix.cfg.MaxPredictedEntries)
	for _, h := range seqHashes {
		if !ix.keeps(h) {
			continue
		}
		s := p.shardOf(h)
		s.mu.Lock()
		list := s.m[h]
		found := false
		for i := range list {
			if list[i].id == id {
				list[i].exp = max(list[i].exp, exp)
				found = true
				break
			}
		}
		if !found {
			if p.count.Load() >= limit {
				s.mu.Unlock()
				p.dropped.Add(1)
				ix.m.predDrops.Inc()
				continue
			}
			s.m[h] = append(list, pred{id: id, exp: exp})
			p.count.Add(1)
		}
		s.mu.Unlock()
	}
	return nil
}

// SweepPredictions removes expired predicted entries and returns how many.
func (ix *Index) SweepPredictions() int {
	now := ix.clock.Now().UnixNano()
	return ix.pred.filter(func(e pred) bool { return e.exp > now })
}

// PredictedEntries returns the number of predicted (hash, worker) entries not
// yet swept.
func (ix *Index) PredictedEntries() int { return int(ix.pred.count.Load()) }

// filter keeps the entries for which keep is true and returns how many it
// dropped.
func (p *predictions) filter(keep func(pred) bool) int {
	dropped := 0
	for i := range p.shards {
		s := &p.shards[i]
		s.mu.Lock()
		for h, list := range s.m {
			kept := list[:0]
			for _, e := range list {
				if keep(e) {
					kept = append(kept, e)
				}
			}
			dropped += len(list) - len(kept)
			if len(kept) == 0 {
				delete(s.m, h)
			} else {
				s.m[h] = kept
			}
		}
		s.mu.Unlock()
	}
	p.count.Add(int64(-dropped))
	return dropped
}

// listHas reports whether list (one hash's entries) holds an unexpired
// prediction for id.
func listHas(list []pred, id uint16, now int64) bool {
	for _, e := range list {
		if e.id == id && e.exp > now {
			return true
		}
	}
	return false
}

// lookup walks the predicted entries like Lookup walks the exact ones and
// merges each worker's predicted depth into dst[start:], keeping the larger.
//
// A prefix predicted on many workers (a system prompt a fleet shares) keeps
// the walk linear: a step marks the ids its hash holds in a bitset and
// keeps the active ids marked, rather than searching the hash's list once
// per active id, and the ended walks are merged into dst through a map
// rather than a scan of dst each. That path's working memory comes from a
// pool (predScratch), so a warm lookup allocates nothing beyond dst; a
// prefix predicted on at most predScanActive workers never touches the
// pool.
func (p *predictions) lookup(seqHashes []uint64, now int64, names nameTable, dst []Match, start int) []Match {
	var stack [predScanActive]uint16
	var ended [predScanActive]predEnd
	active, ends := stack[:0], ended[:0]
	var sc *predScratch
	s := p.shardOf(seqHashes[0])
	s.mu.Lock()
	first := s.m[seqHashes[0]]
	if len(first) > predScanActive {
		sc = p.getScratch(len(first))
		active, ends = sc.active[:0], sc.ends[:0]
	}
	for _, e := range first {
		if e.exp > now {
			active = append(active, e.id)
		}
	}
	s.mu.Unlock()
	depth := 1
	for ; depth < len(seqHashes) && len(active) > 0; depth++ {
		h := seqHashes[depth]
		s := p.shardOf(h)
		kept := active[:0]
		s.mu.Lock()
		list := s.m[h]
		if len(active) <= predScanActive {
			// The hash's list is looked up once above; searching the map
			// again per active id was a third of a deep walk's time.
			for _, id := range active {
				if listHas(list, id, now) {
					kept = append(kept, id)
				} else {
					ends = append(ends, predEnd{id, depth})
				}
			}
		} else {
			// Only a first hash of more than predScanActive workers
			// gets here, and it took the scratch.
			marks := sc.marks
			for _, e := range list {
				if e.exp > now {
					marks[e.id/64] |= 1 << (e.id % 64)
				}
			}
			for _, id := range active {
				if marks[id/64]&(1<<(id%64)) != 0 {
					kept = append(kept, id)
				} else {
					ends = append(ends, predEnd{id, depth})
				}
			}
			for _, e := range list {
				marks[e.id/64] = 0
			}
		}
		s.mu.Unlock()
		active = kept
	}
	for _, id := range active {
		ends = append(ends, predEnd{id, depth})
	}
	if len(ends) <= predScanActive {
		for _, e := range ends {
			dst = mergeMatch(dst, start, names, e.id, e.depth)
		}
	} else {
		at := sc.at
		for i := start; i < len(dst); i++ {
			at[dst[i].Worker] = i
		}
		for _, e := range ends {
			name := names.name(int(e.id))
			if name == "" {
				continue
			}
			if i, ok := at[name]; ok {
				dst[i].Blocks = max(dst[i].Blocks, e.depth)
				continue
			}
			at[name] = len(dst)
			dst = append(dst, Match{Worker: name, Blocks: e.depth})
		}
		clear(at)
	}
	if sc != nil {
		p.scratch.Put(sc)
	}
	return dst
}

// getScratch returns a lookup's scratch, from the pool if it has one, with
// room for n active ids and n ended walks: the first hash's n workers bound
// both, as each walk ends once. The lists are sized here and never appended
// beyond, so lookup never stores its own slices into the scratch, which
// would move its stack arrays to the heap.
func (p *predictions) getScratch(n int) *predScratch {
	sc, _ := p.scratch.Get().(*predScratch)
	if sc == nil {
		sc = &predScratch{
			marks: make([]uint64, (maxWorkerID+1+63)/64),
			at:    make(map[string]int),
		}
	}
	if cap(sc.active) < n {
		sc.active = make([]uint16, 0, n)
		sc.ends = make([]predEnd, 0, n)
	}
	return sc
}

// predScanActive is the number of predicted workers up to which a lookup
// searches lists and dst directly (a few compares each) instead of
// building a bitset and a map.
const predScanActive = 16

// predEnd is where one worker's predicted walk ended: its depth in blocks.
type predEnd struct {
	id    uint16
	depth int
}

func mergeMatch(dst []Match, start int, names nameTable, id uint16, depth int) []Match {
	name := names.name(int(id))
	if name == "" {
		return dst
	}
	for i := start; i < len(dst); i++ {
		if dst[i].Worker == name {
			dst[i].Blocks = max(dst[i].Blocks, depth)
			return dst
		}
	}
	return append(dst, Match{Worker: name, Blocks: depth})
}
