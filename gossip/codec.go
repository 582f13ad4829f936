package gossip

import (
	"encoding/binary"
	"fmt"
	"sort"
)

// Wire format. Every message starts with the magic "SG", the codec version
// and a kind byte. Integers are varints (zigzag for signed values); strings
// are a uvarint length (at most maxStringLen) and the bytes.
//
//	loads (kind 1):      origin | version u64 | timestamp varint | shard_bits u8 |
//	                     shard uvarint | part uvarint | n uvarint | n × entry
//	prediction (kind 2): origin | id uvarint | timestamp varint | worker |
//	                     expires varint | n uvarint | n × hash u64
//	state (kind 3):      timestamp varint | state body
//	state body:          n_origins uvarint | n × (origin | floor_lag uvarint |
//	                     version u64 | n uvarint | n × entry)
//	session (kind 4):    sessions.go (decoded there, not by decodeMessage)
//	digest, fetch, answer (kinds 5–7, version 4): repair.go
//	entry:               worker | version_lag uvarint (version − entry version) |
//	                     active varint | prefill varint | decode varint |
//	                     last_event_id uvarint | blocks varint | instance uvarint |
//	                     suspect_since varint | recovered_at varint (version 3)
//
// Version 2 added the digest's engine instance; version 3 the worker health
// record (Health); version 4 the repair kinds (push-pull carries per-origin
// digests, and what differs is fetched: repair.go). Loads, predictions,
// sessions and the full state did not change in version 4 and are still
// written as version 3, so a replica of the previous release keeps reading
// every broadcast during a rolling upgrade. Versions 2 to 4 are read
// (version 2 entries carry no health); version 1 messages are rejected
// (ErrVersion) like any other version.
//
// Timestamps and expiry times are Unix nanoseconds of the author's clock.
const (
	codecVersion = 4
	// broadcastVersion is the version written on the kinds version 4 did
	// not change (loads, prediction, state, session).
	broadcastVersion = 3
	// minCodecVersion is the oldest version decoded: a replica of the
	// previous release still shares its loads during a rolling upgrade.
	minCodecVersion = 2
	maxStringLen    = 1024
	// minEntryBytes is the smallest encoded entry: a one-byte worker length
	// and seven one-byte varints. Decoders use it to bound counts before they
	// allocate.
	minEntryBytes = 8
)

type msgKind uint8

const (
	kindLoads msgKind = iota + 1
	kindPrediction
	kindState
)

