package tokenizer

import (
	"strconv"
	"unicode/utf16"
	"unicode/utf8"
)

// The vocabulary and merges are most of a tokenizer.json (a 128k-token
// vocabulary and 280k merges for Llama 3), and encoding/json's reflection
// makes them most of the load time. These scanners read exactly those two
// shapes; on anything unexpected they report !ok and the caller falls back
// to encoding/json, which then also produces the error for malformed input.

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanString reads the JSON string starting at b[i] == '"'.
func scanString(b []byte, i int) (string, int, bool) {
	if i >= len(b) || b[i] != '"' {
		return "", i, false
	}
	i++
	start := i
	for i < len(b) && b[i] != '"' && b[i] != '\\' && b[i] >= 0x20 {
		i++
	}
	if i < len(b) && b[i] == '"' {
		s := b[start:i]
		if !utf8.Valid(s) {
			return "", i, false // encoding/json replaces invalid bytes; leave that to it
		}
		return string(s), i + 1, true
	}
	buf := append([]byte(nil), b[start:i]...)
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			if !utf8.Valid(buf) {
				return "", i, false
			}
			return string(buf), i + 1, true
		case c < 0x20:
			return "", i, false
		case c != '\\':
			buf = append(buf, c)
			i++
			continue
		}
		if i+1 >= len(b) {
			return "", i, false
		}
		i += 2
		switch b[i-1] {
		case '"', '\\', '/':
			buf = append(buf, b[i-1])
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
			r, n, ok := scanHex4(b, i)
			if !ok {
				return "", i, false
			}
			i = n
			if utf16.IsSurrogate(r) {
				r2, n2, ok2 := rune(0), 0, false
				if i+1 < len(b) && b[i] == '\\' && b[i+1] == 'u' {
					r2, n2, ok2 = scanHex4(b, i+2)
				}
				if !ok2 {
					return "", i, false // lone surrogates: encoding/json's rules apply
				}
				r = utf16.DecodeRune(r, r2)
				if r == utf8.RuneError {
					return "", i, false
				}
				i = n2
			}
			buf = utf8.AppendRune(buf, r)
		default:
			return "", i, false
		}
	}
	return "", i, false
}

func scanHex4(b []byte, i int) (rune, int, bool) {
	if i+4 > len(b) {
		return 0, i, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 16)
	if err != nil {
		return 0, i, false
	}
	return rune(v), i + 4, true
}

// fastVocab parses {"token": id, ...} with ids that fit uint32.
func fastVocab(b []byte, dst map[string]uint32) bool {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '{' {
		return false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == '}' {
		return skipSpace(b, i+1) == len(b)
	}
	for {
		k, n, ok := scanString(b, i)
		if !ok {
			return false
		}
		i = skipSpace(b, n)
		if i >= len(b) || b[i] != ':' {
			return false
		}
		i = skipSpace(b, i+1)
		start := i
		for i < len(b) && '0' <= b[i] && b[i] <= '9' {
			i++
		}
		if i == start || i-start > 10 || b[start] == '0' && i-start > 1 {
			return false
		}
		v, err := strconv.ParseUint(string(b[start:i]), 10, 32)
		if err != nil {
			return false
		}
		dst[k] = uint32(v)
		i = skipSpace(b, i)
		if i >= len(b) {
			return false
		}
		if b[i] == '}' {
			return skipSpace(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return false
		}
		i = skipSpace(b, i+1)
	}
}

// fastMerges parses ["a b", ...] (strings) or [["a","b"], ...] (pairs);
// strings come back unsplit, pairs as two-element arrays.
func fastMerges(b []byte) (lines []string, pairs [][2]string, ok bool) {
	i := skipSpace(b, 0)
	if i >= len(b) || b[i] != '[' {
		return nil, nil, false
	}
	i = skipSpace(b, i+1)
	if i < len(b) && b[i] == ']' {
		return []string{}, nil, skipSpace(b, i+1) == len(b)
	}
	for {
		if i >= len(b) {
			return nil, nil, false
		}
		if b[i] == '[' && lines == nil {
			var p [2]string
			j := skipSpace(b, i+1)
			for k := 0; k < 2; k++ {
				s, n, ok := scanString(b, j)
				if !ok {
					return nil, nil, false
				}
				p[k] = s
				j = skipSpace(b, n)
				if k == 0 {
					if j >= len(b) || b[j] != ',' {
						return nil, nil, false
					}
					j = skipSpace(b, j+1)
				}
			}
			if j >= len(b) || b[j] != ']' {
				return nil, nil, false
			}
			pairs = append(pairs, p)
			i = skipSpace(b, j+1)
		} else if pairs == nil {
			s, n, ok := scanString(b, i)
			if !ok {
				return nil, nil, false
			}
			lines = append(lines, s)
			i = skipSpace(b, n)
		} else {
			return nil, nil, false
		}
		if i >= len(b) {
			return nil, nil, false
		}
		if b[i] == ']' {
			return lines, pairs, skipSpace(b, i+1) == len(b)
		}
		if b[i] != ',' {
			return nil, nil, false
		}
		i = skipSpace(b, i+1)
	}
}
