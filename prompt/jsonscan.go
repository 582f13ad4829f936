package prompt

import (
	"encoding/binary"
	"unicode/utf8"
)

// A request body used to go through encoding/json's validator once per
// nesting level (the body, then messages, then each message, then each
// content), most of a long chat's routing cost. This scanner validates a
// document in one pass with the grammar encoding/json's checkValid applies
// and hands back raw member values, aliasing the input. It decides nothing
// on its own: whatever it does not vouch for (invalid JSON, a key needing
// unescaping, very deep nesting) it reports as !ok and the caller takes the
// encoding/json path, which then produces the exact error or value.

// maxScanDepth bounds nesting; deeper documents go to encoding/json (whose
// own limit is 10000).
const maxScanDepth = 1000

// Member is one member of a scanned JSON object.
type Member struct {
	// Key is the key's bytes between the quotes; Escaped is set when they
	// hold a backslash escape or a non-ASCII byte, so they are not the
	// key's text (or could case-fold onto an ASCII name).
	Key     []byte
	Escaped bool
	// Value is the value's raw bytes (no surrounding space); it aliases
	// the scanned document.
	Value []byte
	// PlainString is set when Value is a string literal whose text is
	// exactly the bytes between its quotes (no escape, valid UTF-8).
	PlainString bool
}

// ScanObject validates doc as one JSON document and, when it is an object,
// appends its members to dst in order. ok is false when doc is not valid
// JSON, not an object, or nested deeper than the scanner follows.
func ScanObject(doc []byte, dst []Member) ([]Member, bool) {
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return dst, false
	}
	end, members, ok := scanObject(doc, i, 0, dst)
	if !ok || skipWS(doc, end) != len(doc) {
		return dst, false
	}
	return members, true
}

// ScanArray validates doc as one JSON document and, when it is an array,
// appends its elements' raw bytes to dst.
func ScanArray(doc []byte, dst [][]byte) ([][]byte, bool) {
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '[' {
		return dst, false
	}
	i = skipWS(doc, i+1)
	if i < len(doc) && doc[i] == ']' {
		return dst, skipWS(doc, i+1) == len(doc)
	}
	for {
		start := i
		end, ok := scanValue(doc, i, 1)
		if !ok {
			return dst, false
		}
		dst = append(dst, doc[start:end])
		i = skipWS(doc, end)
		if i >= len(doc) {
			return dst, false
		}
		if doc[i] == ']' {
			return dst, skipWS(doc, i+1) == len(doc)
		}
		if doc[i] != ',' {
			return dst, false
		}
		i = skipWS(doc, i+1)
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// scanObject scans the object at b[i] == '{', appending its members when
// dst is not nil-discarding (members are collected only at depth 0).
func scanObject(b []byte, i, depth int, dst []Member) (int, []Member, bool) {
	if depth >= maxScanDepth {
		return i, dst, false
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, dst, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, dst, false
		}
		kEnd, kPlain, ok := scanString(b, i)
		if !ok {
			return i, dst, false
		}
		key := b[i+1 : kEnd-1]
		i = skipWS(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return i, dst, false
		}
		i = skipWS(b, i+1)
		vStart := i
		var vPlain bool
		if i < len(b) && b[i] == '"' {
			i, vPlain, ok = scanString(b, i)
		} else {
			i, ok = scanValue(b, i, depth+1)
		}
		if !ok {
			return i, dst, false
		}
		if depth == 0 {
			dst = append(dst, Member{Key: key, Escaped: !kPlain || !isASCII(key), Value: b[vStart:i], PlainString: vPlain})
		}
		i = skipWS(b, i)
		if i >= len(b) {
			return i, dst, false
		}
		if b[i] == '}' {
			return i + 1, dst, true
		}
		if b[i] != ',' {
			return i, dst, false
		}
		i = skipWS(b, i+1)
	}
}

// scanValue scans the value at b[i] (no leading space) and returns the
// index just past it.
func scanValue(b []byte, i, depth int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		end, _, ok := scanString(b, i)
		return end, ok
	case c == '{':
		end, _, ok := scanObject(b, i, max(depth, 1), nil)
		return end, ok
	case c == '[':
		if depth >= maxScanDepth {
			return i, false
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = scanValue(b, i, depth+1); !ok {
				return i, false
			}
			i = skipWS(b, i)
			if i >= len(b) {
				return i, false
			}
			if b[i] == ']' {
				return i + 1, true
			}
			if b[i] != ',' {
				return i, false
			}
			i = skipWS(b, i+1)
		}
	case c == 't':
		return literal(b, i, "true")
	case c == 'f':
		return literal(b, i, "false")
	case c == 'n':
		return literal(b, i, "null")
	case c == '-' || (c >= '0' && c <= '9'):
		return scanNumber(b, i)
	}
	return i, false
}

func literal(b []byte, i int, lit string) (int, bool) {
	if len(b)-i < len(lit) || string(b[i:i+len(lit)]) != lit {
		return i, false
	}
	return i + len(lit), true
}

