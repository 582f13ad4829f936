package prompt

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPlainStringReadsExactlyWhatJSONDecodingWouldOrDeclines(t *testing.T) {
	for _, raw := range []string{
		`""`,
		`"the quick brown fox"`,
		`"héllo wörld ✓ 🦊"`,
		`"a\"b"`,
		`"tab\there"`,
		`"\u00e9"`,
		`"back\\slash"`,
		"\"bad utf8 \xff here\"",
		"\"truncated \xe2\x9c\"",
	} {
		var want string
		require.NoError(t, json.Unmarshal([]byte(raw), &want), raw)
		got, ok := plainString([]byte(raw))
		if ok {
			assert.Equal(t, want, got, "fast path for %q", raw)
		} else {
			assert.NotEqual(t, raw[1:len(raw)-1], want, "%q was declined although it needs no decoding", raw)
		}
	}
	for _, raw := range []string{``, `"`, `x`, `123`, `["a"]`} {
		_, ok := plainString([]byte(raw))
		assert.False(t, ok, "%q is not a string literal", raw)
	}
}

func FuzzPlainStringAgreesWithJSONDecoding(f *testing.F) {
	for _, s := range []string{`"abc"`, `"a\nb"`, "\"\xff\"", `"é"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var want string
		if json.Unmarshal(raw, &want) != nil {
			return // plainString's precondition: a literal json accepted
		}
		if got, ok := plainString(raw); ok && got != want {
			t.Fatalf("plainString(%q) = %q, json says %q", raw, got, want)
		}
	})
}
