package gossip

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sort"

	"github.com/zeebo/xxh3"
)

// Repair: push-pull carries digests, and what differs is fetched.
//
// Until codec version 4 push-pull exchanged the full State: every origin's
// entry for every worker, replicas × workers entries, with a random peer
// every PushPullInterval; at 10,000 workers and 32 replicas that is about
// 2.5 MB/s per replica (docs/benchmarks.md §10, "Gossip"). Broadcasts
// already deliver nearly every change, so push-pull now carries a digest:
// per origin its floor, its newest version, its entry count and a hash of
// its (worker, version) pairs, about 40 bytes an origin. A replica whose
// summary of an origin differs from the peer's sends the peer a fetch
// (memberlist SendReliable, a TCP stream): for that origin, its entries
// split into buckets by worker hash, and per bucket the newest version and
// the hash of the pairs. The peer answers with its entries of every bucket
// whose hash differs and where it is not behind (its bucket's newest
// version is at least the asker's), one answer per origin. Both sides of a
// push-pull do this, so each takes what the other has; a bucket where each
// side holds something the other lacks is taken by the side that is behind
// first and by the other at the next exchange. Answers are joined like
// any state, so a stale or duplicated answer changes nothing.
//
// An origin is the authority on its own entries. It fetches claims about
// itself only when a peer's summary of it is newer or holds more workers
// than it ever wrote (an earlier incarnation's entries), and those buckets
// are answered whatever their versions; reassert then overwrites the
// claims. A floor in a digest is applied on receipt.
//
//	digest (kind 5):  from | timestamp varint | n uvarint | n × (origin |
//	                  floor_lag uvarint (newest − floor) | newest u64 |
//	                  count uvarint | hash u64)
//	fetch (kind 6):   from | n uvarint | n × (origin | bucket_bits u8 |
//	                  newest u64 | 2^bucket_bits × (newest_lag uvarint | hash u64))
//	answer (kind 7):  from | state body (codec.go), one origin
//
// The three kinds need version 4. A replica of the previous release
// rejects a digest (counted as a state decode error) and so gets no repair
// from upgraded peers until it is upgraded; upgraded replicas still merge
// its full state, and broadcasts flow both ways unchanged.
const (
	kindDigest msgKind = 5
	kindFetch  msgKind = 6
	kindAnswer msgKind = 7
	// maxBucketBits bounds a fetch to 256 buckets per origin (4 kB).
	maxBucketBits = 8
	// workersPerBucket is the target bucket size: an answer for one
	// differing bucket re-sends about this many entries.
	workersPerBucket = 32
	// minDigestOrigin is the smallest encoded digest origin: a length byte,
	// a floor byte, 8 version bytes, a count byte and 8 hash bytes.
	minDigestOrigin = 19
	// minFetchOrigin is the smallest encoded fetch origin: a length byte,
	// the bits, 8 version bytes and one bucket of 9 bytes.
	minFetchOrigin = 19
	minBucketBytes = 9
)

// originSummary is what a digest says about one origin.
type originSummary struct {
	Floor  uint64
	Newest uint64 // the newest entry version, or the floor if higher
	Count  uint64
	Hash   uint64 // sum of pairHash over the entries
}

func (a originSummary) sameEntries(b originSummary) bool {
	return a.Newest == b.Newest && a.Count == b.Count && a.Hash == b.Hash
}

// bucketSummary is one bucket of one origin's entries in a fetch.
type bucketSummary struct {
	Newest uint64
	Hash   uint64
}

type digestMsg struct {
	From      string
	Timestamp int64
	Origins   map[string]originSummary
}

type fetchOrigin struct {
	Origin  string
	Bits    uint8
	Buckets []bucketSummary // 1 << Bits of them
}

type fetchMsg struct {
	From    string
	Origins []fetchOrigin
}

type answerMsg struct {
	From  string
	State State
}

// repairMsg is one decoded repair message; exactly one pointer is set.
type repairMsg struct {
	kind   msgKind
	digest *digestMsg
	fetch  *fetchMsg
	answer *answerMsg
}

