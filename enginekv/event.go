package enginekv

import (
	"errors"
	"fmt"
)

// ErrMalformed is wrapped by every decoding error: a payload or frame that
// is not a KV event batch in any encoding this package knows.
var ErrMalformed = errors.New("enginekv: malformed")

// ErrConfig is wrapped by every Validate error.
var ErrConfig = errors.New("enginekv: invalid config")

// EventKind is the type of one KV cache event.
type EventKind uint8

// Event kinds, as the engines tag them.
const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// Wire tags of the event kinds (msgspec's tag is the class name).
const (
	tagBlockStored      = "BlockStored"
	tagBlockRemoved     = "BlockRemoved"
	tagAllBlocksCleared = "AllBlocksCleared"
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return tagBlockStored
	case BlockRemoved:
		return tagBlockRemoved
	case AllBlocksCleared:
		return tagAllBlocksCleared
	}
	return fmt.Sprintf("EventKind(%d)", uint8(k))
}

// Event is one KV cache event as an engine reports it. Hashes are the
// engine's own (opaque, per process unless seeded), normalised to uint64:
// unsigned ints as they are, signed int64 by two's complement, bytes by
// their last 8 bytes big-endian (shorter ones left-padded with zeros).
type Event struct {
	Kind        EventKind
	BlockHashes []uint64 // engine hashes, normalised to uint64
	ParentHash  uint64
	HasParent   bool
	// TokenIDs of a BlockStored event: the stored blocks' tokens in order,
	// len(BlockHashes)*BlockSize for full blocks. The decoder does not
	// enforce that: a consumer decides what to do with a mismatch.
	TokenIDs  []uint32
	BlockSize int
	LoRAID    int    // 0 if absent/None
	LoRAName  string // "" if absent/None
	Medium    string // "GPU", "CPU", "CPU_PINNED", "DISK", ...; "" when absent (treat as GPU)
	GroupIdx  int    // KV cache group index; 0 when absent
}

// Batch is one published message: the frames' topic and sequence number and
// the payload's timestamp, data-parallel rank and events.
type Batch struct {
	Topic  string
	Seq    uint64
	TS     float64
	DPRank int // -1 when absent/None
	Events []Event
	// Unknown counts events of an unknown type that were skipped.
	Unknown int
}

// Layout is how a payload lays out the batch envelope and its events.
type Layout uint8

// Layouts found in the engines (see doc.go for which version sends which).
const (
	// LayoutArray: [ts, [events], dp_rank], each event a tagged array
	// ["BlockStored", block_hashes, parent_block_hash, ...]. vLLM before
	// the map change, SGLang.
	LayoutArray Layout = iota + 1
	// LayoutMap: [ts, [events], dp_rank], each event a map with a "type"
	// key. vLLM since its events dropped array_like.
	LayoutMap
	// LayoutMapEnvelope: {"ts", "events", "data_parallel_rank"} with map
	// events. A vLLM revision whose EventBatch dropped array_like too.
	LayoutMapEnvelope
)

func (l Layout) String() string {
	switch l {
	case LayoutArray:
		return "array"
	case LayoutMap:
		return "map"
	case LayoutMapEnvelope:
		return "map-envelope"
	}
	return fmt.Sprintf("Layout(%d)", uint8(l))
}

// ParseLayout parses a Layout's String form.
func ParseLayout(s string) (Layout, error) {
	for _, l := range []Layout{LayoutArray, LayoutMap, LayoutMapEnvelope} {
		if s == l.String() {
			return l, nil
		}
	}
	return 0, fmt.Errorf("%w: event encoding %q is not array, map or map-envelope", ErrConfig, s)
}

// HashForm is how a publisher writes block hashes.
type HashForm uint8

// Hash forms found in the engines.
const (
	// HashUint: msgpack unsigned ints (vLLM with integer block hashes).
	HashUint HashForm = iota + 1
	// HashInt64: msgpack signed int64 (SGLang).
	HashInt64
	// HashBytes: a 32-byte digest whose last 8 bytes carry the hash (vLLM
	// with integer block hashes off).
	HashBytes
)

func (h HashForm) String() string {
	switch h {
	case HashUint:
		return "uint"
	case HashInt64:
		return "int64"
	case HashBytes:
		return "bytes"
	}
	return fmt.Sprintf("HashForm(%d)", uint8(h))
}

// ParseHashForm parses a HashForm's String form.
func ParseHashForm(s string) (HashForm, error) {
	for _, h := range []HashForm{HashUint, HashInt64, HashBytes} {
		if s == h.String() {
			return h, nil
		}
	}
	return 0, fmt.Errorf("%w: hash form %q is not uint, int64 or bytes", ErrConfig, s)
}

// Encoding is what EncodeBatch writes: the layout and the hash form.
type Encoding struct {
	Layout Layout
	Hashes HashForm
}

// Validate names the bad field.
func (e Encoding) Validate() error {
	if e.Layout < LayoutArray || e.Layout > LayoutMapEnvelope {
		return fmt.Errorf("%w: Encoding.Layout %d is unknown", ErrConfig, e.Layout)
	}
	if e.Hashes < HashUint || e.Hashes > HashBytes {
		return fmt.Errorf("%w: Encoding.Hashes %d is unknown", ErrConfig, e.Hashes)
	}
	return nil
}
