package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// addedMatch is an occurrence of an added token: text[start:stop] (which
// includes whitespace absorbed by lstrip/rstrip) becomes id.
type addedMatch struct {
	start, stop int
	id          uint32
}

// matcher finds added tokens the way Hugging Face's AddedVocabulary does:
// an Aho-Corasick scan with leftmost-longest semantics over the bytes, then
// single_word, lstrip and rstrip applied to each match. A match that
// single_word rejects is still consumed by the scan, as there.
type matcher struct {
	toks   []addedToken
	nodes  []trieNode
	first  [256]int32 // root edges: node index or -1
	starts string     // the distinct first bytes, for strings.IndexAny
	// startsASCII says starts is all ASCII, so IndexAny reads it as bytes.
	startsASCII bool
}

type trieNode struct {
	term  int32 // index into toks, or -1
	edges []trieEdge
}

type trieEdge struct {
	b    byte
	next int32
}

// newMatcher returns nil when there is nothing to match. Each token's
// pattern is its content, or for normalized tokens the normalized content.
func newMatcher(toks []addedToken, pattern func(addedToken) string) *matcher {
	m := &matcher{}
	for i := range m.first {
		m.first[i] = -1
	}
	for _, t := range toks {
		p := pattern(t)
		if p == "" {
			continue
		}
		idx := int32(len(m.toks))
		m.toks = append(m.toks, t)
		node := m.first[p[0]]
		if node < 0 {
			node = m.newNode()
			m.first[p[0]] = node
			m.starts += p[:1]
		}
		for k := 1; k < len(p); k++ {
			node = m.child(node, p[k])
		}
		if m.nodes[node].term < 0 {
			m.nodes[node].term = idx // the first of duplicate contents wins
		}
	}
	if len(m.toks) == 0 {
		return nil
	}
	m.startsASCII = true
	for k := 0; k < len(m.starts); k++ {
		m.startsASCII = m.startsASCII && m.starts[k] < utf8.RuneSelf
	}
	return m
}

func (m *matcher) newNode() int32 {
	m.nodes = append(m.nodes, trieNode{term: -1})
	return int32(len(m.nodes) - 1)
}

func (m *matcher) child(node int32, b byte) int32 {
	for _, e := range m.nodes[node].edges {
		if e.b == b {
			return e.next
		}
	}
	n := m.newNode()
	m.nodes[node].edges = append(m.nodes[node].edges, trieEdge{b: b, next: n})
	return n
}

// longestAt returns the longest token starting at s[i] and its end, or -1.
func (m *matcher) longestAt(s string, i int) (int32, int) {
	node := m.first[s[i]]
	best, end := int32(-1), 0
	for j := i + 1; node >= 0; j++ {
		if t := m.nodes[node].term; t >= 0 {
			best, end = t, j
		}
		if j >= len(s) {
			break
		}
		next := int32(-1)
		for _, e := range m.nodes[node].edges {
			if e.b == s[j] {
				next = e.next
				break
			}
		}
		node = next
	}
	return best, end
}

// find appends the added-token occurrences of s to dst in order; the text
// between them is tokenized normally.
func (m *matcher) find(s string, dst []addedMatch) []addedMatch {
	if m == nil {
		return dst
	}
	startOffset := 0
	for i := 0; i < len(s); {
		j := m.nextStart(s, i)
		if j < 0 {
			break
		}
		t, end := m.longestAt(s, j)
		if t < 0 {
			i = j + 1
			continue
		}
		i = end
		tok := &m.toks[t]
		start, stop := j, end
		if tok.singleWord {
			if start > 0 && endsWithWord(s[:start]) || stop < len(s) && startsWithWord(s[stop:]) {
				continue
			}
		}
		if tok.lstrip {
			start = max(start-trailingSpace(s[:start]), startOffset)
		}
		if tok.rstrip {
			stop += leadingSpace(s[stop:])
		}
		// A token beginning inside whitespace the previous one absorbed
		// (only possible for tokens that start with whitespace) keeps the
		// splits disjoint.
		start = max(start, startOffset)
		dst = append(dst, addedMatch{start: start, stop: stop, id: tok.id})
		startOffset = stop
	}
	return dst
}

// nextStart returns the first index >= i where a token may start, or -1.
func (m *matcher) nextStart(s string, i int) int {
	if len(m.starts) == 1 {
		if j := strings.IndexByte(s[i:], m.starts[0]); j >= 0 {
			return i + j
		}
		return -1
	}
	if m.startsASCII {
		if j := strings.IndexAny(s[i:], m.starts); j >= 0 {
			return i + j
		}
		return -1
	}
	for ; i < len(s); i++ {
		if m.first[s[i]] >= 0 {
			return i
		}
	}
	return -1
}

// isWordRune is Rust regex's Unicode \w: Alphabetic, marks, decimal
// digits, connector punctuation and join controls.
func isWordRune(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_'
	}
	return unicode.IsLetter(r) || unicode.In(r, unicode.Nl, unicode.Other_Alphabetic, unicode.M, unicode.Nd, unicode.Pc) ||
		r == 0x200C || r == 0x200D
}

func endsWithWord(s string) bool {
	r, _ := utf8.DecodeLastRuneInString(s)
	return isWordRune(r)
}

func startsWithWord(s string) bool {
	r, _ := utf8.DecodeRuneInString(s)
	return isWordRune(r)
}

// trailingSpace and leadingSpace return the byte length of the whitespace
// (Unicode White_Space) at the end and start of s.
func trailingSpace(s string) int {
	n := len(s)
	for n > 0 {
		r, w := utf8.DecodeLastRuneInString(s[:n])
		if !unicode.IsSpace(r) {
			break
		}
		n -= w
	}
	return len(s) - n
}

func leadingSpace(s string) int {
	n := 0
	for n < len(s) {
		r, w := utf8.DecodeRuneInString(s[n:])
		if !unicode.IsSpace(r) {
			break
		}
		n += w
	}
	return n
}
