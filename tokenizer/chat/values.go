package chat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"sort"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Member is one key/value pair of an [Object].
type Member struct {
	Key   string
	Value any
}

// Object is a JSON object that keeps its members in document order.
//
// Python's json.loads keeps key order and templates show it (a tool's schema
// printed with tojson, a tool call's arguments iterated with items()), so
// a byte-exact rendering needs the order of the request. A Go map has none:
// map[string]any values are accepted too, with their keys sorted, which is
// exact only when the request's keys were sorted already. [DecodeJSON]
// produces Objects.
type Object []Member

// Get returns the value of the first member named key.
func (o Object) Get(key string) (any, bool) {
	for _, m := range o {
		if m.Key == key {
			return m.Value, true
		}
	}
	return nil, false
}

// maxDepth bounds the nesting of decoded JSON and of converted values, so a
// hostile request cannot exhaust the stack of the recursive conversions.
const maxDepth = 128

// ErrJSON reports input that is not one JSON value.
var ErrJSON = errors.New("chat: invalid JSON")

// DecodeJSON decodes one JSON value as Python's json.loads sees it: objects
// become [Object] with their members in document order (a repeated key keeps
// its first position and its last value, as a Python dict does), arrays
// []any, numbers json.Number (an integer stays an integer, 1.0 stays a float),
// strings, booleans and null as usual.
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrJSON, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the value", ErrJSON)
	}
	return v, nil
}

func decodeValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, fmt.Errorf("nested deeper than %d", maxDepth)
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			obj := Object{}
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				key, ok := kt.(string)
				if !ok {
					return nil, fmt.Errorf("object key %v is not a string", kt)
				}
				val, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				replaced := false
				for i := range obj {
					if obj[i].Key == key {
						obj[i].Value = val
						replaced = true
						break
					}
				}
				if !replaced {
					obj = append(obj, Member{Key: key, Value: val})
				}
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return obj, nil
		case '[':
			arr := []any{}
			for dec.More() {
				val, err := decodeValue(dec, depth+1)
				if err != nil {
					return nil, err
				}
				arr = append(arr, val)
			}
			if _, err := dec.Token(); err != nil {
				return nil, err
			}
			return arr, nil
		default:
			return nil, fmt.Errorf("unexpected %v", t)
		}
	default:
		return t, nil
	}
}

// toValue converts a Go value into a fresh template value. Every list and
// dict is new, so nothing a template does can reach the caller's data (the
// immutability transformers gets from ImmutableSandboxedEnvironment).
//
// Numbers follow Python's json.loads: a json.Number without '.', 'e' or 'E'
// is an int, otherwise a float. A float64 with an integral value is taken as
// an int, because encoding/json decodes every JSON number to float64 and
// integers are what requests carry; decode with [DecodeJSON] (or UseNumber)
// to keep 1.0 a float.
func toValue(v any, depth int) (jinja.Value, error) {
	if depth > maxDepth {
		return jinja.Value{}, fmt.Errorf("%w: value nested deeper than %d", ErrTemplate, maxDepth)
	}
	switch x := v.(type) {
	case nil:
		return jinja.None(), nil
	case jinja.Value:
		return x, nil
	case bool:
		return jinja.NewBool(x), nil
	case string:
		return jinja.NewString(x), nil
	case int, int8, int16, int32, int64:
		return jinja.NewInt(reflect.ValueOf(x).Int()), nil
	case uint, uint8, uint16, uint32, uint64:
		// A uint64 beyond MaxInt64 wraps, as the conversion always did.
		return jinja.NewInt(int64(reflect.ValueOf(x).Uint())), nil
	case float32:
		return floatValue(float64(x)), nil
	case float64:
		return floatValue(x), nil
	case json.Number:
		s := string(x)
		if !strings.ContainsAny(s, ".eE") {
			if i, err := x.Int64(); err == nil {
				return jinja.NewInt(i), nil
			}
		}
		f, err := x.Float64()
		if err != nil && !math.IsInf(f, 0) {
			return jinja.Value{}, fmt.Errorf("%w: number %q", ErrTemplate, s)
		}
		return jinja.NewFloat(f), nil
	case Object:
		d := jinja.NewDict()
		dict := d.AsDict()
		for _, m := range x {
			mv, err := toValue(m.Value, depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(m.Key, mv)
		}
		return d, nil
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		d := jinja.NewDict()
		dict := d.AsDict()
		for _, k := range keys {
			mv, err := toValue(x[k], depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(k, mv)
		}
		return d, nil
	case []any:
		return listValue(x, depth)
	case []map[string]any:
		return listValue(x, depth)
	case []string:
		items := make([]jinja.Value, len(x))
		for i, it := range x {
			items[i] = jinja.NewString(it)
		}
		return jinja.NewList(items), nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		items := make([]jinja.Value, rv.Len())
		for i := range rv.Len() {
			iv, err := toValue(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return jinja.Value{}, err
			}
			items[i] = iv
		}
		return jinja.NewList(items), nil
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			m := make(map[string]any, rv.Len())
			iter := rv.MapRange()
			for iter.Next() {
				m[iter.Key().String()] = iter.Value().Interface()
			}
			return toValue(m, depth)
		}
	}
	return jinja.Value{}, fmt.Errorf("%w: cannot pass a %T to a template", ErrTemplate, v)
}

// listValue converts the items of a list one level below depth.
func listValue[T any](xs []T, depth int) (jinja.Value, error) {
	items := make([]jinja.Value, len(xs))
	for i, it := range xs {
		iv, err := toValue(it, depth+1)
		if err != nil {
			return jinja.Value{}, err
		}
		items[i] = iv
	}
	return jinja.NewList(items), nil
}

func floatValue(f float64) jinja.Value {
	if f == math.Trunc(f) && math.Abs(f) < 1<<53 {
		return jinja.NewInt(int64(f))
	}
	return jinja.NewFloat(f)
}

// MarshalJSON writes the object with its members in order.
func (o Object) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, m := range o {
		if i > 0 {
			buf.WriteByte(',')
		}
		k, err := json.Marshal(m.Key)
		if err != nil {
			return nil, err
		}
		buf.Write(k)
		buf.WriteByte(':')
		v, err := json.Marshal(m.Value)
		if err != nil {
			return nil, err
		}
		buf.Write(v)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}
