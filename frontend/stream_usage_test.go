package frontend

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/metrics"
)

func TestStreamsWithUsageInEveryChunkStillRecordInterTokenLatencyAndTheirUsage(t *testing.T) {
	for _, style := range []string{"null", "running"} {
		t.Run(style, func(t *testing.T) {
			up := newUpstream(t, 5)
			up.chunkUsage = style
			ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
			m := metrics.NewRouter(nil)
			s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws, Metrics: m})
			base := startServer(t, s)

			status, _, body := post(t, base+"/v1/completions", streamBody("m"), nil)
			require.Equal(t, http.StatusOK, status, body)
			events := strings.Split(strings.TrimSpace(body), "\n\n")
			require.Len(t, events, 7, "5 tokens, a usage chunk and [DONE]: %q", body)
			assert.Equal(t, uint64(4), histogramCount(t, m.ITL.WithLabelValues("m", "default")), "5 tokens have 4 gaps, whatever their usage member holds")
			assert.Equal(t, 40.0, testutil.ToFloat64(m.PromptTokens.WithLabelValues("m", "default")), "the last usage object is the stream's")
			assert.Equal(t, 5.0, testutil.ToFloat64(m.GeneratedTokens.WithLabelValues("m", "default")))
		})
	}
}

func TestAStreamWithRunningUsageThatDidNotAskForUsageSeesNoneOfIt(t *testing.T) {
	up := newUpstream(t, 3)
	up.chunkUsage = "running"
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	base := startServer(t, s)
	status, _, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, http.StatusOK, status, body)
	assert.NotContains(t, body, `"usage"`)
	assert.Contains(t, body, `"text":"t2 "`, "the tokens beside the usage are kept")
}

func TestChunkUsageTellsAUsageObjectFromNullAndFromATokenSpellingUsage(t *testing.T) {
	for _, c := range []struct {
		chunk       string
		usage, only bool
	}{
		{`{"choices":[{"text":"a"}]}`, false, false},
		{`{"choices":[{"text":"a"}],"usage":null}`, false, false},
		{`{"choices":[{"text":"a"}],"usage" : null}`, false, false},
		{`{"choices":[{"delta":{"content":"usage"}}]}`, false, false},
		{`{"choices":[{"delta":{"content":"usage"}}],"usage":{"prompt_tokens":1}}`, true, false},
		{`{"choices":[{"text":"a"}],"usage":{"prompt_tokens":1}}`, true, false},
		{`{"choices":[],"usage":{"prompt_tokens":1}}`, true, true},
		{`{"choices":[ ],"usage":{"prompt_tokens":1}}`, true, true},
		{`{"usage":{"prompt_tokens":1}}`, true, true},
		{`{"choices":null,"usage":{"prompt_tokens":1}}`, true, true},
		{`{"choices":[{"text":"\"usage\": {"}]}`, false, false},
		{`{"usage"`, false, false},
		{``, false, false},
	} {
		usage, only := chunkUsage([]byte(c.chunk))
		assert.Equal(t, c.usage, usage, "usage of %s", c.chunk)
		assert.Equal(t, c.only, only, "only of %s", c.chunk)
	}
}

func FuzzChunkUsage(f *testing.F) {
	for _, s := range []string{`{"choices":[],"usage":{}}`, `{"usage":null}`, `"usage"`, `{"choices":[ ]`, "\"usage\"  :"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		usage, only := chunkUsage(b)
		if only && !usage {
			t.Fatalf("usage-only without usage: %q", b)
		}
		_ = fmt.Sprint(usage)
	})
}

// FuzzWithoutUsageScanAgreesWithWithoutUsage: the scanning route and the
// decoding one make the same chunk of every payload.
func FuzzWithoutUsageScanAgreesWithWithoutUsage(f *testing.F) {
	for _, seed := range []string{
		`{"id":"c","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"usage"}}],"usage":null}`,
		`{"id":"c","choices":[{"index":0,"delta":{"content":"x"}}],"usage":{"prompt_tokens":5}}`,
		`{"choices":null,"usage":{"prompt_tokens":5}}`,
		`{"usage":{"prompt_tokens":5}}`,
		`{"usage":{"prompt_tokens":5},"usage":null}`,
		`{"choices":[ ],"usage":{}}`,
		`{"\u0075sage":{"prompt_tokens":5}}`,
		`{"usage":{"prompt_tokens":5}} x`,
		`[1]`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, payload []byte) {
		wantKept, wantChanged := withoutUsage(payload)
		kept, changed := withoutUsageScan(payload)
		require.Equal(t, wantChanged, changed)
		require.Equal(t, wantKept == nil, kept == nil)
		require.Equal(t, string(wantKept), string(kept))
	})
}

func TestTheUsageChunkIsDroppedWithoutDecodingIt(t *testing.T) {
	chunk := []byte(`{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":4500,"completion_tokens":64,"total_tokens":4564}}`)
	var kept []byte
	allocs := testing.AllocsPerRun(100, func() { kept, _ = withoutUsageScan(chunk) })
	assert.Nil(t, kept)
	assert.Zero(t, allocs)
}
