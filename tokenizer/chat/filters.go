package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// printValue is Python's str() as Jinja2 prints {{ value }}: None is
// "None", floats use repr, lists and dicts their Python repr; an undefined
// value prints nothing.
func printValue(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.NewString(""), nil
	}
	v := args[0]
	if v.IsString() {
		return v, nil
	}
	return jinja.NewString(pyStr(v)), nil
}

// pyStr is str(v).
func pyStr(v jinja.Value) string {
	switch {
	case v.IsUndefined():
		return ""
	case v.IsString():
		return v.AsString()
	}
	var sb strings.Builder
	writeRepr(&sb, v, 0)
	return sb.String()
}

// writeRepr is repr(v) (str(v) for everything but strings, which it quotes).
func writeRepr(sb *strings.Builder, v jinja.Value, depth int) {
	if depth > maxDepth {
		sb.WriteString("...")
		return
	}
	switch {
	case v.IsUndefined():
		// A container never holds Undefined in Python; print what str does.
	case v.IsNone():
		sb.WriteString("None")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("True")
		} else {
			sb.WriteString("False")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(pyFloatRepr(v.AsFloat()))
	case v.IsString():
		writeStrRepr(sb, v.AsString())
	case v.IsList():
		sb.WriteByte('[')
		for i, it := range v.AsList().Items {
			if i > 0 {
				sb.WriteString(", ")
			}
			writeRepr(sb, it, depth+1)
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		sb.WriteByte('{')
		for i, k := range d.Keys {
			if i > 0 {
				sb.WriteString(", ")
			}
			writeStrRepr(sb, k)
			sb.WriteString(": ")
			writeRepr(sb, d.Data[k], depth+1)
		}
		sb.WriteByte('}')
	default:
		sb.WriteString(v.String())
	}
}

// writeStrRepr is Python's repr of a str: single quotes unless the string
// holds a single quote and no double quote, backslash escapes for the
// quote, backslash, \n \r \t and unprintable characters.
func writeStrRepr(sb *strings.Builder, s string) {
	q := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		q = '"'
	}
	sb.WriteByte(q)
	for _, r := range s {
		switch {
		case r == rune(q) || r == '\\':
			sb.WriteByte('\\')
			sb.WriteRune(r)
		case r == '\n':
			sb.WriteString(`\n`)
		case r == '\r':
			sb.WriteString(`\r`)
		case r == '\t':
			sb.WriteString(`\t`)
		case r == utf8.RuneError:
			sb.WriteRune(r)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(sb, `\x%02x`, r)
		case r < 0x7f || unicode.IsPrint(r):
			sb.WriteRune(r)
		case r < 0x100:
			fmt.Fprintf(sb, `\x%02x`, r)
		case r < 0x10000:
			fmt.Fprintf(sb, `\u%04x`, r)
		default:
			fmt.Fprintf(sb, `\U%08x`, r)
		}
	}
	sb.WriteByte(q)
}

// lengthFilter is Jinja2's length/count: len() of a string (in code points),
// list or dict; 0 for an undefined value; a TypeError for anything else.
func lengthFilter(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("length: missing value")
	}
	v := args[0]
	switch {
	case v.IsString():
		return jinja.NewInt(int64(utf8.RuneCountInString(v.AsString()))), nil
	case v.IsList():
		return jinja.NewInt(int64(v.AsList().Len())), nil
	case v.IsDict():
		return jinja.NewInt(int64(v.AsDict().Len())), nil
	case v.IsUndefined():
		return jinja.NewInt(0), nil
	}
	return jinja.Value{}, fmt.Errorf("TypeError: object of type '%s' has no len()", pyTypeName(v))
}

func pyTypeName(v jinja.Value) string {
	switch {
	case v.IsNone():
		return "NoneType"
	case v.IsBool():
		return "bool"
	case v.IsInt():
		return "int"
	case v.IsFloat():
		return "float"
	case v.IsString():
		return "str"
	case v.IsList():
		return "list"
	case v.IsDict():
		return "dict"
	case v.IsCallable():
		return "function"
	}
	return "Undefined"
}

// pyItems is what Python's iter() yields for a filter's value: a list's
// items, a dict's keys, a string's characters, nothing for Undefined, and a
// TypeError for the rest. A list's items are returned as they are: callers
// only read them.
func pyItems(v jinja.Value) ([]jinja.Value, error) {
	var items []jinja.Value
	switch {
	case v.IsList():
		items = v.AsList().Items
	case v.IsDict():
		for _, k := range v.AsDict().Keys {
			items = append(items, jinja.NewString(k))
		}
	case v.IsString():
		for _, r := range v.AsString() {
			items = append(items, jinja.NewString(string(r)))
		}
	case v.IsUndefined():
	default:
		return nil, fmt.Errorf("TypeError: '%s' object is not iterable", pyTypeName(v))
	}
	return items, nil
}

