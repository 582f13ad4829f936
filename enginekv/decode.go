package enginekv

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
)

// Bounds on what a payload may claim. A length beyond the bytes left is
// rejected before anything is allocated, so a corrupt length costs nothing.
const (
	// MaxPayloadBytes bounds one payload.
	MaxPayloadBytes = 64 << 20
	// maxDepth bounds the nesting of values skipped as unknown.
	maxDepth = 32
	// maxBlockSize bounds block_size (vLLM's largest is 256; hybrid models
	// use a few thousand).
	maxBlockSize = 1 << 20
)

// decoder is a cursor over one msgpack payload. It is hand-written rather
// than built on msgpack/v5's streaming Decoder because the per-call cost of
// that Decoder (an interface ByteScanner read, a peek and an unread per
// value) held decoding to 0.86 M blocks/s on the benchmark batch, against
// the adapter's budget of 1 M blocks/s for decode, rehash and publish
// together; the cursor reads the same format from the byte slice (see
// BenchmarkDecodeBatch for the ratio). msgpack/v5 still writes the payloads
// (encode.go) and the tests cross-check against its Marshal.
type decoder struct {
	in []byte
	p  int
	// Arenas the events' slices are cut from, so a batch costs a few
	// allocations instead of two per event (allocation dominated the
	// profile). Each slice is cut with its capacity capped, so a consumer
	// appending to one cannot overwrite its neighbour.
	toks []uint32
	hs   []uint64
	// evs backs Batch.Events; a Decoder keeps it (and the arenas) from one
	// payload to the next.
	evs []Event
	// names interns the LoRA names and media a Decoder has seen, so a
	// name costs no allocation per event (nil for DecodeBatch).
	names map[string]string
}

const (
	tokenChunk = 2048
	hashChunk  = 256
	// maxInterned bounds a Decoder's interned strings: names come from
	// the engine.
	maxInterned = 256
)

// A new arena chunk is at least twice the last one, so a Decoder reusing
// its arenas soon needs a single chunk per payload.
func (dc *decoder) tokenSlice(n int) []uint32 {
	if n > cap(dc.toks)-len(dc.toks) {
		dc.toks = make([]uint32, 0, max(n, tokenChunk, 2*cap(dc.toks)))
	}
	l := len(dc.toks)
	dc.toks = dc.toks[:l+n]
	return dc.toks[l : l+n : l+n]
}

func (dc *decoder) hashSlice(n int) []uint64 {
	if n > cap(dc.hs)-len(dc.hs) {
		dc.hs = make([]uint64, 0, max(n, hashChunk, 2*cap(dc.hs)))
	}
	l := len(dc.hs)
	dc.hs = dc.hs[:l+n]
	return dc.hs[l : l+n : l+n]
}

// DecodeBatch decodes one payload in any of the layouts and hash forms of
// doc.go. Topic and Seq are left zero: they travel in the frames. Unknown
// fields and trailing array elements are skipped; events of an unknown type
// are counted in Unknown and skipped. Every other problem is an error
// wrapping ErrMalformed.
func DecodeBatch(payload []byte) (Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return Batch{}, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrMalformed, len(payload), MaxPayloadBytes)
	}
	dc := decoder{in: payload}
	b, err := dc.batch()
	if err == nil && dc.left() != 0 {
		err = fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, dc.left())
	}
	if err != nil {
		return Batch{}, err
	}
	return b, nil
}

// Decoder decodes payloads like DecodeBatch but reuses its memory from one
// payload to the next: the Batch Decode returns, and every slice and
// string in it, is valid only until the next Decode. The subscriber uses
// one for a TransientHandler, so following an engine allocates nothing per
// batch. The zero value is ready; not safe for concurrent use.
type Decoder struct {
	dc decoder
	b  Batch
}

