package frontend

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// chatWithNewlines is a chat of n messages whose contents hold escaped
// newlines and tabs, as real conversations do (code, lists, paragraphs).
func chatWithNewlines(n int) []byte {
	var msgs []map[string]string
	for i := range n {
		role := []string{"user", "assistant"}[i%2]
		msgs = append(msgs, map[string]string{"role": role, "content": "line one " + strconv.Itoa(i) + "\n\tline two\nline three \"quoted\" é"})
	}
	b, _ := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs})
	return b
}

// The walk reads the text of keys only: a value's escapes are checked for
// lone surrogates but not decoded, so escaped newlines in every message
// cost no allocation. The old walk decoded (and allocated) each such
// value: 40 messages were 40 more allocations than the same chat without
// escapes.
func TestCheckKeysDoesNotDecodeEscapedValues(t *testing.T) {
	escaped := chatWithNewlines(40)
	plain := []byte(strings.NewReplacer(`\n`, " ", `\t`, " ", `\"`, "'").Replace(string(escaped)))
	require.Nil(t, checkKeys(escaped))
	require.Nil(t, checkKeys(plain))
	withEscapes := testing.AllocsPerRun(20, func() { _ = checkKeys(escaped) })
	without := testing.AllocsPerRun(20, func() { _ = checkKeys(plain) })
	require.Equal(t, without, withEscapes, "allocations with escaped values vs without")
}

// The new walk gives the old walk's verdict, code, path and message on any
// input (checkKeys is only called on valid JSON, but must agree and not
// panic on anything).
func FuzzCheckKeysAgreesWithTheOldWalk(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a\nb"}]}`,
		`{"model":"m","model":"n"}`,
		`{"Model":"m"}`,
		`{"model":"m","x":"\ud800"}`,
		`{"model":"m","x":"\ud800\udc00","y":"\udc00"}`,
		`{"model":"m","x":"\\ud800"}`,
		`{"a\u0062":1,"ab":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"\u00e9\n","TEXT":"x"}]}]}`,
		`{"switchyard":{"class":"a","Class":"b"}}`,
		`{"stream_options":{"include_usage":true,"include_usage":false}}`,
		`{"x":"\"","x":1}`,
		`{"x":"a\\","y":"\u"}`,
		`["\ud800"]`,
		`"\udfff"`,
		string(chatWithNewlines(3)),
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, want := checkKeys(body), oldCheckKeys(body)
		if want == nil {
			require.Nil(t, got)
			return
		}
		require.NotNil(t, got)
		require.Equal(t, [3]string{want.Code, want.Param, want.Message}, [3]string{got.Code, got.Param, got.Message})
	})
}

// BenchmarkCheckKeysEscaped is the check on a chat whose messages hold
// escaped newlines (200 messages, about 14 kB).
func BenchmarkCheckKeysEscaped(b *testing.B) {
	body := chatWithNewlines(200)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if e := checkKeys(body); e != nil {
			b.Fatal(e)
		}
	}
}