func (k msgKind) String() string {
	switch k {
	case kindLoads:
		return "loads"
	case kindPrediction:
		return "prediction"
	case kindState:
		return "state"
	case kindSession:
		return "session"
	case kindDigest:
		return "digest"
	case kindFetch:
		return "fetch"
	case kindAnswer:
		return "fetch_answer"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// workerEntry is one worker's entry inside a loads or state message.
type workerEntry struct {
	Worker string
	Entry
}

// loadsMsg carries one part of one shard of an origin's entries. Entries are
// full values (not deltas), so a newer message for the same shard and part
// can replace a queued older one without losing anything.
type loadsMsg struct {
	Origin    string
	Version   uint64 // the origin's version when it authored the message; ≥ every entry's
	Timestamp int64
	ShardBits uint8
	Shard     uint32
	Part      uint32
	Entries   []workerEntry
}

// broadcastName names the memberlist broadcast that carries this shard part,
// so a newer one invalidates the queued older one.
func (m *loadsMsg) broadcastName() string {
	return fmt.Sprintf("l/%s/%d/%d/%d", m.Origin, m.ShardBits, m.Shard, m.Part)
}

// predictionMsg carries one predicted prefix (or one chunk of a long one).
type predictionMsg struct {
	Origin    string
	ID        uint64
	Timestamp int64
	Worker    string
	Expires   int64
	Hashes    []uint64
}

// stateMsg is the full state exchanged on push-pull.
type stateMsg struct {
	Timestamp int64
	State     State
}

func appendHeader(b []byte, k msgKind) []byte {
	v := byte(broadcastVersion)
	if k >= kindDigest {
		v = codecVersion
	}
	return append(b, 'S', 'G', v, byte(k))
}

func appendString(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendEntry(b []byte, version uint64, w string, e Entry) []byte {
	b = appendString(b, w)
	b = binary.AppendUvarint(b, version-e.Version)
	b = binary.AppendVarint(b, int64(e.Load.ActiveRequests))
	b = binary.AppendVarint(b, int64(e.Load.PrefillTokens))
	b = binary.AppendVarint(b, int64(e.Load.DecodeBlocks))
	b = binary.AppendUvarint(b, e.Digest.LastEventID)
	b = binary.AppendVarint(b, int64(e.Digest.Blocks))
	b = binary.AppendUvarint(b, e.Digest.Instance)
	b = binary.AppendVarint(b, e.Health.SuspectSince)
	b = binary.AppendVarint(b, e.Health.RecoveredAt)
	return b
}

func appendLoads(b []byte, m *loadsMsg) []byte {
	b = appendHeader(b, kindLoads)
	b = appendString(b, m.Origin)
	b = binary.LittleEndian.AppendUint64(b, m.Version)
	b = binary.AppendVarint(b, m.Timestamp)
	b = append(b, m.ShardBits)
	b = binary.AppendUvarint(b, uint64(m.Shard))
	b = binary.AppendUvarint(b, uint64(m.Part))
	b = binary.AppendUvarint(b, uint64(len(m.Entries)))
	for _, e := range m.Entries {
		b = appendEntry(b, m.Version, e.Worker, e.Entry)
	}
	return b
}

func appendPrediction(b []byte, m *predictionMsg) []byte {
	b = appendHeader(b, kindPrediction)
	b = appendString(b, m.Origin)
	b = binary.AppendUvarint(b, m.ID)
	b = binary.AppendVarint(b, m.Timestamp)
	b = appendString(b, m.Worker)
	b = binary.AppendVarint(b, m.Expires)
	b = binary.AppendUvarint(b, uint64(len(m.Hashes)))
	for _, h := range m.Hashes {
		b = binary.LittleEndian.AppendUint64(b, h)
	}
	return b
}

// appendState encodes s in a canonical order (origins and workers sorted), so
// equal states encode to equal bytes.
func appendState(b []byte, timestamp int64, s State) []byte {
	b = appendHeader(b, kindState)
	b = binary.AppendVarint(b, timestamp)
	return appendStateBody(b, s)
}

// appendStateBody encodes s without header: the full state's body and a
// fetch answer's.
func appendStateBody(b []byte, s State) []byte {
	origins := s.origins()
	b = binary.AppendUvarint(b, uint64(len(origins)))
	for _, o := range origins {
		entries := s.Origins[o]
		version := s.Floors[o]
		for _, e := range entries {
			version = max(version, e.Version)
		}
		b = appendString(b, o)
		b = binary.AppendUvarint(b, version-s.Floors[o])
		b = binary.LittleEndian.AppendUint64(b, version)
		b = binary.AppendUvarint(b, uint64(len(entries)))
		for _, w := range sortedKeys(entries) {
			b = appendEntry(b, version, w, entries[w])
		}
	}
	return b
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// decodeMessage parses one gossip message of any kind. Exactly one of the
// returned pointers is non-nil when err is nil. Errors wrap ErrForeign,
// ErrVersion or ErrMalformed; it never panics.
func decodeMessage(p []byte) (msgKind, *loadsMsg, *predictionMsg, *stateMsg, error) {
	r := newReader(p)
	k := msgKind(r.u8())
	if r.err != nil {
		return 0, nil, nil, nil, r.err
	}
	switch k {
	case kindLoads:
		m := r.loads()
		r.end()
		if r.err != nil {
			return k, nil, nil, nil, fmt.Errorf("loads: %w", r.err)
		}
		return k, m, nil, nil, nil
	case kindPrediction:
		m := r.prediction()
		r.end()
		if r.err != nil {
			return k, nil, nil, nil, fmt.Errorf("prediction: %w", r.err)
		}
		return k, nil, m, nil, nil
	case kindState:
		m := &stateMsg{Timestamp: r.varint()}
		m.State = r.stateBody()
		r.end()
		if r.err != nil {
			return k, nil, nil, nil, fmt.Errorf("state: %w", r.err)
		}
		return k, nil, nil, m, nil
	}
	return k, nil, nil, nil, fmt.Errorf("%w: unknown kind %d", ErrMalformed, uint8(k))
}

// newReader checks the magic and a version this build reads (minCodecVersion
// to codecVersion) and records the version.
func newReader(p []byte) reader {
	r := reader{buf: p}
	if len(p) >= 3 && p[0] == 'S' && p[1] == 'G' && p[2] >= minCodecVersion && p[2] < codecVersion {
		r.version = p[2]
		r.magic('S', 'G', p[2])
	} else {
		r.version = codecVersion
		r.magic('S', 'G', codecVersion)
	}
	return r
}

// reader decodes with a sticky error: after the first failure every method
// returns zero values, so decoders read straight through and check once.
type reader struct {
	buf     []byte
	off     int
	err     error
	version byte // the message's codec version (gossip messages only)
}

func (r *reader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: "+format+" at offset %d", append([]any{ErrMalformed}, append(args, r.off)...)...)
	}
}

func (r *reader) magic(a, b, version byte) {
	if len(r.buf) < 3 {
		r.err = fmt.Errorf("%w: %d bytes", ErrForeign, len(r.buf))
		return
	}
	if r.buf[0] != a || r.buf[1] != b {
		r.err = fmt.Errorf("%w: magic %q", ErrForeign, r.buf[:2])
		return
	}
	if r.buf[2] != version {
		r.err = fmt.Errorf("%w: %d", ErrVersion, r.buf[2])
		return
	}
	r.off = 3
}

func (r *reader) end() {
	if r.err == nil && r.off != len(r.buf) {
		r.fail("%d trailing bytes", len(r.buf)-r.off)
	}
}

func (r *reader) u8() uint8 {
	if r.err != nil {
		return 0
	}
	if r.off >= len(r.buf) {
		r.fail("truncated")
		return 0
	}
	v := r.buf[r.off]
	r.off++
	return v
}

func (r *reader) u64() uint64 {
	if r.err != nil {
		return 0
	}
	if len(r.buf)-r.off < 8 {
		r.fail("truncated")
		return 0
	}
	v := binary.LittleEndian.Uint64(r.buf[r.off:])
	r.off += 8
	return v
}

func (r *reader) uvarint() uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.buf[r.off:])
	if n <= 0 {
		r.fail("bad uvarint")
		return 0
	}
	r.off += n
	return v
}

func (r *reader) varint() int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.buf[r.off:])
	if n <= 0 {
		r.fail("bad varint")
		return 0
	}
	r.off += n
	return v
}

