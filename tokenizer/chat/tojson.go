package chat

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// tojsonFilter is transformers' tojson: json.dumps(x, ensure_ascii=False,
// indent=None, separators=None, sort_keys=False), arguments by position or
// by name in that order. The library's own filter escapes through Go's
// encoding/json (U+2028, Go float syntax) and sorts keys when indenting;
// Python keeps insertion order, so this one writes Python's bytes itself.
func tojsonFilter(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Value{}, fmt.Errorf("tojson: missing value")
	}
	opt := jsonOptions{}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	params := map[string]jinja.Value{}
	for i, a := range args[1:] {
		if i >= len(names) {
			return jinja.Value{}, fmt.Errorf("tojson() takes from 1 to 5 positional arguments but %d were given", len(args))
		}
		params[names[i]] = a
	}
	for k, v := range kwargs {
		if _, dup := params[k]; dup {
			return jinja.Value{}, fmt.Errorf("tojson() got multiple values for argument '%s'", k)
		}
		known := false
		for _, n := range names {
			known = known || n == k
		}
		if !known {
			return jinja.Value{}, fmt.Errorf("tojson() got an unexpected keyword argument '%s'", k)
		}
		params[k] = v
	}
	if v, ok := params["ensure_ascii"]; ok {
		opt.ensureASCII = v.IsTruthy()
	}
	if v, ok := params["sort_keys"]; ok {
		opt.sortKeys = v.IsTruthy()
	}
	opt.itemSep, opt.keySep = ", ", ": "
	if v, ok := params["indent"]; ok && !v.IsNone() && !v.IsUndefined() {
		switch {
		case v.IsInt():
			if n := v.AsInt(); n > 0 {
				if n > 64 {
					return jinja.Value{}, fmt.Errorf("tojson: indent %d is absurd", n)
				}
				opt.indent = strings.Repeat(" ", int(n))
			}
			opt.indented = true
		case v.IsString():
			opt.indent = v.AsString()
			opt.indented = true
		case v.IsBool():
			if v.AsBool() {
				opt.indent = " "
			}
			opt.indented = true
		default:
			return jinja.Value{}, fmt.Errorf("tojson: indent must be an int or a string")
		}
		opt.itemSep = ","
	}
	if v, ok := params["separators"]; ok && !v.IsNone() && !v.IsUndefined() {
		if !v.IsList() || v.AsList().Len() != 2 || !v.AsList().Items[0].IsString() || !v.AsList().Items[1].IsString() {
			return jinja.Value{}, fmt.Errorf("tojson: separators must be a pair of strings")
		}
		opt.itemSep, opt.keySep = v.AsList().Items[0].AsString(), v.AsList().Items[1].AsString()
	}
	var sb strings.Builder
	if err := opt.encode(&sb, args[0], 0); err != nil {
		return jinja.Value{}, err
	}
	return jinja.NewString(sb.String()), nil
}

type jsonOptions struct {
	ensureASCII bool
	sortKeys    bool
	indented    bool
	indent      string
	itemSep     string
	keySep      string
}

func (o *jsonOptions) newline(sb *strings.Builder, level int) {
	sb.WriteByte('\n')
	for range level {
		sb.WriteString(o.indent)
	}
}

