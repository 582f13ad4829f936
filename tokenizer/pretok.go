package tokenizer

import (
	"strings"

	"github.com/dlclark/regexp2"
)

// piece is a pre-token under construction; first says it starts the text
// (its original offset is 0), which Metaspace's "first" scheme looks at.
type piece struct {
	s     string
	first bool
}

// preTokenizer is one step of a pre-tokenizer Sequence: it splits each
// piece further. Empty pieces are dropped, as Hugging Face does.
type preTokenizer interface {
	split(dst []piece, p piece) []piece
}

type behavior int

const (
	behaviorIsolated behavior = iota + 1
	behaviorRemoved
	behaviorMergedWithPrevious
	behaviorMergedWithNext
	behaviorContiguous
)

// splitPre is the Split pre-tokenizer (and the splitting half of
// ByteLevel with use_regex). Exactly one of hand, re and literal is set.
type splitPre struct {
	hand     handSplitter
	re       *regexp2.Regexp
	literal  string
	behavior behavior
	invert   bool
}

// span is a range of a piece and whether the pattern matched it.
type span struct {
	start, end int
	match      bool
}

func (sp *splitPre) spans(s string) []span {
	var out []span
	add := func(start, end int) {
		if prev := 0; len(out) > 0 {
			prev = out[len(out)-1].end
			if start > prev {
				out = append(out, span{prev, start, false})
			}
		} else if start > 0 {
			out = append(out, span{0, start, false})
		}
		out = append(out, span{start, end, true})
	}
	switch {
	case sp.hand != nil:
		for i := 0; i < len(s); {
			j := sp.hand.next(s, i)
			add(i, j)
			i = j
		}
	case sp.re != nil:
		// regexp2 reports rune indices; map them back to bytes.
		offs := make([]int, 0, len(s)+1)
		for i := 0; i < len(s); {
			offs = append(offs, i)
			_, w := decode(s, i)
			i += w
		}
		offs = append(offs, len(s))
		m, err := sp.re.FindStringMatch(s)
		for err == nil && m != nil {
			if m.Length > 0 {
				add(offs[m.Index], offs[m.Index+m.Length])
			}
			m, err = sp.re.FindNextMatch(m)
		}
	default:
		for i := 0; sp.literal != ""; {
			j := strings.Index(s[i:], sp.literal)
			if j < 0 {
				break
			}
			add(i+j, i+j+len(sp.literal))
			i += j + len(sp.literal)
		}
	}
	end := 0
	if len(out) > 0 {
		end = out[len(out)-1].end
	}
	if end < len(s) {
		out = append(out, span{end, len(s), false})
	}
	if sp.invert {
		for k := range out {
			out[k].match = !out[k].match
		}
	}
	return out
}

func (sp *splitPre) split(dst []piece, p piece) []piece {
	emit := func(start, end int) {
		if end > start {
			dst = append(dst, piece{s: p.s[start:end], first: p.first && start == 0})
		}
	}
	if sp.hand != nil && sp.behavior == behaviorIsolated && !sp.invert {
		for i := 0; i < len(p.s); {
			j := sp.hand.next(p.s, i)
			emit(i, j)
			i = j
		}
		return dst
	}
	spans := sp.spans(p.s)
	switch sp.behavior {
	case behaviorIsolated:
		for _, x := range spans {
			emit(x.start, x.end)
		}
	case behaviorRemoved:
		for _, x := range spans {
			if !x.match {
				emit(x.start, x.end)
			}
		}
	case behaviorMergedWithPrevious:
		start := 0
		for _, x := range spans {
			if x.match {
				emit(start, x.end)
				start = x.end
			}
		}
		emit(start, len(p.s))
	case behaviorMergedWithNext:
		start := 0
		for _, x := range spans {
			if x.match {
				emit(start, x.start)
				start = x.start
			}
		}
		emit(start, len(p.s))
	case behaviorContiguous:
		start, inMatch := 0, false
		for _, x := range spans {
			if x.match != inMatch || !x.match {
				emit(start, x.start)
				start = x.start
			}
			inMatch = x.match
		}
		emit(start, len(p.s))
	}
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer. The byte-to-unicode mapping
// itself is implicit: the model works on raw bytes with a vocabulary mapped
// back to bytes at load time.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
}

var gpt2Split = &splitPre{hand: gpt2Splitter{}, behavior: behaviorIsolated}

func (b byteLevelPre) split(dst []piece, p piece) []piece {
	if b.addPrefixSpace && !strings.HasPrefix(p.s, " ") {
		p.s = " " + p.s
	}
	if !b.useRegex {
		return append(dst, p)
	}
	return gpt2Split.split(dst, p)
}

// prependScheme is Metaspace's prepend_scheme.
type prependScheme int

const (
	prependAlways prependScheme = iota + 1
	prependFirst
	prependNever
)

// metaspacePre is the Metaspace pre-tokenizer of SentencePiece-style files.
type metaspacePre struct {
	replacement string
	scheme      prependScheme
	split       bool
}

func (ms metaspacePre) splitPiece(dst []piece, p piece) []piece {
	s := strings.ReplaceAll(p.s, " ", ms.replacement)
	if !strings.HasPrefix(s, ms.replacement) &&
		(ms.scheme == prependAlways || ms.scheme == prependFirst && p.first) {
		s = ms.replacement + s
	}
	if !ms.split {
		return append(dst, piece{s: s, first: p.first})
	}
	sp := splitPre{literal: ms.replacement, behavior: behaviorMergedWithNext}
	return sp.split(dst, piece{s: s, first: p.first})
}

type metaspaceStep struct{ metaspacePre }

func (m metaspaceStep) split(dst []piece, p piece) []piece { return m.splitPiece(dst, p) }

// digitsPre is the Digits pre-tokenizer.
type digitsPre struct{ individual bool }

func (d digitsPre) split(dst []piece, p piece) []piece {
	start := 0
	emit := func(end int) {
		if end > start {
			dst = append(dst, piece{s: p.s[start:end], first: p.first && start == 0})
		}
		start = end
	}
	prevDigit := false
	for i := 0; i < len(p.s); {
		r, w := decode(p.s, i)
		digit := isNumber(r)
		if digit && (d.individual || !prevDigit) || !digit && prevDigit {
			emit(i)
		}
		prevDigit = digit
		i += w
	}
	emit(len(p.s))
	return dst
}

// compileSplitRegex compiles a tokenizer.json or tiktoken split pattern for
// regexp2. Rust-regex class intersections with a negated class
// ([A&&[^B]], used by Kimi's tiktoken pattern) become .NET class
// subtractions ([A-[B]]), which regexp2 supports.
func compileSplitRegex(pattern string) (*regexp2.Regexp, error) {
	p := strings.ReplaceAll(pattern, "&&[^", "-[")
	return regexp2.Compile(p, regexp2.None)
}
