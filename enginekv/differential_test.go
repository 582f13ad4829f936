package enginekv

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/vmihailenco/msgpack/v5"
)

// kv is one map entry, in order: the generic reference keeps maps as
// ordered pairs, since the events' meaning depends on which "type" key
// comes first.
type kv struct {
	k any
	v any
}

// genericDecode is the reference: msgpack/v5's generic, loose decoding
// (ints as int64/uint64, str and bin as string), maps as ordered pairs.
func genericDecode(p []byte) (any, bool) {
	r := bytes.NewReader(p)
	d := msgpack.NewDecoder(r)
	d.UseLooseInterfaceDecoding(true)
	d.SetMapDecoder(func(d *msgpack.Decoder) (any, error) {
		n, err := d.DecodeMapLen()
		if err != nil {
			return nil, err
		}
		out := make([]kv, 0, min(max(n, 0), 1024))
		for range n {
			k, err := d.DecodeInterfaceLoose()
			if err != nil {
				return nil, err
			}
			v, err := d.DecodeInterfaceLoose()
			if err != nil {
				return nil, err
			}
			out = append(out, kv{k, v})
		}
		return out, nil
	})
	v, err := d.DecodeInterfaceLoose()
	if err != nil || r.Len() != 0 {
		return nil, false
	}
	return v, true
}

// refEvent is what the reference reads of one event: its kind and the
// fields the mirror rehashes from.
type refEvent struct {
	Kind      EventKind
	Hashes    []uint64
	Parent    uint64
	HasParent bool
	Tokens    []uint32
	BlockSize int
}

func refHash(v any) (uint64, bool) {
	switch h := v.(type) {
	case int64:
		return uint64(h), true
	case uint64:
		return h, true
	case string:
		var buf [8]byte
		if n := len(h); n >= 8 {
			copy(buf[:], h[n-8:])
		} else {
			copy(buf[8-n:], h)
		}
		return binary.BigEndian.Uint64(buf[:]), true
	}
	return 0, false
}

func refInt(v any) int {
	switch n := v.(type) {
	case int64:
		return int(n)
	case uint64:
		return int(n)
	}
	return 0
}

// refEvents reads the events of a batch DecodeBatch accepted, by the rules
// of doc.go, from the generic value: an event array at position 1 or under
// "events" (the last one), events of an unknown tag dropped.
func refEvents(v any) []refEvent {
	var raw any
	switch b := v.(type) {
	case []any:
		raw = b[1]
	case []kv:
		for _, e := range b {
			if e.k == "events" {
				raw = e.v
			}
		}
	}
	var out []refEvent
	for _, ev := range raw.([]any) {
		var re refEvent
		fields := map[string]any{}
		switch e := ev.(type) {
		case []any:
			tag, _ := e[0].(string)
			re.Kind = kindOf(tag)
			names := []string{"block_hashes", "parent_block_hash", "token_ids", "block_size"}
			for i, f := range e[1:] {
				if i < len(names) {
					fields[names[i]] = f
				}
			}
		case []kv:
			typed := false
			for _, p := range e {
				if p.k == "type" && !typed {
					tag, _ := p.v.(string)
					re.Kind, typed = kindOf(tag), true
				} else if k, ok := p.k.(string); ok && k != "type" {
					fields[k] = p.v
				}
			}
		}
		if re.Kind == 0 {
			continue
		}
		if re.Kind != AllBlocksCleared {
			for _, h := range fields["block_hashes"].([]any) {
				x, _ := refHash(h)
				re.Hashes = append(re.Hashes, x)
			}
		}
		if re.Kind == BlockStored {
			re.Parent, re.HasParent = refHash(fields["parent_block_hash"])
			if ts, ok := fields["token_ids"].([]any); ok {
				for _, t := range ts {
					re.Tokens = append(re.Tokens, uint32(refInt(t)))
				}
			}
			re.BlockSize = refInt(fields["block_size"])
		}
		out = append(out, re)
	}
	return out
}

func asRef(evs []Event) []refEvent {
	var out []refEvent
	for _, e := range evs {
		re := refEvent{Kind: e.Kind, Hashes: e.BlockHashes, Parent: e.ParentHash, HasParent: e.HasParent,
			Tokens: e.TokenIDs, BlockSize: e.BlockSize}
		if len(re.Hashes) == 0 {
			re.Hashes = nil
		}
		if len(re.Tokens) == 0 {
			re.Tokens = nil
		}
		out = append(out, re)
	}
	return out
}

