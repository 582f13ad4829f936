package tokenizer

import (
	"strings"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer is a tokenizer.json normalizer, applied to each text segment
// between raw-matched added tokens.
type normalizer interface {
	normalize(s string) string
}

type unicodeNorm struct{ form norm.Form }

func (u unicodeNorm) normalize(s string) string { return u.form.String(s) }

type sequenceNorm []normalizer

func (q sequenceNorm) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

// replaceNorm is Replace with a String or Regex pattern.
type replaceNorm struct {
	literal string
	re      *regexp2.Regexp
	content string
}

func (r replaceNorm) normalize(s string) string {
	if r.re == nil {
		if r.literal == "" {
			return s
		}
		return strings.ReplaceAll(s, r.literal, r.content)
	}
	out, err := r.re.Replace(s, r.content, -1, -1)
	if err != nil {
		return s
	}
	return out
}

// prependNorm is Prepend: it prefixes every non-empty segment.
type prependNorm struct{ prefix string }

func (p prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

// decoder turns the file-form tokens of ids back into text, for models
// that are not byte-level (SentencePiece style).
type decoder interface {
	decode(tokens []string) string
}

// decodeStep is one step of a decoder Sequence; like Hugging Face's
// decode_chain it maps a list of tokens to a list of tokens.
type decodeStep interface {
	chain(tokens []string) []string
}

type chainDecoder []decodeStep

func (c chainDecoder) decode(tokens []string) string {
	for _, st := range c {
		tokens = st.chain(tokens)
	}
	return strings.Join(tokens, "")
}

type replaceDec struct{ pattern, content string }

func (r replaceDec) chain(tokens []string) []string {
	for i, t := range tokens {
		tokens[i] = strings.ReplaceAll(t, r.pattern, r.content)
	}
	return tokens
}

// byteFallbackDec turns runs of <0xNN> tokens into their bytes. Hugging
// Face replaces a run that is not valid UTF-8 with U+FFFD; the bytes are
// kept here, as everywhere in Decode.
type byteFallbackDec struct{}

func byteToken(t string) (byte, bool) {
	if len(t) != 6 || t[:3] != "<0x" || t[5] != '>' {
		return 0, false
	}
	var v byte
	for _, c := range []byte(t[3:5]) {
		switch {
		case '0' <= c && c <= '9':
			v = v<<4 | (c - '0')
		case 'A' <= c && c <= 'F':
			v = v<<4 | (c - 'A' + 10)
		default:
			return 0, false
		}
	}
	return v, true
}

func (byteFallbackDec) chain(tokens []string) []string {
	out := tokens[:0:0]
	var run []byte
	for _, t := range tokens {
		if b, ok := byteToken(t); ok {
			run = append(run, b)
			continue
		}
		if len(run) > 0 {
			out = append(out, string(run))
			run = run[:0]
		}
		out = append(out, t)
	}
	if len(run) > 0 {
		out = append(out, string(run))
	}
	return out
}

type fuseDec struct{}

func (fuseDec) chain(tokens []string) []string { return []string{strings.Join(tokens, "")} }

// stripDec removes up to start leading and stop trailing copies of content
// from each token.
type stripDec struct {
	content     string
	start, stop int
}

func (s stripDec) chain(tokens []string) []string {
	for i, t := range tokens {
		for k := 0; k < s.start && strings.HasPrefix(t, s.content); k++ {
			t = t[len(s.content):]
		}
		for k := 0; k < s.stop && strings.HasSuffix(t, s.content); k++ {
			t = t[:len(t)-len(s.content)]
		}
		tokens[i] = t
	}
	return tokens
}

// metaspaceDec is the Metaspace decoder: the replacement becomes a space,
// and the space the pre-tokenizer prepended to the first token goes.
type metaspaceDec struct {
	replacement string
	stripFirst  bool
}

func (m metaspaceDec) chain(tokens []string) []string {
	for i, t := range tokens {
		t = strings.ReplaceAll(t, m.replacement, " ")
		if i == 0 && m.stripFirst {
			t = strings.TrimPrefix(t, " ")
		}
		tokens[i] = t
	}
	return tokens
}
