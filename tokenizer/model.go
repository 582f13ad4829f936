package tokenizer

import (
	"encoding/binary"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"unsafe"
)

var (
	// ErrUnsupported reports a tokenizer file that uses a model, normalizer,
	// pre-tokenizer or option this package does not implement. Loading fails
	// rather than producing ids that differ from the engine's.
	ErrUnsupported = errors.New("unsupported tokenizer")
	// ErrMalformed reports a tokenizer file that is not valid JSON or whose
	// content is inconsistent (a merge of tokens outside the vocabulary, a
	// bad rank line, ...).
	ErrMalformed = errors.New("malformed tokenizer file")
)

// Model is a loaded tokenizer: a BPE vocabulary and merges with the
// normalizer, pre-tokenizer, added tokens, post-processor and decoder of a
// Hugging Face tokenizer.json, or a tiktoken encoding. It is immutable after
// loading and safe for concurrent use.
type Model struct {
	name string

	// vocab maps each token as written in the file (byte-level tokens in
	// their printable GPT-2 form) to its id, added tokens included.
	vocab strMap
	// raw maps the text a model-vocabulary token stands for (raw bytes for
	// byte-level models) to its id: the lookup key of BPE.
	raw strMap
	// merges maps a pair of ids (left<<32 | right) to rank<<32 | merged id.
	merges map[uint64]uint64
	// decoded holds the bytes each id decodes to; tokens the file form.
	// (strMap and strList hold no pointers: see strtable.go.)
	decoded strList
	tokens  strList

	byteLevel    bool
	byteID       [256]uint32
	byteOK       [256]bool
	ignoreMerges bool
	byteFallback bool
	fallbackID   [256]uint32
	fallbackOK   [256]bool
	unkID        uint32
	hasUnk       bool
	fuseUnk      bool

	norm normalizer
	pre  []preTokenizer
	// fast is set when the whole pre-tokenization is one hand-written split
	// (Isolated) with nothing else to do, the common byte-level case.
	fast handSplitter

	rawAdded  *matcher // added tokens matched in the raw text
	normAdded *matcher // added tokens matched after normalization

	dec decoder

	prefix, suffix []uint32 // post-processor of a single sequence
	addBOS         bool
	bosToken       string
	eosToken       string
	specials       map[string]string
	vocabSize      int
}

// A Model is a Tokenizer, so callers of the toy move over unchanged.
var _ Tokenizer = (*Model)(nil)

// scratch is per-call working memory, pooled so Encode allocates only its
// result.
type scratch struct {
	syms    []uint32
	vals    []uint64
	pieces  []piece
	pieces2 []piece
	matches []addedMatch
	cuts    []addedMatch // matches and turn cuts (EncodeCached)
	// EncodeCached's working set: the ids as they are built, the cuts'
	// prefix hashes, the keys and counts of the prefixes to store.
	ids    []uint32
	hashes []uint64
	keys   []cacheKey
	counts []int
	// text is EncodeTurns' buffer for the one turn being rendered.
	text []byte

	// words caches the ids of recent pre-tokens of one model. Text repeats
	// its words, and this small table stays in the CPU cache where the
	// vocabulary and merge tables (megabytes) do not. It is direct-mapped
	// by a hash of the piece (a collision replaces the older word) and
	// holds no pointers, so the collector never scans it; the keys' bytes
	// and the ids live in two arenas, and the whole cache is cleared when
	// either is full.
	wordsModel *Model
	short      []shortSlot // 1<<shortBits entries once used
	words      []wordSlot  // wordSlots entries once used
	// gen is the cache's generation: a slot holds a word only when its gen
	// is this one, so clearing the cache (a new model, full arenas) is one
	// increment; the tables are zeroed when it wraps.
	gen      uint8
	wordIDs  []uint32
	wordKeys []byte
	// noWordCache turns the word cache off, for the benchmark that
	// measures what it saves.
	noWordCache bool
}

