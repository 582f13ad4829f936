package prompt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
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
	end, members, ok := scanObject(doc, i, 0, dst, nil, nil)
	if !ok || skipWS(doc, end) != len(doc) {
		return dst, false
	}
	return members, true
}

// ScanObjectChecked is ScanObject that also reports, in the same pass,
// whether the document is unambiguous: two JSON readers cannot read it
// differently. It is when, throughout, every string is valid UTF-8 and
// holds no lone surrogate escape (a \uD800-\uDFFF not in a high-low
// pair), no value nests deeper than maxDepth (the document is at depth 0),
// and every object has at most maxCheckedKeys keys, each plain ASCII (no
// escape), no two equal ignoring ASCII case, and none a case variant of
// one of names (which must be lower-case ASCII). A document that is not
// unambiguous by this test may still be: the caller then checks it the
// slow way. unambiguous is false whenever ok is.
func ScanObjectChecked(doc []byte, dst []Member, maxDepth int, names []string) (members []Member, unambiguous, ok bool) {
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '{' {
		return dst, false, false
	}
	var keys [64][]byte
	f := scanFacts{clean: true, maxDepth: maxDepth, names: names}
	end, members, ok := scanObject(doc, i, 0, dst, &f, keys[:0])
	if !ok || skipWS(doc, end) != len(doc) {
		return dst, false, false
	}
	return members, f.clean, true
}

// maxCheckedKeys bounds the keys of one object that ScanObjectChecked
// compares pairwise; an object with more is left to the caller's check.
const maxCheckedKeys = 32

// scanFacts is what ScanObjectChecked learns on the way. Once clean is
// false nothing more is checked: the caller checks the document itself.
type scanFacts struct {
	clean    bool
	maxDepth int
	names    []string
}

// container notes an object or array at depth: its elements are one
// deeper.
func (f *scanFacts) container(depth int) {
	if depth >= f.maxDepth {
		f.clean = false
	}
}

// str notes the string b[start:end] (quotes included) that scanString
// described with flags.
func (f *scanFacts) str(b []byte, start, end int, flags uint8) {
	switch {
	case flags&strInvalid != 0:
		f.clean = false
	case flags&strSurrogate != 0 && loneSurrogateEscape(b[start:end]):
		f.clean = false
	}
}

// key notes key, a member name of an object whose keys before it are
// prev.
func (f *scanFacts) key(key []byte, escaped bool, prev [][]byte) {
	if escaped || len(prev) >= maxCheckedKeys {
		f.clean = false
		return
	}
	upper := false
	for _, c := range key {
		if c >= 'A' && c <= 'Z' {
			upper = true
			break
		}
	}
	for _, p := range prev {
		if len(p) == len(key) && asciiFoldEqual(p, key) {
			f.clean = false
			return
		}
	}
	if upper {
		for _, name := range f.names {
			if FoldsTo(key, name) {
				f.clean = false
				return
			}
		}
	}
}

func asciiFoldEqual(a, b []byte) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		x, y := a[i], b[i]
		if x >= 'A' && x <= 'Z' {
			x += 'a' - 'A'
		}
		if y >= 'A' && y <= 'Z' {
			y += 'a' - 'A'
		}
		if x != y {
			return false
		}
	}
	return true
}

