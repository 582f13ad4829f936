package prompt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scanDocs are documents on both sides of JSON's grammar.
var scanDocs = []string{
	`{}`, ` { } `, `{"a":1}`, `{"a":-0.5e+3,"b":[1,{"c":null}],"d":"x\u00e9\n","e":true,"f":false}`,
	`{"model":"m","messages":[{"role":"user","content":"héllo"}]}`, "{\"a\":\"\xff\"}", `{"a\"b":1}`,
	`{"a":1,"a":2}`, `{"A":1}`, `[]`, `"x"`, `1`, `null`, ``, `{`, `{"a"}`, `{"a":}`, `{"a":1,}`, `{,}`,
	`{"a":01}`, `{"a":1.}`, `{"a":.5}`, `{"a":1e}`, `{"a":-}`, `{"a":"\x"}`, `{"a":"\u12"}`, "{\"a\":\"\x01\"}",
	`{"a":tru}`, `{"a":nul}`, `{"a":[1,]}`, `{"a":[1 2]}`, `{} {}`, `{}x`, `{"a":1}]`, "\t{\"a\" :\n1 }\r\n",
}

func TestScanObjectAcceptsWhatEncodingJSONAcceptsAndSplitsMembersAsItDoes(t *testing.T) {
	for _, doc := range scanDocs {
		members, ok := ScanObject([]byte(doc), nil)
		trimmed := bytes.TrimSpace([]byte(doc))
		want := json.Valid([]byte(doc)) && len(trimmed) > 0 && trimmed[0] == '{'
		require.Equal(t, want, ok, "%q", doc)
		if !ok {
			continue
		}
		var m map[string]json.RawMessage
		require.NoError(t, json.Unmarshal([]byte(doc), &m))
		keys := map[string]int{}
		for _, mb := range members {
			keys[string(mb.Key)]++
		}
		for _, mb := range members {
			if mb.Escaped || keys[string(mb.Key)] > 1 {
				continue
			}
			assert.Equal(t, string(m[string(mb.Key)]), string(mb.Value), "%q member %q", doc, mb.Key)
			if mb.PlainString {
				var s string
				require.NoError(t, json.Unmarshal(mb.Value, &s))
				assert.Equal(t, s, string(mb.Value[1:len(mb.Value)-1]), "%q member %q", doc, mb.Key)
			}
		}
	}
}

func TestScanArraySplitsElementsAsEncodingJSONDoes(t *testing.T) {
	for _, doc := range []string{`[]`, ` [ ] `, `[1]`, `[{"a":[1,2]}, "x" ,null]`, `[1,]`, `[`, `{}`, `[1]x`, `[01]`} {
		elems, ok := ScanArray([]byte(doc), nil)
		var want []json.RawMessage
		err := json.Unmarshal([]byte(doc), &want)
		require.Equal(t, err == nil, ok, "%q", doc)
		if ok {
			require.Len(t, elems, len(want), "%q", doc)
			for i := range want {
				assert.Equal(t, string(want[i]), string(elems[i]), "%q element %d", doc, i)
			}
		}
	}
}

func TestScanMessageDefersWhatOnlyEncodingJSONDecidesExactly(t *testing.T) {
	for _, raw := range []string{
		`{"Role":"user","content":"x"}`, `{"role":"user","CONTENT":"x"}`, `{"role":"a","role":"b"}`,
		`{"role":1}`, `{"r\u006fle":"user"}`, `{"role":"us\qer"}`, `[]`,
	} {
		_, _, _, ok := scanMessage([]byte(raw), nil)
		assert.False(t, ok, "%s must go to encoding/json", raw)
	}
	// An escaped role is decoded here, as encoding/json decodes it.
	for _, raw := range []string{`{"role":"\u0075ser"}`, "{\"role\":\"\xff\"}", `{"role":"a\ud800\n"}`} {
		wm, _, _, ok := scanMessage([]byte(raw), nil)
		require.True(t, ok, raw)
		var ref wireMessage
		require.NoError(t, json.Unmarshal([]byte(raw), &ref))
		assert.Equal(t, ref.Role, wm.Role, raw)
	}
	wm, n, first, ok := scanMessage([]byte(`{"content":null,"role":"assistant","tool_calls":[]}`), nil)
	require.True(t, ok)
	assert.Equal(t, "assistant", wm.Role)
	assert.Equal(t, "null", string(wm.Content))
	assert.Equal(t, 3, n)
	assert.Equal(t, "content", first)
}