// wordSlot is one word cache entry; idLen 0 marks an empty slot.
type wordSlot struct {
	hash   uint64
	keyOff uint32
	idOff  uint32
	keyLen uint8
	idLen  uint8
	gen    uint8
}

// shortSlot is a word cache entry for a piece of at most 16 bytes that
// encodes to at most 3 ids, most words of prose and code: the bytes and the
// ids sit in the slot, so a hit reads one half cache line. n is 0 in an
// empty slot, else the piece's length | the ids' count << 5.
type shortSlot struct {
	k0, k1 uint64
	ids    [3]uint32
	n      uint8
	gen    uint8
}

// shortKey loads a piece of at most 16 bytes as two words, zero-padded.
func shortKey(w string) (k0, k1 uint64) {
	n := len(w)
	b := unsafe.Slice(unsafe.StringData(w), n) // read only
	switch {
	case n >= 8:
		k0 = binary.LittleEndian.Uint64(b)
		if n > 8 { // the last 8 bytes, shifted down to bytes 8..n-1
			k1 = binary.LittleEndian.Uint64(b[n-8:]) >> (8 * (16 - n))
		}
	case n >= 4:
		hi := uint64(binary.LittleEndian.Uint32(b[n-4:])) >> (8 * (8 - n))
		k0 = uint64(binary.LittleEndian.Uint32(b)) | hi<<32
	default:
		for i := range n {
			k0 |= uint64(b[i]) << (8 * i)
		}
	}
	return k0, k1
}

// shortIndex is a slot of the short table for a key: a multiplicative
// hash, its top bits.
func shortIndex(k0, k1 uint64, n int) uint64 {
	h := (k0*0x9e3779b97f4a7c15 ^ k1*0xc2b2ae3d27d4eb4f ^ uint64(n)) * 0x165667b19e3779f9
	return h >> (64 - shortBits)
}

// shortBits sizes the short table: 1<<14 slots of 32 bytes.
const shortBits = 14

// wordSlots is the word cache's size (a power of two): some 400 kB per
// scratch, which a long prompt's distinct words fill sparsely enough that
// collisions are rare. maxCachedWordLen keeps long pieces, which rarely
// repeat, out of it; the arenas bound how much it holds before a clear.
const (
	wordSlots        = 1 << 14
	maxCachedWordLen = 32
	wordKeyArena     = 256 << 10
	wordIDArena      = 64 << 10
)

// wordSeed seeds the word cache's hash; one per process.
var wordSeed = maphash.MakeSeed()

var scratchPool = sync.Pool{New: func() any { return new(scratch) }}

// Name returns the name the model was loaded under (a path or tiktoken:NAME).
func (m *Model) Name() string { return m.name }

// VocabSize returns one more than the largest token id.
func (m *Model) VocabSize() int { return m.vocabSize }

// TokenID returns the id of a token as written in the tokenizer file (added
// tokens included), e.g. TokenID("<|eot_id|>"). For tiktoken encodings the
// token is its raw bytes.
func (m *Model) TokenID(token string) (uint32, bool) {
	return m.vocab.get(token)
}

// Token returns the token of id as written in the tokenizer file.
func (m *Model) Token(id uint32) (string, bool) {
	if int(id) >= m.tokens.Len() || m.tokens.get(id) == "" && m.decoded.get(id) == "" {
		return "", false
	}
	return m.tokens.get(id), true
}

// AddBOS reports whether a completions prompt gets a BOS token: the
// tokenizer_config.json add_bos_token when present, otherwise whether the
// post-processor puts a special token before the sequence.
func (m *Model) AddBOS() bool { return m.addBOS }

// BOSToken and EOSToken return the bos_token and eos_token of
// tokenizer_config.json (for BOS, the post-processor's leading token when the
// config has none). Empty when unknown.
func (m *Model) BOSToken() string { return m.bosToken }

