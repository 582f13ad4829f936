package frontend

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// decodeBodies are request bodies the one-pass decoder takes and ones it
// must leave to encoding/json.
var decodeBodies = []struct {
	body string
	fast bool
}{
	{`{"model":"m","prompt":"hi"}`, true},
	{`{"model":"m","stream":true,"max_tokens":20,"messages":[{"role":"user","content":"x"}],"user":"u"}`, true},
	{`{"model":null,"max_tokens":null,"stream":null,"add_generation_prompt":false,"add_special_tokens":true,"continue_final_message":true}`, true},
	{`{"model":"m","prompt":"x","switchyard":{"class":"a","deadline_ms":10},"extra":{"k":[1,2]}}`, true},
	{`{"model":"m","tools":[{"type":"function"}],"chat_template_kwargs":{"a":1},"input":"i","instructions":"s"}`, true},
	{`{"Model":"m","prompt":"hi"}`, false},    // encoding/json matches keys without case
	{`{"model":"m","model":"n"}`, false},      // the last one wins there
	{`{"model":"\u006d"}`, false},             // needs unescaping
	{`{"mod\u0065l":"m"}`, false},             // so does the key
	{`{"model":"m","max_tokens":1.5}`, false}, // a type error names the field
	{`{"model":"m","max_tokens":"5"}`, false}, //
	{`{"model":"m","stream":"yes"}`, false},   //
	{`{"model":"m","switchyard":{"priority":"x"}}`, false},
	{`{"model":"m","max_tokens":99999999999999999999}`, false},
	{`{"model":1}`, false}, {`[]`, false}, {`{"model":"m"`, false}, {``, false},
}

func TestDecodeRequestEqualsEncodingJSONOrDefersToIt(t *testing.T) {
	for _, c := range decodeBodies {
		var got openAIRequest
		ok := decodeRequest([]byte(c.body), &got)
		assert.Equal(t, c.fast, ok, "%s", c.body)
		if !ok {
			continue
		}
		var want openAIRequest
		require.NoError(t, json.Unmarshal([]byte(c.body), &want), c.body)
		assert.Equal(t, want, got, "%s", c.body)
	}
}

func TestParseRequestKeepsTheErrorsOfEncodingJSON(t *testing.T) {
	_, apiErr := parseRequest(endpointCompletions, []byte(`{"model":"m","max_tokens":"5","prompt":"x"}`), nil)
	require.NotNil(t, apiErr)
	assert.Equal(t, "max_tokens", apiErr.Param)
	assert.Equal(t, "invalid_type", apiErr.Code)
	assert.Equal(t, "max_tokens must be of type integer, got string", apiErr.Message)
	_, apiErr = parseRequest(endpointCompletions, []byte(`{"model":"m",}`), nil)
	require.NotNil(t, apiErr)
	assert.Equal(t, "invalid_json", apiErr.Code)
}

// FuzzDecodeRequestAgreesWithEncodingJSON: whatever the one-pass decoder
// accepts, encoding/json accepts and decodes to the same request.
func FuzzDecodeRequestAgreesWithEncodingJSON(f *testing.F) {
	for _, c := range decodeBodies {
		f.Add([]byte(c.body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var got openAIRequest
		if !decodeRequest(body, &got) {
			return
		}
		var want openAIRequest
		if err := json.Unmarshal(body, &want); err != nil {
			t.Fatalf("decodeRequest accepted %q, encoding/json says %v", body, err)
		}
		if !assert.ObjectsAreEqual(want, got) {
			t.Fatalf("decodeRequest(%q) = %+v, encoding/json %+v", body, got, want)
		}
	})
}
