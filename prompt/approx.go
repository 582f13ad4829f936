package prompt

import "encoding/binary"

// approxBytes is how many bytes of text one pseudo-token stands for: close
// to what BPE vocabularies average on English, so the load a request books
// stays about right.
const approxBytes = 4

// approxTokens returns one pseudo-token per approxBytes bytes of text: a
// hash of those bytes, so equal text prefixes give equal token prefixes
// (up to the last partial chunk) and therefore shared block hashes.
func approxTokens(text string) []uint32 {
	out := make([]uint32, 0, (len(text)+approxBytes-1)/approxBytes)
	for i := 0; i < len(text); i += approxBytes {
		var chunk [approxBytes]byte
		n := copy(chunk[:], text[i:])
		v := binary.LittleEndian.Uint32(chunk[:]) ^ uint32(n)<<29
		// A multiplicative mix keeps ids spread; the values only need to be
		// stable and distinct for distinct chunks.
		v *= 0x9E3779B1
		v ^= v >> 15
		out = append(out, v)
	}
	return out
}

// approxCount is len(approxTokens(text)) without building it.
func approxCount(text string) int { return (len(text) + approxBytes - 1) / approxBytes }
