package frontend

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// The router reads a request with encoding/json, which matches keys
// without case (Unicode simple folding: "MODEL", "ſtream" and "\u006dodel"
// all set the model) and keeps the last of repeated keys, and forwards the
// client's bytes to an engine that reads them with Python's json module:
// case-sensitively, last duplicate winning, lone surrogates kept, invalid
// UTF-8 refused. Where the two readers could disagree about a value the
// router acts on (model, max_tokens, stream, n, the hints...), a tenant
// could be authorised, booked and charged for one request and served
// another. checkKeys refuses those bodies instead (docs/api.md, *What the
// router reads*), so what the router acts on is what the engine reads.

// ErrAmbiguousBody marks a body two JSON readers could read differently:
// a repeated key, keys equal but for case, a case-variant of a field the
// router reads, a lone surrogate escape or invalid UTF-8 (HTTP 400).
var ErrAmbiguousBody = errors.New("frontend: ambiguous request body")

// Codes of the ambiguity errors, also the reason label of their counter.
const (
	codeDuplicateKey   = "duplicate_key"
	codeCaseVariantKey = "case_variant_key"
	codeInvalidUnicode = "invalid_unicode"
	codeNestedTooDeep  = "nested_too_deep"
)

// maxBodyNesting bounds how deep a body nests. Python's json refuses
// documents nested about 1000 deep (its recursion limit), encoding/json
// 10000; real requests nest under ten.
const maxBodyNesting = 512

// bodyMetrics count the bodies refused as ambiguous, by reason.
type bodyMetrics struct {
	ambiguous *prometheus.CounterVec // reason
}

func newBodyMetrics(reg prometheus.Registerer) *bodyMetrics {
	return &bodyMetrics{ambiguous: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_router_ambiguous_bodies_total",
		Help: "Request bodies refused with 400 because an engine could read them differently from the router, by reason (duplicate_key, case_variant_key, invalid_unicode, nested_too_deep).",
	}, []string{"reason"})}
}

// count adds e to the counter when it is an ambiguity error.
func (m *bodyMetrics) count(e *APIError) {
	if m != nil && e != nil && errors.Is(e, ErrAmbiguousBody) {
		m.ambiguous.WithLabelValues(e.Code).Inc()
	}
}

// keyLevel is what the router reads at one place of the body: which keys
// it decodes into a struct (where encoding/json folds case), and what the
// values under those keys are.
type keyLevel uint8

const (
	// levelOpaque: passed through or read only as a map (tools,
	// chat_template_kwargs, unknown fields): only repeated keys matter.
	levelOpaque keyLevel = iota
	levelTop
	levelHints         // the switchyard object
	levelStreamOptions // stream_options
	levelMessages      // the messages array: its elements are messages
	levelMessage       // one chat message
	levelParts         // a content array: its elements are parts
	levelPart          // one content part
	levelInputItems    // the Responses input array
	levelInputItem     // one input item
)

var (
	// topFields are the top-level keys the router reads (decode.go).
	topFields = requestFields[:]
	// Keys of the objects the router (or package prompt) decodes.
	hintFields          = []string{"class", "priority", "deadline_ms", "worker", "allowed_workers"}
	streamOptionsFields = []string{"include_usage", "continuous_usage_stats"}
	messageFields       = []string{"role", "content"}
	partFields          = []string{"type", "text", "refusal"}
	inputItemFields     = []string{"type", "role", "content", "call_id", "name", "arguments", "output"}
	// structFields are the keys of every level above: the decode's scan
	// (prompt.ScanObjectChecked) finds a body unambiguous only when no
	// key anywhere is a case variant of one of them, so that checkKeys,
	// which checks each level's own, would find nothing.
	structFields = slices.Concat(topFields, hintFields, streamOptionsFields, messageFields, partFields, inputItemFields)
)

// fields are the keys read at l; nil at a level read as a map or not at all.
func (l keyLevel) fields() []string {
	switch l {
	case levelTop:
		return topFields
	case levelHints:
		return hintFields
	case levelStreamOptions:
		return streamOptionsFields
	case levelMessage:
		return messageFields
	case levelPart:
		return partFields
	case levelInputItem:
		return inputItemFields
	}
	return nil
}

// child is the level of key's value in an object at l.
func (l keyLevel) child(key []byte) keyLevel {
	switch {
	case l == levelTop && string(key) == "switchyard":
		return levelHints
	case l == levelTop && string(key) == "stream_options":
		return levelStreamOptions
	case l == levelTop && string(key) == "messages":
		return levelMessages
	case l == levelTop && string(key) == "input":
		return levelInputItems
	case (l == levelMessage || l == levelInputItem) && string(key) == "content":
		return levelParts
	}
	return levelOpaque
}

// element is the level of an array element at l.
func (l keyLevel) element() keyLevel {
	switch l {
	case levelMessages:
		return levelMessage
	case levelParts:
		return levelPart
	case levelInputItems:
		return levelInputItem
	}
	return levelOpaque
}

// keyError is an ambiguity found at path (outermost first).
type keyError struct {
	code, msg string
	path      []string
}

