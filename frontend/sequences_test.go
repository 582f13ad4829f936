package frontend

import (
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNSequencesAreBookedAndChargedAsThatMany(t *testing.T) {
	rec := &grantRecorder{}
	up := newUpstream(t, 2)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16, MaxModelLen: 4096}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(rec, ws...), Workers: ws})
	base := startServer(t, s)
	for _, b := range []string{
		`{"model":"m","prompt":"hello there","max_tokens":10,"n":4}`,
		`{"model":"m","prompt":"hello there","max_tokens":10,"n":2,"best_of":6}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}],"n":3}`,
		`{"model":"m","input":"hello there","n":64}`, // embeddings have no sequences
	} {
		path := "/v1/completions"
		switch {
		case b[14:22] == "messages":
			path = "/v1/chat/completions"
		case b[14:19] == "input":
			path = "/v1/embeddings"
		}
		status, _, body := post(t, base+path, b, nil)
		require.Equal(t, http.StatusOK, status, "%s: %s", b, body)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.Len(t, rec.reqs, 4)
	n4 := rec.reqs[0]
	assert.Equal(t, 4, n4.Sequences)
	assert.Equal(t, 40, n4.ExpectedOutputTokens, "max_tokens per sequence")
	assert.Equal(t, 40, n4.OutputBound)
	assert.Equal(t, 6, rec.reqs[1].Sequences, "best_of generates max(n, best_of)")
	assert.Equal(t, 60, rec.reqs[1].ExpectedOutputTokens)
	chat := rec.reqs[2]
	assert.Equal(t, 3, chat.Sequences)
	assert.Equal(t, 3*DefaultConfig().DefaultMaxTokens, chat.ExpectedOutputTokens)
	assert.Equal(t, 3*(4096-chat.PromptTokens), chat.OutputBound, "each sequence may fill the context")
	assert.Equal(t, 1, rec.reqs[3].Sequences)
}

func TestAnAbsurdNOrBestOfIsRefused(t *testing.T) {
	for _, c := range []struct{ body, param string }{
		{`{"model":"m","prompt":"x","n":0}`, "n"},
		{`{"model":"m","prompt":"x","n":-3}`, "n"},
		{`{"model":"m","prompt":"x","n":129}`, "n"},
		{`{"model":"m","prompt":"x","best_of":100000}`, "best_of"},
	} {
		_, e := parseRequest(endpointCompletions, []byte(c.body), nil)
		require.NotNil(t, e, c.body)
		assert.Equal(t, http.StatusBadRequest, e.Status)
		assert.Equal(t, "invalid_value", e.Code)
		assert.Equal(t, c.param, e.Param)
	}
}
