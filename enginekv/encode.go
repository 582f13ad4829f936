package enginekv

import (
	"bytes"
	"encoding/binary"

	"github.com/vmihailenco/msgpack/v5"
)

// EncodeBatch writes b's payload the way a vLLM or SGLang publisher does in
// the given encoding (Topic and Seq travel in the frames and are not
// written). Fields at their zero value that the engines omit or send as nil
// (parent, lora_id, lora_name, medium, group_idx, dp rank) are written as
// the engines write them, so DecodeBatch(EncodeBatch(b)) gives back b's
// events. An invalid enc falls back to LayoutArray and HashUint.
func EncodeBatch(b Batch, enc Encoding) []byte {
	return AppendBatch(nil, b, enc)
}

// AppendBatch is EncodeBatch appending to dst.
func AppendBatch(dst []byte, b Batch, enc Encoding) []byte {
	if enc.Validate() != nil {
		enc = Encoding{Layout: LayoutArray, Hashes: HashUint}
	}
	buf := bytes.NewBuffer(dst)
	w := &encoder{e: msgpack.NewEncoder(buf), enc: enc}
	w.batch(&b)
	return buf.Bytes()
}

type encoder struct {
	e   *msgpack.Encoder
	enc Encoding
}

// bytes.Buffer writes never fail, so neither do the encoder's.
func (w *encoder) str(s string) { _ = w.e.EncodeString(s) }
func (w *encoder) nil_()        { _ = w.e.EncodeNil() }
func (w *encoder) int(v int)    { _ = w.e.EncodeInt(int64(v)) }

func (w *encoder) optStr(s string) {
	if s == "" {
		w.nil_()
		return
	}
	w.str(s)
}

func (w *encoder) hash(h uint64) {
	switch w.enc.Hashes {
	case HashInt64:
		_ = w.e.EncodeInt(int64(h))
	case HashBytes:
		// A 32-byte digest like vLLM's sha256 hashes; only the last 8 bytes
		// carry the hash, the rest is filler derived from it.
		var d [32]byte
		for i := 0; i < 3; i++ {
			binary.BigEndian.PutUint64(d[8*i:], h*0x9e3779b97f4a7c15+uint64(i))
		}
		binary.BigEndian.PutUint64(d[24:], h)
		_ = w.e.EncodeBytes(d[:])
	default:
		_ = w.e.EncodeUint(h)
	}
}

func (w *encoder) hashes(hs []uint64) {
	_ = w.e.EncodeArrayLen(len(hs))
	for _, h := range hs {
		w.hash(h)
	}
}

func (w *encoder) batch(b *Batch) {
	if w.enc.Layout == LayoutMapEnvelope {
		n := 2
		if b.DPRank >= 0 {
			n = 3
		}
		_ = w.e.EncodeMapLen(n)
		w.str("ts")
		_ = w.e.EncodeFloat64(b.TS)
		w.str("events")
		w.events(b.Events)
		if b.DPRank >= 0 {
			w.str("data_parallel_rank")
			w.int(b.DPRank)
		}
		return
	}
	_ = w.e.EncodeArrayLen(3)
	_ = w.e.EncodeFloat64(b.TS)
	w.events(b.Events)
	if b.DPRank >= 0 {
		w.int(b.DPRank)
	} else {
		w.nil_()
	}
}

func (w *encoder) events(evs []Event) {
	_ = w.e.EncodeArrayLen(len(evs))
	for i := range evs {
		if w.enc.Layout == LayoutArray {
			w.arrayEvent(&evs[i])
		} else {
			w.mapEvent(&evs[i])
		}
	}
}

func (w *encoder) tokens(ts []uint32) {
	_ = w.e.EncodeArrayLen(len(ts))
	for _, t := range ts {
		_ = w.e.EncodeUint(uint64(t))
	}
}

func (w *encoder) parent(ev *Event) {
	if ev.HasParent {
		w.hash(ev.ParentHash)
	} else {
		w.nil_()
	}
}

func (w *encoder) loraID(id int) {
	if id == 0 {
		w.nil_()
	} else {
		w.int(id)
	}
}

// arrayEvent writes a tagged array. Trailing defaults are dropped, as
// msgspec's omit_defaults does for array_like structs.
func (w *encoder) arrayEvent(ev *Event) {
	switch ev.Kind {
	case BlockStored:
		n := 8 // tag + the seven fields without defaults
		if ev.GroupIdx != 0 {
			n = 10 // + extra_keys, group_idx
		}
		_ = w.e.EncodeArrayLen(n)
		w.str(tagBlockStored)
		w.hashes(ev.BlockHashes)
		w.parent(ev)
		w.tokens(ev.TokenIDs)
		w.int(ev.BlockSize)
		w.loraID(ev.LoRAID)
		w.optStr(ev.Medium)
		w.optStr(ev.LoRAName)
		if ev.GroupIdx != 0 {
			w.nil_()
			w.int(ev.GroupIdx)
		}
	case BlockRemoved:
		n := 3
		if ev.GroupIdx != 0 {
			n = 4
		}
		_ = w.e.EncodeArrayLen(n)
		w.str(tagBlockRemoved)
		w.hashes(ev.BlockHashes)
		w.optStr(ev.Medium)
		if ev.GroupIdx != 0 {
			w.int(ev.GroupIdx)
		}
	default:
		_ = w.e.EncodeArrayLen(1)
		w.str(tagAllBlocksCleared)
	}
}

// mapEvent writes a map with "type" first, as msgspec does for tagged
// structs; fields with defaults are omitted at their default.
func (w *encoder) mapEvent(ev *Event) {
	switch ev.Kind {
	case BlockStored:
		n := 8
		if ev.GroupIdx != 0 {
			n++
		}
		_ = w.e.EncodeMapLen(n)
		w.str("type")
		w.str(tagBlockStored)
		w.str("block_hashes")
		w.hashes(ev.BlockHashes)
		w.str("parent_block_hash")
		w.parent(ev)
		w.str("token_ids")
		w.tokens(ev.TokenIDs)
		w.str("block_size")
		w.int(ev.BlockSize)
		w.str("lora_id")
		w.loraID(ev.LoRAID)
		w.str("medium")
		w.optStr(ev.Medium)
		w.str("lora_name")
		w.optStr(ev.LoRAName)
		if ev.GroupIdx != 0 {
			w.str("group_idx")
			w.int(ev.GroupIdx)
		}
	case BlockRemoved:
		n := 3
		if ev.GroupIdx != 0 {
			n++
		}
		_ = w.e.EncodeMapLen(n)
		w.str("type")
		w.str(tagBlockRemoved)
		w.str("block_hashes")
		w.hashes(ev.BlockHashes)
		w.str("medium")
		w.optStr(ev.Medium)
		if ev.GroupIdx != 0 {
			w.str("group_idx")
			w.int(ev.GroupIdx)
		}
	default:
		_ = w.e.EncodeMapLen(1)
		w.str("type")
		w.str(tagAllBlocksCleared)
	}
}
