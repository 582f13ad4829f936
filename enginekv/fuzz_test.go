package enginekv

import (
	"context"
	"math"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// normalized makes nil and empty token lists compare equal (a nil
// token_ids decodes as nil, an empty one as empty; both re-encode as []).
func normalized(evs []Event) []Event {
	out := make([]Event, len(evs))
	for i, ev := range evs {
		if len(ev.TokenIDs) == 0 {
			ev.TokenIDs = nil
		}
		out[i] = ev
	}
	return out
}

func FuzzDecodeBatch(f *testing.F) {
	for _, enc := range allEncodings {
		f.Add(EncodeBatch(sampleBatch(), enc))
		f.Add(EncodeBatch(benchBatch(), enc))
	}
	for _, v := range []any{
		[]any{1.0, []any{[]any{"BlockStored", []any{int64(-2)}, int64(-3), []any{5, 6}, 2, nil, "CPU_PINNED", map[string]any{"cache_salt": "s"}}}, 2},
		map[string]any{"ts": 1, "events": []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{[]byte{1, 2}}}}},
		[]any{1.0, []any{[]any{"Unknown", 1}, []any{7}}},
		[]any{1.0, []any{[]any{"BlockRemoved", []any{1}, "NVME"}, []any{"BlockRemoved", []any{2}, "DISK"}}},
		[]any{1.0},
	} {
		p, err := msgpack.Marshal(v)
		require.NoError(f, err)
		f.Add(p)
	}
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, p []byte) {
		b, err := DecodeBatch(p)
		if err != nil {
			require.ErrorIs(t, err, ErrMalformed)
			return
		}
		for _, l := range []Layout{LayoutArray, LayoutMap, LayoutMapEnvelope} {
			for _, h := range []HashForm{HashUint, HashInt64, HashBytes} {
				again, err := DecodeBatch(EncodeBatch(b, Encoding{Layout: l, Hashes: h}))
				require.NoError(t, err, "%v/%v", l, h)
				require.Equal(t, normalized(b.Events), normalized(again.Events), "%v/%v", l, h)
				for i := range b.Events {
					tier, err := b.Events[i].Tier()
					if err != nil {
						require.ErrorIs(t, err, ErrUnknownMedium)
						require.ErrorIs(t, err, ErrMalformed)
						continue
					}
					require.True(t, tier >= MediumGPU && tier < NumMedia)
					again, err := again.Events[i].Tier()
					require.NoError(t, err)
					require.Equal(t, tier, again)
				}
				require.Equal(t, b.DPRank, again.DPRank)
				require.Zero(t, again.Unknown)
				if !math.IsNaN(b.TS) {
					require.Equal(t, b.TS, again.TS)
				}
			}
		}
	})
}

// sequenceChecker is a Handler that fails the test if batches between two
// resets are not contiguous.
type sequenceChecker struct {
	mu      sync.Mutex
	t       *testing.T
	have    bool
	last    uint64
	batches int
}

func (c *sequenceChecker) Batch(b Batch) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.have && b.Seq != c.last+1 {
		c.t.Fatalf("batch %d after %d without a reset", b.Seq, c.last)
	}
	c.have, c.last = true, b.Seq
	c.batches++
}

func (c *sequenceChecker) Reset(ResetReason) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.have = false
}

// splitMessages turns fuzz input into multipart messages: a count byte
// (frames, mod 6), then per frame a length byte and that many bytes.
func splitMessages(in []byte) [][][]byte {
	var msgs [][][]byte
	for len(in) > 0 {
		n := int(in[0] % 6)
		in = in[1:]
		var frames [][]byte
		for range n {
			if len(in) == 0 {
				break
			}
			l := min(int(in[0]), len(in)-1)
			frames = append(frames, in[1:1+l])
			in = in[1+l:]
		}
		msgs = append(msgs, frames)
	}
	return msgs
}

func joinMessages(msgs ...[][]byte) []byte {
	var out []byte
	for _, frames := range msgs {
		out = append(out, byte(len(frames)))
		for _, f := range frames {
			out = append(out, byte(len(f)))
			out = append(out, f...)
		}
	}
	return out
}

func FuzzSubscriberFrames(f *testing.F) {
	small := func(i int) []byte {
		return EncodeBatch(Batch{DPRank: 0, Events: []Event{{Kind: BlockRemoved, BlockHashes: []uint64{uint64(i)}}}},
			Encoding{Layout: LayoutArray, Hashes: HashUint})
	}
	msg := func(seq uint64, p []byte) [][]byte { return [][]byte{[]byte("t"), seqBytes(seq), p} }
	f.Add(joinMessages(msg(0, small(0)), msg(1, small(1)), msg(3, small(3)), msg(1, small(1)), msg(0, small(0))))
	f.Add(joinMessages([][]byte{{0}}, msg(5, []byte("junk")), [][]byte{seqBytes(EndSeq), {}}, msg(6, small(6))))
	f.Add(joinMessages([][]byte{{}, seqBytes(EndSeq), {}}, [][]byte{{}, []byte("kv"), seqBytes(2), small(2)}))
	f.Fuzz(func(t *testing.T, in []byte) {
		cfg := DefaultSubscriberConfig()
		cfg.Endpoint = "tcp://127.0.0.1:1"
		chk := &sequenceChecker{t: t}
		s, err := NewSubscriber(cfg, chk, nil, prometheus.NewRegistry())
		require.NoError(t, err)
		var wg sync.WaitGroup
		replays := make(chan replayResult, 1)
		for _, frames := range splitMessages(in) {
			rb, res := parseLive(frames)
			if res == frameOK {
				require.Len(t, rb.seqCheck(frames), 8)
				s.live(context.Background(), rb, &wg, replays)
			} else {
				s.corrupt(res, nil)
			}
			if rrb, rres := parseReplay(frames); rres == frameEnd {
				require.Equal(t, EndSeq, rrb.seq)
			}
		}
		wg.Wait()
	})
}

// seqCheck returns the seq frame parseLive read, to check it took the
// right one.
func (rb rawBatch) seqCheck(frames [][]byte) []byte {
	if len(frames) == 3 {
		return frames[1]
	}
	return frames[0]
}