// pairHash identifies a (worker, version) pair; wh is the worker's hash.
// Entries of equal version but different value (which a correct origin
// never writes) hash alike.
func pairHash(wh, version uint64) uint64 {
	x := wh ^ (version * 0x9e3779b97f4a7c15)
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}

// bucketOf maps a worker hash to one of 2^bits buckets.
func bucketOf(wh uint64, bits uint8) int {
	if bits == 0 {
		return 0
	}
	return int(wh >> (64 - bits))
}

// bucketBits chooses the bucket count for an origin of n entries.
func bucketBits(n uint64) uint8 {
	return min(uint8(bits.Len64(n/workersPerBucket)), maxBucketBits)
}

// summary is s's digest of origin.
func (s State) summary(origin string) originSummary {
	sum := originSummary{Floor: s.Floors[origin], Newest: s.Floors[origin]}
	for w, e := range s.Origins[origin] {
		sum.Count++
		sum.Hash += pairHash(xxh3.HashString(w), e.Version)
		sum.Newest = max(sum.Newest, e.Version)
	}
	return sum
}

// buckets splits origin's entries into 2^bits buckets and summarises each.
func (s State) buckets(origin string, bits uint8) []bucketSummary {
	out := make([]bucketSummary, 1<<bits)
	for w, e := range s.Origins[origin] {
		wh := xxh3.HashString(w)
		b := &out[bucketOf(wh, bits)]
		b.Hash += pairHash(wh, e.Version)
		b.Newest = max(b.Newest, e.Version)
	}
	return out
}

// digest summarises every origin of s.
func (s State) digest() map[string]originSummary {
	out := make(map[string]originSummary)
	for _, o := range s.origins() {
		out[o] = s.summary(o)
	}
	return out
}

func appendDigest(b []byte, m *digestMsg) []byte {
	b = appendHeader(b, kindDigest)
	b = appendString(b, m.From)
	b = binary.AppendVarint(b, m.Timestamp)
	b = binary.AppendUvarint(b, uint64(len(m.Origins)))
	for _, o := range sortedKeys(m.Origins) {
		sum := m.Origins[o]
		b = appendString(b, o)
		b = binary.AppendUvarint(b, sum.Newest-sum.Floor)
		b = binary.LittleEndian.AppendUint64(b, sum.Newest)
		b = binary.AppendUvarint(b, sum.Count)
		b = binary.LittleEndian.AppendUint64(b, sum.Hash)
	}
	return b
}

func appendFetch(b []byte, m *fetchMsg) []byte {
	b = appendHeader(b, kindFetch)
	b = appendString(b, m.From)
	b = binary.AppendUvarint(b, uint64(len(m.Origins)))
	for _, fo := range m.Origins {
		var newest uint64
		for _, bk := range fo.Buckets {
			newest = max(newest, bk.Newest)
		}
		b = appendString(b, fo.Origin)
		b = append(b, fo.Bits)
		b = binary.LittleEndian.AppendUint64(b, newest)
		for _, bk := range fo.Buckets {
			b = binary.AppendUvarint(b, newest-bk.Newest)
			b = binary.LittleEndian.AppendUint64(b, bk.Hash)
		}
	}
	return b
}

func appendAnswer(b []byte, m *answerMsg) []byte {
	b = appendHeader(b, kindAnswer)
	b = appendString(b, m.From)
	return appendStateBody(b, m.State)
}

// isRepairMessage reports whether p claims to be a digest, fetch or answer
// (decodeRepair checks the rest, the version included).
func isRepairMessage(p []byte) bool {
	return len(p) >= 4 && p[0] == 'S' && p[1] == 'G' && msgKind(p[3]) >= kindDigest && msgKind(p[3]) <= kindAnswer
}

