package kvindex

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
	"github.com/zeebo/xxh3"
)

// The known answers below were computed once from the spec (design §6) with
// direct xxh3 calls on hand-built byte slices (see independent* helpers) and
// pinned, so that a change to either the spec expression or the production
// code is caught, and so engines written in other languages can check
// themselves against these numbers.
const (
	katBlock0 = 0xcb38e4d7fb2dca5c // tokens 1,2,3,4
	katBlock1 = 0xe8d3ec39b907b74c // tokens 5,6,7,8
	katBlock2 = 0x06b748f1777d599c // tokens 9,10,11,12
	katSeq1   = 0x44a2b2379d6d3c3d // chain(block0, block1)
	katSeq2   = 0xaea1e67a6c80cf84 // chain(seq1, block2)
	katBig    = 0xb56d6eeee9c2c3af // 100 tokens i*7919, wider than the stack buffer
)

func independentLE32(tokens ...uint32) []byte {
	b := make([]byte, 0, 4*len(tokens))
	for _, t := range tokens {
		b = append(b, byte(t), byte(t>>8), byte(t>>16), byte(t>>24))
	}
	return b
}

func independentChain(parent, block, seed uint64) uint64 {
	b := make([]byte, 16)
	for i := 0; i < 8; i++ {
		b[i] = byte(parent >> (8 * i))
		b[8+i] = byte(block >> (8 * i))
	}
	return xxh3.HashSeed(b, seed)
}

func TestBlockHashIsXXH3OfLittleEndianTokensSeeded1337(t *testing.T) {
	require.Equal(t, uint64(katBlock0), xxh3.HashSeed(independentLE32(1, 2, 3, 4), 1337), "the pinned vector follows the spec")
	require.Equal(t, uint64(katBlock0), BlockHash([]uint32{1, 2, 3, 4}, BaseSeed))
	require.Equal(t, uint64(katBlock1), BlockHash([]uint32{5, 6, 7, 8}, BaseSeed))
	require.Equal(t, uint64(katBlock2), BlockHash([]uint32{9, 10, 11, 12}, BaseSeed))
}

func TestBlockHashOfLongBlocksMatchesTheSpec(t *testing.T) {
	toks := make([]uint32, 100)
	for i := range toks {
		toks[i] = uint32(i * 7919)
	}
	require.Equal(t, uint64(katBig), xxh3.HashSeed(independentLE32(toks...), 1337))
	require.Equal(t, uint64(katBig), BlockHash(toks, BaseSeed))
}

func TestSequenceHashChainsParentThenBlockLittleEndian(t *testing.T) {
	require.Equal(t, uint64(katSeq1), independentChain(katBlock0, katBlock1, 1337))
	require.Equal(t, uint64(katSeq2), independentChain(katSeq1, katBlock2, 1337))
	require.Equal(t, uint64(katSeq1), ChainHash(katBlock0, katBlock1, BaseSeed))

	got := SequenceHashes([]uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}, 4, BaseSeed)
	require.Equal(t, []uint64{katBlock0, katSeq1, katSeq2}, got, "seq[0] is the first block's hash, then the chain")
}

func TestPartialTrailingBlocksAreNeverHashed(t *testing.T) {
	full := SequenceHashes([]uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, BaseSeed)
	for extra := 1; extra < 4; extra++ {
		toks := []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}[:8+extra]
		require.Equal(t, full, SequenceHashes(toks, 4, BaseSeed), "with %d trailing tokens", extra)
	}
	require.Empty(t, SequenceHashes([]uint32{1, 2, 3}, 4, BaseSeed), "a prompt shorter than a block has no hashes")
	require.Empty(t, SequenceHashes([]uint32{1, 2, 3, 4}, 0, BaseSeed), "a non-positive block size hashes nothing")
}

func TestAppendSequenceHashesAppendsAfterExistingElements(t *testing.T) {
	dst := make([]uint64, 1, 8)
	dst[0] = 42
	dst = AppendSequenceHashes(dst, []uint32{1, 2, 3, 4, 5, 6, 7, 8}, 4, BaseSeed)
	require.Equal(t, []uint64{42, katBlock0, katSeq1}, dst)
}

func TestSaltSeparatesCacheNamespaces(t *testing.T) {
	require.Equal(t, uint64(BaseSeed), Salt(), "no namespace is the base seed")
	require.Equal(t, uint64(BaseSeed), Salt("", ""), "empty parts are no namespace")

	// Independent expression: xxh3 of the parts each followed by a zero
	// byte, its little-endian bytes hashed again with the base seed.
	inner := xxh3.Hash([]byte("llama-3-8b\x00\x00"))
	want := xxh3.HashSeed(binary.LittleEndian.AppendUint64(nil, inner), 1337)
	require.Equal(t, want, Salt("llama-3-8b", ""))

	seeds := map[uint64]string{}
	for _, parts := range [][]string{{"m"}, {"m", "lora"}, {"m", "", "salt"}, {"ml", "ora"}, {"", "m"}} {
		s := Salt(parts...)
		require.NotEqual(t, uint64(BaseSeed), s)
		prev, dup := seeds[s]
		require.False(t, dup, "namespaces %v and %s share a seed", parts, prev)
		seeds[s] = fmt.Sprint(parts)
	}
	toks := []uint32{1, 2, 3, 4}
	require.NotEqual(t, BlockHash(toks, BaseSeed), BlockHash(toks, Salt("m")), "the same tokens under another namespace hash differently")
}
