package tokenizer

import (
	"hash/maphash"
	"iter"
	"unsafe"
)

// The vocabulary tables hold a string per token (200k for o200k_base). As
// Go maps and []string they were some 800k pointers, and the collector
// marked every one of them in every cycle, for the life of the process: 17
// ms of CPU per cycle for o200k_base, most of a busy router's collection
// work. strMap and strList hold the same strings as bytes in one arena and
// offsets beside it, none of which the collector scans.

// strMap maps strings to ids as a map[string]uint32 does (a second set of a
// key replaces its id), without pointers.
type strMap struct {
	keys []byte // the keys' bytes, appended
	// slots is an open-addressing table, at most half full. A slot holds
	// where its key's bytes are, so a lookup reads one slot and the key.
	slots []strSlot
	n     int // keys set
	seed  maphash.Seed
}

// strSlot is one key: its bytes are keys[off:off+n1-1]; n1 is 0 in an empty
// slot. tag is the top half of the key's hash.
type strSlot struct {
	tag, id, off, n1 uint32
}

func newStrMap(capacity int) strMap {
	size := 16
	for size < 2*capacity {
		size *= 2
	}
	return strMap{slots: make([]strSlot, size), seed: maphash.MakeSeed()}
}

// Len is the number of keys.
func (m *strMap) Len() int { return m.n }

// find returns the slot of key, or the empty slot where it would go.
func (m *strMap) find(key string) *strSlot {
	h := maphash.String(m.seed, key)
	tag := uint32(h >> 32)
	mask := uint64(len(m.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.n1 == 0 || s.tag == tag && int(s.n1-1) == len(key) && string(m.keys[s.off:s.off+s.n1-1]) == key {
			return s
		}
	}
}

// get returns the id of key.
func (m *strMap) get(key string) (uint32, bool) {
	if len(m.slots) == 0 {
		return 0, false
	}
	s := m.find(key)
	return s.id, s.n1 != 0
}

// set maps key to id.
func (m *strMap) set(key string, id uint32) {
	if 2*(m.n+1) > len(m.slots) {
		m.grow()
	}
	s := m.find(key)
	if s.n1 == 0 {
		*s = strSlot{tag: uint32(maphash.String(m.seed, key) >> 32), off: uint32(len(m.keys)), n1: uint32(len(key)) + 1}
		m.keys = append(m.keys, key...)
		m.n++
	}
	s.id = id
}

// grow doubles the slots (16 at first) and re-inserts every key.
func (m *strMap) grow() {
	if len(m.slots) == 0 {
		*m = newStrMap(8)
		return
	}
	old := m.slots
	m.slots = make([]strSlot, 2*len(old))
	mask := uint64(len(m.slots) - 1)
	for _, s := range old {
		if s.n1 == 0 {
			continue
		}
		i := maphash.Bytes(m.seed, m.keys[s.off:s.off+s.n1-1]) & mask
		for m.slots[i].n1 != 0 {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// All yields every key and its id, in no particular order.
func (m *strMap) All() iter.Seq2[string, uint32] {
	return func(yield func(string, uint32) bool) {
		for _, s := range m.slots {
			if s.n1 != 0 && !yield(string(m.keys[s.off:s.off+s.n1-1]), s.id) {
				return
			}
		}
	}
}

// strList is a []string indexed by token id, without pointers. Setting an
// index again leaves its old bytes in the arena (load time only: added
// tokens over the model's).
type strList struct {
	bytes []byte    // never rewritten, only appended: returned strings alias it
	spans []strSpan // by index
}

type strSpan struct{ off, n uint32 }

func newStrList(n int) strList { return strList{spans: make([]strSpan, n)} }

// Len is the number of indexes.
func (l *strList) Len() int { return len(l.spans) }

// get returns the string at i ("" when never set); i must be < Len.
func (l *strList) get(i uint32) string {
	sp := l.spans[i]
	if sp.n == 0 {
		return ""
	}
	// The arena's bytes are never written twice, so the string may alias them.
	return unsafe.String(&l.bytes[sp.off], int(sp.n))
}

// set puts s at i; i must be < Len.
func (l *strList) set(i uint32, s string) {
	l.spans[i] = strSpan{off: uint32(len(l.bytes)), n: uint32(len(s))}
	l.bytes = append(l.bytes, s...)
}
