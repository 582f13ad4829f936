package wire

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
)

// KV event batch format, version 2 or 3 (little-endian):
//
//	magic "SK" | version u8 | worker: u8 len + bytes | instance u64 | first_id u64 |
//	time_unix_nano i64 | [version 3: sample uvarint] | n_events uvarint | events...
//	event: kind u8 | stored: has_parent u8, [parent u64], n uvarint, n × hash u64
//	                 removed: n uvarint, n × hash u64
//	                 cleared: (nothing)
//
// Event i of a batch has id first_id+i. Ids start at 1 for each engine
// instance (a fresh random Instance on every engine start), so a consumer
// detects a restart by the instance changing or the id going back, and a lost
// batch by a gap in ids. An empty batch whose FirstID is one past the last
// published id is a heartbeat: it reveals a lost trailing batch.
//
// Version 1 (never released) had no publish time; consumers measure event lag
// from it, so version 2 added it and version 1 is rejected as ErrVersion.
// Version 3 adds the publisher's sampling rate (KVEventBatch.Sample); a
// batch of every hash is still written as version 2, so a publisher that
// does not sample speaks to routers of either version.
const (
	kvBatchVersion        = 2
	kvBatchVersionSampled = 3
	kvDumpVersion         = 1
	// MaxBlocksPerMessage bounds the hashes a decoder accepts in one message,
	// so a corrupt length cannot make it allocate without bound.
	MaxBlocksPerMessage = 1 << 20
)

// KVEventKind is the kind of one KV cache event.
type KVEventKind uint8

// The KV event kinds.
const (
	KVStored KVEventKind = iota + 1
	KVRemoved
	KVCleared
)

func (k KVEventKind) String() string {
	switch k {
	case KVStored:
		return "stored"
	case KVRemoved:
		return "removed"
	case KVCleared:
		return "cleared"
	}
	return fmt.Sprintf("kv_event_kind(%d)", uint8(k))
}

// KVEvent is one change to an engine's prefix cache. Hashes are sequence
// hashes (kvindex.SequenceHashes): each identifies a full block and the whole
// prefix before it.
type KVEvent struct {
	Kind KVEventKind
	// Parent is the sequence hash of the block before Hashes[0] (Stored only);
	// HasParent is false when the stored chain starts at the prompt's start.
	Parent    uint64
	HasParent bool
	Hashes    []uint64
}

// KVEventBatch is what an engine publishes on Subjects.KV(worker).
type KVEventBatch struct {
	Worker   string
	Instance uint64
	FirstID  uint64
	// TimeUnixNano is when the engine published the batch (0: unknown);
	// consumers observe their event lag from it.
	TimeUnixNano int64
	// Sample is the publisher's sampling rate: its events carry only the
	// hashes kvindex.Sampled keeps at this rate (0 or 1: every hash).
	Sample int
	Events []KVEvent
}

// LastID is the id of the batch's last event (FirstID-1 when empty).
func (b *KVEventBatch) LastID() uint64 { return b.FirstID + uint64(len(b.Events)) - 1 }

// AppendKVEventBatch appends the encoding of b to dst.
func AppendKVEventBatch(dst []byte, b *KVEventBatch) []byte {
	version := byte(kvBatchVersion)
	if b.Sample > 1 {
		version = kvBatchVersionSampled
	}
	dst = append(dst, 'S', 'K', version)
	dst = appendShortString(dst, b.Worker)
	dst = binary.LittleEndian.AppendUint64(dst, b.Instance)
	dst = binary.LittleEndian.AppendUint64(dst, b.FirstID)
	dst = binary.LittleEndian.AppendUint64(dst, uint64(b.TimeUnixNano))
	if version == kvBatchVersionSampled {
		dst = binary.AppendUvarint(dst, uint64(b.Sample))
	}
	dst = binary.AppendUvarint(dst, uint64(len(b.Events)))
	for i := range b.Events {
		e := &b.Events[i]
		dst = append(dst, byte(e.Kind))
		switch e.Kind {
		case KVStored:
			if e.HasParent {
				dst = append(dst, 1)
				dst = binary.LittleEndian.AppendUint64(dst, e.Parent)
			} else {
				dst = append(dst, 0)
			}
			dst = appendHashes(dst, e.Hashes)
		case KVRemoved:
			dst = appendHashes(dst, e.Hashes)
		}
	}
	return dst
}