// decodeRepair parses a digest, fetch or answer. Errors wrap ErrForeign,
// ErrVersion or ErrMalformed; it never panics.
func decodeRepair(p []byte) (repairMsg, error) {
	r := newReader(p)
	k := msgKind(r.u8())
	if r.err != nil {
		return repairMsg{}, r.err
	}
	if r.version < codecVersion {
		return repairMsg{}, fmt.Errorf("%w: %s message of version %d", ErrMalformed, k, r.version)
	}
	var m repairMsg
	m.kind = k
	switch k {
	case kindDigest:
		m.digest = r.digest()
	case kindFetch:
		m.fetch = r.fetch()
	case kindAnswer:
		m.answer = &answerMsg{From: r.str()}
		m.answer.State = r.stateBody()
		if r.err == nil && m.answer.From == "" {
			r.fail("empty sender")
		}
	default:
		return repairMsg{}, fmt.Errorf("%w: %s is not a repair message", ErrMalformed, k)
	}
	r.end()
	if r.err != nil {
		return repairMsg{}, fmt.Errorf("%s: %w", k, r.err)
	}
	return m, nil
}

func (r *reader) digest() *digestMsg {
	m := &digestMsg{From: r.str(), Timestamp: r.varint()}
	if r.err == nil && m.From == "" {
		r.fail("empty sender")
	}
	n := r.count(minDigestOrigin)
	if r.err != nil {
		return nil
	}
	m.Origins = make(map[string]originSummary, n)
	for i := 0; i < n && r.err == nil; i++ {
		o := r.str()
		floorLag := r.uvarint()
		var sum originSummary
		sum.Newest = r.u64()
		sum.Count = r.uvarint()
		sum.Hash = r.u64()
		if r.err != nil {
			break
		}
		if o == "" {
			r.fail("empty origin")
		}
		if floorLag > sum.Newest {
			r.fail("floor lag %d exceeds version %d", floorLag, sum.Newest)
		}
		if _, dup := m.Origins[o]; dup {
			r.fail("duplicate origin %q", o)
		}
		sum.Floor = sum.Newest - floorLag
		m.Origins[o] = sum
	}
	return m
}

func (r *reader) fetch() *fetchMsg {
	m := &fetchMsg{From: r.str()}
	if r.err == nil && m.From == "" {
		r.fail("empty sender")
	}
	n := r.count(minFetchOrigin)
	if r.err != nil {
		return nil
	}
	seen := make(map[string]struct{}, n)
	for i := 0; i < n && r.err == nil; i++ {
		fo := fetchOrigin{Origin: r.str(), Bits: r.u8()}
		newest := r.u64()
		if r.err != nil {
			break
		}
		if fo.Origin == "" {
			r.fail("empty origin")
			break
		}
		if _, dup := seen[fo.Origin]; dup {
			r.fail("duplicate origin %q", fo.Origin)
			break
		}
		seen[fo.Origin] = struct{}{}
		if fo.Bits > maxBucketBits {
			r.fail("bucket bits %d", fo.Bits)
			break
		}
		nb := 1 << fo.Bits
		if nb > (len(r.buf)-r.off)/minBucketBytes {
			r.fail("%d buckets exceed remaining bytes", nb)
			break
		}
		fo.Buckets = make([]bucketSummary, nb)
		for j := range fo.Buckets {
			lag := r.uvarint()
			fo.Buckets[j].Hash = r.u64()
			if r.err == nil && lag > newest {
				r.fail("bucket version lag %d exceeds version %d", lag, newest)
			}
			fo.Buckets[j].Newest = newest - lag
		}
		m.Origins = append(m.Origins, fo)
	}
	return m
}

// answerBuckets returns the entries of origin that a fetch asks for: those
// in the buckets whose hash differs from the asker's, where this state is
// not behind the asker, or every differing bucket when authority is set
// (the asker is the origin: it wants every claim about itself that differs
// from its own).
func (s State) answerBuckets(fo fetchOrigin, authority bool) map[string]Entry {
	mine := s.buckets(fo.Origin, fo.Bits)
	out := make(map[string]Entry)
	for w, e := range s.Origins[fo.Origin] {
		i := bucketOf(xxh3.HashString(w), fo.Bits)
		theirs := fo.Buckets[i]
		if mine[i].Hash == theirs.Hash || (!authority && mine[i].Newest < theirs.Newest) {
			continue
		}
		out[w] = e
	}
	return out
}

// sortedOrigins lists a fetch's origins sorted, for deterministic tests.
func sortedOrigins(fos []fetchOrigin) []fetchOrigin {
	sort.Slice(fos, func(i, j int) bool { return fos[i].Origin < fos[j].Origin })
	return fos
}
