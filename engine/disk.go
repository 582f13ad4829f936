package engine

import (
	"container/list"

	"github.com/switchyard/switchyard/kvindex"
)

// The disk tier: a bounded pool of KV blocks on local disk (or a remote
// store), below the host tier, as vLLM's offloading connectors keep with
// medium DISK. A block the host tier evicts is written down to it; the
// disk tier drops its least recently used block when full. A prompt's
// continuation found on disk loads back at DiskLoadMsPerToken per token,
// slower than the host tier's. It publishes on its own stream,
// kvindex.TierStream(WorkerID, kvindex.TierDisk), like the host tier.
func newDiskTier(blocks int, worker string, instance uint64) *hostTier {
	return &hostTier{tier: kvindex.TierDisk, cap: blocks, lru: list.New(), at: make(map[uint64]*list.Element, blocks),
		name: kvindex.TierStream(worker, kvindex.TierDisk), inst: instance ^ 0x6469736b /* "disk" */}
}

// DiskTierStream is the worker id the disk tier publishes as ("" without one).
func (e *Engine) DiskTierStream() string {
	if e.host == nil || e.host.below == nil {
		return ""
	}
	return e.host.below.name
}