// Decode decodes one payload exactly as DecodeBatch does (same batch, same
// errors) into the Decoder's memory.
func (d *Decoder) Decode(payload []byte) (*Batch, error) {
	if len(payload) > MaxPayloadBytes {
		return nil, fmt.Errorf("%w: payload of %d bytes exceeds %d", ErrMalformed, len(payload), MaxPayloadBytes)
	}
	dc := &d.dc
	dc.in, dc.p = payload, 0
	dc.toks, dc.hs = dc.toks[:0], dc.hs[:0]
	if dc.names == nil {
		dc.names = make(map[string]string)
	}
	b, err := dc.batch()
	if err == nil && dc.left() != 0 {
		err = fmt.Errorf("%w: %d bytes after the batch", ErrMalformed, dc.left())
	}
	dc.in = nil // the payload is the caller's
	if err != nil {
		return nil, err
	}
	d.b = b
	return &d.b, nil
}

func malformed(what string, err error) error {
	if err == nil {
		return fmt.Errorf("%w: %s", ErrMalformed, what)
	}
	return fmt.Errorf("%w: %s: %v", ErrMalformed, what, err)
}

var errTruncated = malformed("truncated", nil)

// msgpack type codes (the format's spec; the names follow msgpack/v5's
// msgpcode).
const (
	cPosFixMax = 0x7f
	cFixMap    = 0x80
	cFixArray  = 0x90
	cFixStr    = 0xa0
	cNil       = 0xc0
	cFalse     = 0xc2
	cTrue      = 0xc3
	cBin8      = 0xc4
	cBin16     = 0xc5
	cBin32     = 0xc6
	cExt8      = 0xc7
	cExt16     = 0xc8
	cExt32     = 0xc9
	cFloat     = 0xca
	cDouble    = 0xcb
	cUint8     = 0xcc
	cUint16    = 0xcd
	cUint32    = 0xce
	cUint64    = 0xcf
	cInt8      = 0xd0
	cInt16     = 0xd1
	cInt32     = 0xd2
	cInt64     = 0xd3
	cFixExt1   = 0xd4
	cFixExt16  = 0xd8
	cStr8      = 0xd9
	cStr16     = 0xda
	cStr32     = 0xdb
	cArray16   = 0xdc
	cArray32   = 0xdd
	cMap16     = 0xde
	cMap32     = 0xdf
	cNegFixMin = 0xe0
)

func (dc *decoder) left() int { return len(dc.in) - dc.p }

func (dc *decoder) peek() (byte, error) {
	if dc.p >= len(dc.in) {
		return 0, errTruncated
	}
	return dc.in[dc.p], nil
}