// sortFilter is Jinja2's sort(value, reverse=False, case_sensitive=False,
// attribute=None): a stable sort, strings compared case-insensitively unless
// asked, by an attribute or item (dotted path) when given. Values Python
// cannot order against each other are a TypeError, as in Python.
func sortFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("sort: missing value")
	}
	params := map[string]jinja.Value{}
	names := []string{"reverse", "case_sensitive", "attribute"}
	for i, a := range args[1:] {
		if i >= len(names) {
			return jinja.Value{}, fmt.Errorf("sort: too many arguments")
		}
		params[names[i]] = a
	}
	for k, v := range kwargs {
		params[k] = v
	}
	reverse := params["reverse"].IsTruthy()
	caseSensitive := params["case_sensitive"].IsTruthy()
	items, err := pyItems(args[0])
	if err != nil {
		return jinja.Value{}, err
	}
	keys := make([]jinja.Value, len(items))
	attr, hasAttr := params["attribute"]
	for i, it := range items {
		k := it
		if hasAttr && !attr.IsNone() && !attr.IsUndefined() {
			k = lookupPath(it, pyStr(attr))
		}
		if k.IsString() && !caseSensitive {
			k = jinja.NewString(strings.ToLower(k.AsString()))
		}
		keys[i] = k
	}
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	var cmpErr error
	sort.SliceStable(idx, func(a, b int) bool {
		x, y := keys[idx[a]], keys[idx[b]]
		if reverse {
			x, y = y, x
		}
		less, err := pyLess(x, y)
		if err != nil && cmpErr == nil {
			cmpErr = err
		}
		return less
	})
	if cmpErr != nil {
		return jinja.Value{}, cmpErr
	}
	out := make([]jinja.Value, len(items))
	for i, j := range idx {
		out[i] = items[j]
	}
	return jinja.NewList(out), nil
}

// lookupPath is Jinja2's attribute getter for "a.b.0": items of dicts,
// indexes of lists, undefined when missing.
func lookupPath(v jinja.Value, path string) jinja.Value {
	for _, part := range strings.Split(path, ".") {
		switch {
		case v.IsDict():
			nv, ok := v.AsDict().Get(part)
			if !ok {
				return jinja.Undefined()
			}
			v = nv
		case v.IsList():
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= v.AsList().Len() {
				return jinja.Undefined()
			}
			v = v.AsList().Items[i]
		default:
			return jinja.Undefined()
		}
	}
	return v
}

// pyLess is Python's x < y for the values templates sort.
func pyLess(x, y jinja.Value) (bool, error) {
	num := func(v jinja.Value) (float64, bool) {
		switch {
		case v.IsInt():
			return float64(v.AsInt()), true
		case v.IsFloat():
			return v.AsFloat(), true
		case v.IsBool():
			if v.AsBool() {
				return 1, true
			}
			return 0, true
		}
		return 0, false
	}
	if a, ok := num(x); ok {
		if b, ok := num(y); ok {
			if x.IsInt() && y.IsInt() {
				return x.AsInt() < y.AsInt(), nil
			}
			return a < b, nil
		}
	}
	if x.IsString() && y.IsString() {
		return x.AsString() < y.AsString(), nil
	}
	if x.IsList() && y.IsList() {
		xs, ys := x.AsList().Items, y.AsList().Items
		for i := 0; i < len(xs) && i < len(ys); i++ {
			if xs[i].Equals(ys[i]) {
				continue
			}
			return pyLess(xs[i], ys[i])
		}
		return len(xs) < len(ys), nil
	}
	return false, fmt.Errorf("TypeError: '<' not supported between instances of '%s' and '%s'", pyTypeName(x), pyTypeName(y))
}

// trimFilter is Jinja2's trim(value, chars=None): str(value).strip(chars).
func trimFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("trim: missing value")
	}
	s := pyStr(args[0])
	chars, ok := kwargs["chars"]
	if len(args) > 1 {
		chars, ok = args[1], true
	}
	if ok && !chars.IsNone() && !chars.IsUndefined() {
		return jinja.NewString(strings.Trim(s, pyStr(chars))), nil
	}
	return jinja.NewString(strings.TrimFunc(s, pyIsSpace)), nil
}

// stringFilter is Jinja2's string: str(value).
func stringFilter(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("string: missing value")
	}
	return jinja.NewString(pyStr(args[0])), nil
}

// maxRange is Jinja2's sandbox limit on range() (MAX_RANGE): a template
// cannot make the render build an enormous list.
const maxRange = 100000