// DecodeKVEventBatch parses a batch. Errors wrap ErrMalformed or ErrVersion.
func DecodeKVEventBatch(p []byte) (*KVEventBatch, error) {
	var d KVBatchDecoder
	return d.Decode(p)
}

// maxKVSample bounds the sampling rate a batch may declare.
const maxKVSample = 1 << 16

// KVBatchDecoder decodes batch after batch into the same memory: a consumer
// that decodes in a loop allocates only while batches grow. The zero value
// is ready to use; a decoder is not safe for concurrent use.
type KVBatchDecoder struct {
	batch  *KVEventBatch
	events []KVEvent
	arena  []uint64 // every event's hashes, back to back
	spans  [][2]int // each event's hashes in arena
}

// Decode parses a batch. The batch and its events' hashes belong to the
// decoder and are overwritten by its next Decode, unless the caller Takes
// them first. Errors wrap ErrMalformed or ErrVersion.
func (d *KVBatchDecoder) Decode(p []byte) (*KVEventBatch, error) {
	if d.batch == nil {
		d.batch = &KVEventBatch{}
	}
	if err := d.decode(p); err != nil {
		return nil, err
	}
	return d.batch, nil
}

// Take hands the last decoded batch (the pointer Decode returned) over to
// the caller for good: the decoder lets go of its memory and allocates
// afresh on its next Decode.
func (d *KVBatchDecoder) Take() *KVEventBatch {
	b := d.batch
	d.batch, d.events, d.arena = nil, nil, nil
	return b
}

func (d *KVBatchDecoder) decode(p []byte) error {
	r := reader{buf: p}
	if len(r.buf) < 3 || r.buf[0] != 'S' || r.buf[1] != 'K' {
		return fmt.Errorf("kv batch: %w: bad magic", ErrMalformed)
	}
	version := r.buf[2]
	if version != kvBatchVersion && version != kvBatchVersionSampled {
		return fmt.Errorf("kv batch: %w: version %d", ErrVersion, version)
	}
	r.buf = r.buf[3:]
	events, arena, spans := d.events[:0], d.arena[:0], d.spans[:0]
	b := d.batch
	*b = KVEventBatch{}
	b.Worker = r.shortString()
	b.Instance = r.u64()
	b.FirstID = r.u64()
	b.TimeUnixNano = int64(r.u64())
	if version == kvBatchVersionSampled {
		s := r.uvarint()
		if r.err == nil && (s < 2 || s > maxKVSample) {
			r.fail(fmt.Sprintf("sample %d outside [2, %d]", s, maxKVSample))
		}
		b.Sample = int(s)
	}
	n := r.count(1)
	if r.err == nil && events == nil {
		// Events can be one byte on the wire and 40 in memory: grow with
		// the events actually decoded rather than trusting the count.
		events = make([]KVEvent, 0, min(n, 1024))
	}
	// The hashes of every event go to one arena; the events' slices are
	// cut from it once it stops growing.
	for i := 0; i < n && r.err == nil; i++ {
		e := KVEvent{Kind: KVEventKind(r.u8())}
		from := len(arena)
		switch e.Kind {
		case KVStored:
			switch r.u8() {
			case 0:
			case 1:
				e.HasParent = true
				e.Parent = r.u64()
			default:
				r.fail("bad has_parent flag")
			}
			arena = r.appendHashes(arena)
		case KVRemoved:
			arena = r.appendHashes(arena)
		case KVCleared:
		default:
			r.fail(fmt.Sprintf("unknown event kind %d", e.Kind))
		}
		if len(arena) > MaxBlocksPerMessage {
			r.fail("too many blocks")
		}
		events = append(events, e)
		spans = append(spans, [2]int{from, len(arena)})
	}
	if r.err == nil && len(r.buf) != 0 {
		r.fail(fmt.Sprintf("%d trailing bytes", len(r.buf)))
	}
	if r.err == nil && !ValidName(b.Worker) {
		r.fail(fmt.Sprintf("invalid worker id %q", b.Worker))
	}
	if r.err == nil && b.FirstID == 0 {
		r.fail("event id 0")
	}
	if r.err == nil && b.FirstID+uint64(len(events)) < b.FirstID {
		r.fail("event id overflow")
	}
	d.events, d.arena, d.spans = events, arena, spans
	if r.err != nil {
		return fmt.Errorf("kv batch: %w", r.err)
	}
	for i, sp := range spans {
		if events[i].Kind != KVCleared {
			events[i].Hashes = arena[sp[0]:sp[1]:sp[1]]
		}
	}
	b.Events = events
	return nil
}