// be reads an n-byte big-endian unsigned number.
func (dc *decoder) be(n int) (uint64, error) {
	if dc.left() < n {
		return 0, errTruncated
	}
	b := dc.in[dc.p : dc.p+n]
	dc.p += n
	switch n {
	case 1:
		return uint64(b[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(b)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(b)), nil
	}
	return binary.BigEndian.Uint64(b), nil
}

func isNil(c byte) bool { return c == cNil }
func isInt(c byte) bool {
	return c <= cPosFixMax || c >= cNegFixMin || (c >= cUint8 && c <= cInt64)
}
func isStr(c byte) bool { return c&0xe0 == cFixStr || (c >= cStr8 && c <= cStr32) }
func isBin(c byte) bool { return c >= cBin8 && c <= cBin32 }
func isArray(c byte) bool {
	return c&0xf0 == cFixArray || c == cArray16 || c == cArray32
}
func isMap(c byte) bool { return c&0xf0 == cFixMap || c == cMap16 || c == cMap32 }

// containerLen reads an array or map header; elems is how many values it
// holds (twice the entries of a map), checked against the bytes left since
// every value takes at least one.
func (dc *decoder) containerLen(what string, wantMap bool) (int, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	var n uint64
	switch {
	case !wantMap && c&0xf0 == cFixArray, wantMap && c&0xf0 == cFixMap:
		dc.p++
		n = uint64(c & 0x0f)
	case !wantMap && c == cArray16, wantMap && c == cMap16:
		dc.p++
		n, err = dc.be(2)
	case !wantMap && c == cArray32, wantMap && c == cMap32:
		dc.p++
		n, err = dc.be(4)
	default:
		kind := "an array"
		if wantMap {
			kind = "a map"
		}
		return 0, malformed(fmt.Sprintf("%s: code 0x%02x is not %s", what, c, kind), nil)
	}
	if err != nil {
		return 0, err
	}
	elems := n
	if wantMap {
		elems = 2 * n
	}
	if elems > uint64(dc.left()) {
		return 0, malformed(fmt.Sprintf("%s claims %d values in %d bytes", what, elems, dc.left()), nil)
	}
	return int(n), nil
}

func (dc *decoder) arrayLen(what string) (int, error) { return dc.containerLen(what, false) }
func (dc *decoder) mapLen(what string) (int, error)   { return dc.containerLen(what, true) }

// rawLen reads the header of a str, bin or ext value and returns the
// payload length (ext: plus its type byte), checked against the bytes left.
func (dc *decoder) rawLen(c byte) (int, error) {
	var n uint64
	var err error
	dc.p++
	switch {
	case c&0xe0 == cFixStr:
		n = uint64(c & 0x1f)
	case c == cStr8 || c == cBin8:
		n, err = dc.be(1)
	case c == cStr16 || c == cBin16:
		n, err = dc.be(2)
	case c == cStr32 || c == cBin32:
		n, err = dc.be(4)
	case c == cExt8:
		n, err = dc.be(1)
		n++
	case c == cExt16:
		n, err = dc.be(2)
		n++
	case c == cExt32:
		n, err = dc.be(4)
		n++
	case c >= cFixExt1 && c <= cFixExt16:
		n = 1 + 1<<(c-cFixExt1)
	default:
		return 0, malformed(fmt.Sprintf("code 0x%02x has no length", c), nil)
	}
	if err != nil {
		return 0, err
	}
	if n > uint64(dc.left()) {
		return 0, malformed(fmt.Sprintf("value claims %d bytes in %d", n, dc.left()), nil)
	}
	return int(n), nil
}

// skip skips one value of any type, with bounded nesting.
func (dc *decoder) skip(depth int) error {
	if depth > maxDepth {
		return malformed("values nested too deep", nil)
	}
	c, err := dc.peek()
	if err != nil {
		return err
	}
	switch {
	case isArray(c) || isMap(c):
		n, err := dc.containerLen("value", isMap(c))
		if err != nil {
			return err
		}
		if isMap(c) {
			n *= 2
		}
		for range n {
			if err := dc.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c <= cPosFixMax || c >= cNegFixMin || c == cNil || c == cFalse || c == cTrue:
		dc.p++
		return nil
	case c == cFloat || c == cUint32 || c == cInt32:
		return dc.advance(5)
	case c == cDouble || c == cUint64 || c == cInt64:
		return dc.advance(9)
	case c == cUint8 || c == cInt8:
		return dc.advance(2)
	case c == cUint16 || c == cInt16:
		return dc.advance(3)
	}
	n, err := dc.rawLen(c)
	if err != nil {
		return err
	}
	dc.p += n
	return nil
}

func (dc *decoder) advance(n int) error {
	if dc.left() < n {
		return errTruncated
	}
	dc.p += n
	return nil
}

// rawStr reads a str (or bin) value's bytes without copying.
func (dc *decoder) rawStr(what string) ([]byte, error) {
	c, err := dc.peek()
	if err != nil {
		return nil, err
	}
	if !isStr(c) && !isBin(c) {
		return nil, malformed(fmt.Sprintf("%s: code 0x%02x is not a string", what, c), nil)
	}
	n, err := dc.rawLen(c)
	if err != nil {
		return nil, err
	}
	b := dc.in[dc.p : dc.p+n]
	dc.p += n
	return b, nil
}

// str reads a string; the common values are interned so decoding them
// allocates nothing.
func (dc *decoder) str(what string) (string, error) {
	b, err := dc.rawStr(what)
	if err != nil {
		return "", err
	}
	switch string(b) {
	case "GPU":
		return "GPU", nil
	case "CPU":
		return "CPU", nil
	case "CPU_PINNED":
		return "CPU_PINNED", nil
	case "DISK":
		return "DISK", nil
	case tagBlockStored:
		return tagBlockStored, nil
	case tagBlockRemoved:
		return tagBlockRemoved, nil
	case tagAllBlocksCleared:
		return tagAllBlocksCleared, nil
	}
	if dc.names == nil {
		return string(b), nil
	}
	if s, ok := dc.names[string(b)]; ok {
		return s, nil
	}
	if len(dc.names) >= maxInterned {
		clear(dc.names)
	}
	s := string(b)
	dc.names[s] = s
	return s, nil
}

// integer reads a signed or unsigned msgpack integer; the returned bits are
// the value's two's complement, neg whether it was negative.
func (dc *decoder) integer(what string) (uint64, bool, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= cPosFixMax:
		dc.p++
		return uint64(c), false, nil
	case c >= cNegFixMin:
		dc.p++
		return uint64(int64(int8(c))), true, nil
	case c >= cUint8 && c <= cUint64:
		dc.p++
		v, err := dc.be(1 << (c - cUint8))
		return v, false, err
	case c >= cInt8 && c <= cInt64:
		dc.p++
		n := 1 << (c - cInt8)
		v, err := dc.be(n)
		if err != nil {
			return 0, false, err
		}
		shift := 64 - 8*n
		s := int64(v<<shift) >> shift // sign-extend
		return uint64(s), s < 0, nil
	}
	return 0, false, malformed(fmt.Sprintf("%s: code 0x%02x is not an integer", what, c), nil)
}

// smallInt reads an integer in [lo, hi], or nil as def.
func (dc *decoder) smallInt(what string, lo, hi, def int) (int, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	if isNil(c) {
		dc.p++
		return def, nil
	}
	v, neg, err := dc.integer(what)
	if err != nil {
		return 0, err
	}
	if neg {
		if int64(v) < int64(lo) {
			return 0, malformed(fmt.Sprintf("%s %d below %d", what, int64(v), lo), nil)
		}
		return int(int64(v)), nil
	}
	if v > uint64(hi) {
		return 0, malformed(fmt.Sprintf("%s %d above %d", what, v, hi), nil)
	}
	return int(v), nil
}

// hash reads one block hash in any form; ok is false for nil.
func (dc *decoder) hash(what string) (uint64, bool, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isNil(c):
		dc.p++
		return 0, false, nil
	case isInt(c):
		v, _, err := dc.integer(what)
		return v, err == nil, err
	case isBin(c) || isStr(c):
		raw, err := dc.rawStr(what)
		if err != nil {
			return 0, false, err
		}
		var buf [8]byte
		if n := len(raw); n >= 8 {
			copy(buf[:], raw[n-8:])
		} else {
			copy(buf[8-n:], raw)
		}
		return binary.BigEndian.Uint64(buf[:]), true, nil
	}
	return 0, false, malformed(fmt.Sprintf("%s: code 0x%02x is not a hash", what, c), nil)
}