// rangeGlobal is range(stop) / range(start, stop[, step]) with the
// sandbox's limit.
func rangeGlobal(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	var n [3]int64
	for i, a := range args {
		if i >= 3 || !a.IsInt() && !a.IsBool() {
			return jinja.Value{}, fmt.Errorf("TypeError: range() takes 1 to 3 integers")
		}
		if a.IsBool() {
			if a.AsBool() {
				n[i] = 1
			}
			continue
		}
		n[i] = a.AsInt()
	}
	start, stop, step := int64(0), int64(0), int64(1)
	switch len(args) {
	case 1:
		stop = n[0]
	case 2:
		start, stop = n[0], n[1]
	case 3:
		start, stop, step = n[0], n[1], n[2]
	default:
		return jinja.Value{}, fmt.Errorf("TypeError: range expected at least 1 argument, got 0")
	}
	if step == 0 {
		return jinja.Value{}, fmt.Errorf("ValueError: range() arg 3 must not be zero")
	}
	var count int64
	switch {
	case step > 0 && stop > start:
		count = (stop - start + step - 1) / step
	case step < 0 && stop < start:
		count = (start - stop - step - 1) / -step
	}
	if count < 0 || count > maxRange {
		return jinja.Value{}, fmt.Errorf("OverflowError: range too big, the sandbox blocks ranges larger than MAX_RANGE (%d)", maxRange)
	}
	items := make([]jinja.Value, count)
	for i := range items {
		items[i] = jinja.NewInt(start + int64(i)*step)
	}
	return jinja.NewList(items), nil
}

func isNumber(v jinja.Value) bool { return v.IsInt() || v.IsFloat() || v.IsBool() }

func asFloat(v jinja.Value) float64 {
	switch {
	case v.IsInt():
		return float64(v.AsInt())
	case v.IsFloat():
		return v.AsFloat()
	case v.IsBool() && v.AsBool():
		return 1
	}
	return 0
}

func asInt(v jinja.Value) int64 {
	if v.IsInt() {
		return v.AsInt()
	}
	if v.IsBool() && v.AsBool() {
		return 1
	}
	return 0
}

// addOp is Python's a + b: numbers add, strings and lists concatenate,
// anything else is a TypeError (the library joins a string with anything).
func addOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 {
		return jinja.Value{}, fmt.Errorf("add: want two operands")
	}
	a, b := args[0], args[1]
	switch {
	case a.IsUndefined() || b.IsUndefined():
		return jinja.Value{}, fmt.Errorf("UndefinedError: an operand of + is undefined")
	case isNumber(a) && isNumber(b):
		if (a.IsInt() || a.IsBool()) && (b.IsInt() || b.IsBool()) {
			return jinja.NewInt(asInt(a) + asInt(b)), nil
		}
		return jinja.NewFloat(asFloat(a) + asFloat(b)), nil
	case a.IsString() && b.IsString():
		return jinja.NewString(a.AsString() + b.AsString()), nil
	case a.IsList() && b.IsList():
		items := make([]jinja.Value, 0, a.AsList().Len()+b.AsList().Len())
		items = append(items, a.AsList().Items...)
		items = append(items, b.AsList().Items...)
		return jinja.NewList(items), nil
	case a.IsString() || a.IsList():
		return jinja.Value{}, fmt.Errorf("TypeError: can only concatenate %s (not \"%s\") to %s", pyTypeName(a), pyTypeName(b), pyTypeName(a))
	}
	return jinja.Value{}, fmt.Errorf("TypeError: unsupported operand type(s) for +: '%s' and '%s'", pyTypeName(a), pyTypeName(b))
}

// pyEqual is Python's ==, under which 1 == 1.0 == True.
func pyEqual(a, b jinja.Value) bool {
	if isNumber(a) && isNumber(b) {
		return asFloat(a) == asFloat(b)
	}
	return a.Equals(b)
}

// inOp is Python's a in b: a substring, a list member, a dict key; an
// undefined container holds nothing; None and numbers are a TypeError.
func inOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 {
		return jinja.Value{}, fmt.Errorf("in: want two operands")
	}
	a, b := args[0], args[1]
	switch {
	case b.IsString():
		if !a.IsString() {
			return jinja.Value{}, fmt.Errorf("TypeError: 'in <string>' requires string as left operand, not %s", pyTypeName(a))
		}
		return jinja.NewBool(strings.Contains(b.AsString(), a.AsString())), nil
	case b.IsList():
		for _, it := range b.AsList().Items {
			if pyEqual(a, it) {
				return jinja.NewBool(true), nil
			}
		}
		return jinja.NewBool(false), nil
	case b.IsDict():
		if !a.IsString() {
			return jinja.NewBool(false), nil
		}
		return jinja.NewBool(b.AsDict().Has(a.AsString())), nil
	case b.IsUndefined():
		return jinja.NewBool(false), nil
	}
	return jinja.Value{}, fmt.Errorf("TypeError: argument of type '%s' is not iterable", pyTypeName(b))
}

