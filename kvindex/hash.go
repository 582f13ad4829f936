package kvindex

import (
	"encoding/binary"
	"math/bits"

	"github.com/zeebo/xxh3"
)

// BaseSeed is the xxh3 seed of block hashes when no salt applies.
const BaseSeed = 1337

// Salt returns the hashing seed for a cache namespace: the model, LoRA adapter
// and per-request cache salt enter the seed, so identical tokens under
// different namespaces never share cache entries. The empty namespace is
// BaseSeed.
func Salt(parts ...string) uint64 {
	empty := true
	for _, p := range parts {
		if p != "" {
			empty = false
		}
	}
	if empty {
		return BaseSeed
	}
	h := xxh3.New()
	var sep [1]byte
	for _, p := range parts {
		_, _ = h.WriteString(p)
		_, _ = h.Write(sep[:])
	}
	return xxh3.HashSeed(binary.LittleEndian.AppendUint64(nil, h.Sum64()), BaseSeed)
}

// BlockHash hashes one full block of tokens: xxh3-64 of the tokens as
// little-endian u32 with the given seed.
func BlockHash(tokens []uint32, seed uint64) uint64 {
	var stack [64 * 4]byte
	buf := stack[:0]
	if len(tokens)*4 > len(stack) {
		buf = make([]byte, 0, len(tokens)*4)
	}
	for _, t := range tokens {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	return xxh3.HashSeed(buf, seed)
}

// ChainHash returns the sequence hash of a block given its parent's sequence
// hash: xxh3(le(parent) ‖ le(block)) with the given seed.
func ChainHash(parent, block uint64, seed uint64) uint64 {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], parent)
	binary.LittleEndian.PutUint64(b[8:], block)
	return xxh3.HashSeed(b[:], seed)
}

// SequenceHashes returns the sequence hash of every full block of tokens
// (partial trailing blocks are never hashed): seq[0] = block[0],
// seq[i] = ChainHash(seq[i-1], block[i]).
// The slice is allocated once at the block count (nil without a full block).
func SequenceHashes(tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize <= 0 || len(tokens) < blockSize {
		return nil
	}
	return AppendSequenceHashes(make([]uint64, 0, len(tokens)/blockSize), tokens, blockSize, seed)
}

// AppendSequenceHashes appends the sequence hashes of tokens' full blocks to
// dst, reusing its capacity.
func AppendSequenceHashes(dst []uint64, tokens []uint32, blockSize int, seed uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	var prev uint64
	for i := 0; i < n; i++ {
		h := BlockHash(tokens[i*blockSize:(i+1)*blockSize], seed)
		if i > 0 {
			h = ChainHash(prev, h, seed)
		}
		dst = append(dst, h)
		prev = h
	}
	return dst
}

// ModelSeed is the seed a request's blocks are hashed with, on routers and
// workers alike: the served model name the request asked for, which for a
// LoRA request is the adapter's name (the name the engine reports as a
// stored block's lora_name). Requests for different models therefore never
// share cache entries, even on a worker that serves several.
func ModelSeed(model string) uint64 { return Salt(model) }

// MaxSample bounds Config.Sample: one block in 256 already leaves a
// 4,096-token prompt (256 blocks of 16) one sampled position on average.
const MaxSample = 256

// mix is the 64-bit finaliser of MurmurHash3: every output bit depends on
// every input bit, so the sampling rule does not depend on how an engine's
// hashes happen to be laid out (vLLM's and SGLang's are not all xxh3).
func mix(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

// Sampled reports whether the sequence hash h is one the index keeps at
// sampling rate n (Config.Sample): about one hash in n, chosen by the hash
// alone, so every store, removal, dump, prediction and lookup of the same
// hash agrees without knowing the block's depth. The rule is
// mix(h)·n < 2^64, the high word of the 128-bit product being zero
// (Lemire's multiply-shift range reduction: one multiply, no division). Every
// hash is sampled at n <= 1.
func Sampled(h uint64, n int) bool {
	if n <= 1 {
		return true
	}
	hi, _ := bits.Mul64(mix(h), uint64(n))
	return hi == 0
}

// KeepSampled removes from hs, in place, the hashes Sampled does not keep
// at rate n, and returns what is left (hs itself at n <= 1).
func KeepSampled(hs []uint64, n int) []uint64 {
	if n <= 1 {
		return hs
	}
	kept := hs[:0]
	for _, h := range hs {
		if Sampled(h, n) {
			kept = append(kept, h)
		}
	}
	return kept
}