func (dc *decoder) hashes(what string) ([]uint64, error) {
	n, err := dc.arrayLen(what)
	if err != nil {
		return nil, err
	}
	out := dc.hashSlice(n)
	for i := range out {
		h, ok, err := dc.hash(what)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, malformed(what+" holds nil", nil)
		}
		out[i] = h
	}
	return out, nil
}

// tokenCode is how a token id of one msgpack type code is cut out of the 8
// big-endian bytes starting at the code: (x >> shift) & mask, size bytes.
type tokenCode struct {
	shift uint8
	size  uint8
	mask  uint32
}

var tokenCodes = func() (t [256]tokenCode) {
	for c := 0; c <= cPosFixMax; c++ {
		t[c] = tokenCode{shift: 56, size: 1, mask: 0x7f}
	}
	t[cUint8] = tokenCode{shift: 48, size: 2, mask: 0xff}
	t[cUint16] = tokenCode{shift: 40, size: 3, mask: 0xffff}
	t[cUint32] = tokenCode{shift: 24, size: 5, mask: 0xffffffff}
	return t
}()

// tokens reads token ids (nil reads as none).
func (dc *decoder) tokens() ([]uint32, error) {
	c, err := dc.peek()
	if err != nil {
		return nil, err
	}
	if isNil(c) {
		dc.p++
		return nil, nil
	}
	n, err := dc.arrayLen("token_ids")
	if err != nil {
		return nil, err
	}
	out := dc.tokenSlice(n)
	// Fast path, without a branch on the value's width: a vocabulary below
	// 2^32 is written as positive fixints and uint8/16/32, mixed at random
	// (a 128k vocabulary is half uint16, half uint32), which a switch
	// mispredicted on every other token. Read 8 bytes from the type code on
	// and cut the value out by the code's shift and mask (tokenCodes has
	// size 0 for every other code). The cursor lives in locals here: kept
	// in the decoder, every token stored and reloaded it.
	//
	// The cursor's advance is the loop's critical path (each token's
	// place depends on the last one's size), so it is computed from the
	// code byte by arithmetic rather than through the table: 1 for a
	// fixint (c < 0x80), 1 + 1<<(c-0xcc) for uint8/16/32 (2, 3, 5 bytes).
	// For those codes it equals tc.size; other codes leave the loop.
	in, p, i := dc.in, dc.p, 0
	for ; i < len(out) && p+8 <= len(in); i++ {
		c := uint(in[p])
		tc := tokenCodes[c]
		if tc.size == 0 {
			break
		}
		x := binary.BigEndian.Uint64(in[p:])
		out[i] = uint32(x>>tc.shift) & tc.mask
		p += 1 + int((c>>7)<<((c-cUint8)&7))
	}
	dc.p = p
	for ; i < len(out); i++ {
		v, neg, err := dc.integer("token id")
		if err != nil {
			return nil, err
		}
		if neg || v > math.MaxUint32 {
			return nil, malformed(fmt.Sprintf("token id %d out of range", int64(v)), nil)
		}
		out[i] = uint32(v)
	}
	return out, nil
}