// int reads a zigzag varint that must fit a 32-bit int: loads and block
// counts are small, and the bound keeps sums from overflowing.
func (r *reader) int() int {
	v := r.varint()
	if v < -1<<31 || v > 1<<31-1 {
		r.fail("integer %d out of range", v)
		return 0
	}
	return int(v)
}

func (r *reader) str() string {
	n := r.uvarint()
	if r.err != nil {
		return ""
	}
	if n > maxStringLen || n > uint64(len(r.buf)-r.off) {
		r.fail("string length %d", n)
		return ""
	}
	s := string(r.buf[r.off : r.off+int(n)])
	r.off += int(n)
	return s
}

// count reads an element count and checks that the remaining bytes can hold
// that many elements of at least minSize bytes, so a corrupt count cannot
// make the decoder allocate without bound.
func (r *reader) count(minSize int) int {
	n := r.uvarint()
	if r.err != nil {
		return 0
	}
	if n > uint64((len(r.buf)-r.off)/minSize) {
		r.fail("count %d exceeds remaining bytes", n)
		return 0
	}
	return int(n)
}

func (r *reader) entry(version uint64) (string, Entry) {
	w := r.str()
	lag := r.uvarint()
	var e Entry
	e.Load.ActiveRequests = r.int()
	e.Load.PrefillTokens = r.int()
	e.Load.DecodeBlocks = r.int()
	e.Digest.LastEventID = r.uvarint()
	e.Digest.Blocks = r.int()
	e.Digest.Instance = r.uvarint()
	if r.version >= 3 {
		e.Health.SuspectSince = r.varint()
		e.Health.RecoveredAt = r.varint()
	}
	if r.err == nil && lag > version {
		r.fail("entry version lag %d exceeds version %d", lag, version)
	}
	e.Version = version - lag
	return w, e
}

