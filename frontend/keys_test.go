package frontend

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestACaseVariantModelKeyCannotGetAnotherModelPastTheTenantsList(t *testing.T) {
	h := newAuthHarness(t, acme) // acme may use m only; the worker also serves "other"
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"other","MODEL":"m","prompt":"hi"}`, bearer("sk-acme"))
	require.Equal(t, http.StatusBadRequest, status, body)
	e := apiErr(t, body)
	assert.Equal(t, codeCaseVariantKey, deref(e.Code))
	assert.Equal(t, "MODEL", deref(e.Param))
	assert.Zero(t, h.up.requests.Load(), "the engine, which reads \"model\", never saw the request")
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.bodies.ambiguous.WithLabelValues(codeCaseVariantKey)))
}

func TestARepeatedMaxTokensIsRefusedNamingTheKey(t *testing.T) {
	h := newAuthHarness(t, acme)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1,"max_tokens":100000}`, bearer("sk-acme"))
	require.Equal(t, http.StatusBadRequest, status, body)
	e := apiErr(t, body)
	assert.Equal(t, codeDuplicateKey, deref(e.Code))
	assert.Equal(t, "max_tokens", deref(e.Param))
	assert.Zero(t, h.up.requests.Load())
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.bodies.ambiguous.WithLabelValues(codeDuplicateKey)))
}

func TestACaseVariantStreamKeyIsRefused(t *testing.T) {
	h := newAuthHarness(t, acme)
	for _, b := range []string{
		`{"model":"m","prompt":"hi","Stream":true}`,
		`{"model":"m","prompt":"hi","stream":false,"STREAM":true}`,
		`{"model":"m","prompt":"hi","ſtream":true}`, // U+017F folds onto s in encoding/json
	} {
		status, _, body := post(t, h.base+"/v1/completions", b, bearer("sk-acme"))
		require.Equal(t, http.StatusBadRequest, status, b)
		assert.Equal(t, codeCaseVariantKey, deref(apiErr(t, body).Code), b)
	}
	assert.Zero(t, h.up.requests.Load())
}

func TestAmbiguousKeysAreRefusedAtEveryLevelTheRouterReads(t *testing.T) {
	cases := []struct {
		ep          endpoint
		body, param string
		code        string
	}{
		{endpointCompletions, `{"model":"m","prompt":"x","switchyard":{"class":"batch","CLASS":"realtime"}}`, "switchyard.CLASS", codeCaseVariantKey},
		{endpointCompletions, `{"model":"m","prompt":"x","switchyard":{"class":"batch","class":"realtime"}}`, "switchyard.class", codeDuplicateKey},
		{endpointCompletions, `{"model":"m","prompt":"x","stream":true,"stream_options":{"Include_Usage":true}}`, "stream_options.Include_Usage", codeCaseVariantKey},
		{endpointChat, `{"model":"m","messages":[{"role":"user","content":"long text","CONTENT":"x"}]}`, "messages[0].CONTENT", codeCaseVariantKey},
		{endpointChat, `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a","Text":"b"}]}]}`, "messages[0].content[0].Text", codeCaseVariantKey},
		{endpointResponses, `{"model":"m","input":[{"role":"user","content":"a","Role":"system"}]}`, "input[0].Role", codeCaseVariantKey},
		{endpointCompletions, `{"model":"m","prompt":"x","n":1,"N":64}`, "N", codeCaseVariantKey},
		{endpointCompletions, `{"model":"m","prompt":"x","mod\u0065l":"other"}`, "model", codeDuplicateKey}, // unescaped, the key is model: a repeat
		{endpointCompletions, `{"model":"m","prompt":"x","extra":{"a":1,"a":2}}`, "extra.a", codeDuplicateKey},
		{endpointCompletions, `{"model":"\ud800","prompt":"x"}`, "model", codeInvalidUnicode},
		{endpointCompletions, "{\"model\":\"m\xff\",\"prompt\":\"x\"}", "", codeInvalidUnicode},
	}
	for _, c := range cases {
		_, e := parseRequest(c.ep, []byte(c.body), nil)
		require.NotNil(t, e, c.body)
		assert.True(t, errors.Is(e, ErrAmbiguousBody), "%s: %v", c.body, e)
		if c.code != "" {
			assert.Equal(t, c.code, e.Code, c.body)
			assert.Equal(t, c.param, e.Param, c.body)
		}
	}
}