// EOSToken: see BOSToken.
func (m *Model) EOSToken() string { return m.eosToken }

// SpecialTokens returns bos_token, eos_token, unk_token and pad_token from
// tokenizer_config.json, those present, keyed by those names. Chat templates
// receive them as variables.
func (m *Model) SpecialTokens() map[string]string {
	out := make(map[string]string, len(m.specials))
	for k, v := range m.specials {
		out[k] = v
	}
	return out
}

// Encode returns the ids of text as Hugging Face's
// tokenizer.encode(text, add_special_tokens=False) does: added and special
// tokens written in the text are recognised, nothing is added around it.
func (m *Model) Encode(text string) []uint32 {
	return m.AppendEncode(make([]uint32, 0, len(text)/3+8), text)
}

// AppendEncode appends the ids of text (as Encode) to dst.
func (m *Model) AppendEncode(dst []uint32, text string) []uint32 {
	sc := scratchPool.Get().(*scratch)
	dst = m.appendEncode(dst, text, sc)
	scratchPool.Put(sc)
	return dst
}

func (m *Model) appendEncode(dst []uint32, text string, sc *scratch) []uint32 {
	sc.matches = m.rawAdded.find(text, sc.matches[:0])
	matches := sc.matches
	prev := 0
	for k := range matches {
		mt := matches[k]
		dst = m.appendSegment(dst, text[prev:mt.start], prev == 0, sc)
		dst = append(dst, mt.id)
		prev = mt.stop
	}
	return m.appendSegment(dst, text[prev:], prev == 0, sc)
}

// EncodeWithSpecialTokens returns the ids of text with the tokens the
// post-processor adds around a single sequence (BOS, and EOS for some
// families), as tokenizer.encode(text) does; this is what vLLM sends for a
// completions prompt.
func (m *Model) EncodeWithSpecialTokens(text string) []uint32 {
	out := make([]uint32, 0, len(text)/4+4+len(m.prefix)+len(m.suffix))
	out = append(out, m.prefix...)
	out = m.AppendEncode(out, text)
	return append(out, m.suffix...)
}

// Count returns len(m.Encode(text)).
func (m *Model) Count(text string) int { return len(m.Encode(text)) }

// appendSegment encodes text that holds no raw-matched added token. first
// says it starts the whole text (Metaspace's prepend_scheme "first").
func (m *Model) appendSegment(dst []uint32, seg string, first bool, sc *scratch) []uint32 {
	if seg == "" {
		return dst
	}
	if m.norm != nil {
		seg = m.norm.normalize(seg)
	}
	if m.normAdded == nil {
		return m.appendPretokenized(dst, seg, first, sc)
	}
	// The matches of the raw pass are in use by the caller: keep them.
	saved := sc.matches
	sc.matches = nil
	matches := m.normAdded.find(seg, nil)
	prev := 0
	for _, mt := range matches {
		dst = m.appendPretokenized(dst, seg[prev:mt.start], first && prev == 0, sc)
		dst = append(dst, mt.id)
		prev = mt.stop
	}
	dst = m.appendPretokenized(dst, seg[prev:], first && prev == 0, sc)
	sc.matches = saved
	return dst
}

func (m *Model) appendPretokenized(dst []uint32, s string, first bool, sc *scratch) []uint32 {
	if s == "" {
		return dst
	}
	if m.fast != nil {
		for i := 0; i < len(s); {
			j := m.fast.next(s, i)
			dst = m.appendWord(dst, s[i:j], sc)
			i = j
		}
		return dst
	}
	pieces := append(sc.pieces[:0], piece{s: s, first: first})
	next := sc.pieces2[:0]
	for _, p := range m.pre {
		next = next[:0]
		for _, pc := range pieces {
			next = p.split(next, pc)
		}
		pieces, next = next, pieces
	}
	for _, pc := range pieces {
		dst = m.appendWord(dst, pc.s, sc)
	}
	sc.pieces, sc.pieces2 = pieces[:0], next[:0]
	return dst
}