func (dc *decoder) float(what string) (float64, error) {
	c, err := dc.peek()
	if err != nil {
		return 0, err
	}
	switch {
	case c == cDouble:
		dc.p++
		v, err := dc.be(8)
		return math.Float64frombits(v), err
	case c == cFloat:
		dc.p++
		v, err := dc.be(4)
		return float64(math.Float32frombits(uint32(v))), err
	case isInt(c):
		v, neg, err := dc.integer(what)
		if neg {
			return float64(int64(v)), err
		}
		return float64(v), err
	case isNil(c):
		dc.p++
		return 0, nil
	}
	return 0, malformed(fmt.Sprintf("%s: code 0x%02x is not a number", what, c), nil)
}

func (dc *decoder) batch() (Batch, error) {
	b := Batch{DPRank: -1}
	c, err := dc.peek()
	if err != nil {
		return b, err
	}
	switch {
	case isArray(c):
		n, err := dc.arrayLen("batch")
		if err != nil {
			return b, err
		}
		if n < 2 {
			return b, malformed(fmt.Sprintf("batch has %d elements, want at least [ts, events]", n), nil)
		}
		if b.TS, err = dc.float("ts"); err != nil {
			return b, err
		}
		if err := dc.events(&b); err != nil {
			return b, err
		}
		if n > 2 {
			if b.DPRank, err = dc.smallInt("data_parallel_rank", 0, math.MaxInt32, -1); err != nil {
				return b, err
			}
		}
		for i := 3; i < n; i++ {
			if err := dc.skip(1); err != nil {
				return b, err
			}
		}
		return b, nil
	case isMap(c):
		n, err := dc.mapLen("batch")
		if err != nil {
			return b, err
		}
		sawEvents := false
		for range n {
			k, err := dc.str("batch key")
			if err != nil {
				return b, err
			}
			switch k {
			case "ts":
				b.TS, err = dc.float("ts")
			case "events":
				sawEvents = true
				err = dc.events(&b)
			case "data_parallel_rank", "attn_dp_rank":
				b.DPRank, err = dc.smallInt("data_parallel_rank", 0, math.MaxInt32, -1)
			default:
				err = dc.skip(1)
			}
			if err != nil {
				return b, err
			}
		}
		if !sawEvents {
			return b, malformed("batch map has no events", nil)
		}
		return b, nil
	}
	return b, malformed(fmt.Sprintf("batch: code 0x%02x is neither an array nor a map", c), nil)
}

