package enginekv

import (
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/switchyard/switchyard/internal/testenv"
)

var allEncodings = func() []Encoding {
	var out []Encoding
	for _, l := range []Layout{LayoutArray, LayoutMap, LayoutMapEnvelope} {
		for _, h := range []HashForm{HashUint, HashInt64, HashBytes} {
			out = append(out, Encoding{Layout: l, Hashes: h})
		}
	}
	return out
}()

func sampleBatch() Batch {
	return Batch{TS: 1757500000.25, DPRank: 0, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{0xDEADBEEF12345678, math.MaxUint64}, TokenIDs: seqTokens(0, 32), BlockSize: 16, Medium: "GPU"},
		{Kind: BlockStored, BlockHashes: []uint64{7}, ParentHash: math.MaxUint64, HasParent: true, TokenIDs: []uint32{128000, 0, 1, 127, 128, 255, 256, 65535, 65536, 4294967295, 42, 2, 3, 4, 5, 6}, BlockSize: 16, LoRAID: 3, LoRAName: "adapter", Medium: "GPU", GroupIdx: 1},
		{Kind: BlockRemoved, BlockHashes: []uint64{0x8000000000000001, 1}, Medium: "CPU"},
		{Kind: AllBlocksCleared},
	}}
}

func seqTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func TestEveryEncodingRoundTripsToTheSameEvents(t *testing.T) {
	want := sampleBatch()
	for _, enc := range allEncodings {
		t.Run(fmt.Sprintf("%v/%v", enc.Layout, enc.Hashes), func(t *testing.T) {
			got, err := DecodeBatch(EncodeBatch(want, enc))
			require.NoError(t, err)
			require.Equal(t, want, got)
		})
	}
}

func TestABatchWithoutRankDecodesRankMinusOne(t *testing.T) {
	for _, enc := range allEncodings {
		b := Batch{TS: 1, DPRank: -1, Events: []Event{{Kind: AllBlocksCleared}}}
		got, err := DecodeBatch(EncodeBatch(b, enc))
		require.NoError(t, err)
		require.Equal(t, -1, got.DPRank, "%v", enc)
	}
	// The two-element envelope of vLLM before data_parallel_rank existed.
	p, err := msgpack.Marshal([]any{1.5, []any{[]any{"AllBlocksCleared"}}})
	require.NoError(t, err)
	got, err := DecodeBatch(p)
	require.NoError(t, err)
	require.Equal(t, Batch{TS: 1.5, DPRank: -1, Events: []Event{{Kind: AllBlocksCleared}}}, got)
}

func TestSignedHashesAreTheirTwosComplement(t *testing.T) {
	p, err := msgpack.Marshal([]any{0.0, []any{
		[]any{"BlockRemoved", []any{int64(-1), int64(-9223372036854775808), int64(5)}},
	}, 0})
	require.NoError(t, err)
	got, err := DecodeBatch(p)
	require.NoError(t, err)
	require.Equal(t, []uint64{math.MaxUint64, 1 << 63, 5}, got.Events[0].BlockHashes)
}

func TestByteHashesUseTheirLastEightBytesAndShortOnesArePadded(t *testing.T) {
	long := make([]byte, 32)
	for i := range long {
		long[i] = byte(i)
	}
	p, err := msgpack.Marshal([]any{0.0, []any{
		[]any{"BlockRemoved", []any{long, []byte{1, 2}, []byte{}}},
	}})
	require.NoError(t, err)
	got, err := DecodeBatch(p)
	require.NoError(t, err)
	require.Equal(t, []uint64{0x18191a1b1c1d1e1f, 0x0102, 0}, got.Events[0].BlockHashes)
}

func TestMapEventsDecodeWhateverTheKeyOrderAndSkipUnknownKeys(t *testing.T) {
	ev := map[string]any{
		"extra_keys": []any{[]any{"salt"}, nil}, "token_ids": []any{1, 2}, "block_size": 1,
		"parent_block_hash": nil, "lora_id": nil, "medium": "GPU", "lora_name": nil,
		"kv_cache_spec_kind": "full_attention", "event_version": 1, "locality": nil,
		"type": "BlockStored", "block_hashes": []any{uint64(10), uint64(11)}, "group_idx": 0,
	}
	for range 20 { // Go map iteration order varies: several orders are tried
		p, err := msgpack.Marshal(map[string]any{"events": []any{ev}, "ts": 2.5, "data_parallel_rank": 1, "future": []any{1}})
		require.NoError(t, err)
		got, err := DecodeBatch(p)
		require.NoError(t, err)
		require.Equal(t, Batch{TS: 2.5, DPRank: 1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{10, 11},
			TokenIDs: []uint32{1, 2}, BlockSize: 1, Medium: "GPU"}}}, got)
	}
}

func TestUnknownEventTypesAreCountedAndSkipped(t *testing.T) {
	p, err := msgpack.Marshal([]any{0.0, []any{
		[]any{"BlockMoved", "whatever", map[string]any{"x": 1}},
		map[string]any{"block_hashes": "not even a list", "type": "Future"},
		[]any{"AllBlocksCleared"},
		[]any{7, 8},
	}, 0})
	require.NoError(t, err)
	got, err := DecodeBatch(p)
	require.NoError(t, err)
	require.Equal(t, 3, got.Unknown)
	require.Equal(t, []Event{{Kind: AllBlocksCleared}}, got.Events)
}

