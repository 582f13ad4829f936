package engine

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// checkInvariants verifies the pool and queues against each other.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	e.mu.Lock()
	defer e.mu.Unlock()
	refs := make([]int32, len(e.pool.blocks))
	for _, s := range e.running {
		require.Equal(t, stateRunning, s.state)
		require.GreaterOrEqual(t, len(s.blocks), e.blocksFor(s.computed), "a running request holds blocks for its computed tokens")
		for _, id := range s.blocks {
			refs[id]++
		}
	}
	landed := 0
	for _, s := range e.waiting {
		require.Equal(t, stateWaiting, s.state)
		if len(s.blocks) > 0 { // a landed transfer's (transfer.go)
			landed++
			require.Equal(t, pullDone, s.pull)
			require.Equal(t, s.pullTokens, s.computed)
			require.GreaterOrEqual(t, len(s.blocks), e.blocksFor(s.computed))
			for _, id := range s.blocks {
				refs[id]++
			}
			continue
		}
		require.Zero(t, s.computed, "other waiting requests hold no blocks")
	}
	require.Equal(t, landed, e.landed)
	for _, s := range e.pulls {
		require.Equal(t, statePulling, s.state)
		for _, id := range s.blocks {
			refs[id]++
		}
	}
	require.Equal(t, len(e.pulls), e.st.Transferring)
	free := 0
	for id := range e.pool.blocks {
		if refs[id] != e.pool.blocks[id].ref {
			t.Fatalf("block %d has ref %d, but %d requests hold it", id, e.pool.blocks[id].ref, refs[id])
		}
		if refs[id] == 0 {
			free++
		}
	}
	free += e.pool.n - len(e.pool.blocks) // never used
	require.Equal(t, free, e.pool.nFree)
	n := e.pool.n - len(e.pool.blocks)
	for _, l := range []struct {
		on   onList
		list freeList
	}{{onFront, e.pool.front}, {onBack, e.pool.back}} {
		prev := int32(-1)
		for id := l.list.head; id >= 0; id = e.pool.blocks[id].next {
			b := e.pool.blocks[id]
			if b.ref != 0 || b.on != l.on || b.prev != prev {
				t.Fatalf("block %d on free list %d has ref %d, list %d, prev %d (want %d)", id, l.on, b.ref, b.on, b.prev, prev)
			}
			prev = id
			n++
		}
		require.Equal(t, prev, l.list.tail)
	}
	require.Equal(t, free, n, "the free lists and the never-used blocks are exactly the free blocks")
	for h, id := range e.pool.cached {
		if b := e.pool.blocks[id]; !b.hashed || b.hash != h {
			t.Fatalf("cached hash %x points at block %d holding %x (hashed=%v)", h, id, b.hash, b.hashed)
		}
	}
	require.True(t, slices.IsSortedFunc(e.running, cmpSeq))
	require.LessOrEqual(t, len(e.running), e.cfg.MaxNumSeqs)
	require.Equal(t, len(e.running)+len(e.waiting)+len(e.pulls), len(e.seqs))
}

func TestRandomWorkloadsKeepThePoolConsistentAndFinishEveryRequest(t *testing.T) {
	for seed := range uint64(30) {
		randomWorkload(t, seed, false)
	}
}

// TestRandomWorkloadsWithTransfersKeepThePoolConsistentAndFinishEveryRequest
// mixes decode-role requests (half of them, random prefixes and delays)
// into the same workloads: pulls in flight and landed transfers hold
// blocks, and nothing may leak or deadlock.
func TestRandomWorkloadsWithTransfersKeepThePoolConsistentAndFinishEveryRequest(t *testing.T) {
	for seed := range uint64(30) {
		randomWorkload(t, seed, true)
	}
}

func randomWorkload(t *testing.T, seed uint64, pull bool) {
	t.Helper()
	{
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			cfg := smallConfig()
			cfg.NumBlocks = 12 + rng.IntN(60)
			cfg.MaxNumBatchedTokens = 8 + rng.IntN(200)
			cfg.MaxNumSeqs = 1 + rng.IntN(10)
			cfg.WatermarkFraction = float64(rng.IntN(2)) * 0.05
			h := newHarness(t, cfg)
			maxLen := (cfg.NumBlocks - int(cfg.WatermarkFraction*float64(cfg.NumBlocks))) * cfg.BlockSize
			cancelled := map[string]bool{}
			for i := range 80 {
				id := fmt.Sprint("r", i)
				plen := 1 + rng.IntN(min(150, maxLen-1))
				out := 1 + rng.IntN(min(60, maxLen-plen))
				p := append(prompt(uint32(rng.IntN(3)), min(plen, 16*rng.IntN(4))), prompt(uint32(500+i), plen)...)
				p = p[:plen]
				if pull && rng.IntN(2) == 0 {
					h.submitTransfer(id, p, out, Transfer{Tokens: rng.IntN(plen + 1), Delay: time.Duration(rng.IntN(50)) * time.Millisecond})
				} else {
					h.submit(id, p, out, rng.IntN(3))
				}
				if rng.IntN(6) == 0 {
					victim := fmt.Sprint("r", rng.IntN(i+1))
					if h.e.Cancel(victim) {
						cancelled[victim] = true
					}
				}
				for range rng.IntN(5) {
					h.step()
					checkInvariants(t, h.e)
				}
			}
			h.runIdle()
			checkInvariants(t, h.e)
			for i := range 80 {
				id := fmt.Sprint("r", i)
				d := h.finish(id)
				if cancelled[id] {
					require.Equal(t, FinishCancelled, d.Finish)
					continue
				}
				require.Equal(t, FinishLength, d.Finish, id)
				require.Equal(t, len(h.deltas[id])-1, d.Index, "%s: every token delivered once", id)
			}
			require.Zero(t, h.e.Stats().KVBlocksUsed)
		})
	}
}