func (dc *decoder) events(b *Batch) error {
	n, err := dc.arrayLen("events")
	if err != nil {
		return err
	}
	// Decoded in place: copying Event values (which hold pointers) into the
	// slice costs write barriers.
	if cap(dc.evs) < n || dc.evs == nil { // an empty batch has empty, not nil, Events
		dc.evs = make([]Event, n)
	}
	b.Events = dc.evs[:n]
	k := 0
	for range n {
		ev := &b.Events[k]
		known, err := dc.event(ev)
		if err != nil {
			return err
		}
		if !known {
			*ev = Event{}
			b.Unknown++
			continue
		}
		k++
	}
	b.Events = b.Events[:k:k]
	return nil
}

func kindOf(tag string) EventKind {
	switch tag {
	case tagBlockStored:
		return BlockStored
	case tagBlockRemoved:
		return BlockRemoved
	case tagAllBlocksCleared:
		return AllBlocksCleared
	}
	return 0
}

// Positions of the fields of a tagged-array event after the tag, per kind
// (msgspec writes struct fields in declaration order).
const (
	posHashes = iota // both kinds
	posParent
	posTokens
	posBlockSize
	posLoRAID
	posMedium
	posLoRAName
	posExtraKeys
	posGroupIdx
)

const (
	posRemovedHashes = iota
	posRemovedMedium
	posRemovedGroupIdx
)

func (dc *decoder) event(ev *Event) (bool, error) {
	c, err := dc.peek()
	if err != nil {
		return false, err
	}
	switch {
	case isArray(c):
		return dc.arrayEvent(ev)
	case isMap(c):
		return dc.mapEvent(ev)
	}
	return false, malformed(fmt.Sprintf("event: code 0x%02x is neither an array nor a map", c), nil)
}

func (dc *decoder) arrayEvent(ev *Event) (bool, error) {
	n, err := dc.arrayLen("event")
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, malformed("event array is empty", nil)
	}
	tag, err := dc.eventTag()
	if err != nil {
		return false, err
	}
	*ev = Event{Kind: kindOf(tag)}
	for i := range n - 1 {
		switch ev.Kind {
		case BlockStored:
			err = dc.storedField(ev, i)
		case BlockRemoved:
			switch i {
			case posRemovedHashes:
				ev.BlockHashes, err = dc.hashes("block_hashes")
			case posRemovedMedium:
				err = dc.lenientStr(&ev.Medium)
			case posRemovedGroupIdx:
				err = dc.lenientInt(&ev.GroupIdx)
			default:
				err = dc.skip(1)
			}
		default:
			err = dc.skip(1)
		}
		if err != nil {
			return false, err
		}
	}
	if ev.Kind == 0 {
		return false, nil
	}
	if err := checkEvent(ev, n-1); err != nil {
		return false, err
	}
	return true, nil
}