// FuzzScanObjectAgreesWithEncodingJSON: the scanner accepts exactly the
// objects encoding/json accepts, and what it reads of a message is what
// json.Unmarshal and topLevelMembers read.
func FuzzScanObjectAgreesWithEncodingJSON(f *testing.F) {
	for _, s := range scanDocs {
		f.Add([]byte(s))
	}
	f.Add([]byte(`{"role":"user","content":[{"type":"text","text":"a"}],"name":"n"}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		members, ok := ScanObject(doc, nil)
		trimmed := bytes.TrimSpace(doc)
		want := json.Valid(doc) && len(trimmed) > 0 && trimmed[0] == '{'
		if ok != want && (!want || len(doc) <= maxScanDepth) {
			t.Fatalf("ScanObject(%q) ok=%v, encoding/json valid object=%v", doc, ok, want)
		}
		for _, mb := range members {
			if mb.PlainString {
				var s string
				if json.Unmarshal(mb.Value, &s) != nil || s != string(mb.Value[1:len(mb.Value)-1]) {
					t.Fatalf("member %q of %q is not the plain string it claims", mb.Key, doc)
				}
			}
		}
		wm, n, first, ok := scanMessage(doc, nil)
		if !ok {
			return
		}
		var ref wireMessage
		if err := json.Unmarshal(doc, &ref); err != nil {
			t.Fatalf("scanMessage accepted %q, encoding/json says %v", doc, err)
		}
		rn, rfirst := topLevelMembers(doc)
		if wm.Role != ref.Role || !bytes.Equal(wm.Content, ref.Content) || n != rn || first != rfirst {
			t.Fatalf("scanMessage(%q) = %q %q %d %q, want %q %q %d %q", doc, wm.Role, wm.Content, n, first, ref.Role, ref.Content, rn, rfirst)
		}
	})
}

// TestPlainWordAgreesWithPlainByte: the 8-byte test of string scanning
// says "plain" exactly when plainByte says so for all 8 bytes, over every
// byte value in every position and random words.
func TestPlainWordAgreesWithPlainByte(t *testing.T) {
	check := func(w [8]byte) {
		want := true
		for _, c := range w {
			want = want && plainByte[c]
		}
		if got := plainWord(binary.LittleEndian.Uint64(w[:])); got != want {
			t.Fatalf("plainWord(%q) = %v; want %v", w[:], got, want)
		}
	}
	for pos := range 8 {
		for c := range 256 {
			for _, fill := range []byte{'a', ' ', '~', 0x21, 0x5d, 0x23, 0x5b} {
				var w [8]byte
				for k := range w {
					w[k] = fill
				}
				w[pos] = byte(c)
				check(w)
			}
		}
	}
	rng := rand.New(rand.NewPCG(8, 8))
	for range 200_000 {
		var w [8]byte
		for k := range w {
			w[k] = byte(0x18 + rng.IntN(0x70)) // mostly plain, near every boundary
		}
		check(w)
	}
}

// messageArrays are messages arrays that scanMessages and parseMessages
// must agree on: plain and escaped contents, parts, nulls, keys repeated,
// escaped or in another case, roles of every kind, whitespace, and
// malformed arrays and elements (for which scanMessages must decline).
var messageArrays = []string{
	`[{"role":"user","content":"hi"}]`,
	` [ {"content":"hi" , "role":"assistant"} , {"role":"user","content":"a\nb \"q\" \u00e9"} ] `,
	`[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]`,
	`[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}]`,
	`[{"role":"user","foo":1}]`, `[{"role":"user"}]`, `[{"content":"x","role":"user","name":"n"}]`,
	`[{"role":"user","content":"a","content":"b"}]`, `[{"role":"user","role":"system","content":"a"}]`,
	`[{"Role":"user","content":"a"}]`, `[{"role":"user","CONTENT":"a"}]`, `[{"r\u006fle":"user","content":"a"}]`,
	`[{"role":"us\u0065r","content":"a"}]`, `[{"role":null,"content":"a"}]`, `[{"role":1,"content":"a"}]`, `[{"content":"a"}]`,
	`[{"role":"x y","content":""}]`, `[{"role":"tool","content":"r","tool_call_id":"1"}]`, `[{"role":"developer","content":"d"}]`,
	`[]`, `[1]`, `["x"]`, `[{"role":"user","content":"a"},]`, `[{"role":"user","content":"a"}`, `[{"role":"user","content":"a"}] x`,
	`{"role":"user"}`, `[{"role":"user","content":5}]`, `[{"role":"user","content":[1]}]`, `[{"role":"user","content":"\ud800"}]`,
	"[{\"role\":\"user\",\"content\":\"\xff\"}]", `[{"role":"user","content":"a"},{"role":"system","content":"b"},{"role":"user","content":"c"}]`,
	`[{"role":"user","content":"ends in a backslash \\"}]`, `[{"role":"user","content":"\\\"q\\\\\"},{"role":"a\\","content":"\\"}]`,
	`[{"role":"user","content":"x","name":"\"n\"","tool_calls":[{"a":"]}\\"}]}]`, `[{"role":"user","content":"\\\"q\\\\"}]`,
}

// TestScanMessagesParsesAsParseMessages: on every array scanMessages takes,
// its messages are parseMessages' own; on the rest it declines (and the
// caller's parseMessages then reports the error). Skimming a validated
// array gives what scanning it gives.
func TestScanMessagesParsesAsParseMessages(t *testing.T) {
	took, skimmed := 0, 0
	for _, doc := range messageArrays {
		checkScanMessages(t, []byte(doc))
		if _, ok := scanMessages([]byte(doc), false); ok {
			took++
		}
		if _, ok := scanMessages([]byte(doc), true); ok && json.Valid([]byte(doc)) {
			skimmed++
		}
	}
	require.Greater(t, took, len(messageArrays)/3)
	require.Equal(t, took, skimmed)
}

func checkScanMessages(t *testing.T, doc []byte) {
	t.Helper()
	skimmed, skimOK := scanMessages(doc, true) // on anything: must not panic
	got, ok := scanMessages(doc, false)
	if json.Valid(doc) && utf8.Valid(doc) {
		require.Equal(t, ok, skimOK, "%s: skimmed a validated array otherwise than scanned", doc)
		require.Equal(t, got, skimmed, "%s: skimmed a validated array otherwise than scanned", doc)
	}
	var in Input
	err := in.parseMessages(doc)
	if !ok {
		return
	}
	require.NoError(t, err, "%s: scanMessages took an array parseMessages refuses", doc)
	require.Equal(t, in.Messages, got, "%s", doc)
	require.Len(t, got, len(got[:cap(got)]), "the messages are allocated at their count")
}

func FuzzScanMessagesParsesAsParseMessages(f *testing.F) {
	for _, doc := range messageArrays {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkScanMessages(t, doc)
	})
}

// BenchmarkScanObjectChecked is the frontend decode's scan of the replica
// benchmark's 4k chat (the body's one validating pass).
func BenchmarkScanObjectChecked(b *testing.B) {
	m, err := OpenSpec("tiktoken:o200k_base", 0)
	require.NoError(b, err)
	body := nextTurnBodies(b, m, false)[0]
	b.SetBytes(int64(len(body)))
	var buf [16]Member
	for b.Loop() {
		if _, unambiguous, ok := ScanObjectChecked(body, buf[:0], 512, nil); !ok || !unambiguous {
			b.Fatal("the chat does not scan")
		}
	}
}

// toolArrays are tools arrays (and what is not one) for skimArray.
var toolArrays = []string{
	`[]`, ` [ ] `, `[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"userId":{"type":"string"}}}}}]`,
	`[{"a":"]\\"},"b":[1,2,{"c":null}]} , {"d":"\"}"}]`, `[1,"x",null,true,[],{}]`, `[ "a" ]`, `{}`, `"x"`, `1`, `null`,
	`[1,]`, `[1`, `[1] x`, `[`, ``,
}

// On a valid UTF-8 JSON document skimArray splits an array exactly as
// json.Unmarshal into []json.RawMessage does, and declines anything else
// (null included: the caller's encoding/json path decides those).
func TestSkimArrayAgreesWithEncodingJSON(t *testing.T) {
	for _, doc := range toolArrays {
		checkSkimArray(t, []byte(doc))
	}
}

func checkSkimArray(t *testing.T, doc []byte) {
	t.Helper()
	got, ok := skimArray(doc) // on anything: must not panic
	if !json.Valid(doc) || !utf8.Valid(doc) {
		return
	}
	trimmed := bytes.TrimSpace(doc)
	require.Equal(t, trimmed[0] == '[', ok, "%s: takes exactly the arrays", doc)
	if ok {
		var want []json.RawMessage
		require.NoError(t, json.Unmarshal(doc, &want), "%s", doc)
		require.Equal(t, want, got, "%s", doc)
		require.NotNil(t, got, "%s", doc)
	}
}

func FuzzSkimArrayAgreesWithEncodingJSON(f *testing.F) {
	for _, doc := range toolArrays {
		f.Add([]byte(doc))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		checkSkimArray(t, doc)
	})
}