func (o *jsonOptions) encode(sb *strings.Builder, v jinja.Value, level int) error {
	if level > maxDepth {
		return fmt.Errorf("tojson: nested deeper than %d", maxDepth)
	}
	switch {
	case v.IsNone():
		sb.WriteString("null")
	case v.IsBool():
		if v.AsBool() {
			sb.WriteString("true")
		} else {
			sb.WriteString("false")
		}
	case v.IsInt():
		sb.WriteString(strconv.FormatInt(v.AsInt(), 10))
	case v.IsFloat():
		sb.WriteString(jsonFloat(v.AsFloat()))
	case v.IsString():
		writePyJSONString(sb, v.AsString(), o.ensureASCII)
	case v.IsList():
		items := v.AsList().Items
		if len(items) == 0 {
			sb.WriteString("[]")
			return nil
		}
		sb.WriteByte('[')
		for i, it := range items {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if o.indented {
				o.newline(sb, level+1)
			}
			if err := o.encode(sb, it, level+1); err != nil {
				return err
			}
		}
		if o.indented {
			o.newline(sb, level)
		}
		sb.WriteByte(']')
	case v.IsDict():
		d := v.AsDict()
		if d.Len() == 0 {
			sb.WriteString("{}")
			return nil
		}
		keys := d.Keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sort.Strings(keys)
		}
		sb.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				sb.WriteString(o.itemSep)
			}
			if o.indented {
				o.newline(sb, level+1)
			}
			writePyJSONString(sb, k, o.ensureASCII)
			sb.WriteString(o.keySep)
			if err := o.encode(sb, d.Data[k], level+1); err != nil {
				return err
			}
		}
		if o.indented {
			o.newline(sb, level)
		}
		sb.WriteByte('}')
	case v.IsUndefined():
		return fmt.Errorf("tojson: Object of type Undefined is not JSON serializable")
	default:
		return fmt.Errorf("tojson: a %s is not JSON serializable", v.String())
	}
	return nil
}

// sort.Strings orders by bytes, Python's sorted() by code points: for valid
// UTF-8 the two orders agree.

// jsonFloat is json.dumps's float: float.__repr__, with NaN and Infinity as
// Python spells them.
func jsonFloat(f float64) string {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return pyFloatRepr(f)
}

// pyFloatRepr is Python's repr(float): the shortest digits that round-trip,
// in positional notation when the decimal exponent is in [-4, 16) (with ".0"
// when integral), scientific otherwise ("1e+16", "1.5e-05").
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	e := strconv.FormatFloat(f, 'e', -1, 64)
	sign := ""
	if e[0] == '-' {
		sign, e = "-", e[1:]
	}
	mant, expStr, _ := strings.Cut(e, "e")
	exp, _ := strconv.Atoi(expStr)
	if exp < -4 || exp >= 16 {
		return sign + e
	}
	digits := strings.Replace(mant, ".", "", 1)
	if exp >= 0 {
		intLen := exp + 1
		for len(digits) < intLen {
			digits += "0"
		}
		frac := digits[intLen:]
		if frac == "" {
			frac = "0"
		}
		return sign + digits[:intLen] + "." + frac
	}
	return sign + "0." + strings.Repeat("0", -exp-1) + digits
}

const hexDigits = "0123456789abcdef"

// writePyJSONString quotes s as json.dumps does: '"', '\\' and the control
// characters escaped (\n \r \t \b \f by name, the rest as \u00XX), and with
// ensureASCII everything outside ' '..'~' as \uXXXX (surrogate pairs above
// the BMP). Nothing else is escaped: not '<', '>', '&', nor U+2028/U+2029,
// which Go's encoder would escape.
func writePyJSONString(sb *strings.Builder, s string, ensureASCII bool) {
	sb.WriteByte('"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch c {
			case '"':
				sb.WriteString(`\"`)
			case '\\':
				sb.WriteString(`\\`)
			case '\n':
				sb.WriteString(`\n`)
			case '\r':
				sb.WriteString(`\r`)
			case '\t':
				sb.WriteString(`\t`)
			case '\b':
				sb.WriteString(`\b`)
			case '\f':
				sb.WriteString(`\f`)
			default:
				if c < 0x20 || (ensureASCII && c == 0x7f) {
					writeU(sb, rune(c))
				} else {
					sb.WriteByte(c)
				}
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if !ensureASCII {
			sb.WriteString(s[i : i+size])
		} else if r >= 0x10000 {
			r -= 0x10000
			writeU(sb, 0xd800+(r>>10))
			writeU(sb, 0xdc00+(r&0x3ff))
		} else {
			writeU(sb, r)
		}
		i += size
	}
	sb.WriteByte('"')
}

func writeU(sb *strings.Builder, r rune) {
	sb.WriteString(`\u`)
	sb.WriteByte(hexDigits[(r>>12)&0xf])
	sb.WriteByte(hexDigits[(r>>8)&0xf])
	sb.WriteByte(hexDigits[(r>>4)&0xf])
	sb.WriteByte(hexDigits[r&0xf])
}
