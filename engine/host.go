package engine

import (
	"container/list"
	"time"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// The host tier: a bounded pool of KV blocks in host memory, as vLLM's CPU
// offloading connector and SGLang's hierarchical cache keep. A cached block
// the GPU pool evicts is copied down (a stored event on the tier's stream);
// the tier evicts its least recently used block when full (a removed
// event). A waiting request whose prefix continues in the host tier past
// its GPU hit gets those blocks copied back instead of prefilled: they cost
// their load time (HostLoadMsPerToken per token) in the step that admits
// it, count as cached tokens, and are committed to the GPU pool as stored
// events on the engine's own stream.
//
// The tier publishes on a stream of its own, worker
// kvindex.TierStream(WorkerID, kvindex.TierCPU), with its own instance and
// ids: routers index it as that stream (kvindex doc, "Offloaded tiers").
// Its stored events carry no parent (each hash is a sequence hash, and a
// parent copied down earlier may be gone).
//
// The disk tier (DiskBlocks, below the host tier) is one more hostTier:
// a block the host tier evicts is written down to it, and a prompt's
// offloaded continuation may run through blocks of either tier, each
// priced at its own tier's load time (disk.go).
type hostTier struct {
	tier  kvindex.Tier
	below *hostTier // the next tier down (disk below host), nil for the last
	cap   int
	lru   *list.List // of uint64 hashes, front most recently used
	at    map[uint64]*list.Element
	name  string
	inst  uint64
	last  uint64
	first uint64
	evs   []wire.KVEvent
	// hit is hostHits' answer for loadFromHost, the tier of each block
	// found: the allocation between them may move blocks down a tier.
	hit []*hostTier
}

func newHostTier(blocks int, worker string, instance uint64) *hostTier {
	return &hostTier{tier: kvindex.TierCPU, cap: blocks, lru: list.New(), at: make(map[uint64]*list.Element, blocks),
		name: kvindex.TierStream(worker, kvindex.TierCPU), inst: instance ^ 0x686f7374 /* "host" */}
}

// newTiers builds the offloaded tiers cfg asks for: nil without a host
// tier, else the host tier with the disk tier (if any) below it.
func newTiers(cfg *Config, instance uint64) *hostTier {
	if cfg.HostBlocks == 0 {
		return nil
	}
	h := newHostTier(cfg.HostBlocks, cfg.WorkerID, instance)
	if cfg.DiskBlocks > 0 {
		h.below = newDiskTier(cfg.DiskBlocks, cfg.WorkerID, instance)
	}
	return h
}

func (h *hostTier) has(hash uint64) bool {
	_, ok := h.at[hash]
	return ok
}

// put copies a GPU-evicted block down, evicting the least recently used.
func (h *hostTier) put(hash uint64) {
	if el, ok := h.at[hash]; ok {
		h.lru.MoveToFront(el)
		return
	}
	if h.lru.Len() >= h.cap {
		old := h.lru.Back()
		oh := old.Value.(uint64)
		h.lru.Remove(old)
		delete(h.at, oh)
		if h.below != nil {
			h.below.put(oh) // written down before it is dropped here
		}
		if n := len(h.evs); n > 0 && h.evs[n-1].Kind == wire.KVRemoved {
			h.evs[n-1].Hashes = append(h.evs[n-1].Hashes, oh)
		} else {
			h.emit(wire.KVEvent{Kind: wire.KVRemoved, Hashes: []uint64{oh}})
		}
	}
	h.at[hash] = h.lru.PushFront(hash)
	if n := len(h.evs); n > 0 && h.evs[n-1].Kind == wire.KVStored {
		h.evs[n-1].Hashes = append(h.evs[n-1].Hashes, hash)
		return
	}
	h.emit(wire.KVEvent{Kind: wire.KVStored, Hashes: []uint64{hash}})
}

// use marks a block read back (most recently used).
func (h *hostTier) use(hash uint64) {
	if el, ok := h.at[hash]; ok {
		h.lru.MoveToFront(el)
	}
}

func (h *hostTier) emit(ev wire.KVEvent) {
	h.last++
	if len(h.evs) == 0 {
		h.first = h.last
	}
	h.evs = append(h.evs, ev)
}

// clear empties the tier (ResetPrefixCache) with a cleared event.
func (h *hostTier) clear() {
	h.lru.Init()
	clear(h.at)
	h.emit(wire.KVEvent{Kind: wire.KVCleared})
	if h.below != nil {
		h.below.clear()
	}
}

// flush hands the tier's events to sink as its stream's batch.
func (h *hostTier) flush(sink EventSink) {
	if h.below != nil {
		// The lower tier first: a block moved down is on disk before the
		// host tier's removal of it is published.
		h.below.flush(sink)
	}
	if len(h.evs) == 0 {
		return
	}
	b := &wire.KVEventBatch{Worker: h.name, Instance: h.inst, FirstID: h.first, Events: h.evs}
	h.evs = nil // the sink may keep the batch
	if sink != nil {
		sink.PublishKVEvents(b)
	}
}

// hostHits counts the blocks of s's prompt after its first gpu hits that
// the offloaded tiers hold (each block in the host tier or the disk tier
// below it), up to max blocks in all.
func (e *Engine) hostHits(s *seq, gpu, maxHit int) int {
	if e.host == nil {
		return 0
	}
	e.host.hit = e.host.hit[:0]
	for n := gpu; n < maxHit && n < len(s.hashes); n++ {
		t := e.host.holds(s.hashes[n])
		if t == nil {
			break
		}
		e.host.hit = append(e.host.hit, t)
	}
	return len(e.host.hit)
}

// holds is the tier (h or one below it) holding hash, nil if none does.
func (h *hostTier) holds(hash uint64) *hostTier {
	for t := h; t != nil; t = t.below {
		if t.has(hash) {
			return t
		}
	}
	return nil
}

// loadFromHost commits s's blocks [gpu, gpu+n), just allocated, as loaded
// from the offloaded tiers, and returns their load time: each block at its
// own tier's cost per token. The first admission records the split in s.
func (e *Engine) loadFromHost(s *seq, gpu, n int) time.Duration {
	if n == 0 {
		return 0
	}
	var host, disk int
	for i, t := range e.host.hit[:n] {
		t.use(s.hashes[gpu+i]) // a no-op if the allocation moved it down
		if t.tier == kvindex.TierDisk {
			disk++
		} else {
			host++
		}
	}
	bs := e.cfg.BlockSize
	e.st.HostCachedTokens += uint64(host * bs)
	e.st.HostLoads += uint64(host)
	e.st.DiskCachedTokens += uint64(disk * bs)
	e.st.DiskLoads += uint64(disk)
	if !s.started {
		s.hostCached, s.diskCached = host*bs, disk*bs
	}
	ms := float64(host*bs)*e.cfg.HostLoadMsPerToken + float64(disk*bs)*e.cfg.DiskLoadMsPerToken
	return time.Duration(ms * float64(time.Millisecond))
}

// HostTierStream is the worker id the host tier publishes as ("" without one).
func (e *Engine) HostTierStream() string {
	if e.host == nil {
		return ""
	}
	return e.host.name
}