// FuzzDecoderAgreesWithGenericMsgpack is the differential check of the
// hand-written cursor: whatever it accepts, msgpack/v5's generic decoding
// of the same bytes (when it can: it rejects ext types it does not know)
// holds the same events, hashes, parents, tokens and block sizes; and a
// Decoder reusing its memory from an earlier payload decodes exactly what
// DecodeBatch does, errors included.
func FuzzDecoderAgreesWithGenericMsgpack(f *testing.F) {
	for _, enc := range allEncodings {
		f.Add(EncodeBatch(sampleBatch(), enc))
		f.Add(EncodeBatch(benchBatch(), enc))
	}
	// Token ids at every width, at the end of the payload too (the fast
	// path reads 8 bytes ahead).
	f.Add(EncodeBatch(Batch{DPRank: -1, Events: []Event{{Kind: BlockStored, BlockHashes: []uint64{1},
		TokenIDs: []uint32{0, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1}, BlockSize: 8}}}, Encoding{Layout: LayoutMap, Hashes: HashUint}))
	for _, v := range []any{
		map[string]any{"events": []any{map[string]any{"block_hashes": []any{1}, "type": "BlockRemoved"}}, "ts": 2},
		[]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{int64(-1)}, 1}}},
		[]any{1.0, []any{[]any{"BlockStored", []any{1}, nil, []any{uint64(1) << 40}, 1}}},
	} {
		p, err := msgpack.Marshal(v)
		require.NoError(f, err)
		f.Add(p)
	}
	for _, h := range []HashForm{HashUint, HashInt64, HashBytes} {
		f.Add(EncodeBatch(oneBlockRemovals(), Encoding{Layout: LayoutMap, Hashes: h}))
	}
	warm := EncodeBatch(benchBatch(), Encoding{Layout: LayoutArray, Hashes: HashBytes})
	f.Fuzz(func(t *testing.T, p []byte) {
		var dec Decoder
		_, err := dec.Decode(warm)
		require.NoError(t, err)
		want, wantErr := DecodeBatch(p)
		got, gotErr := dec.Decode(p)
		if wantErr != nil {
			require.Error(t, gotErr)
			require.ErrorIs(t, gotErr, ErrMalformed)
			require.Equal(t, wantErr.Error(), gotErr.Error())
			return
		}
		require.NoError(t, gotErr)
		require.Equal(t, want, *got)
		v, ok := genericDecode(p)
		if !ok {
			return
		}
		require.Equal(t, refEvents(v), asRef(want.Events))
	})
}

// oneBlockRemovals is vLLM's usual eviction traffic: one BlockRemoved per
// block, medium given or not.
func oneBlockRemovals() Batch {
	return Batch{TS: 3, DPRank: 0, Events: []Event{
		{Kind: BlockRemoved, BlockHashes: []uint64{5}, Medium: "GPU"},
		{Kind: BlockRemoved, BlockHashes: []uint64{1 << 63}},
		{Kind: BlockRemoved, BlockHashes: []uint64{7}, Medium: "CPU_PINNED"},
	}}
}

func TestOneBlockRemovalMapEventsDecodeAsTheGeneralPathReadsThem(t *testing.T) {
	for _, h := range []HashForm{HashUint, HashInt64, HashBytes} {
		got, err := DecodeBatch(EncodeBatch(oneBlockRemovals(), Encoding{Layout: LayoutMap, Hashes: h}))
		require.NoError(t, err)
		require.Equal(t, oneBlockRemovals(), got, "%v", h)
	}
	// Shapes the fast path does not take, or takes and gives back.
	for _, v := range []any{
		[]any{0, []any{map[string]any{"type": "BlockRemoved", "block_hashes": []any{nil}, "medium": "GPU"}}},
		[]any{0, []any{orderedMap{{"type", "BlockRemoved"}, {"block_hashes", []any{9}}, {"medium", 4}}}},
		[]any{0, []any{orderedMap{{"type", "BlockRemoved"}, {"block_hashes", []any{9}}, {"lora", "x"}}}},
	} {
		p, err := msgpack.Marshal(v)
		require.NoError(t, err)
		var dec Decoder
		want, wantErr := DecodeBatch(p)
		got, gotErr := dec.Decode(p)
		require.Equal(t, wantErr == nil, gotErr == nil)
		if wantErr == nil {
			require.Equal(t, want, *got)
			require.Equal(t, []uint64{9}, want.Events[0].BlockHashes)
			require.Empty(t, want.Events[0].Medium)
		}
	}
}

// orderedMap marshals as a msgpack map with its entries in order.
type orderedMap []struct {
	k string
	v any
}

func (m orderedMap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, kv := range m {
		if err := e.EncodeString(kv.k); err != nil {
			return err
		}
		if err := e.Encode(kv.v); err != nil {
			return err
		}
	}
	return nil
}