func TestSGLangEventsWithMetadataAndTrailingFieldsDecode(t *testing.T) {
	p, err := msgpack.Marshal([]any{3.0, []any{
		// SGLang's BlockStoredWithMetadata: medium, then a metadata map.
		[]any{"BlockStored", []any{int64(-2)}, int64(-3), []any{5, 6}, 2, nil, "CPU_PINNED", map[string]any{"cache_salt": "s"}},
		[]any{"BlockRemoved", []any{int64(-2)}, nil, 0, "future field"},
	}, 2})
	require.NoError(t, err)
	got, err := DecodeBatch(p)
	require.NoError(t, err)
	require.Equal(t, Batch{TS: 3, DPRank: 2, Events: []Event{
		{Kind: BlockStored, BlockHashes: []uint64{math.MaxUint64 - 1}, ParentHash: math.MaxUint64 - 2, HasParent: true,
			TokenIDs: []uint32{5, 6}, BlockSize: 2, Medium: "CPU_PINNED"},
		{Kind: BlockRemoved, BlockHashes: []uint64{math.MaxUint64 - 1}},
	}}, got)
}

func TestMalformedPayloadsAreTypedErrors(t *testing.T) {
	mk := func(v any) []byte {
		p, err := msgpack.Marshal(v)
		require.NoError(t, err)
		return p
	}
	cases := map[string][]byte{
		"empty":                   {},
		"not msgpack":             []byte("hello"),
		"a string":                mk("batch"),
		"short envelope":          mk([]any{1.0}),
		"events not a list":       mk([]any{1.0, 5}),
		"event not a container":   mk([]any{1.0, []any{5}}),
		"stored too short":        mk([]any{1.0, []any{[]any{"BlockStored", []any{1}}}}),
		"hash of wrong type":      mk([]any{1.0, []any{[]any{"BlockRemoved", []any{1.5}}}}),
		"nil hash":                mk([]any{1.0, []any{[]any{"BlockRemoved", []any{nil}}}}),
		"negative token":          mk([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{-1}, 1, nil, nil, nil}}}),
		"huge token":              mk([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}, 1, nil, nil, nil}}}),
		"map without type":        mk([]any{1.0, []any{map[string]any{"block_hashes": []any{1}}}}),
		"envelope without events": mk(map[string]any{"ts": 1.0}),
		"trailing bytes":          append(mk([]any{1.0, []any{}}), 0xc0),
		"absurd array length":     {0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff},
		"absurd token length":     append(mk([]any{1.0, []any{[]any{"BlockStored", []any{1}, nil}}})[:0:0], 0x92, 0x00, 0x91, 0x94, 0xab, 'B', 'l', 'o', 'c', 'k', 'S', 't', 'o', 'r', 'e', 'd', 0x90, 0xc0, 0xdd, 0x7f, 0xff, 0xff, 0xff),
		"deep nesting":            append(append([]byte{0x93, 0x00, 0x90}, repeat(0x91, 100)...), 0xc0),
	}
	for name, p := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeBatch(p)
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrMalformed), "%v", err)
		})
	}
}

func repeat(b byte, n int) []byte {
	out := make([]byte, n)
	for i := range out {
		out[i] = b
	}
	return out
}

// benchBatch is 32 BlockStored events of one 16-token block each, chained,
// with Llama-3-sized token ids.
func benchBatch() Batch {
	b := Batch{TS: 1757500000.25, DPRank: 0}
	for i := range 32 {
		toks := make([]uint32, 16)
		for j := range toks {
			toks[j] = uint32(100000 + i*16 + j)
		}
		b.Events = append(b.Events, Event{Kind: BlockStored, BlockHashes: []uint64{uint64(i+1) * 0x9e3779b97f4a7c15},
			ParentHash: uint64(i) * 0x9e3779b97f4a7c15, HasParent: i > 0, TokenIDs: toks, BlockSize: 16, Medium: "GPU"})
	}
	return b
}

func BenchmarkDecodeBatch(b *testing.B) {
	encs := []Encoding{{LayoutArray, HashUint}, {LayoutMap, HashUint}, {LayoutArray, HashInt64}, {LayoutMap, HashBytes}}
	benchDecode(b, encs, func(p []byte) error {
		_, err := DecodeBatch(p)
		return err
	})
}

// BenchmarkDecodeBatchGeneric is the baseline: msgpack/v5 decoding the
// same payloads into generic values, which is what a decoder built on the
// library's reflection path would start from.
func BenchmarkDecodeBatchGeneric(b *testing.B) {
	benchDecode(b, []Encoding{{LayoutArray, HashUint}, {LayoutMap, HashUint}}, func(p []byte) error {
		var v any
		return msgpack.Unmarshal(p, &v)
	})
}

// benchDecode runs decode over benchBatch encoded in each of encs, so that
// the decoder and its baseline are measured on the same payloads.
func benchDecode(b *testing.B, encs []Encoding, decode func([]byte) error) {
	for _, enc := range encs {
		b.Run(fmt.Sprintf("%v/%v", enc.Layout, enc.Hashes), func(b *testing.B) {
			p := EncodeBatch(benchBatch(), enc)
			b.SetBytes(int64(len(p)))
			b.ReportAllocs()
			cpu0 := testenv.ProcessCPU()
			for b.Loop() {
				if err := decode(p); err != nil {
					b.Fatal(err)
				}
			}
			reportBlocks(b, cpu0)
		})
	}
}

func reportBlocks(b *testing.B, cpu0 time.Duration) {
	blocks := float64(32 * b.N)
	b.ReportMetric(blocks/b.Elapsed().Seconds(), "blocks/s")
	if cpu := testenv.ProcessCPU() - cpu0; cpu > 0 {
		b.ReportMetric(blocks/cpu.Seconds(), "blocks/cpu-s")
	}
}
