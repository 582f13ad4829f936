package prompt

import (
	"encoding/json"
	"testing"
	"unicode/utf8"

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

// TestParseDecodesEscapedMessagesAsEncodingJSONWithOneAllocationEach: a
// chat whose roles and contents hold escapes parses to what encoding/json
// decodes, and each escaped string costs one allocation (encoding/json's
// decode cost four per message).
func TestParseDecodesEscapedMessagesAsEncodingJSONWithOneAllocationEach(t *testing.T) {
	body := []byte(`{"messages":[` +
		`{"role":"system","content":"You are terse.\nAnswer in \"one\" line.\u00e9"},` +
		`{"role":"user","content":"line one\nline two\ttabbed \ud83e\udd8a \ud800 lone"},` +
		`{"role":"assistant","content":"ok\r\n\/path\\to"},` +
		`{"content":"plain, aliased","role":"us\u0065r"},` +
		`{"role":"user","content":"next\nturn"}]}`)
	f := bodyFields(t, body)
	var want []struct{ Role, Content string }
	require.NoError(t, json.Unmarshal(f.Messages, &want))
	in, err := Parse(KindChat, f)
	require.NoError(t, err)
	require.Len(t, in.Messages, len(want))
	for i, m := range in.Messages {
		assert.Equal(t, want[i].Role, m.Role, "message %d", i)
		assert.Equal(t, want[i].Content, m.Content, "message %d", i)
	}
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Parse(KindChat, f); err != nil {
			t.Fatal(err)
		}
	})
	// A plain chat's 3 (BenchmarkChatNextTurn/parse), and one string per
	// escaped role or content (4 contents, 1 role); encoding/json's decode
	// made this 68.
	assert.LessOrEqual(t, allocs, 3.0+5)
}

// TestAnInvalidEscapeIsTheSameTypedError: what encoding/json refused is
// still a *RequestError naming the field.
func TestAnInvalidEscapeIsTheSameTypedError(t *testing.T) {
	for _, content := range []string{`"bad \q escape"`, `"bad \u12G4 escape"`} {
		_, err := Parse(KindChat, &Fields{Messages: json.RawMessage(`[{"role":"user","content":` + content + `}]`)})
		var re *RequestError
		require.ErrorAs(t, err, &re, content)
		assert.Equal(t, "messages", re.Param, content) // the array does not parse
		assert.ErrorIs(t, err, ErrBadRequest)
		_, err = Parse(KindCompletion, &Fields{Prompt: json.RawMessage(content)})
		require.ErrorAs(t, err, &re, content)
		assert.Equal(t, "prompt", re.Param, content)
	}
}

// unquoteCases are string literals on both sides of JSON's grammar and of
// UTF-8's, with every escape and surrogate case.
var unquoteCases = []string{
	`""`, `"plain"`, `"héllo ✓ 🦊"`, `"line\nbreak"`, `"\"quoted\" \\ \/ \b\f\n\r\t"`, `"\\"`, `"\\\""`,
	`"a long enough run\nto go 8 at a time\n"`, `"\u00e9\u00E9"`, `"\u0000"`, `"\ud83e\udd8a"`,
	`"\ud83e"`, `"\udd8a"`, `"\ud83e\ud83e"`, `"\udd8a\ud83e\udd8a"`, `"\ud83ex"`, `"\ud83e\u0041"`, `"\ud83e\n"`,
	"\"bad \xff utf8\"", "\"é\\n\xe2\x9c\"", `"\x"`, `"\u12"`, `"\"`, `"a"b"`, "\"tab\there\"", `"\ud83e\uZZZZ"`, `"`, ``,
}

// On a literal of a validated document (valid JSON, valid UTF-8)
// unquoteValidated gives unquote's text; on anything else it does not
// panic.
func TestUnquoteValidatedDecodesAsUnquote(t *testing.T) {
	valid := 0
	for _, raw := range unquoteCases {
		if checkUnquoteValidated(t, []byte(raw)) {
			valid++
		}
	}
	require.Greater(t, valid, len(unquoteCases)/2)
}

func checkUnquoteValidated(t *testing.T, raw []byte) bool {
	t.Helper()
	got, ok := unquoteValidated(raw)
	var s string
	if !utf8.Valid(raw) || json.Unmarshal(raw, &s) != nil || len(raw) == 0 || raw[0] != '"' || raw[len(raw)-1] != '"' {
		return false
	}
	want, wantOK := unquote(raw)
	require.True(t, wantOK, "%q", raw)
	require.True(t, ok, "%q", raw)
	require.Equal(t, want, got, "%q", raw)
	return true
}

func FuzzUnquoteValidatedDecodesAsUnquote(f *testing.F) {
	for _, s := range unquoteCases {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		checkUnquoteValidated(t, raw)
	})
}
