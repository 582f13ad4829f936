package bench

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// evictingTrace: prefixes A..D of 1024 tokens (64 blocks) on two workers
// whose GPU pools hold little more than one each, ten seconds apart, then A
// again: by then A's blocks have left the GPU of the worker that computed
// them.
func evictingTrace() []TraceRequest {
	var reqs []TraceRequest
	for i, g := range []uint64{0, 1, 2, 3, 0, 2} {
		reqs = append(reqs, TraceRequest{
			Index: i, Arrival: time.Duration(i) * 10 * time.Second, InputLength: 1040, OutputLength: 4,
			Segments: []Segment{{Seed: 100 + g, Len: 1024}, {Seed: 1000 + uint64(i), Len: 16}},
		})
	}
	return reqs
}

func TestSimHostTierServesEvictedPrefixesAndTheRouterFindsThem(t *testing.T) {
	cfg := simTestConfig()
	cfg.Engine.NumBlocks = 66
	without := runSim(t, cfg, evictingTrace())
	assert.Nil(t, without.Tiers)

	cfg.Engine.HostBlocks = 512
	with := runSim(t, cfg, evictingTrace())
	require.NotNil(t, with.Tiers)
	assert.Zero(t, with.Tiers.IndexResyncs, "the tier streams arrive complete")
	assert.Equal(t, 6, with.Summary.OK)
	assert.EqualValues(t, 2*1024, with.Summary.CachedTokens, "both repeats are served from the host tier")
	assert.InDelta(t, 2*1024.0/float64(with.Tiers.PromptTokens), with.Tiers.HostHitRate, 1e-9)
	assert.Zero(t, with.Tiers.GPUHitRate)
	assert.Equal(t, 2, with.Tiers.TTFTHost.Count)
	assert.Less(t, with.Tiers.TTFTHost.Mean, with.Tiers.TTFTMiss.Mean, "loading back beats recomputing")
	assert.Zero(t, without.Summary.CachedTokens, "without the tier both repeats recompute")
}

// The same trace with a host tier too small for one prefix and a disk tier
// below it: the evicted prefixes pass through host memory to disk, the
// repeats load from disk, and the report splits hits and TTFT by tier.
func TestSimDiskTierServesPrefixesTheHostTierEvicted(t *testing.T) {
	cfg := simTestConfig()
	cfg.Engine.NumBlocks = 66
	cfg.Engine.HostBlocks = 16
	hostOnly := runSim(t, cfg, evictingTrace())
	require.NotNil(t, hostOnly.Tiers)
	assert.Zero(t, hostOnly.Tiers.DiskHitRate)

	cfg.Engine.DiskBlocks = 1024
	cfg.Engine.DiskLoadMsPerToken = 0.002 // a fast disk: loading beats recomputing
	rep := runSim(t, cfg, evictingTrace())
	require.NotNil(t, rep.Tiers)
	assert.Zero(t, rep.Tiers.IndexResyncs, "the disk streams arrive complete")
	assert.Equal(t, 6, rep.Summary.OK)
	assert.Positive(t, rep.Tiers.DiskHitRate, "repeats load from disk")
	assert.Positive(t, rep.Tiers.TTFTDisk.Count, "a repeat loads from disk")
	assert.Less(t, rep.Tiers.TTFTDisk.Mean, rep.Tiers.TTFTMiss.Mean, "loading back from a fast disk beats recomputing 1024 tokens")
	assert.Greater(t, rep.Summary.CachedTokens, hostOnly.Summary.CachedTokens, "the disk tier keeps what the small host tier drops")
	assert.Equal(t, 1024, rep.Config.DiskBlocks)
}