// KVDumpRequest asks a worker for its full block set on Subjects.KVDump.
type KVDumpRequest struct {
	Version int `json:"version"`
	// MaxBlocksPerChunk bounds each reply chunk (0: the worker's default).
	MaxBlocksPerChunk int `json:"max_blocks_per_chunk,omitempty"`
}

// EncodeKVDumpRequest returns the JSON form of r.
func EncodeKVDumpRequest(r *KVDumpRequest) []byte {
	r.Version = kvDumpVersion
	b, _ := json.Marshal(r) // cannot fail: plain ints
	return b
}

// DecodeKVDumpRequest parses a dump request.
func DecodeKVDumpRequest(p []byte) (*KVDumpRequest, error) {
	var r KVDumpRequest
	if err := json.Unmarshal(p, &r); err != nil {
		return nil, fmt.Errorf("%w: kv dump request: %v", ErrMalformed, err)
	}
	if r.Version != kvDumpVersion {
		return nil, fmt.Errorf("%w: kv dump request version %d", ErrVersion, r.Version)
	}
	if r.MaxBlocksPerChunk < 0 {
		return nil, fmt.Errorf("%w: kv dump request max_blocks_per_chunk %d", ErrMalformed, r.MaxBlocksPerChunk)
	}
	return &r, nil
}

// KVDumpChunk is one part of a worker's reply to a dump request. A dump is
// the worker's whole block set as of event id AsOfID: a consumer applies it,
// then the events after AsOfID. Chunks are numbered from 0; the last has
// Final set.
type KVDumpChunk struct {
	Worker   string
	Instance uint64
	AsOfID   uint64
	Seq      uint32
	Final    bool
	Hashes   []uint64
}

// Dump chunk format, version 1: magic "SD" | version u8 | worker | instance u64
// | as_of u64 | seq u32 | final u8 | n uvarint | n × hash u64.

// AppendKVDumpChunk appends the encoding of c to dst.
func AppendKVDumpChunk(dst []byte, c *KVDumpChunk) []byte {
	dst = append(dst, 'S', 'D', kvDumpVersion)
	dst = appendShortString(dst, c.Worker)
	dst = binary.LittleEndian.AppendUint64(dst, c.Instance)
	dst = binary.LittleEndian.AppendUint64(dst, c.AsOfID)
	dst = binary.LittleEndian.AppendUint32(dst, c.Seq)
	if c.Final {
		dst = append(dst, 1)
	} else {
		dst = append(dst, 0)
	}
	return appendHashes(dst, c.Hashes)
}

// DecodeKVDumpChunk parses a dump chunk.
func DecodeKVDumpChunk(p []byte) (*KVDumpChunk, error) {
	r := reader{buf: p}
	if err := r.header('S', 'D', kvDumpVersion); err != nil {
		return nil, fmt.Errorf("kv dump chunk: %w", err)
	}
	c := &KVDumpChunk{}
	c.Worker = r.shortString()
	c.Instance = r.u64()
	c.AsOfID = r.u64()
	c.Seq = r.u32()
	switch r.u8() {
	case 0:
	case 1:
		c.Final = true
	default:
		r.fail("bad final flag")
	}
	c.Hashes = r.hashes()
	if r.err == nil && len(r.buf) != 0 {
		r.fail(fmt.Sprintf("%d trailing bytes", len(r.buf)))
	}
	if r.err == nil && !ValidName(c.Worker) {
		r.fail(fmt.Sprintf("invalid worker id %q", c.Worker))
	}
	if r.err != nil {
		return nil, fmt.Errorf("kv dump chunk: %w", r.err)
	}
	return c, nil
}

// LoadReport is a worker's own view of its load, published on
// Subjects.Load(worker) every 100 ms and on change.
type LoadReport struct {
	Version  int     `json:"version"`
	Worker   string  `json:"worker"`
	Instance uint64  `json:"instance"`
	Seq      uint64  `json:"seq"`
	Running  int     `json:"running"`
	Waiting  int     `json:"waiting"`
	KVUsage  float64 `json:"kv_usage"` // used blocks / total blocks, 0..1
	// KVBlocksUsed and KVBlocksTotal are the raw pool numbers.
	KVBlocksUsed  int     `json:"kv_blocks_used"`
	KVBlocksTotal int     `json:"kv_blocks_total"`
	PrefixHitRate float64 `json:"prefix_hit_rate"` // cumulative, 0..1
	// LastEventID is the id of the last KV event the worker published, so
	// consumers notice lost trailing batches.
	LastEventID  uint64 `json:"last_event_id"`
	TimeUnixNano int64  `json:"time_unix_nano"`
}

