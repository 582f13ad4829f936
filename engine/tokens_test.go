package engine

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/wire"
)

// tokenSink records batches with the token ids the engine attaches.
type tokenSink struct {
	batches []*wire.KVEventBatch
	tokens  [][][]uint32
	plain   int
}

func (s *tokenSink) PublishKVEvents(*wire.KVEventBatch) { s.plain++ }
func (s *tokenSink) PublishKVEventsWithTokens(b *wire.KVEventBatch, toks [][]uint32) {
	s.batches = append(s.batches, b)
	s.tokens = append(s.tokens, toks)
}

func TestATokenSinkGetsEachStoredBlocksTokensAlignedWithItsEvents(t *testing.T) {
	cfg := smallConfig()
	cfg.NumBlocks = 16
	sink := &tokenSink{}
	cfg.Events = sink
	clock := &virtualClock{now: time.Unix(1000, 0)}
	e, err := New(cfg, clock)
	require.NoError(t, err)
	run := func(id string, p []uint32) {
		_, err := e.Submit(&Request{ID: id, Prompt: p, MaxTokens: 1, OnDelta: func(Delta) {}})
		require.NoError(t, err)
		for {
			next := e.Step(clock.now)
			if next.IsZero() {
				return
			}
			clock.now = next
		}
	}
	a := prompt(1, 100)
	run("a", a)
	nA := len(sink.batches)
	// Enough other prompts to evict a's blocks: removals must carry no tokens.
	for i := range 4 {
		run(string(rune('b'+i)), prompt(uint32(1000*(i+2)), 60))
	}
	require.Zero(t, sink.plain, "a TokenEventSink is never called without tokens")
	var stored, removed int
	var aTokens []uint32
	for i, b := range sink.batches {
		require.Len(t, sink.tokens[i], len(b.Events))
		for j, ev := range b.Events {
			toks := sink.tokens[i][j]
			switch ev.Kind {
			case wire.KVStored:
				stored++
				require.Len(t, toks, len(ev.Hashes)*cfg.BlockSize)
				if i < nA {
					aTokens = append(aTokens, toks...)
				}
			default:
				removed++
				assert.Nil(t, toks)
			}
		}
	}
	assert.Positive(t, stored)
	assert.Positive(t, removed, "the small pool evicted something")
	assert.Equal(t, a[:96], aTokens, "a's six full blocks, in order")
}
