package frontend

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAnEngineThatSchedulesByPriorityGetsTheRequestsPriorityInVLLMsField(t *testing.T) {
	byPriority, plain := newUpstream(t, 2), newUpstream(t, 2)
	ws := staticWorkers{
		{ID: "w1", URL: byPriority.URL(), Model: "m", BlockSize: 16, PrioritySchedules: true},
		{ID: "w2", URL: plain.URL(), Model: "m", BlockSize: 16},
	}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	base := startServer(t, s)

	status, _, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`, map[string]string{HeaderPriority: "5"})
	require.Equal(t, http.StatusOK, status, body)
	var sent map[string]any
	require.NoError(t, json.Unmarshal([]byte(byPriority.lastBody.Load().(string)), &sent))
	assert.EqualValues(t, -5, sent["priority"], "vLLM serves lower values earlier; Switchyard higher ones")

	status, _, body = post(t, base+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"priority":3}`, map[string]string{HeaderPriority: "5"})
	require.Equal(t, http.StatusOK, status, body)
	require.NoError(t, json.Unmarshal([]byte(byPriority.lastBody.Load().(string)), &sent))
	assert.EqualValues(t, 3, sent["priority"], "a priority the client gave the engine is its own")

	only := staticWorkers{ws[1]}
	s2, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, only...), Workers: only})
	status, _, body = post(t, startServer(t, s2)+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`, map[string]string{HeaderPriority: "5"})
	require.Equal(t, http.StatusOK, status, body)
	assert.NotContains(t, plain.lastBody.Load().(string), `"priority"`, "an engine without priority scheduling would refuse the field")
}

func FuzzEnginePriority(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, ` {"priority":2} `, `{"pri\u006frity":1}`, `[]`, `{`} {
		f.Add([]byte(s), int32(4))
	}
	f.Fuzz(func(t *testing.T, body []byte, p int32) {
		out := enginePriority(body, p)
		if json.Valid(body) && !json.Valid(out) {
			t.Fatalf("%q became invalid: %q", body, out)
		}
	})
}