// loneSurrogateEscape reports whether the string literal raw (valid JSON)
// holds a \u escape of a UTF-16 surrogate that is not a high one directly
// followed by an escaped low one: encoding/json reads it as U+FFFD,
// Python keeps the surrogate.
func loneSurrogateEscape(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i++ // the escaped character
			continue
		}
		r := hex4(raw, i)
		switch {
		case r < 0:
			return false // not valid JSON: not this function's to judge
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		case r >= 0xd800 && r <= 0xdbff:
			if lo := hex4(raw, i+6); lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
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
		end, ok := scanValue(doc, i, 1, nil, nil)
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

// scanObject scans the object at b[i] == '{', appending its members to
// dst at depth 0 (members are collected only there). f, when not nil,
// collects ScanObjectChecked's facts; the object's keys are then kept
// after the end of keys (an enclosing object's), in its spare capacity
// while there is some. (A field of f would put that array on the heap.)
func scanObject(b []byte, i, depth int, dst []Member, f *scanFacts, keys [][]byte) (int, []Member, bool) {
	if depth >= maxScanDepth {
		return i, dst, false
	}
	own := keys[len(keys):]
	if f != nil && f.clean {
		f.container(depth)
	}
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, dst, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, dst, false
		}
		kEnd, kFlags, ok := scanString(b, i)
		if !ok {
			return i, dst, false
		}
		key := b[i+1 : kEnd-1]
		kEscaped := kFlags&(strEscaped|strInvalid) != 0 || !isASCII(key)
		if f != nil && f.clean {
			f.key(key, kEscaped, own)
			own = append(own, key)
		}
		i = skipWS(b, kEnd)
		if i >= len(b) || b[i] != ':' {
			return i, dst, false
		}
		i = skipWS(b, i+1)
		vStart := i
		var vFlags uint8
		vString := i < len(b) && b[i] == '"'
		if vString {
			i, vFlags, ok = scanString(b, i)
			if ok && f != nil && f.clean {
				f.str(b, vStart, i, vFlags)
			}
		} else {
			i, ok = scanValue(b, i, depth+1, f, own)
		}
		if !ok {
			return i, dst, false
		}
		if depth == 0 {
			dst = append(dst, Member{Key: key, Escaped: kEscaped, Value: b[vStart:i], PlainString: vString && vFlags&(strEscaped|strInvalid) == 0})
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
// keys are the keys of the enclosing object (for the facts f collects).
func scanValue(b []byte, i, depth int, f *scanFacts, keys [][]byte) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch c := b[i]; {
	case c == '"':
		end, flags, ok := scanString(b, i)
		if ok && f != nil && f.clean {
			f.str(b, i, end, flags)
		}
		return end, ok
	case c == '{':
		end, _, ok := scanObject(b, i, max(depth, 1), nil, f, keys)
		return end, ok
	case c == '[':
		if depth >= maxScanDepth {
			return i, false
		}
		if f != nil && f.clean {
			f.container(depth)
		}
		i = skipWS(b, i+1)
		if i < len(b) && b[i] == ']' {
			return i + 1, true
		}
		for {
			var ok bool
			if i, ok = scanValue(b, i, depth+1, f, keys); !ok {
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

// What scanString found in a string literal.
const (
	strEscaped   uint8 = 1 << iota // a backslash escape
	strInvalid                     // invalid UTF-8 (decoding replaces it)
	strSurrogate                   // a \u escape of a UTF-16 surrogate
)

// scanString scans the string literal at b[i] == '"' and returns the index
// past its closing quote and what it holds (its text is the bytes between
// the quotes when flags has neither strEscaped nor strInvalid). As
// encoding/json does, it accepts invalid UTF-8 (decoding replaces it) and
// rejects control characters and malformed escapes.
func scanString(b []byte, i int) (end int, flags uint8, ok bool) {
	i++
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
			return i + 1, flags, true
		case c < 0x20:
			return i, 0, false
		case c == '\\':
			flags |= strEscaped
			if i+1 >= len(b) {
				return i, 0, false
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) {
					return i, 0, false
				}
				for _, h := range b[i+2 : i+6] {
					if !isHex(h) {
						return i, 0, false
					}
				}
				// A hex digit is at least '8' exactly when it is 8-f.
				if b[i+2]|0x20 == 'd' && b[i+3] >= '8' {
					flags |= strSurrogate
				}
				i += 6
			default:
				return i, 0, false
			}
		default: // c >= 0x80: a multi-byte sequence, never holding a quote
			r, size := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && size == 1 {
				flags |= strInvalid
			}
			i += size
		}
	}
	return i, 0, false
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

// The skim functions read a document that a caller's scan has already
// validated (valid JSON, as ScanObject checks it, and valid UTF-8) as the
// scan functions do, without validating it again: strings are found with
// bytes.IndexByte, which is several times faster than the scan's byte
// checks. A request's messages are most of its body, and were otherwise
// validated twice. On other input they never read out of bounds or
// panic, and report !ok on what a valid document would not hold; what
// they return for an invalid document that they do not catch is
// meaningless.

// skimObject is scanObject at depth 0 for a validated document.
func skimObject(b []byte, i int, dst []Member) (int, []Member, bool) {
	i = skipWS(b, i+1)
	if i < len(b) && b[i] == '}' {
		return i + 1, dst, true
	}
	for {
		if i >= len(b) || b[i] != '"' {
			return i, dst, false
		}
		kEnd, kEscaped, ok := skimString(b, i)
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
		vString, vEscaped := i < len(b) && b[i] == '"', false
		if vString {
			i, vEscaped, ok = skimString(b, i)
		} else {
			i, ok = skimValue(b, i)
		}
		if !ok {
			return i, dst, false
		}
		dst = append(dst, Member{Key: key, Escaped: kEscaped || !isASCII(key), Value: b[vStart:i], PlainString: vString && !vEscaped})
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

// skimArray is the elements of the array doc (of a validated document) as
// json.Unmarshal into a []json.RawMessage gives them, but aliasing doc: a
// non-nil slice, empty for an empty array. ok is false when doc is not an
// array.
func skimArray(doc []byte) ([]json.RawMessage, bool) {
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '[' {
		return nil, false
	}
	out := []json.RawMessage{}
	i = skipWS(doc, i+1)
	if i < len(doc) && doc[i] == ']' {
		return out, skipWS(doc, i+1) == len(doc)
	}
	for {
		start := i
		end, ok := skimValue(doc, i)
		if !ok {
			return nil, false
		}
		out = append(out, doc[start:end])
		i = skipWS(doc, end)
		if i >= len(doc) {
			return nil, false
		}
		if doc[i] == ']' {
			return out, skipWS(doc, i+1) == len(doc)
		}
		if doc[i] != ',' {
			return nil, false
		}
		i = skipWS(doc, i+1)
	}
}

// skimString finds the end of the string literal at b[i] == '"' and
// whether it holds an escape: one search for its closing quote (one that
// an odd run of backslashes does not escape) and one for a backslash.
func skimString(b []byte, i int) (end int, escaped, ok bool) {
	j := i + 1
	for {
		k := bytes.IndexByte(b[j:], '"')
		if k < 0 {
			return len(b), false, false
		}
		q := j + k
		r := q
		for r > i+1 && b[r-1] == '\\' {
			r--
		}
		if (q-r)%2 == 0 {
			return q + 1, q > r || bytes.IndexByte(b[i+1:r], '\\') >= 0, true
		}
		j = q + 1
	}
}

// skimValue finds the end of the value at b[i] (no leading space).
func skimValue(b []byte, i int) (int, bool) {
	if i >= len(b) {
		return i, false
	}
	switch b[i] {
	case '"':
		end, _, ok := skimString(b, i)
		return end, ok
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				end, _, ok := skimString(b, i)
				if !ok {
					return end, false
				}
				i = end
				continue
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					return i + 1, true
				}
			}
			i++
		}
		return i, false
	}
	start := i // a number or a literal
	for i < len(b) && b[i] != ',' && b[i] != '}' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\r' && b[i] != '\t' {
		i++
	}
	return i, i > start
}