// eventTag reads a tag: msgspec writes the class name; an int tag (msgspec
// allows them) cannot be one of ours, so it reads as an unknown type.
func (dc *decoder) eventTag() (string, error) {
	c, err := dc.peek()
	if err != nil {
		return "", err
	}
	if isStr(c) || isBin(c) {
		return dc.str("event tag")
	}
	return "", dc.skip(1)
}

func (dc *decoder) storedField(ev *Event, i int) error {
	var err error
	switch i {
	case posHashes:
		ev.BlockHashes, err = dc.hashes("block_hashes")
	case posParent:
		ev.ParentHash, ev.HasParent, err = dc.hash("parent_block_hash")
	case posTokens:
		ev.TokenIDs, err = dc.tokens()
	case posBlockSize:
		ev.BlockSize, err = dc.smallInt("block_size", 0, maxBlockSize, 0)
	case posLoRAID:
		ev.LoRAID, err = dc.smallInt("lora_id", math.MinInt32, math.MaxInt32, 0)
	case posMedium:
		err = dc.lenientStr(&ev.Medium)
	case posLoRAName:
		// SGLang puts a metadata map here (BlockStoredWithMetadata):
		// anything but a string is skipped.
		err = dc.lenientStr(&ev.LoRAName)
	case posGroupIdx:
		err = dc.lenientInt(&ev.GroupIdx)
	default: // extra_keys and whatever later versions append
		err = dc.skip(1)
	}
	return err
}

// lenientStr reads a string into *s, leaving it unchanged for nil or a
// value of another type (a position reused differently by another engine).
func (dc *decoder) lenientStr(s *string) error {
	c, err := dc.peek()
	if err != nil {
		return err
	}
	if isStr(c) {
		*s, err = dc.str("string field")
		return err
	}
	return dc.skip(1)
}

// lenientInt reads a small non-negative int into *v, skipping nil or a
// value of another type.
func (dc *decoder) lenientInt(v *int) error {
	c, err := dc.peek()
	if err != nil {
		return err
	}
	if isInt(c) {
		*v, err = dc.smallInt("group_idx", 0, math.MaxInt32, 0)
		return err
	}
	return dc.skip(1)
}

// removedMapPrefix is how vLLM's map events begin a BlockRemoved of one
// block (msgspec writes "type" first, then the fields in order):
// {"type": "BlockRemoved", "block_hashes": [ — then the hash, and "medium"
// and its value. vLLM sends one such event per evicted block, so in a busy
// engine's stream they are about half the events; their fields read
// generically cost more than all of a block's token ids.
var (
	removedMapPrefix = []byte("\x83\xa4type\xacBlockRemoved\xacblock_hashes\x91")
	mediumKey        = []byte("\xa6medium")
)

// removedMapEvent reads a map event laid out exactly as removedMapPrefix
// and mediumKey say, into the same Event mapEvent would give. ok is false,
// with the cursor back where it was, for anything else (the general path
// then reads it, errors included).
func (dc *decoder) removedMapEvent(ev *Event) (ok bool) {
	start := dc.p
	dc.p += len(removedMapPrefix)
	h, isHash, err := dc.hash("block_hashes")
	if err != nil || !isHash || !bytes.HasPrefix(dc.in[dc.p:], mediumKey) {
		dc.p = start
		return false
	}
	dc.p += len(mediumKey)
	var medium string
	if err := dc.lenientStr(&medium); err != nil {
		dc.p = start
		return false
	}
	hs := dc.hashSlice(1)
	hs[0] = h
	*ev = Event{Kind: BlockRemoved, BlockHashes: hs, Medium: medium}
	return true
}