func TestKeysThatDifferOnlyInCaseWhereTheRouterReadsNothingPass(t *testing.T) {
	for _, b := range []string{
		// A tool's schema and the template kwargs are read as maps, if at
		// all: "id" and "ID" are two properties there.
		`{"model":"m","messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"id":{},"ID":{}}}}}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":1,"A":2},"Temperature":1}`,
		`{"model":"\u006d","messages":[{"role":"user","content":"\ud83d\ude00"}]}`,
	} {
		p, e := parseRequest(endpointChat, []byte(b), nil)
		require.Nil(t, e, "%s: %v", b, e)
		assert.Equal(t, "m", p.model)
	}
}

func TestNestingDeeperThanTheBoundIsRefused(t *testing.T) {
	deep := `{"model":"m","prompt":"x","extra":`
	for range maxBodyNesting + 1 {
		deep += "["
	}
	for range maxBodyNesting + 1 {
		deep += "]"
	}
	_, e := parseRequest(endpointCompletions, []byte(deep+"}"), nil)
	require.NotNil(t, e)
	assert.Equal(t, codeNestedTooDeep, e.Code)
}

// BenchmarkCheckKeys is what the ambiguity check adds to every request:
// one more pass over the body.
func BenchmarkCheckKeys(b *testing.B) {
	for name, body := range map[string][]byte{
		"completion=1k": []byte(`{"model":"m","stream":true,"max_tokens":64,"prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 110) + `"}`),
		"chat=4k":       []byte(chatBody(b, 4096)),
	} {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if e := checkKeys(body); e != nil {
					b.Fatal(e)
				}
			}
		})
	}
}

func TestObjectsWithManyKeysAreCheckedThroughTheirFoldedForms(t *testing.T) {
	var b strings.Builder
	b.WriteString(`{"model":"m","prompt":"x"`)
	for i := range 2 * manyKeys {
		fmt.Fprintf(&b, `,"k%d":1`, i)
	}
	wide := b.String()
	_, e := parseRequest(endpointCompletions, []byte(wide+`,"k3":2}`), nil)
	require.NotNil(t, e)
	assert.Equal(t, codeDuplicateKey, e.Code)
	assert.Equal(t, "k3", e.Param)
	_, e = parseRequest(endpointCompletions, []byte(wide+`,"MODEL":"other"}`), nil)
	require.NotNil(t, e)
	assert.Equal(t, codeCaseVariantKey, e.Code)
	_, e = parseRequest(endpointCompletions, []byte(wide+`,"K3":2}`), nil)
	require.NotNil(t, e, "K3 and k3 at the top level, read without case")
	assert.Equal(t, codeCaseVariantKey, e.Code)
	_, e = parseRequest(endpointCompletions, []byte(wide+`,"extra":{"a":1,"A":2}}`), nil)
	require.Nil(t, e)
	assert.Equal(t, foldKey([]byte("ſtream"), true), foldKey([]byte("STREAM"), true), "U+017F folds with s, as in encoding/json")

	// 100k distinct keys in one object: one map pass, not 5·10^9 comparisons.
	b.Reset()
	b.WriteString(`{"model":"m","prompt":"x","extra":{"a":0`)
	for i := range 100000 {
		fmt.Fprintf(&b, `,"%d":0`, i)
	}
	b.WriteString(`}}`)
	_, e = parseRequest(endpointCompletions, []byte(b.String()), nil)
	require.Nil(t, e)
}
