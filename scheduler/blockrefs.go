package scheduler

import "math/bits"

// blockRefs counts, per prompt block hash, the active bookings on one worker
// that hold the block. It is an open-addressing table with linear probing:
// the ledger adds and removes every block of every booking, and a Go map's
// per-operation cost dominated admission (two ops per prompt block).
// Zero is the empty-slot marker, so hash 0 is counted on the side.
type blockRefs struct {
	n     int   // live keys in the table (excluding zero); read by the selector scan
	zero  int32 // count for hash 0
	shift uint8
	keys  []uint64
	vals  []int32
}

const blockRefsMinSize = 64

// slot is the key's home position: Fibonacci hashing spreads sequential or
// low-entropy keys (tests, simple hashers) over the table.
func (s *blockRefs) slot(k uint64) int {
	return int((k * 0x9E3779B97F4A7C15) >> s.shift)
}

// count is the number of distinct hashes held.
func (s *blockRefs) count() int {
	if s.zero > 0 {
		return s.n + 1
	}
	return s.n
}

func (s *blockRefs) has(k uint64) bool {
	if k == 0 {
		return s.zero > 0
	}
	if s.n == 0 {
		return false
	}
	mask := len(s.keys) - 1
	for i := s.slot(k); ; i = (i + 1) & mask {
		switch s.keys[i] {
		case k:
			return true
		case 0:
			return false
		}
	}
}

func (s *blockRefs) inc(k uint64) {
	if k == 0 {
		s.zero++
		return
	}
	if 2*(s.n+1) > len(s.keys) {
		s.grow()
	}
	mask := len(s.keys) - 1
	for i := s.slot(k); ; i = (i + 1) & mask {
		switch s.keys[i] {
		case k:
			s.vals[i]++
			return
		case 0:
			s.keys[i], s.vals[i] = k, 1
			s.n++
			return
		}
	}
}

// dec drops one reference; the hash leaves the set at zero. Unknown hashes
// are ignored.
func (s *blockRefs) dec(k uint64) {
	if k == 0 {
		if s.zero > 0 {
			s.zero--
		}
		return
	}
	if s.n == 0 {
		return
	}
	mask := len(s.keys) - 1
	i := s.slot(k)
	for ; s.keys[i] != k; i = (i + 1) & mask {
		if s.keys[i] == 0 {
			return
		}
	}
	if s.vals[i] > 1 {
		s.vals[i]--
		return
	}
	// Backward-shift deletion keeps every probe chain unbroken without
	// tombstones.
	s.n--
	for j := i; ; {
		j = (j + 1) & mask
		kj := s.keys[j]
		if kj == 0 {
			break
		}
		home := s.slot(kj)
		// kj may move into the hole at i unless its home lies cyclically
		// in (i, j].
		if (j > i && (home <= i || home > j)) || (j < i && home <= i && home > j) {
			s.keys[i], s.vals[i] = kj, s.vals[j]
			i = j
		}
	}
	s.keys[i], s.vals[i] = 0, 0
}

// reset empties the set, keeping its table.
func (s *blockRefs) reset() {
	clear(s.keys)
	clear(s.vals)
	s.n, s.zero = 0, 0
}

func (s *blockRefs) grow() {
	size := max(blockRefsMinSize, 2*len(s.keys))
	oldK, oldV := s.keys, s.vals
	s.keys, s.vals = make([]uint64, size), make([]int32, size)
	s.shift = uint8(64 - bits.TrailingZeros(uint(size)))
	s.n = 0
	mask := size - 1
	for idx, k := range oldK {
		if k == 0 {
			continue
		}
		i := s.slot(k)
		for s.keys[i] != 0 {
			i = (i + 1) & mask
		}
		s.keys[i], s.vals[i] = k, oldV[idx]
		s.n++
	}
}