// iterOp lets a for loop run over what Python can iterate and fails on the
// rest (None, numbers), where the library would loop zero times.
func iterOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 1 {
		return jinja.Value{}, fmt.Errorf("iter: want one operand")
	}
	v := args[0]
	if v.IsNone() || isNumber(v) || v.IsCallable() {
		return jinja.Value{}, fmt.Errorf("TypeError: '%s' object is not iterable", pyTypeName(v))
	}
	return v, nil
}

// powOp is Python's a ** b: an int for ints with a non-negative exponent
// (the library always makes a float).
func powOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 || !isNumber(args[0]) || !isNumber(args[1]) {
		return jinja.Value{}, fmt.Errorf("TypeError: unsupported operand type(s) for ** or pow()")
	}
	a, b := args[0], args[1]
	if !a.IsFloat() && !b.IsFloat() && asInt(b) >= 0 {
		r, base, e := int64(1), asInt(a), asInt(b)
		if e > 4096 {
			return jinja.Value{}, fmt.Errorf("OverflowError: exponent %d too large", e)
		}
		for range e {
			r *= base
		}
		return jinja.NewInt(r), nil
	}
	return jinja.NewFloat(math.Pow(asFloat(a), asFloat(b))), nil
}

// pyIsSpace is Python's str.isspace for one character: Go's White_Space
// set plus the ASCII separators U+001C..U+001F.
// Trim is Jinja2's trim filter without chars (Python's str.strip()), for
// renderers that write a known template's output directly.
func Trim(s string) string { return strings.TrimFunc(s, pyIsSpace) }

func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f
}

// methodOp returns the str method name bound to v, for the call that
// follows: strip, lstrip and rstrip with Python's whitespace and cutsets.
// On anything but a string the method does not exist and the render fails,
// as calling Jinja2's undefined attribute does.
func methodOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 || !args[1].IsString() {
		return jinja.Value{}, fmt.Errorf("method: bad call")
	}
	v, name := args[0], args[1].AsString()
	if !v.IsString() {
		return jinja.Value{}, fmt.Errorf("UndefinedError: '%s' object has no attribute '%s'", pyTypeName(v), name)
	}
	s := v.AsString()
	return jinja.NewCallable(name, func(cargs []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
		if len(cargs) > 1 || len(kwargs) > 0 {
			return jinja.Value{}, fmt.Errorf("TypeError: %s expected at most 1 argument", name)
		}
		cut := ""
		useCut := len(cargs) == 1 && !cargs[0].IsNone()
		if useCut {
			if !cargs[0].IsString() {
				return jinja.Value{}, fmt.Errorf("TypeError: %s arg must be None or str", name)
			}
			cut = cargs[0].AsString()
		}
		switch {
		case name == "strip" && useCut:
			return jinja.NewString(strings.Trim(s, cut)), nil
		case name == "strip":
			return jinja.NewString(strings.TrimFunc(s, pyIsSpace)), nil
		case name == "lstrip" && useCut:
			return jinja.NewString(strings.TrimLeft(s, cut)), nil
		case name == "lstrip":
			return jinja.NewString(strings.TrimLeftFunc(s, pyIsSpace)), nil
		case name == "rstrip" && useCut:
			return jinja.NewString(strings.TrimRight(s, cut)), nil
		default:
			return jinja.NewString(strings.TrimRightFunc(s, pyIsSpace)), nil
		}
	}), nil
}

// concatOp is Jinja2's a ~ b: str() of both, so None is "None".
func concatOp(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
	if len(args) != 2 {
		return jinja.Value{}, fmt.Errorf("concat: want two operands")
	}
	return jinja.NewString(pyStr(args[0]) + pyStr(args[1])), nil
}

// joinFilter is Jinja2's join(value, d=”, attribute=None): str() of each
// item (of each item's attribute), joined by d.
func joinFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("join: missing value")
	}
	sep, attr := "", jinja.None()
	if len(args) > 1 {
		sep = pyStr(args[1])
	}
	if len(args) > 2 {
		attr = args[2]
	}
	if v, ok := kwargs["d"]; ok {
		sep = pyStr(v)
	}
	if v, ok := kwargs["attribute"]; ok {
		attr = v
	}
	items, err := pyItems(args[0])
	if err != nil {
		return jinja.Value{}, err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		if !attr.IsNone() && !attr.IsUndefined() {
			it = lookupPath(it, pyStr(attr))
		}
		parts[i] = pyStr(it)
	}
	return jinja.NewString(strings.Join(parts, sep)), nil
}