// checkKeys refuses a body (already known to be valid JSON) that an engine
// could read differently from the router: anywhere, a key that repeats or
// a string with a lone surrogate escape; in the objects the router decodes,
// two keys equal but for case or a key equal to a field it reads but for
// case; invalid UTF-8 or nesting deeper than maxBodyNesting. The error is
// a 400 naming the key's path. A body the decode's scan found unambiguous
// (bodyScan) need not be checked: checkKeys would pass it.
func checkKeys(body []byte) *APIError {
	if !utf8.Valid(body) {
		return ambiguous(codeInvalidUnicode, "", "the body is not valid UTF-8")
	}
	w := keyWalker{b: body}
	if _, ke := w.value(skipSpace(body, 0), 0, levelTop); ke != nil {
		param := joinPath(ke.path)
		return ambiguous(ke.code, param, ke.msg)
	}
	return nil
}

func ambiguous(code, param, msg string) *APIError {
	return &APIError{Status: 400, Type: typeInvalidRequest, Code: code, Param: param, Message: msg, err: ErrAmbiguousBody}
}

// joinPath spells a path as the errors of package prompt do:
// messages[2].content, switchyard.class.
func joinPath(p []string) string {
	var b []byte
	for _, s := range p {
		if len(s) > 0 && s[0] == '[' {
			b = append(b, s...)
			continue
		}
		if len(b) > 0 {
			b = append(b, '.')
		}
		b = append(b, s...)
	}
	return string(b)
}

// keyWalker walks a valid JSON document once. It never panics on other
// input: a malformed document ends the walk without an error (the decoder
// before it reports those).
type keyWalker struct {
	b    []byte
	keys [][]byte // the keys of the objects being walked, innermost last
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\n' || b[i] == '\r' || b[i] == '\t') {
		i++
	}
	return i
}

// value walks the value at b[i] and returns the index past it.
func (w *keyWalker) value(i, depth int, l keyLevel) (int, *keyError) {
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
		end, _, ke := w.str(i, false)
		return end, ke
	}
	for i < len(w.b) && !endsScalar(w.b[i]) {
		i++
	}
	return i, nil
}

func (w *keyWalker) array(i, depth int, l keyLevel) (int, *keyError) {
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

func (w *keyWalker) object(i, depth int, l keyLevel) (int, *keyError) {
	base := len(w.keys)
	defer func() { w.keys = w.keys[:base] }()
	fields := l.fields()
	// Past manyKeys keys an object's keys are compared through a map of
	// their folded forms: pairwise, a 4 MiB object of short keys would
	// take 10^10 comparisons.
	var seen map[string][]byte
	i = skipSpace(w.b, i+1)
	for i < len(w.b) && w.b[i] == '"' {
		end, key, ke := w.str(i, true)
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
func (w *keyWalker) checkKey(key []byte, base int, fields []string, seen map[string][]byte) *keyError {
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

// foldEqual is encoding/json's key match: equal under Unicode simple case
// folding (its foldName is defined to agree with EqualFold).
func foldEqual(a, b []byte) bool {
	return bytes.EqualFold(a, b)
}

// manyKeys is where an object's keys go into a map (object).
const manyKeys = 32

// foldKey is key's folded form when folds (keys equal under simple case
// folding have the same one, as encoding/json's foldName), else key.
func foldKey(key []byte, folds bool) string {
	if !folds {
		return string(key)
	}
	out := make([]byte, 0, len(key))
	for i := 0; i < len(key); {
		r, n := utf8.DecodeRune(key[i:])
		i += n
		for {
			// The smallest rune of r's fold orbit stands for all of it.
			r2 := unicode.SimpleFold(r)
			if r2 <= r {
				r = r2
				break
			}
			r = r2
		}
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}

// endsScalar reports whether c ends a number or literal.
func endsScalar(c byte) bool {
	return c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\r' || c == '\n'
}

// str walks the string at b[i] == '"'. It returns the index past it and,
// when text is set (a key), its decoded text (aliasing b when it has no
// escape). A value's text is never read, so it is not decoded: a chat's
// messages are long strings full of escaped newlines, and decoding each
// (allocating a copy) was most of the walk. A string with a lone surrogate
// escape is an error either way: encoding/json reads it as U+FFFD, Python
// keeps the surrogate.
func (w *keyWalker) str(i int, text bool) (int, []byte, *keyError) {
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
		if loneSurrogate(raw) {
			return q + 1, nil, &keyError{code: codeInvalidUnicode, msg: "a string holds a lone UTF-16 surrogate escape (\\ud800-\\udfff not in a pair)"}
		}
		if !text {
			return q + 1, nil, nil
		}
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return q + 1, nil, nil
		}
		return q + 1, []byte(s), nil
	}
}

// loneSurrogate reports whether the string literal raw holds a \u escape
// of a surrogate that is not a high one followed by a low one.
func loneSurrogate(raw []byte) bool {
	for i := 0; i < len(raw); i++ {
		// Jump to the next escape: a long value has few.
		e := bytes.IndexByte(raw[i:], '\\')
		if e < 0 {
			return false
		}
		i += e
		if i+1 >= len(raw) || raw[i+1] != 'u' {
			i++
			continue
		}
		r, ok := hex4(raw, i+2)
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
			lo, ok := hex4(raw, i+8)
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

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(n), err == nil
}
