package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// The split patterns below are the pre-tokenizer regexes of the common
// families, written exactly as they appear in tokenizer.json files and in
// tiktoken. A Split whose pattern is one of them runs a hand-written splitter
// (proven equal to regexp2 by TestHandSplittersEqualRegexp2); any other
// pattern runs through regexp2.
const (
	// patternCL100K is cl100k_base's pattern, also Llama 3's.
	patternCL100K = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternQwen2 is Qwen 2/2.5/3's: cl100k with single digits.
	patternQwen2 = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternO200K is o200k_base's pattern.
	patternO200K = `[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// patternGPT2 is GPT-2's (r50k/p50k), also the ByteLevel
	// pre-tokenizer's built-in pattern when use_regex is true.
	patternGPT2 = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
)

// handSplitter cuts text into the same pieces as one of the patterns above.
// next returns the end of the match that starts at i (i < len(s)); every
// byte belongs to exactly one match, so the pieces cover the text.
type handSplitter interface {
	next(s string, i int) int
}

// handSplitterFor returns the hand-written splitter for pattern, or nil.
func handSplitterFor(pattern string) handSplitter {
	switch pattern {
	case patternCL100K:
		return cl100kSplitter{maxDigits: 3}
	case patternQwen2:
		return cl100kSplitter{maxDigits: 1}
	case patternO200K:
		return o200kSplitter{}
	case patternGPT2:
		return gpt2Splitter{}
	}
	return nil
}

// decode returns the rune at i and its width. An invalid byte reads as
// U+FFFD of width one, which classifies as "other" (So) like regexp2 sees
// it; byte-level BPE then still encodes the original byte.
func decode(s string, i int) (rune, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

func isLetter(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z'
	}
	return unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	if r < utf8.RuneSelf {
		return '0' <= r && r <= '9'
	}
	return unicode.IsNumber(r)
}

// isSpace is \s as regexp2 defines it (unicode.IsSpace), which is the
// Unicode White_Space set that Oniguruma and Rust's regex use too.
func isSpace(r rune) bool {
	if r < utf8.RuneSelf {
		return r == ' ' || '\t' <= r && r <= '\r'
	}
	return unicode.IsSpace(r)
}

func isNewline(r rune) bool { return r == '\r' || r == '\n' }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

// contraction returns the length of 's|'t|'re|'ve|'m|'ll|'d at i, or 0;
// fold makes it (?i:...). Case folding is ASCII-only, as in regexp2 (no
// non-ASCII rune lowercases to one of these letters under unicode.ToLower).
func contraction(s string, i int, fold bool) int {
	if i >= len(s) || s[i] != '\'' || i+1 >= len(s) {
		return 0
	}
	lower := func(c byte) byte {
		if fold && 'A' <= c && c <= 'Z' {
			return c + 'a' - 'A'
		}
		return c
	}
	switch lower(s[i+1]) {
	case 's', 't', 'm', 'd':
		return 2
	case 'r', 'v':
		if i+2 < len(s) && lower(s[i+2]) == 'e' {
			return 3
		}
	case 'l':
		if i+2 < len(s) && lower(s[i+2]) == 'l' {
			return 3
		}
	}
	return 0
}

// spaceRun returns the end of the run of whitespace starting at i, and the
// start of its last rune and the end of its last newline (-1 if none).
func spaceRun(s string, i int) (end, lastStart, nlEnd int) {
	nlEnd = -1
	j := i
	for j < len(s) {
		r, w := decode(s, j)
		if !isSpace(r) {
			break
		}
		lastStart = j
		j += w
		if isNewline(r) {
			nlEnd = j
		}
	}
	return j, lastStart, nlEnd
}

// whitespace matches \s*[\r\n]+|\s+(?!\S)|\s+ at i, where s[i] is a space.
func whitespace(s string, i int) int {
	end, lastStart, nlEnd := spaceRun(s, i)
	if nlEnd > 0 {
		// \s* backtracks to the last newline of the run; [\r\n]+ then
		// takes it and stops, as what follows is not a newline.
		return nlEnd
	}
	if end == len(s) {
		return end // \s+(?!\S) at the end of the text
	}
	if lastStart > i {
		return lastStart // \s+(?!\S) leaves the last space to the next piece
	}
	return end // \s+
}

// cl100kSplitter is patternCL100K (maxDigits 3) and patternQwen2 (1).
type cl100kSplitter struct{ maxDigits int }

func (c cl100kSplitter) next(s string, i int) int {
	if n := contraction(s, i, true); n > 0 {
		return i + n
	}
	if e := c.ascii(s, i); e > 0 {
		return e
	}
	r, w := decode(s, i)
	// [^\r\n\p{L}\p{N}]?\p{L}+
	j := i
	if !isLetter(r) && !isNewline(r) && !isNumber(r) {
		j = i + w
	}
	if j < len(s) {
		if r2, w2 := decode(s, j); isLetter(r2) {
			j += w2
			for j < len(s) {
				r3, w3 := decode(s, j)
				if !isLetter(r3) {
					break
				}
				j += w3
			}
			return j
		}
	}
	// \p{N}{1,maxDigits}
	if isNumber(r) {
		j = i + w
		for n := 1; n < c.maxDigits && j < len(s); n++ {
			r2, w2 := decode(s, j)
			if !isNumber(r2) {
				break
			}
			j += w2
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	if e := otherRun(s, i, r, w, false); e > 0 {
		return e
	}
	if isSpace(r) {
		return whitespace(s, i)
	}
	return i + w // unreachable: every rune is a letter, number, space or other
}

// otherRun matches ' ?[^\s\p{L}\p{N}]+[\r\n]*' (with '/' in the trailing
// class for o200k) at i, or returns 0.
func otherRun(s string, i int, r rune, w int, slash bool) int {
	j := i
	if r == ' ' {
		j += w
		if j >= len(s) {
			return 0
		}
		r, w = decode(s, j)
	}
	if !isOther(r) {
		return 0
	}
	j += w
	for j < len(s) {
		r2, w2 := decode(s, j)
		if !isOther(r2) {
			break
		}
		j += w2
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || slash && s[j] == '/') {
		j++
	}
	return j
}

// gpt2Splitter is patternGPT2.
type gpt2Splitter struct{}

func (gpt2Splitter) next(s string, i int) int {
	if n := contraction(s, i, false); n > 0 {
		return i + n
	}
	r, w := decode(s, i)
	j, rr, ww := i, r, w
	if r == ' ' && i+1 < len(s) {
		j = i + 1
		rr, ww = decode(s, j)
	}
	// ' ?\p{L}+' and ' ?\p{N}+'
	for _, class := range [2]func(rune) bool{isLetter, isNumber} {
		if class(rr) {
			k := j + ww
			for k < len(s) {
				r3, w3 := decode(s, k)
				if !class(r3) {
					break
				}
				k += w3
			}
			return k
		}
	}
	// ' ?[^\s\p{L}\p{N}]+'
	if isOther(rr) && (j > i || r != ' ') {
		k := j + ww
		for k < len(s) {
			r3, w3 := decode(s, k)
			if !isOther(r3) {
				break
			}
			k += w3
		}
		return k
	}
	// \s+(?!\S)|\s+
	end, lastStart, _ := spaceRun(s, i)
	if end == len(s) || lastStart == i {
		return end
	}
	return lastStart
}

// o200kSplitter is patternO200K.
type o200kSplitter struct{}

// upperish is [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}], lowerish is
// [\p{Ll}\p{Lm}\p{Lo}\p{M}].
func upperish(r rune) bool {
	if r < utf8.RuneSelf {
		return 'A' <= r && r <= 'Z'
	}
	return unicode.In(r, unicode.Lu, unicode.Lt, unicode.Lm, unicode.Lo, unicode.M)
}

func lowerish(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z'
	}
	return unicode.In(r, unicode.Ll, unicode.Lm, unicode.Lo, unicode.M)
}

func runOf(s string, j int, class func(rune) bool) int {
	for j < len(s) {
		r, w := decode(s, j)
		if !class(r) {
			break
		}
		j += w
	}
	return j
}

// o200kWord matches U*L+ (upperFirst false) or U+L* (true) at j, then an
// optional contraction; it returns the end or -1.
func o200kWord(s string, j int, upperFirst bool) int {
	uEnd := runOf(s, j, upperish)
	var end int
	if upperFirst {
		if uEnd == j {
			return -1
		}
		end = runOf(s, uEnd, lowerish)
	} else {
		// U* is greedy and backtracks rune by rune until L+ can start.
		k := uEnd
		for {
			if k < len(s) {
				if r, _ := decode(s, k); lowerish(r) {
					break
				}
			}
			if k == j {
				return -1
			}
			_, w := utf8.DecodeLastRuneInString(s[j:k])
			k -= w
		}
		end = runOf(s, k, lowerish)
	}
	return end + contraction(s, end, true)
}

func (o200kSplitter) next(s string, i int) int {
	if e := o200kASCII(s, i); e > 0 {
		return e
	}
	r, w := decode(s, i)
	prefix := !isLetter(r) && !isNewline(r) && !isNumber(r)
	for _, upperFirst := range [2]bool{false, true} {
		if prefix && i+w < len(s) {
			if e := o200kWord(s, i+w, upperFirst); e >= 0 {
				return e
			}
		}
		if e := o200kWord(s, i, upperFirst); e >= 0 {
			return e
		}
	}
	if isNumber(r) {
		j := i + w
		for n := 1; n < 3 && j < len(s); n++ {
			r2, w2 := decode(s, j)
			if !isNumber(r2) {
				break
			}
			j += w2
		}
		return j
	}
	if e := otherRun(s, i, r, w, true); e > 0 {
		return e
	}
	if isSpace(r) {
		return whitespace(s, i)
	}
	return i + w
}

// o200kASCIIWord is next's answer when the piece at i is a word (the first
// two alternatives) decided by ASCII bytes alone, the bulk of English text
// and code; it returns -1 when it cannot tell, and next then runs the
// general matcher. With ASCII only, the Unicode classes reduce to [A-Z]
// (upperish) and [a-z] (lowerish), and U*L+'s backtracking cannot succeed
// once the upper run is followed by no lower letter: the letters it gives
// back are upper, not lower.
func o200kASCIIWord(s string, i int) int {
	c := s[i]
	if c >= utf8.RuneSelf {
		return -1
	}
	j := i
	switch {
	case 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z':
	case '0' <= c && c <= '9', c == '\r', c == '\n':
		return -1
	default: // [^\r\n\p{L}\p{N}]? takes it, if a word follows
		if j++; j >= len(s) {
			return -1
		}
	}
	u := j
	for u < len(s) && 'A' <= s[u] && s[u] <= 'Z' {
		u++
	}
	l := u
	for l < len(s) && 'a' <= s[l] && s[l] <= 'z' {
		l++
	}
	if l < len(s) && s[l] >= utf8.RuneSelf {
		return -1 // a non-ASCII letter or mark may extend the word
	}
	if l == u && u == j {
		return -1 // no word at j; the other alternatives decide
	}
	// U*L+ when a lower run follows, else U+L* with an empty L*.
	return l + contraction(s, l, true)
}

// ASCII byte classes for the splitters' fast paths. Bytes >= 0x80 are
// asciiHigh: a fast path that meets one where it matters leaves the piece to
// the general matcher, which decodes runes.
const (
	asciiLower = 1 << iota
	asciiUpper
	asciiDigit
	asciiSpace   // \s other than \r and \n: ' ', \t, \v, \f
	asciiNewline // \r, \n
	asciiOther   // [^\s\p{L}\p{N}] among ASCII bytes
	asciiHigh
)

var asciiClass = func() (t [256]uint8) {
	for c := range 256 {
		switch {
		case c >= utf8.RuneSelf:
			t[c] = asciiHigh
		case 'a' <= c && c <= 'z':
			t[c] = asciiLower
		case 'A' <= c && c <= 'Z':
			t[c] = asciiUpper
		case '0' <= c && c <= '9':
			t[c] = asciiDigit
		case c == '\r' || c == '\n':
			t[c] = asciiNewline
		case isSpace(rune(c)):
			t[c] = asciiSpace
		default:
			t[c] = asciiOther
		}
	}
	return t
}()

// classAt is the class of s[i], or 0 past the end.
func classAt(s string, i int) uint8 {
	if i < len(s) {
		return asciiClass[s[i]]
	}
	return 0
}

// asciiDigits matches \p{N}{1,max} at i, where s[i] is an ASCII digit; -1
// when a byte that may be a non-ASCII number decides it.
func asciiDigits(s string, i, max int) int {
	j := i + 1
	for n := 1; n < max; n++ {
		switch classAt(s, j) {
		case asciiDigit:
			j++
			continue
		case asciiHigh:
			return -1
		}
		break
	}
	return j
}

// asciiOtherRun matches ' ?[^\s\p{L}\p{N}]+[\r\n]*' (with '/' in the
// trailing class when slash is set) at i, where s[i] is ' ' or an ASCII
// other; 0 when it does not match, -1 when a non-ASCII byte decides it.
func asciiOtherRun(s string, i int, slash bool) int {
	j := i
	if s[j] == ' ' {
		j++
	}
	switch classAt(s, j) {
	case asciiOther:
	case asciiHigh:
		return -1
	default:
		return 0
	}
	for j++; ; j++ {
		c := classAt(s, j)
		if c == asciiOther {
			continue
		}
		if c == asciiHigh {
			return -1 // a non-ASCII symbol would extend the run
		}
		break
	}
	for j < len(s) && (s[j] == '\r' || s[j] == '\n' || slash && s[j] == '/') {
		j++
	}
	return j
}

// asciiWhitespace is whitespace (\s*[\r\n]+|\s+(?!\S)|\s+) for a run of
// ASCII whitespace at i; -1 when the run reaches a non-ASCII byte, which may
// be whitespace too.
func asciiWhitespace(s string, i int) int {
	j, nlEnd := i, -1
	for ; j < len(s); j++ {
		c := asciiClass[s[j]]
		if c == asciiNewline {
			nlEnd = j + 1
		} else if c != asciiSpace {
			if c == asciiHigh {
				return -1
			}
			break
		}
	}
	switch {
	case nlEnd > 0:
		return nlEnd
	case j == len(s):
		return j
	case j-1 > i:
		return j - 1 // \s+(?!\S) leaves the last space to the next piece
	}
	return j
}

// o200kASCII is next's answer when ASCII bytes alone decide the piece at i,
// the bulk of English text and code; -1 when the general matcher must run.
// It tries the pattern's alternatives in order on the classes above: words
// (o200kASCIIWord), \p{N}{1,3}, the symbol run, then whitespace. A word's
// optional prefix is any byte but \r, \n, a letter or a digit; when no word
// follows it, the later alternatives decide as the regex's backtracking does.
func o200kASCII(s string, i int) int {
	if e := o200kASCIIWord(s, i); e > 0 {
		return e
	}
	c := asciiClass[s[i]]
	switch c {
	case asciiDigit:
		return asciiDigits(s, i, 3)
	case asciiNewline:
		return asciiWhitespace(s, i)
	case asciiOther, asciiSpace:
		// No word starts here with this byte as its prefix, unless a
		// letter or a non-ASCII byte follows: then o200kASCIIWord could
		// not tell, and neither can this.
		if classAt(s, i+1)&(asciiLower|asciiUpper|asciiHigh) != 0 {
			return -1
		}
		if c == asciiOther || s[i] == ' ' {
			if e := asciiOtherRun(s, i, true); e != 0 {
				return e
			}
		}
		if c == asciiSpace {
			return asciiWhitespace(s, i)
		}
	}
	return -1
}

// asciiLetters is the end of the run of ASCII letters at j; -1 when it ends
// at a non-ASCII byte, which may be a letter.
func asciiLetters(s string, j int) int {
	for ; j < len(s); j++ {
		if c := asciiClass[s[j]]; c&(asciiLower|asciiUpper) == 0 {
			if c == asciiHigh {
				return -1
			}
			break
		}
	}
	return j
}

// ascii is next's answer, after contractions, when ASCII bytes alone decide
// the piece at i; -1 when the general matcher must run. The alternatives in
// order: [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,max}, the symbol run, then
// whitespace.
func (c cl100kSplitter) ascii(s string, i int) int {
	switch k := asciiClass[s[i]]; k {
	case asciiLower, asciiUpper:
		return asciiLetters(s, i+1)
	case asciiDigit:
		return asciiDigits(s, i, c.maxDigits)
	case asciiNewline:
		return asciiWhitespace(s, i)
	case asciiOther, asciiSpace:
		switch classAt(s, i+1) {
		case asciiLower, asciiUpper:
			return asciiLetters(s, i+2) // the byte is the word's prefix
		case asciiHigh:
			return -1
		}
		if k == asciiOther || s[i] == ' ' {
			if e := asciiOtherRun(s, i, false); e != 0 {
				return e
			}
		}
		if k == asciiSpace {
			return asciiWhitespace(s, i)
		}
	}
	return -1
}