func (dc *decoder) mapEvent(ev *Event) (bool, error) {
	if bytes.HasPrefix(dc.in[dc.p:], removedMapPrefix) && dc.removedMapEvent(ev) {
		return true, nil
	}
	n, err := dc.mapLen("event")
	if err != nil {
		return false, err
	}
	start := dc.p
	kind, first, err := dc.findType(n)
	if err != nil {
		return false, err
	}
	// msgspec writes "type" first: then the fields start right after it
	// and need no second look at it.
	keys := n
	if first {
		keys--
	} else {
		dc.p = start
	}
	*ev = Event{Kind: kind}
	for range keys {
		kb, err := dc.rawStr("event key")
		if err != nil {
			return false, err
		}
		if kind == 0 || string(kb) == "type" {
			// An unknown type is skipped whole: its fields may mean
			// something else.
			if err := dc.skip(1); err != nil {
				return false, err
			}
			continue
		}
		if err := dc.mapField(ev, kb); err != nil {
			return false, err
		}
	}
	if kind == 0 {
		return false, nil
	}
	if err := checkEvent(ev, -1); err != nil {
		return false, err
	}
	return true, nil
}

// findType scans an event map of n entries for its "type" and returns its
// kind (0 for an unknown type). msgspec writes the tag first, so the scan
// usually stops at the first key; no order is promised, so it goes on if not.
// first is whether "type" was the map's first key (the cursor is then just
// past its value).
func (dc *decoder) findType(n int) (kind EventKind, first bool, err error) {
	for i := range n {
		kb, err := dc.rawStr("event key")
		if err != nil {
			return 0, false, err
		}
		if string(kb) == "type" {
			tag, err := dc.eventTag()
			return kindOf(tag), i == 0, err
		}
		if err := dc.skip(1); err != nil {
			return 0, false, err
		}
	}
	return 0, false, malformed("event map has no type", nil)
}

func (dc *decoder) mapField(ev *Event, kb []byte) error {
	var err error
	switch string(kb) {
	case "block_hashes":
		ev.BlockHashes, err = dc.hashes("block_hashes")
	case "parent_block_hash":
		ev.ParentHash, ev.HasParent, err = dc.hash("parent_block_hash")
	case "token_ids":
		ev.TokenIDs, err = dc.tokens()
	case "block_size":
		ev.BlockSize, err = dc.smallInt("block_size", 0, maxBlockSize, 0)
	case "lora_id":
		ev.LoRAID, err = dc.smallInt("lora_id", math.MinInt32, math.MaxInt32, 0)
	case "medium":
		err = dc.lenientStr(&ev.Medium)
	case "lora_name":
		err = dc.lenientStr(&ev.LoRAName)
	case "group_idx":
		err = dc.lenientInt(&ev.GroupIdx)
	default:
		err = dc.skip(1)
	}
	return err
}

// checkEvent keeps only the fields the kind has and checks the required
// ones. fields is the number of array fields after the tag (-1 for maps,
// where a missing field shows as its zero value).
func checkEvent(ev *Event, fields int) error {
	switch ev.Kind {
	case BlockStored:
		if fields >= 0 && fields < posBlockSize+1 {
			return malformed(fmt.Sprintf("BlockStored has %d fields, want at least %d", fields, posBlockSize+1), nil)
		}
		if ev.BlockHashes == nil && fields < 0 {
			return malformed("BlockStored without block_hashes", nil)
		}
	case BlockRemoved:
		if fields >= 0 && fields < 1 {
			return malformed("BlockRemoved without block_hashes", nil)
		}
		if ev.BlockHashes == nil && fields < 0 {
			return malformed("BlockRemoved without block_hashes", nil)
		}
		*ev = Event{Kind: BlockRemoved, BlockHashes: ev.BlockHashes, Medium: ev.Medium, GroupIdx: ev.GroupIdx}
	case AllBlocksCleared:
		*ev = Event{Kind: AllBlocksCleared}
	}
	return nil
}