// scanNumber follows JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
func scanNumber(b []byte, i int) (int, bool) {
	if b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case i < len(b) && b[i] >= '1' && b[i] <= '9':
		i = digits(b, i)
	default:
		return i, false
	}
	if i < len(b) && b[i] == '.' {
		j := digits(b, i+1)
		if j == i+1 {
			return j, false
		}
		i = j
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		j := digits(b, i)
		if j == i {
			return j, false
		}
		i = j
	}
	return i, true
}

func digits(b []byte, i int) int {
	for i < len(b) && b[i] >= '0' && b[i] <= '9' {
		i++
	}
	return i
}

// scanString scans the string literal at b[i] == '"' and returns the index
// past its closing quote; plain is set when it holds no escape and its
// bytes are valid UTF-8 (its text is then the bytes between the quotes).
// As encoding/json does, it accepts invalid UTF-8 (decoding replaces it)
// and rejects control characters and malformed escapes.
func scanString(b []byte, i int) (end int, plain, ok bool) {
	start := i + 1
	i = start
	escaped, high := false, false
	for i < len(b) {
		// Most of a body is the text of long strings: skip its ordinary
		// bytes in a tight loop.
		for i+8 <= len(b) && plainWord(binary.LittleEndian.Uint64(b[i:])) {
			i += 8
		}
		for i < len(b) && plainByte[b[i]] {
			i++
		}
		if i >= len(b) {
			break
		}
		c := b[i]
		switch {
		case c == '"':
			plain = !escaped && (!high || utf8.Valid(b[start:i]))
			return i + 1, plain, true
		case c < 0x20:
			return i, false, false
		case c == '\\':
			escaped = true
			if i+1 >= len(b) {
				return i, false, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, false, false
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return i, false, false
					}
				}
				i += 6
			default:
				return i, false, false
			}
		case c >= 0x80:
			high = true
			i++
		default:
			i++
		}
	}
	return i, false, false
}

// plainWord reports whether none of the 8 bytes of x ends or complicates
// a string: no '"', '\\', control byte or byte >= 0x80 (plainByte for 8
// bytes at once). A byte is zero after the XOR exactly when it was the
// character; (v - 0x01…) &^ v & 0x80… is non-zero exactly when some byte of
// v is zero, and (x - 0x20…) &^ x & 0x80… when some byte of x is below 0x20.
func plainWord(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	q := x ^ ('"' * ones)
	bs := x ^ ('\\' * ones)
	return ((q-ones)&^q|(bs-ones)&^bs|(x-0x20*ones)&^x|x)&highs == 0
}

func isHex(c byte) bool {
	return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
}

func isASCII(s []byte) bool {
	for _, c := range s {
		if c >= 0x80 {
			return false
		}
	}
	return true
}

// scanMessage reads a chat message's role and content in one pass, as
// json.Unmarshal into wireMessage would, and its member count and first
// key as topLevelMembers would. ok is false when it cannot vouch for the
// result: the message is not a valid object, a key needs unescaping or
// case-folds onto role or content (encoding/json matches keys without
// case), a key repeats, or role is not a string; the caller then decodes
// with encoding/json.
func scanMessage(raw []byte, buf []Member) (wm wireMessage, n int, first string, ok bool) {
	members, ok := ScanObject(raw, buf)
	if !ok {
		return wireMessage{}, 0, "", false
	}
	var seenRole, seenContent bool
	for _, mb := range members {
		switch {
		case mb.Escaped:
			return wireMessage{}, 0, "", false
		case string(mb.Key) == "role":
			if seenRole {
				return wireMessage{}, 0, "", false
			}
			seenRole = true
			switch {
			case mb.PlainString:
				wm.Role = string(mb.Value[1 : len(mb.Value)-1])
			case mb.Value[0] == '"':
				if wm.Role, ok = unquote(mb.Value); !ok {
					return wireMessage{}, 0, "", false
				}
			case string(mb.Value) == "null":
			default:
				return wireMessage{}, 0, "", false
			}
		case string(mb.Key) == "content":
			if seenContent {
				return wireMessage{}, 0, "", false
			}
			seenContent = true
			wm.Content, wm.contentPlain = mb.Value, mb.PlainString
		case FoldsTo(mb.Key, "role"), FoldsTo(mb.Key, "content"):
			return wireMessage{}, 0, "", false
		}
	}
	if len(members) > 0 {
		first = string(members[0].Key)
	}
	return wm, len(members), first, true
}

// FoldsTo reports whether key equals the lower-case ASCII name ignoring
// ASCII case: the matches of a JSON member name to a field that the
// scanners decide themselves (anything else is left to encoding/json).
func FoldsTo(key []byte, name string) bool {
	if len(key) != len(name) {
		return false
	}
	for i := range key {
		c := key[i]
		if c >= 'A' && c <= 'Z' {
			c += 'a' - 'A'
		}
		if c != name[i] {
			return false
		}
	}
	return true
}

// plainByte marks the bytes a string literal holds as they are: not a
// quote, a backslash, a control character or a non-ASCII byte.
var plainByte = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()