func (r *reader) loads() *loadsMsg {
	m := &loadsMsg{}
	m.Origin = r.str()
	m.Version = r.u64()
	m.Timestamp = r.varint()
	m.ShardBits = r.u8()
	if r.err == nil && m.ShardBits > maxShardBits {
		r.fail("shard bits %d", m.ShardBits)
	}
	shard := r.uvarint()
	if r.err == nil && shard >= 1<<m.ShardBits {
		r.fail("shard %d out of range", shard)
	}
	m.Shard = uint32(shard)
	part := r.uvarint()
	if r.err == nil && part > 1<<16 {
		r.fail("part %d out of range", part)
	}
	m.Part = uint32(part)
	n := r.count(minEntryBytes)
	if r.err != nil {
		return nil
	}
	m.Entries = make([]workerEntry, 0, n)
	seen := make(map[string]struct{}, n)
	for i := 0; i < n && r.err == nil; i++ {
		w, e := r.entry(m.Version)
		if _, dup := seen[w]; dup && r.err == nil {
			r.fail("duplicate worker %q", w)
		}
		seen[w] = struct{}{}
		m.Entries = append(m.Entries, workerEntry{Worker: w, Entry: e})
	}
	if m.Origin == "" {
		r.fail("empty origin")
	}
	return m
}

func (r *reader) prediction() *predictionMsg {
	m := &predictionMsg{}
	m.Origin = r.str()
	m.ID = r.uvarint()
	m.Timestamp = r.varint()
	m.Worker = r.str()
	m.Expires = r.varint()
	n := r.count(8)
	if r.err != nil {
		return nil
	}
	m.Hashes = make([]uint64, n)
	for i := range m.Hashes {
		m.Hashes[i] = r.u64()
	}
	if m.Origin == "" || m.Worker == "" {
		r.fail("empty origin or worker")
	}
	return m
}

func (r *reader) stateBody() State {
	var st State
	// An origin needs at least a length byte, a floor byte, 8 version bytes
	// and a count byte.
	n := r.count(11)
	if r.err != nil {
		return st
	}
	for i := 0; i < n && r.err == nil; i++ {
		o := r.str()
		floorLag := r.uvarint()
		version := r.u64()
		k := r.count(minEntryBytes)
		if r.err != nil {
			break
		}
		if o == "" {
			r.fail("empty origin")
			break
		}
		if floorLag > version {
			r.fail("floor lag %d exceeds version %d", floorLag, version)
			break
		}
		if _, dup := st.Origins[o]; dup {
			r.fail("duplicate origin %q", o)
			break
		}
		if _, dup := st.Floors[o]; dup {
			r.fail("duplicate origin %q", o)
			break
		}
		if floor := version - floorLag; floor > 0 {
			st.setFloor(o, floor)
		}
		entries := make(map[string]Entry, k)
		for j := 0; j < k && r.err == nil; j++ {
			w, e := r.entry(version)
			if _, dup := entries[w]; dup && r.err == nil {
				r.fail("duplicate worker %q", w)
			}
			entries[w] = e
		}
		if len(entries) > 0 {
			if st.Origins == nil {
				st.Origins = make(map[string]map[string]Entry)
			}
			st.Origins[o] = entries
		}
	}
	return st
}
