package frontend

import (
	"encoding/json"
	"errors"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// messagesHarness is newAuthHarness with the worker's Messages capability
// chosen: a real actor, one real upstream, tenant acme.
func messagesHarness(t *testing.T, native bool, tn tenant.Tenant) *authHarness {
	t.Helper()
	pol, err := ParsePolicy([]byte(authPolicy))
	require.NoError(t, err)
	up := newUpstream(t, 3)
	actor := startActor(t, pol, []scheduler.Worker{{ID: "w1", URL: up.URL(), BlockSize: 16, KVBlocks: 4096, MaxRunning: 4}})
	set, err := tenant.NewSet([]tenant.Tenant{tn})
	require.NoError(t, err)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: NewLocalAdmitter(actor),
		Workers:  staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16, Models: []string{"other"}, Messages: native}},
		Policy:   pol,
		Tenants:  set,
	})
	return &authHarness{s: s, actor: actor, up: up, base: startServer(t, s)}
}

const helloMessages = `{"model":"m","max_tokens":3,"system":"be brief","messages":[{"role":"user","content":"hi"}],"switchyard":{"deadline_ms":60000}}`

// anthropicErr decodes an Anthropic error body.
func anthropicErr(t *testing.T, body string) (typ, errType, code string) {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type string `json:"type"`
			Code string `json:"code"`
		} `json:"error"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &e), body)
	return e.Type, e.Error.Type, e.Error.Code
}

func TestAMessagesRequestIsAdmittedAsItsTenantsChatCompletionAndTranslatedForAChatOnlyWorker(t *testing.T) {
	h := messagesHarness(t, false, acme)
	status, hdr, body := post(t, h.base+"/v1/messages", helloMessages, map[string]string{"x-api-key": "sk-acme", "anthropic-version": "2023-06-01"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, hdr.Get(HeaderRequestID), hdr.Get("request-id"))
	assert.Equal(t, "2023-06-01", hdr.Get("anthropic-version"))
	assert.Equal(t, "w1", hdr.Get(HeaderRoutedWorker))
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "batch").Counters.Admitted, "the tenant's default class, as for a chat completion")

	assert.Equal(t, "/v1/chat/completions", h.up.lastPath.Load())
	var sent map[string]any
	require.NoError(t, json.Unmarshal([]byte(h.up.lastBody.Load().(string)), &sent))
	assert.Equal(t, []any{map[string]any{"role": "system", "content": "be brief"}, map[string]any{"role": "user", "content": "hi"}}, sent["messages"])
	assert.NotContains(t, sent, "switchyard", "the router's hints stay at the router")

	var msg struct {
		Type       string         `json:"type"`
		StopReason string         `json:"stop_reason"`
		Usage      map[string]int `json:"usage"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &msg))
	assert.Equal(t, "message", msg.Type)
	assert.Equal(t, "max_tokens", msg.StopReason)
	assert.Equal(t, map[string]int{"input_tokens": 8, "output_tokens": 3, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 32}, msg.Usage)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.messages.forwarded.WithLabelValues(messagesTranslated)))

	status, hdr, body = post(t, h.base+"/v1/messages", `{"model":"m","max_tokens":3,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		map[string]string{"x-api-key": "sk-acme", HeaderClass: "standard"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, "text/event-stream", hdr.Get("Content-Type"))
	assert.Contains(t, body, "event: message_start\n")
	assert.Contains(t, body, "event: message_stop\n")
	assert.NotContains(t, body, "[DONE]")
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "standard").Counters.Admitted, "the class header applies")
}

func TestAWorkerServingMessagesGetsTheClientsBodyAndItsAnswerPassesThrough(t *testing.T) {
	h := messagesHarness(t, true, acme)
	status, _, body := post(t, h.base+"/v1/messages", helloMessages, map[string]string{"x-api-key": "sk-acme"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, "/v1/messages", h.up.lastPath.Load())
	assert.JSONEq(t, `{"model":"m","max_tokens":3,"system":"be brief","messages":[{"role":"user","content":"hi"}]}`, h.up.lastBody.Load().(string))
	assert.Contains(t, body, `"object":"text_completion"`, "the engine's own answer, untranslated")
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.messages.forwarded.WithLabelValues(messagesNative)))
}

func TestMessagesRefusalsTakeAnthropicsErrorTypes(t *testing.T) {
	limited := acme
	limited.Quota = tenant.Quota{Concurrent: 1}
	h := messagesHarness(t, false, limited)
	for _, tc := range []struct {
		name, body   string
		hdr          map[string]string
		status       int
		errType      string
		code         string
		countsAsBody bool
	}{
		{"no key", helloMessages, nil, 401, "authentication_error", "missing_api_key", false},
		{"an unknown key", helloMessages, map[string]string{"x-api-key": "sk-nope"}, 401, "authentication_error", "invalid_api_key", false},
		{"a model the tenant may not use", `{"model":"other","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-api-key": "sk-acme"}, 403, "permission_error", "model_not_allowed", false},
		{"a class the tenant may not ask for", helloMessages, map[string]string{"x-api-key": "sk-acme", HeaderClass: "realtime"}, 403, "permission_error", "class_not_allowed", false},
		{"a missing max_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-api-key": "sk-acme"}, 400, "invalid_request_error", "missing_required_parameter", true},
		{"a duplicate key", `{"model":"m","model":"other","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-api-key": "sk-acme"}, 400, "invalid_request_error", "duplicate_key", true},
	} {
		status, _, body := post(t, h.base+"/v1/messages", tc.body, tc.hdr)
		require.Equal(t, tc.status, status, "%s: %s", tc.name, body)
		typ, et, code := anthropicErr(t, body)
		assert.Equal(t, "error", typ, tc.name)
		assert.Equal(t, tc.errType, et, tc.name)
		assert.Equal(t, tc.code, code, tc.name)
		if tc.countsAsBody {
			assert.Equal(t, 1.0, testutil.ToFloat64(h.s.messages.invalid.WithLabelValues(tc.code)), tc.name)
		}
	}
	assert.Zero(t, h.up.requests.Load(), "no refused request reached the worker")

	h.up.gate = make(chan struct{})
	done := postInBackground(h.base+"/v1/messages", helloMessages, map[string]string{"x-api-key": "sk-acme"})
	waitFor(t, func() bool { return h.up.requests.Load() == 1 })
	status, hdr, body := post(t, h.base+"/v1/messages", helloMessages, map[string]string{"x-api-key": "sk-acme"})
	require.Equal(t, http.StatusTooManyRequests, status, body)
	_, et, code := anthropicErr(t, body)
	assert.Equal(t, "rate_limit_error", et)
	assert.Equal(t, "quota_exceeded", code)
	assert.Equal(t, "1", hdr.Get("Retry-After"))
	close(h.up.gate)
	require.Equal(t, http.StatusOK, <-done)

	status, _, body = post(t, h.base+"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, map[string]string{"x-api-key": "sk-acme"})
	require.Equal(t, http.StatusOK, status, body)
	var count struct {
		InputTokens int `json:"input_tokens"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &count))
	assert.Positive(t, count.InputTokens)
	status, _, body = post(t, h.base+"/v1/messages/count_tokens", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, nil)
	require.Equal(t, http.StatusUnauthorized, status, body)

	req, err := http.NewRequest(http.MethodGet, h.base+"/v1/messages", nil)
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	var e struct {
		Type string `json:"type"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
	assert.Equal(t, "error", e.Type, "even a wrong method is answered in Anthropic's shape")
}

func TestAMessagesConversationHashesAsTheSameChatCompletionDoes(t *testing.T) {
	messages := `{"model":"m","max_tokens":8,"system":"You are terse.","messages":[
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","content":[{"type":"tool_use","id":"call_1","name":"get_weather","input":{"city":"Paris"}}]},
		{"role":"user","content":[{"type":"tool_result","tool_use_id":"call_1","content":"sunny"}]}],
		"tools":[{"name":"get_weather","input_schema":{"type":"object"}}]}`
	chat := `{"model":"m","max_tokens":8,"messages":[
		{"role":"system","content":"You are terse."},
		{"role":"user","content":"Weather in Paris?"},
		{"role":"assistant","tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"call_1","content":"sunny"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`
	pm, e := parseRequest(endpointMessages, []byte(messages), http.Header{})
	require.Nil(t, e)
	pc, e := parseRequest(endpointChat, []byte(chat), http.Header{})
	require.Nil(t, e)
	require.Len(t, pm.input.Messages, len(pc.input.Messages))
	for i := range pc.input.Messages {
		m, c := pm.input.Messages[i], pc.input.Messages[i]
		assert.Equal(t, c.Role, m.Role, i)
		assert.Equal(t, c.Content, m.Content, i)
		assert.JSONEq(t, string(c.Raw), string(m.Raw), "message %d reaches the chat template as the chat request's does", i)
	}
	require.Len(t, pm.input.Tools, 1)
	assert.JSONEq(t, string(pc.input.Tools[0]), string(pm.input.Tools[0]))

	reg := toyPrompts(t, "m")
	rm, err := reg.Tokenize(t.Context(), "m", pm.input, nil)
	require.NoError(t, err)
	rc, err := reg.Tokenize(t.Context(), "m", pc.input, nil)
	require.NoError(t, err)
	assert.Equal(t, rc.IDs.Slice(), rm.IDs.Slice(), "the same tokens, so the same block hashes and the same cached prefix")
}

// FuzzParseMessages: parsing arbitrary Messages bodies never panics, every
// refusal is a described 400, and an accepted request carries a chat form
// the engine can read.
func FuzzParseMessages(f *testing.F) {
	for _, seed := range []string{
		helloMessages,
		`{"model":"m","max_tokens":1,"stream":true,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"url","url":"u"}}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"a","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":"x"}]}]}`,
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{}}],"tool_choice":{"type":"tool","name":"f"}}`,
		`{"model":`, `[]`, `null`, "",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		p, apiErr := parseRequest(endpointMessages, body, http.Header{})
		if apiErr != nil {
			if apiErr.Status != http.StatusBadRequest || apiErr.Message == "" ||
				!errors.Is(apiErr, ErrBadRequest) && !errors.Is(apiErr, ErrAmbiguousBody) {
				t.Fatalf("refusal is not a described 400: %+v", apiErr)
			}
			return
		}
		if p.model == "" || p.maxTokens < 1 || p.input == nil || p.messages == nil || !json.Valid(p.messages.chat) || !json.Valid(p.forward) {
			t.Fatalf("accepted an invalid request: %+v", p)
		}
	})
}
