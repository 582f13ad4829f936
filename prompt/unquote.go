package prompt

import (
	"bytes"
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
	"unsafe"
)

// unquote returns the text of the JSON string literal raw (its quotes
// included, no surrounding space) exactly as json.Unmarshal into a string
// decodes it: escapes resolved, a \u escape of a lone or mismatched
// surrogate and every byte of invalid UTF-8 replaced by U+FFFD. ok is false
// when raw is not one string literal: missing quotes, a control character
// or an unescaped quote inside, a malformed escape.
//
// Chat contents hold escapes at every line break, and json.Unmarshal paid
// for a validating pass and a reflective decode on each of them. Here text
// that needs no decoding aliases raw (see Parse) and
// anything else is decoded into one allocation, never longer than raw
// unless raw holds invalid UTF-8.
func unquote(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	i := plainRun(s, 0)
	for i < len(s) && s[i] >= 0x80 { // valid UTF-8 is its own text
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			break
		}
		i = plainRun(s, i+size)
	}
	if i == len(s) {
		if i == 0 {
			return "", true
		}
		return unsafe.String(&s[0], len(s)), true
	}
	buf := make([]byte, i, len(s))
	copy(buf, s[:i])
	for i < len(s) {
		switch c := s[i]; {
		case c == '\\':
			if i+1 >= len(s) {
				return "", false
			}
			switch e := s[i+1]; e {
			case '"', '\\', '/':
				buf = append(buf, e)
			case 'b':
				buf = append(buf, '\b')
			case 'f':
				buf = append(buf, '\f')
			case 'n':
				buf = append(buf, '\n')
			case 'r':
				buf = append(buf, '\r')
			case 't':
				buf = append(buf, '\t')
			case 'u':
				r := hex4(s, i)
				if r < 0 {
					return "", false
				}
				i += 6
				if utf16.IsSurrogate(r) {
					// A high surrogate pairs with a low one escaped right
					// after it; any other surrogate stands alone, is
					// U+FFFD, and what follows is decoded on its own.
					if dec := utf16.DecodeRune(r, hex4(s, i)); dec != utf8.RuneError {
						buf = utf8.AppendRune(buf, dec)
						i += 6
						continue
					}
					r = utf8.RuneError
				}
				buf = utf8.AppendRune(buf, r)
				continue
			default:
				return "", false
			}
			i += 2
		case c == '"', c < 0x20:
			return "", false
		case c < 0x80:
			j := plainRun(s, i)
			buf = append(buf, s[i:j]...)
			i = j
		default:
			// DecodeRune's RuneError for an invalid byte is what
			// encoding/json writes in its place.
			r, size := utf8.DecodeRune(s[i:])
			buf = utf8.AppendRune(buf, r)
			i += size
		}
	}
	return unsafe.String(unsafe.SliceData(buf), len(buf)), true
}

// unquoteValidated is unquote for a string literal of a validated
// document (Fields.Validated: valid JSON and valid UTF-8), where it gives
// unquote's text: with no control character, invalid UTF-8 or malformed
// escape to look for, only the escapes need finding, and bytes.IndexByte
// finds them several times faster than unquote's checks. On other input
// it never panics; ok is false on what it notices is not a literal.
func unquoteValidated(raw []byte) (string, bool) {
	if len(raw) < 2 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return "", false
	}
	s := raw[1 : len(raw)-1]
	k := bytes.IndexByte(s, '\\')
	if k < 0 {
		if len(s) == 0 {
			return "", true
		}
		return unsafe.String(&s[0], len(s)), true
	}
	buf := make([]byte, 0, len(s))
	for k >= 0 {
		buf = append(buf, s[:k]...)
		if k+1 >= len(s) {
			return "", false
		}
		n := 2
		switch e := s[k+1]; e {
		case '"', '\\', '/':
			buf = append(buf, e)
		case 'b':
			buf = append(buf, '\b')
		case 'f':
			buf = append(buf, '\f')
		case 'n':
			buf = append(buf, '\n')
		case 'r':
			buf = append(buf, '\r')
		case 't':
			buf = append(buf, '\t')
		case 'u':
			r := hex4(s, k)
			if r < 0 {
				return "", false
			}
			n = 6
			if utf16.IsSurrogate(r) {
				if dec := utf16.DecodeRune(r, hex4(s, k+6)); dec != utf8.RuneError {
					r, n = dec, 12
				} else {
					r = utf8.RuneError
				}
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", false
		}
		s = s[k+n:]
		k = bytes.IndexByte(s, '\\')
	}
	buf = append(buf, s...)
	return unsafe.String(unsafe.SliceData(buf), len(buf)), true
}

// plainRun is the end of the run of s's bytes from i that a string literal
// holds as they are (plainByte's), 8 at a time where it can.
func plainRun(s []byte, i int) int {
	for i+8 <= len(s) && plainWord(binary.LittleEndian.Uint64(s[i:])) {
		i += 8
	}
	for i < len(s) && plainByte[s[i]] {
		i++
	}
	return i
}

// hex4 is the code unit of the \uXXXX escape at s[i:], or -1 when there is
// none.
func hex4(s []byte, i int) rune {
	if i+6 > len(s) || s[i] != '\\' || s[i+1] != 'u' {
		return -1
	}
	var r rune
	for _, c := range s[i+2 : i+6] {
		switch {
		case c >= '0' && c <= '9':
			c -= '0'
		case c >= 'a' && c <= 'f':
			c = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			c = c - 'A' + 10
		default:
			return -1
		}
		r = r<<4 | rune(c)
	}
	return r
}
