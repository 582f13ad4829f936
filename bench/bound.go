package bench

import (
	"github.com/switchyard/switchyard/kvindex"
)

// CacheBound is what an ideal prefix cache would hit on a trace, the
// reference a routing policy's hit rate is read against. Both bounds replay
// the trace's prompts in arrival order through one LRU cache of full blocks
// and count a request's hit as the longest prefix of its blocks already
// cached, as an engine's prefix cache does:
//   - AllPools: one cache as large as every worker's pool together, as if the
//     fleet were one engine and routing lost nothing;
//   - OneWorker: one worker's pool alone, what a router that sent every
//     request to the same worker could at best reach.
//
// Timing, eviction order inside an engine (leaves first) and blocks pinned
// by running requests are ignored: the bound is an estimate, not a promise,
// and a policy can exceed it only by luck of eviction order.
type CacheBound struct {
	// BlocksPerWorker and Workers size the caches; BlockSize is in tokens.
	BlocksPerWorker int `json:"blocks_per_worker"`
	Workers         int `json:"workers"`
	BlockSize       int `json:"block_size"`
	// AllPools and OneWorker are hit rates: cached prompt tokens over all
	// prompt tokens, in [0, 1].
	AllPools  float64 `json:"all_pools"`
	OneWorker float64 `json:"one_worker"`
}

// ComputeCacheBound replays reqs' prompt blocks (tokens synthesized with v,
// hashed as the simulator hashes them) through LRU caches of workers ×
// blocksPerWorker and blocksPerWorker blocks of blockSize tokens.
func ComputeCacheBound(reqs []TraceRequest, v Vocab, blockSize, blocksPerWorker, workers int) CacheBound {
	b := CacheBound{BlocksPerWorker: blocksPerWorker, Workers: workers, BlockSize: blockSize}
	if blockSize <= 0 || blocksPerWorker <= 0 || workers <= 0 {
		return b
	}
	all, one := newBlockLRU(blocksPerWorker*workers), newBlockLRU(blocksPerWorker)
	var tokens []uint32
	var hashes []uint64
	var prompt, hitAll, hitOne int64
	for i := range reqs {
		tokens = reqs[i].AppendTokens(tokens[:0], v)
		hashes = kvindex.AppendSequenceHashes(hashes[:0], tokens, blockSize, kvindex.BaseSeed)
		prompt += int64(len(tokens))
		hitAll += int64(all.access(hashes) * blockSize)
		hitOne += int64(one.access(hashes) * blockSize)
	}
	if prompt > 0 {
		b.AllPools = float64(hitAll) / float64(prompt)
		b.OneWorker = float64(hitOne) / float64(prompt)
	}
	return b
}

// blockLRU is a fixed-capacity LRU set of block hashes: a doubly linked
// list over a slot array (no allocation per access once full) and a map
// from hash to slot.
type blockLRU struct {
	slot       map[uint64]int32
	hash       []uint64
	prev, next []int32
	head, tail int32 // most and least recently used; -1 when empty
	capacity   int
}

// lruPrealloc bounds what newBlockLRU allocates up front: the all-pools
// LRU of 10,000 workers has room for 544 M blocks, far more than any run
// touches, and grows by append instead.
const lruPrealloc = 1 << 20

func newBlockLRU(capacity int) *blockLRU {
	n := min(capacity, lruPrealloc)
	return &blockLRU{slot: make(map[uint64]int32, n), hash: make([]uint64, 0, n),
		prev: make([]int32, 0, n), next: make([]int32, 0, n), head: -1, tail: -1, capacity: capacity}
}

// access returns how many leading blocks of hashes were cached, then makes
// every block of hashes the most recently used (inserting the missing ones,
// evicting the least recently used beyond capacity).
func (c *blockLRU) access(hashes []uint64) int {
	hit := 0
	for hit < len(hashes) {
		if _, ok := c.slot[hashes[hit]]; !ok {
			break
		}
		hit++
	}
	for _, h := range hashes {
		if s, ok := c.slot[h]; ok {
			c.unlink(s)
			c.pushFront(s)
			continue
		}
		var s int32
		if len(c.hash) < c.capacity {
			s = int32(len(c.hash))
			c.hash, c.prev, c.next = append(c.hash, h), append(c.prev, -1), append(c.next, -1)
		} else {
			s = c.tail
			c.unlink(s)
			delete(c.slot, c.hash[s])
			c.hash[s] = h
		}
		c.slot[h] = s
		c.pushFront(s)
	}
	return hit
}

func (c *blockLRU) unlink(s int32) {
	p, n := c.prev[s], c.next[s]
	if p >= 0 {
		c.next[p] = n
	} else {
		c.head = n
	}
	if n >= 0 {
		c.prev[n] = p
	} else {
		c.tail = p
	}
	c.prev[s], c.next[s] = -1, -1
}

func (c *blockLRU) pushFront(s int32) {
	c.prev[s], c.next[s] = -1, c.head
	if c.head >= 0 {
		c.prev[c.head] = s
	}
	c.head = s
	if c.tail < 0 {
		c.tail = s
	}
}