const loadReportVersion = 1

// EncodeLoadReport returns the JSON form of r.
func EncodeLoadReport(r *LoadReport) []byte {
	r.Version = loadReportVersion
	b, err := json.Marshal(r)
	if err != nil { // only NaN/Inf floats can fail; report them as zero
		c := *r
		c.KVUsage, c.PrefixHitRate = 0, 0
		b, _ = json.Marshal(&c)
	}
	return b
}

// DecodeLoadReport parses and validates a load report.
func DecodeLoadReport(p []byte) (*LoadReport, error) {
	var r LoadReport
	if err := json.Unmarshal(p, &r); err != nil {
		return nil, fmt.Errorf("%w: load report: %v", ErrMalformed, err)
	}
	switch {
	case r.Version != loadReportVersion:
		return nil, fmt.Errorf("%w: load report version %d", ErrVersion, r.Version)
	case !ValidName(r.Worker):
		return nil, fmt.Errorf("%w: load report worker %q", ErrMalformed, r.Worker)
	case r.Running < 0 || r.Waiting < 0 || r.KVBlocksUsed < 0 || r.KVBlocksTotal < 0:
		return nil, fmt.Errorf("%w: load report from %s has negative counts", ErrMalformed, r.Worker)
	case math.IsNaN(r.KVUsage) || r.KVUsage < 0 || r.KVUsage > 1:
		return nil, fmt.Errorf("%w: load report from %s kv_usage %v", ErrMalformed, r.Worker, r.KVUsage)
	case math.IsNaN(r.PrefixHitRate) || r.PrefixHitRate < 0 || r.PrefixHitRate > 1:
		return nil, fmt.Errorf("%w: load report from %s prefix_hit_rate %v", ErrMalformed, r.Worker, r.PrefixHitRate)
	}
	return &r, nil
}

func appendShortString(dst []byte, s string) []byte {
	if len(s) > 255 {
		s = s[:255]
	}
	dst = append(dst, byte(len(s)))
	return append(dst, s...)
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(hs)))
	// One capacity check for the run, not one per hash.
	n := len(dst)
	dst = slices.Grow(dst, 8*len(hs))[:n+8*len(hs)]
	out := dst[n:]
	for i, h := range hs {
		binary.LittleEndian.PutUint64(out[8*i:], h)
	}
	return dst
}

// reader decodes with sticky errors: after the first failure every read
// returns zero, so decoders check r.err once at the end.
type reader struct {
	buf []byte
	err error
}

func (r *reader) fail(msg string) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s", ErrMalformed, msg)
	}
	r.buf = nil
}

func (r *reader) header(m0, m1 byte, version byte) error {
	if len(r.buf) < 3 || r.buf[0] != m0 || r.buf[1] != m1 {
		return fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if r.buf[2] != version {
		return fmt.Errorf("%w: version %d", ErrVersion, r.buf[2])
	}
	r.buf = r.buf[3:]
	return nil
}

func (r *reader) take(n int) []byte {
	if r.err != nil {
		return nil
	}
	if n < 0 || len(r.buf) < n {
		r.fail("truncated")
		return nil
	}
	b := r.buf[:n]
	r.buf = r.buf[n:]
	return b
}

func (r *reader) u8() uint8 {
	if b := r.take(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.take(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.take(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) shortString() string {
	n := int(r.u8())
	return string(r.take(n))
}

// uvarint reads one uvarint.
func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, k := binary.Uvarint(r.buf)
	if k <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.buf = r.buf[k:]
	return v
}

// count reads a uvarint element count and checks that at least minBytes per
// element remain, so a corrupt count cannot force a large allocation.
func (r *reader) count(minBytes int) int {
	v := r.uvarint()
	if r.err != nil {
		return 0
	}
	if v > MaxBlocksPerMessage || v*uint64(minBytes) > uint64(len(r.buf)) {
		r.fail("count exceeds message")
		return 0
	}
	return int(v)
}

// appendHashes reads a count and that many hashes onto dst.
func (r *reader) appendHashes(dst []uint64) []uint64 {
	n := r.count(8)
	if r.err != nil {
		return dst
	}
	dst = slices.Grow(dst, n)
	for range n {
		dst = append(dst, r.u64())
	}
	return dst
}

func (r *reader) hashes() []uint64 { return r.appendHashes([]uint64{}) }