// noMerge is the pair value of two symbols that do not merge.
const noMerge = ^uint64(0)

func (m *Model) pair(a, b uint32) uint64 {
	if v, ok := m.merges[uint64(a)<<32|uint64(b)]; ok {
		return v
	}
	return noMerge
}

// appendWord runs BPE on one pre-token.
func (m *Model) appendWord(dst []uint32, w string, sc *scratch) []uint32 {
	if w == "" {
		return dst
	}
	if m.byteLevel && len(w) == 1 && m.byteOK[w[0]] {
		return append(dst, m.byteID[w[0]])
	}
	if len(w) > maxCachedWordLen || sc.noWordCache {
		return m.appendWordUncached(dst, w, sc)
	}
	if sc.wordsModel != m || sc.words == nil {
		sc.resetWords(m)
	}
	if len(w) <= 16 {
		k0, k1 := shortKey(w)
		slot := &sc.short[shortIndex(k0, k1, len(w))]
		if slot.k0 == k0 && slot.k1 == k1 && int(slot.n&31) == len(w) && slot.gen == sc.gen {
			if slot.n>>5 == 1 {
				return append(dst, slot.ids[0])
			}
			return append(dst, slot.ids[:slot.n>>5]...)
		}
		start := len(dst)
		dst = m.appendWordUncached(dst, w, sc)
		if n := len(dst) - start; n <= 3 {
			*slot = shortSlot{k0: k0, k1: k1, n: uint8(len(w)) | uint8(n)<<5, gen: sc.gen}
			copy(slot.ids[:], dst[start:])
		}
		return dst
	}
	h := maphash.String(wordSeed, w)
	slot := &sc.words[h&(wordSlots-1)]
	if slot.hash == h && slot.idLen > 0 && slot.gen == sc.gen && int(slot.keyLen) == len(w) &&
		string(sc.wordKeys[slot.keyOff:slot.keyOff+uint32(slot.keyLen)]) == w {
		return append(dst, sc.wordIDs[slot.idOff:slot.idOff+uint32(slot.idLen)]...)
	}
	start := len(dst)
	dst = m.appendWordUncached(dst, w, sc)
	n := len(dst) - start
	if n > maxCachedWordLen {
		return dst
	}
	if len(sc.wordKeys)+len(w) > wordKeyArena || len(sc.wordIDs)+n > wordIDArena {
		sc.resetWords(m)
		slot = &sc.words[h&(wordSlots-1)]
	}
	*slot = wordSlot{hash: h, keyOff: uint32(len(sc.wordKeys)), idOff: uint32(len(sc.wordIDs)), keyLen: uint8(len(w)), idLen: uint8(n), gen: sc.gen}
	sc.wordKeys = append(sc.wordKeys, w...)
	sc.wordIDs = append(sc.wordIDs, dst[start:]...)
	return dst
}

func (sc *scratch) resetWords(m *Model) {
	sc.wordsModel = m
	if sc.words == nil {
		sc.words = make([]wordSlot, wordSlots)
		sc.short = make([]shortSlot, 1<<shortBits)
		sc.wordKeys = make([]byte, 0, wordKeyArena)
		sc.wordIDs = make([]uint32, 0, wordIDArena)
		sc.gen = 1 // zeroed slots (gen 0) hold nothing
	} else if sc.gen++; sc.gen == 0 {
		clear(sc.words)
		clear(sc.short)
		sc.gen = 1
	}
	sc.wordIDs = sc.wordIDs[:0]
	sc.wordKeys = sc.wordKeys[:0]
}

