package wire

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
)

// NamedFile is one tokenizer file: its name as listed in
// TokenizerSource.Files and its bytes.
type NamedFile struct {
	Name string
	Data []byte
}

// TokenizerDigest is the TokenizerSource.SHA256 of files, in their order:
// the hex SHA-256 over each file's name, a NUL byte, its length as 8
// little-endian bytes and its bytes. The adapter advertises it; a router
// recomputes it over what it fetched before using the files. Lengths make
// the framing unambiguous, so moving bytes from one file to the next
// changes the digest.
func TokenizerDigest(files []NamedFile) string {
	h := sha256.New()
	var n [8]byte
	for _, f := range files {
		_, _ = h.Write([]byte(f.Name))
		_, _ = h.Write([]byte{0})
		binary.LittleEndian.PutUint64(n[:], uint64(len(f.Data)))
		_, _ = h.Write(n[:])
		_, _ = h.Write(f.Data)
	}
	return hex.EncodeToString(h.Sum(nil))
}
