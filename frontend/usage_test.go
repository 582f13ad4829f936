package frontend

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/tenant"
)

func TestAStreamThatDidNotAskForUsageIsChargedTheEnginesUsageAndSeesNoUsageChunk(t *testing.T) {
	// 1000 tokens per minute; each stream is estimated at its prompt plus
	// max_tokens 900, the engine uses 43. Charged the estimate (as when the
	// router never learnt a stream's usage) the second stream is over the
	// quota; charged the usage, all three pass.
	limited := acme
	limited.Quota = tenant.Quota{TokensPerMinute: 1000}
	h := newAuthHarness(t, limited)
	for i := range 3 {
		status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":900,"stream":true}`, bearer("sk-acme"))
		require.Equal(t, http.StatusOK, status, "request %d: %s", i, body)
		assert.NotContains(t, body, `"usage"`, "the client did not ask for usage")
		assert.Contains(t, body, `"text":"t2 "`)
		assert.True(t, strings.HasSuffix(body, "data: [DONE]\n\n"), "%q", body)
		assert.NotContains(t, body, "\n\n\n", "no empty event where the usage chunk was")
		waitFor(t, func() bool { snap, _ := h.actor.Flush(t.Context()); return snap.Bookings == 0 })
	}
	var sent struct {
		StreamOptions map[string]any `json:"stream_options"`
	}
	require.NoError(t, json.Unmarshal([]byte(h.up.lastBody.Load().(string)), &sent))
	assert.Equal(t, map[string]any{"include_usage": true}, sent.StreamOptions, "the router asked the engine")
}

func TestAStreamThatAskedForUsageStillGetsIt(t *testing.T) {
	h := newAuthHarness(t, acme)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, bearer("sk-acme"))
	require.Equal(t, http.StatusOK, status, body)
	assert.Contains(t, body, `"completion_tokens":3`)
	status, _, body = post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":false}}`, bearer("sk-acme"))
	require.Equal(t, http.StatusOK, status, body)
	assert.NotContains(t, body, `"usage"`, "asked not to")
}

func TestWithStreamUsageReencodesOnlyStreamOptions(t *testing.T) {
	for in, want := range map[string]string{
		`{"model":"m","prompt":"<x>"}`:          `{"model":"m","prompt":"<x>","stream_options":{"include_usage":true}}`,
		` { } `:                                 ` { "stream_options":{"include_usage":true}} `,
		`{"a":1,"stream_options":null,"b":"<"}`: `{"a":1,"stream_options":{"include_usage":true},"b":"<"}`,
		`{"stream_options":{"continuous_usage_stats":true,"x":1}}`: `{"stream_options":{"include_usage":true,"x":1}}`,
		`{"stream_\u006fptions":{"include_usage":false},"p":"<"}`:  `{"stream_\u006fptions":{"include_usage":true},"p":"<"}`,
	} {
		got, err := withStreamUsage([]byte(in))
		require.NoError(t, err, in)
		assert.Equal(t, want, string(got), in)
	}
}

func TestAnAbsentMaxTokensIsChargedUpToTheModelsContext(t *testing.T) {
	rec := &grantRecorder{}
	up := newUpstream(t, 2)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16, MaxModelLen: 4096}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)
	status, _, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hello there","stream":true}`, nil)
	require.Equal(t, http.StatusOK, status, body)
	status, _, body = post(t, base+"/v1/completions", `{"model":"m","prompt":"hello there","max_tokens":50}`, nil)
	require.Equal(t, http.StatusOK, status, body)
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.reqs, 2)
	free := rec.reqs[0]
	assert.Equal(t, DefaultConfig().DefaultMaxTokens, free.ExpectedOutputTokens, "booked as before")
	assert.Equal(t, 4096-free.PromptTokens, free.OutputBound, "charged up to what the context leaves")
	bounded := rec.reqs[1]
	assert.Equal(t, 50, bounded.ExpectedOutputTokens)
	assert.Equal(t, 50, bounded.OutputBound)
}

func TestATenantsStreamsWithoutMaxTokensAreChargedTheContextNotADefault(t *testing.T) {
	// No worker says its context: the router's -http.max-prompt-tokens
	// (32768) bounds it. A quota of 40000 tokens a minute holds one such
	// stream at a time, not 150 (40000 / 256).
	limited := acme
	limited.Quota = tenant.Quota{TokensPerMinute: 40000}
	h := newAuthHarness(t, limited)
	h.up.gate = make(chan struct{})
	done := postInBackground(h.base+"/v1/completions", `{"model":"m","prompt":"first","stream":true}`, bearer("sk-acme"))
	waitFor(t, func() bool { return h.up.requests.Load() == 1 })
	// The second stream is refused at once; were it admitted, it would
	// reach the engine (and wait at its gate).
	second := postInBackground(h.base+"/v1/completions", `{"model":"m","prompt":"second","stream":true}`, bearer("sk-acme"))
	status := 0
	waitFor(t, func() bool {
		select {
		case status = <-second:
			return true
		default:
			return h.up.requests.Load() == 2
		}
	})
	close(h.up.gate)
	if status == 0 {
		status = <-second
	}
	require.Equal(t, http.StatusTooManyRequests, status)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.auth.rejected.WithLabelValues("acme", "quota_exceeded")))
	require.Equal(t, http.StatusOK, <-done)
}

// BenchmarkWithStreamUsage is what asking for a stream's usage adds: one
// scan of the body and one copy.
func BenchmarkWithStreamUsage(b *testing.B) {
	body := []byte(`{"model":"m","stream":true,"max_tokens":64,"prompt":"` + strings.Repeat("the quick brown fox jumps over the lazy dog ", 110) + `"}`)
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		if _, err := withStreamUsage(body); err != nil {
			b.Fatal(err)
		}
	}
}

func TestAStreamsUsageIsAskedForInTheBodysSpareCapacityWithoutDisturbingTheParse(t *testing.T) {
	const chat = `{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}]} `
	body := append(make([]byte, 0, len(chat)+1+streamUsageRoom), chat...)
	p, apiErr := parseRequest(endpointChat, body, http.Header{})
	require.Nil(t, apiErr)
	require.True(t, p.injectedUsage)
	assert.Equal(t, `{"model":"m","stream":true,"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}],"stream_options":{"include_usage":true}} `, string(p.forward))
	assert.Same(t, unsafe.SliceData(body), unsafe.SliceData(p.forward), "the forwarded body is built in place, not copied")

	// The parse's strings alias the body before its closing brace, which
	// stayed where it was.
	pristine, apiErr := parseRequest(endpointChat, []byte(strings.Replace(chat, `"stream":true`, `"stream":false`, 1)), http.Header{})
	require.Nil(t, apiErr)
	require.False(t, pristine.injectedUsage)
	assert.Equal(t, pristine.input.Messages, p.input.Messages)
	assert.Equal(t, "m", p.model)
}

func TestABodyWithoutSpareCapacityIsCopiedToAskForUsage(t *testing.T) {
	const in = `{"model":"m","prompt":"hi","stream":true}`
	body := []byte(in)[:len(in):len(in)]
	p, apiErr := parseRequest(endpointCompletions, body, http.Header{})
	require.Nil(t, apiErr)
	assert.Equal(t, `{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":true}}`, string(p.forward))
	assert.Equal(t, in, string(body), "the client's bytes are untouched")
}
