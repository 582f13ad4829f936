package frontend

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/prompt"
)

// nested is a body whose "x" holds a value depth levels below the top
// object (the top object is depth 0, "x"'s value depth 1).
func nested(depth int) string {
	return `{"model":"m","prompt":"p","x":` + strings.Repeat("[", depth-1) + "1" + strings.Repeat("]", depth-1) + "}"
}

// manyKeys is an object of n distinct keys as a tool's parameters.
func manyKeysBody(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`"k` + strings.Repeat("x", i) + `":1`)
	}
	b.WriteString("}}}]}")
	return b.String()
}

// usualBodies are bodies as clients send them, which the decode's scan
// must vouch for without checkKeys' walk: plain and escaped chats,
// non-ASCII text, an emoji as a surrogate pair, tools whose schemas have
// camelCase keys, content parts, hints and stream options.
var usualBodies = []string{
	string(chatWithNewlines(40)),
	`{"model":"m","messages":[{"role":"user","content":"héllo 你好 \ud83d\ude00 \u00e9"}],"stream":true}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a\nb"},{"type":"image_url","image_url":{"url":"data:x"}}]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"get","parameters":{"type":"object","properties":{"userId":{"type":"string"},"maxResults":{"type":"integer"}},"required":["userId"]}}}]}`,
	`{"model":"m","prompt":"p","switchyard":{"class":"a","priority":1,"deadline_ms":10},"stream":true,"stream_options":{"include_usage":false}}`,
	`{"model":"m","input":[{"type":"message","role":"user","content":"x"},{"type":"function_call","call_id":"1","name":"f","arguments":"{}"}]}`,
	nested(maxBodyNesting),
	manyKeysBody(maxBodyNesting / 16),
}

// ambiguousBodies are bodies checkKeys refuses, one or more of each kind.
var ambiguousBodies = []string{
	`{"model":"m","prompt":"p","x":{"a":1,"a":2}}`,
	`{"model":"m","messages":[{"role":"user","content":"x","content":"y"}]}`,
	`{"model":"m","messages":[{"role":"user","Content":"x"}]}`,
	`{"model":"m","prompt":"p","switchyard":{"class":"a","CLASS":"b"}}`,
	`{"model":"m","prompt":"p","stream_options":{"Include_Usage":true}}`,
	`{"model":"m","prompt":"p","Stream":true}`,
	`{"model":"m","input":[{"type":"message","Role":"user","content":"x"}]}`,
	`{"model":"m","prompt":"p\ud800"}`,
	`{"model":"m","prompt":"p\udc00\ud800"}`,
	`{"model":"m","prompt":"p","x":["\ud83d"]}`,
	"{\"model\":\"m\",\"prompt\":\"\xff\"}",
	"{\"model\":\"m\",\"prompt\":\"p\",\"x\":{\"\xc3\x28\":1}}",
	`{"model":"m","prompt":"p","x\ud800":1}`,
	`{"model":"m","prompt":"p","a\u0062":1,"ab":2}`,
	nested(maxBodyNesting + 1),
	`{"model":"m","prompt":"p","max_to\u212aens":5}`,
}

// The decode's one scan vouches for usual bodies, so checkKeys does not
// walk them again.
func TestTheDecodeVouchesForUsualBodies(t *testing.T) {
	for _, body := range append(usualBodies, chatBody(t, 4096)) {
		var req openAIRequest
		var sc bodyScan
		require.True(t, decodeRequestScan([]byte(body), &req, &sc), "%.200s", body)
		require.True(t, sc.unambiguous, "%.200s", body)
		require.Nil(t, checkKeys([]byte(body)), "%.200s", body)
	}
}

// Every body checkKeys refuses is one the decode's scan does not vouch
// for, so checkKeys still walks it, and the refusal is checkKeys' own.
func TestTheDecodeLeavesEveryAmbiguityToCheckKeys(t *testing.T) {
	for _, body := range append(ambiguousBodies, manyKeysBody(40)) {
		var req openAIRequest
		var sc bodyScan
		if decodeRequestScan([]byte(body), &req, &sc) {
			require.False(t, sc.unambiguous, "%.200s", body)
		}
		want := checkKeys([]byte(body))
		if body == manyKeysBody(40) {
			require.Nil(t, want, "more keys than the scan compares, none ambiguous")
			continue
		}
		require.NotNil(t, want, "%.200s", body)
		_, got := parseRequest(endpointChat, []byte(body), http.Header{})
		require.Equal(t, want, got, "%.200s", body)
	}
}

// The checked scan reads what ScanObject reads, and a body it calls
// unambiguous is one checkKeys passes.
func FuzzCheckedScanFindsWhatCheckKeysWould(f *testing.F) {
	for _, s := range append(slices.Clone(usualBodies), ambiguousBodies...) {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		want, wantOK := prompt.ScanObject(body, nil)
		got, unambiguous, ok := prompt.ScanObjectChecked(body, nil, maxBodyNesting, structFields)
		require.Equal(t, wantOK, ok)
		require.Equal(t, want, got)
		if unambiguous {
			require.True(t, ok)
			require.Nil(t, checkKeys(body), "the scan vouched for a body checkKeys refuses")
		}
	})
}

// parseRequest gives the old route's verdict, error and parsed request on
// any body, for every endpoint it parses.
func FuzzParseRequestAgreesWithTheOldRoute(f *testing.F) {
	for _, s := range append(slices.Clone(usualBodies), ambiguousBodies...) {
		for ep := range uint8(4) {
			f.Add([]byte(s), ep)
		}
	}
	for _, s := range []string{
		`{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[]}],"n":2}`,
		`{"model":"m","messages":[{"role":"user","content":"a\u0000"}],"stream":true,"stream_options":null}`,
		`{"model":"m","messages":[{"role":"us\u0065r","content":"a"}]}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"switchyard":{"worker":"w1"},"stream":true}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":5}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[]}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"tools":null}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"tools":5}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[1]}`,
		`{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[{"x":"]}\"}"} , {}]}`,
		`{"model":"m","messages":[]}`, `{"model":"m","messages":[1]}`, `{"model":"m"}`, `{"model":`, `[]`,
	} {
		f.Add([]byte(s), uint8(0))
		f.Add([]byte(s), uint8(1))
	}
	endpoints := [...]endpoint{endpointChat, endpointCompletions, endpointEmbeddings, endpointResponses}
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		ep := endpoints[int(which)%len(endpoints)]
		// As readBody leaves it, one copy per route: parseRequest may
		// build the forwarded body in its spare capacity.
		owned := func() []byte { return append(make([]byte, 0, len(body)+1+streamUsageRoom), body...) }
		h := http.Header{}
		got, gotErr := parseRequest(ep, owned(), h)
		want, wantErr := oldParseRequest(ep, owned(), h)
		if wantErr != nil {
			require.NotNil(t, gotErr, "the old route refused %q: %v", body, wantErr)
			require.Equal(t, [5]string{wantErr.Type, wantErr.Code, wantErr.Param, wantErr.Message, http.StatusText(wantErr.Status)},
				[5]string{gotErr.Type, gotErr.Code, gotErr.Param, gotErr.Message, http.StatusText(gotErr.Status)})
			return
		}
		require.Nil(t, gotErr, "the old route accepted %q", body)
		require.Equal(t, string(want.forward), string(got.forward))
		want.forward, got.forward = nil, nil
		require.Equal(t, want, got)
	})
}
