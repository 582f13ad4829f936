package tokenizer

import (
	"math/rand/v2"
	"reflect"
	"runtime"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestStrMapBehavesAsAGoMap(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var got strMap // the zero value is usable
	want := map[string]uint32{}
	key := func() string {
		// Short keys collide often; the empty key and long keys occur too.
		switch rng.IntN(10) {
		case 0:
			return ""
		case 1:
			return string(make([]byte, 40+rng.IntN(40))) + strconv.Itoa(rng.IntN(50))
		}
		return strconv.Itoa(rng.IntN(5000))
	}
	for range 20000 {
		k, v := key(), rng.Uint32()
		got.set(k, v)
		want[k] = v
		probe := key()
		id, ok := got.get(probe)
		wid, wok := want[probe]
		require.Equal(t, wok, ok, "key %q present", probe)
		require.Equal(t, wid, id, "id of %q", probe)
	}
	require.Equal(t, len(want), got.Len())
	seen := map[string]bool{}
	for k, v := range got.All() {
		require.Equal(t, want[k], v, "All yields %q's id", k)
		require.False(t, seen[k], "All yields %q once", k)
		seen[k] = true
	}
	require.Len(t, seen, len(want))
}

func TestStrListKeepsEachIndexsLastString(t *testing.T) {
	l := newStrList(4)
	l.set(2, "two")
	l.set(0, "zero")
	first := l.get(2)
	l.set(2, "deux") // a later set replaces; the string returned before stays intact
	require.Equal(t, "two", first)
	require.Equal(t, "deux", l.get(2))
	require.Equal(t, "zero", l.get(0))
	require.Equal(t, "", l.get(1), "an index never set is empty")
	require.Equal(t, 4, l.Len())
}

// The point of strMap and strList: a loaded vocabulary costs the collector
// nothing to mark. As maps and []string, o200k_base's tables were ~800k
// pointers marked in every cycle.
func TestAVocabularyHoldsNoPointersForTheCollector(t *testing.T) {
	m, err := LoadTiktoken("o200k_base")
	require.NoError(t, err)
	for name, v := range map[string]any{
		"vocab.keys": m.vocab.keys, "vocab.slots": m.vocab.slots, "raw.slots": m.raw.slots, "tokens.bytes": m.tokens.bytes, "tokens.spans": m.tokens.spans,
	} {
		require.False(t, hasPointers(v), "%s has pointers", name)
	}
	runtime.KeepAlive(m)
}

// hasPointers reports whether the elements of slice v hold pointers.
func hasPointers(v any) bool {
	var walk func(t reflect.Type) bool
	walk = func(t reflect.Type) bool {
		switch t.Kind() {
		case reflect.Struct:
			for i := range t.NumField() {
				if walk(t.Field(i).Type) {
					return true
				}
			}
			return false
		case reflect.Array:
			return walk(t.Elem())
		case reflect.Bool, reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
			reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr,
			reflect.Float32, reflect.Float64, reflect.Complex64, reflect.Complex128:
			return false
		}
		return true
	}
	return walk(reflect.TypeOf(v).Elem())
}
