package bench

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func seg(seed uint64, n int) Segment { return Segment{Seed: seed, Len: n} }

func req(segs ...Segment) TraceRequest {
	r := TraceRequest{Segments: segs}
	for _, s := range segs {
		r.InputLength += s.Len
	}
	return r
}

func TestCacheBoundCountsOnlyLeadingCachedBlocks(t *testing.T) {
	// Blocks of 2 tokens. The second prompt shares its first two blocks with
	// the first and then diverges: a prefix cache serves those two only,
	// even though its last block equals the first prompt's last block by
	// content (its prefix differs, so its sequence hash does too).
	reqs := []TraceRequest{req(seg(1, 8)), req(seg(1, 4), seg(3, 2), seg(1, 2))}
	b := ComputeCacheBound(reqs, DefaultVocab(), 2, 100, 1)
	assert.InDelta(t, 4.0/16.0, b.AllPools, 1e-9)
	assert.InDelta(t, 4.0/16.0, b.OneWorker, 1e-9)
}

func TestCacheBoundOfAllPoolsKeepsWhatOneWorkerEvicts(t *testing.T) {
	// Each prompt is 4 blocks; one worker holds 4 blocks, two hold 8. A, C, A:
	// one worker has evicted A by its return, two workers' worth still has it.
	reqs := []TraceRequest{req(seg(1, 8)), req(seg(2, 8)), req(seg(1, 8))}
	b := ComputeCacheBound(reqs, DefaultVocab(), 2, 4, 2)
	assert.InDelta(t, 8.0/24.0, b.AllPools, 1e-9)
	assert.InDelta(t, 0, b.OneWorker, 1e-9)
	assert.Equal(t, CacheBound{BlocksPerWorker: 4, Workers: 2, BlockSize: 2, AllPools: b.AllPools, OneWorker: 0}, b)
}

func TestCacheBoundCountsPartialBlocksAsPromptButNeverAsHits(t *testing.T) {
	// 5 tokens: two full blocks of 2 and one token that no cache holds.
	reqs := []TraceRequest{req(seg(1, 5)), req(seg(1, 5))}
	b := ComputeCacheBound(reqs, DefaultVocab(), 2, 10, 1)
	assert.InDelta(t, 4.0/10.0, b.AllPools, 1e-9)
}

func TestBlockLRUEvictsTheLeastRecentlyUsed(t *testing.T) {
	c := newBlockLRU(3)
	require.Equal(t, 0, c.access([]uint64{1, 2, 3}))
	require.Equal(t, 1, c.access([]uint64{1})) // 1 is now the most recent; 2 the least
	require.Equal(t, 0, c.access([]uint64{4})) // evicts 2
	assert.Equal(t, 1, c.access([]uint64{3}))
	assert.Equal(t, 1, c.access([]uint64{1}))
	assert.Equal(t, 0, c.access([]uint64{2}), "2 was evicted")
	assert.Len(t, c.slot, 3)
}

func TestCacheBoundOfAnEmptyPoolIsZero(t *testing.T) {
	b := ComputeCacheBound([]TraceRequest{req(seg(1, 8))}, DefaultVocab(), 2, 0, 8)
	assert.Zero(t, b.AllPools)
	assert.Zero(t, b.OneWorker)
}
