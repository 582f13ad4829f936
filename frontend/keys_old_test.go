package frontend

// The ambiguity check as it stood before str stopped decoding values and
// loneSurrogate jumped between escapes (keys.go): the reference of
// FuzzCheckKeysAgreesWithTheOldWalk. Kept verbatim but for the names.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// oldCheckKeys refuses a body (already known to be valid JSON) that an engine
// could read differently from the router: anywhere, a key that repeats or
// a string with a lone surrogate escape; in the objects the router decodes,
// two keys equal but for case or a key equal to a field it reads but for
// case; invalid UTF-8 or nesting deeper than maxBodyNesting. The error is
// a 400 naming the key's path.
func oldCheckKeys(body []byte) *APIError {
	if !utf8.Valid(body) {
		return ambiguous(codeInvalidUnicode, "", "the body is not valid UTF-8")
	}
	w := oldKeyWalker{b: body}
	if _, ke := w.value(skipSpace(body, 0), 0, levelTop); ke != nil {
		param := joinPath(ke.path)
		return ambiguous(ke.code, param, ke.msg)
	}
	return nil
}

// oldKeyWalker walks a valid JSON document once. It never panics on other
// input: a malformed document ends the walk without an error (the decoder
// before it reports those).
type oldKeyWalker struct {
	b    []byte
	keys [][]byte // the keys of the objects being walked, innermost last
}

// value walks the value at b[i] and returns the index past it.
func (w *oldKeyWalker) value(i, depth int, l keyLevel) (int, *keyError) {
	if i >= len(w.b) {
		return i, nil
	}
	if depth > maxBodyNesting {
		return i, &keyError{code: codeNestedTooDeep, msg: fmt.Sprintf("the body nests deeper than %d levels", maxBodyNesting)}
	}
	switch w.b[i] {
	case '{':
		return w.object(i, depth, l)
	case '[':
		return w.array(i, depth, l)
	case '"':
		end, _, ke := w.str(i)
		return end, ke
	}
	for i < len(w.b) && !endsScalar(w.b[i]) {
		i++
	}
	return i, nil
}

func (w *oldKeyWalker) array(i, depth int, l keyLevel) (int, *keyError) {
	i = skipSpace(w.b, i+1)
	if i < len(w.b) && w.b[i] == ']' {
		return i + 1, nil
	}
	for n := 0; i < len(w.b); n++ {
		end, ke := w.value(i, depth+1, l.element())
		if ke != nil {
			ke.path = append([]string{"[" + strconv.Itoa(n) + "]"}, ke.path...)
			return end, ke
		}
		i = skipSpace(w.b, end)
		if i >= len(w.b) || w.b[i] != ',' {
			break
		}
		i = skipSpace(w.b, i+1)
	}
	if i < len(w.b) && w.b[i] == ']' {
		i++
	}
	return i, nil
}

func (w *oldKeyWalker) object(i, depth int, l keyLevel) (int, *keyError) {
	base := len(w.keys)
	defer func() { w.keys = w.keys[:base] }()
	fields := l.fields()
	// Past manyKeys keys an object's keys are compared through a map of
	// their folded forms: pairwise, a 4 MiB object of short keys would
	// take 10^10 comparisons.
	var seen map[string][]byte
	i = skipSpace(w.b, i+1)
	for i < len(w.b) && w.b[i] == '"' {
		end, key, ke := w.str(i)
		if ke != nil {
			return end, ke
		}
		if n := len(w.keys) - base; n == manyKeys {
			seen = make(map[string][]byte, 2*manyKeys)
			for _, k := range w.keys[base:] {
				seen[foldKey(k, fields != nil)] = k
			}
		}
		if ke := w.checkKey(key, base, fields, seen); ke != nil {
			ke.path = []string{string(key)}
			return end, ke
		}
		w.keys = append(w.keys, key)
		i = skipSpace(w.b, end)
		if i >= len(w.b) || w.b[i] != ':' {
			return i, nil
		}
		end, ke = w.value(skipSpace(w.b, i+1), depth+1, l.child(key))
		if ke != nil {
			ke.path = append([]string{string(key)}, ke.path...)
			return end, ke
		}
		i = skipSpace(w.b, end)
		if i >= len(w.b) || w.b[i] != ',' {
			break
		}
		i = skipSpace(w.b, i+1)
	}
	if i < len(w.b) && w.b[i] == '}' {
		i++
	}
	return i, nil
}

// checkKey compares key with the keys before it in its object
// (w.keys[base:]) and with the fields read at its level.
func (w *oldKeyWalker) checkKey(key []byte, base int, fields []string, seen map[string][]byte) *keyError {
	folds := fields != nil // a level decoded into a struct: case matters
	same := func(prev []byte) *keyError {
		if string(prev) == string(key) {
			return &keyError{code: codeDuplicateKey, msg: fmt.Sprintf("the key %q appears more than once in one object", key)}
		}
		return &keyError{code: codeCaseVariantKey, msg: fmt.Sprintf("the keys %q and %q differ only in case", prev, key)}
	}
	if seen != nil {
		f := foldKey(key, folds)
		if prev, ok := seen[f]; ok {
			return same(prev)
		}
		seen[f] = key
	} else {
		for _, prev := range w.keys[base:] {
			if string(prev) == string(key) || folds && foldEqual(prev, key) {
				return same(prev)
			}
		}
	}
	if !folds {
		return nil
	}
	for _, f := range fields {
		if string(key) != f && foldEqual(key, []byte(f)) {
			return &keyError{code: codeCaseVariantKey, msg: fmt.Sprintf("the key %q must be spelled %q (engines read keys case-sensitively)", key, f)}
		}
	}
	return nil
}

// str walks the string at b[i] == '"'. It returns the index past it and,
// decoded, its text (aliasing b when it has no escape). A string with a
// lone surrogate escape is an error: encoding/json reads it as U+FFFD,
// Python keeps the surrogate.
func (w *oldKeyWalker) str(i int) (int, []byte, *keyError) {
	start, j := i, i+1
	for {
		q := bytes.IndexByte(w.b[j:], '"')
		if q < 0 {
			return len(w.b), nil, nil
		}
		q += j
		// The quote is escaped when an odd run of backslashes precedes it
		// (the run starts after the previous quote, at j at the earliest).
		k := q
		for k > j && w.b[k-1] == '\\' {
			k--
		}
		if (q-k)%2 == 1 {
			j = q + 1
			continue
		}
		raw := w.b[start : q+1]
		if bytes.IndexByte(raw, '\\') < 0 {
			return q + 1, raw[1 : len(raw)-1], nil
		}
		if oldLoneSurrogate(raw) {
			return q + 1, nil, &keyError{code: codeInvalidUnicode, msg: "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair)"}
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return q + 1, nil, nil
		}
		return q + 1, []byte(s), nil
	}
}

// oldLoneSurrogate reports whether the string literal raw holds a \u escape
// of a surrogate that is not a high one followed by a low one.
func oldLoneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		if raw[i] != '\\' {
			continue
		}
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i++
			continue
		}
		r, ok := oldHex4(raw, i+2)
		if !ok {
			return false // malformed: the decoder reports it
		}
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return true
		case r >= 0xd800 && r <= 0xdbff:
			if i+12 > len(raw) || raw[i+6] != '\\' || raw[i+7] != 'u' {
				return true
			}
			lo, ok := oldHex4(raw, i+8)
			if !ok || lo < 0xdc00 || lo > 0xdfff {
				return true
			}
			i += 11
		default:
			i += 5
		}
	}
	return false
}

func oldHex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(n), err == nil
}
