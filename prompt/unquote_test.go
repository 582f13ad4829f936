package prompt

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// jsonUnquote is encoding/json's verdict on raw as a string: its text, or
// ok false when json.Unmarshal refuses it.
func jsonUnquote(raw []byte) (string, bool) {
	var s string
	err := json.Unmarshal(raw, &s)
	return s, err == nil
}

func TestUnquoteDecodesAsEncodingJSON(t *testing.T) {
	for _, raw := range []string{
		`""`, `"plain"`, `"héllo ✓ 🦊"`,
		`"line\nbreak"`, `"\"quoted\" \\ \/ \b\f\n\r\t"`, `"a long enough run\nto go 8 at a time\n"`,
		`"\u00e9\u00E9"`, `"\u0000"`, `"\ud83e\udd8a"`, // a surrogate pair: 🦊
		`"\ud83e"`, `"\udd8a"`, `"\ud83e\ud83e"`, `"\udd8a\ud83e\udd8a"`, `"\ud83ex"`, // lone ones
		`"\ud83e\u0041"`, `"\ud83e\n"`,
		"\"bad \xff utf8\"", "\"truncated \xe2\x9c\"", "\"surrogate in utf8 \xed\xa0\x80\"", "\"\xff\\n\"",
		"\"é\\n\xe2\x9c\"",
		// refused
		`"\x"`, `"\u12"`, `"\u12G4"`, `"\"`, `"a"b"`, "\"tab\there\"", "\"\x00\"", `"\ud83e\uZZZZ"`,
		`"`, ``, `abc`, `"abc`, `abc"`,
	} {
		want, wantOK := jsonUnquote([]byte(raw))
		got, ok := unquote([]byte(raw))
		require.Equal(t, wantOK, ok, "accepts %q", raw)
		assert.Equal(t, want, got, "%q", raw)
	}
}

func TestUnquoteAliasesWhatNeedsNoDecodingAndAllocatesOnceOtherwise(t *testing.T) {
	plain := []byte(`"héllo wörld, no escapes"`)
	s, ok := unquote(plain)
	require.True(t, ok)
	plain[1] = 'H'
	assert.Equal(t, "Héllo wörld, no escapes", s, "plain text aliases raw")

	escaped := []byte(`"line one\nline two\n\u00e9\ud83e\udd8a and \"more\""`)
	allocs := testing.AllocsPerRun(100, func() {
		if _, ok := unquote(escaped); !ok {
			t.Fatal("refused")
		}
	})
	assert.Equal(t, 1.0, allocs)
}

func FuzzUnquoteAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\nb"`, "\"\xff\"", `"é"`, `"\ud83e\udd8a"`, `"\ud83e"`, `"\ud83e\u00e9"`, `"\u12"`, `"\q"`, `"a"b"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		if len(raw) == 0 || raw[0] != '"' {
			return // callers hand over a literal (null, numbers: not strings)
		}
		want, wantOK := jsonUnquote(raw)
		got, ok := unquote(raw)
		if wantOK && raw[len(raw)-1] != '"' {
			return // trailing space json allows; callers trim it
		}
		if ok != wantOK || got != want {
			t.Fatalf("unquote(%q) = %q, %v; encoding/json: %q, %v", raw, got, ok, want, wantOK)
		}
	})
}