func (m *Model) appendWordUncached(dst []uint32, w string, sc *scratch) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.raw.get(w); ok {
			return append(dst, id)
		}
	}
	syms := sc.syms[:0]
	if m.byteLevel {
		for i := 0; i < len(w); i++ {
			if m.byteOK[w[i]] {
				syms = append(syms, m.byteID[w[i]])
			} else {
				syms = m.appendUnk(syms)
			}
		}
	} else {
		syms = m.appendChars(syms, w)
	}
	syms = m.merge(syms, sc)
	dst = append(dst, syms...)
	sc.syms = syms[:0]
	return dst
}

// appendUnk appends the unknown token (fused with a preceding one when
// fuse_unk is set); without an unk_token the character is dropped, as
// Hugging Face does.
func (m *Model) appendUnk(syms []uint32) []uint32 {
	if !m.hasUnk {
		return syms
	}
	if m.fuseUnk && len(syms) > 0 && syms[len(syms)-1] == m.unkID {
		return syms
	}
	return append(syms, m.unkID)
}

// appendChars gives the initial symbols of a non-byte-level word: one per
// character, <0xNN> byte tokens for characters outside the vocabulary when
// byte_fallback is set, else the unknown token.
func (m *Model) appendChars(syms []uint32, w string) []uint32 {
	for i := 0; i < len(w); {
		_, n := decode(w, i)
		if id, ok := m.raw.get(w[i : i+n]); ok {
			syms = append(syms, id)
			i += n
			continue
		}
		if m.byteFallback {
			ok := true
			for k := i; k < i+n; k++ {
				ok = ok && m.fallbackOK[w[k]]
			}
			if ok {
				for k := i; k < i+n; k++ {
					syms = append(syms, m.fallbackID[w[k]])
				}
				i += n
				continue
			}
		}
		syms = m.appendUnk(syms)
		i += n
	}
	return syms
}

// merge applies merges by rank (lowest first, leftmost on ties) until no
// adjacent pair merges: Hugging Face's BPE and, with merges derived from
// ranks, tiktoken's.
func (m *Model) merge(syms []uint32, sc *scratch) []uint32 {
	if len(syms) < 2 {
		return syms
	}
	if len(syms) > heapThreshold {
		return m.mergeHeap(syms)
	}
	return m.mergeScan(syms, sc)
}

// mergeScan is merge by scanning every pair for the best one, the fastest
// way for short words.
func (m *Model) mergeScan(syms []uint32, sc *scratch) []uint32 {
	vals := sc.vals[:0]
	for i := 0; i+1 < len(syms); i++ {
		vals = append(vals, m.pair(syms[i], syms[i+1]))
	}
	for len(vals) > 0 {
		best, bi := noMerge, -1
		for i, v := range vals {
			if v < best {
				best, bi = v, i
			}
		}
		if bi < 0 {
			break
		}
		syms[bi] = uint32(best)
		copy(syms[bi+1:], syms[bi+2:])
		syms = syms[:len(syms)-1]
		if bi+1 < len(vals) {
			copy(vals[bi+1:], vals[bi+2:])
		}
		vals = vals[:len(vals)-1]
		if bi < len(vals) {
			vals[bi] = m.pair(syms[bi], syms[bi+1])
		}
		if bi > 0 {
			vals[bi-1] = m.pair(syms[bi-1], syms[bi])
		}
	}
	sc.vals = vals[:0]
	return syms
}

// Decode returns the text of ids: byte-level tokens map back to their
// bytes, added tokens to their content. Unlike Hugging Face it does not
// replace invalid UTF-8 with U+FFFD, so Decode(Encode(s)) == s for any
// bytes s; ids outside the vocabulary are skipped.
func (m *Model) Decode(ids []uint32) string {
	if m.dec != nil {
		toks := make([]string, 0, len(ids))
		for _, id := range ids {
			if int(id) < m.decoded.Len() {
				toks = append(toks, m.decoded.get(id))
			}
		}
		return m.dec.decode(toks)
	}
	var b strings.Builder
	for _, id := range ids {
		if int(id) < m.decoded.Len() {
			b.WriteString(m.decoded.get(id))
		}
	}
	return b.String()
}
