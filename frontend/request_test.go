package frontend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tokenizer"
)

// admitNever fails the test if a request reaches admission.
func admitNever(t *testing.T) *fakeAdmitter {
	return &fakeAdmitter{admit: func(context.Context, *scheduler.Request) (Ticket, error) {
		t.Errorf("a request that should have been refused reached admission")
		return nil, scheduler.ErrNoEndpoints
	}}
}

func TestBadInputsGetTheRightOpenAIError(t *testing.T) {
	cfg := DefaultConfig()
	cfg.MaxBodyBytes = 2048
	cfg.MaxPromptTokens = 50
	pol, err := ParsePolicy([]byte("classes: [{name: a}, {name: b}]\ndefault_class: a"))
	require.NoError(t, err)
	s, _ := newTestServer(t, cfg, Deps{
		Admitter: admitNever(t),
		Workers: staticWorkers{
			{ID: "w1", URL: "http://127.0.0.1:1", Model: "m", BlockSize: 16},
			{ID: "w2", URL: "http://127.0.0.1:1", Model: "other", BlockSize: 16},
		},
		Policy: pol,
	})
	base := startServer(t, s)

	cases := []struct {
		name, path, body string
		headers          map[string]string
		status           int
		code, param      string
	}{
		{"malformed json", "/v1/completions", `{"model":`, nil, 400, "invalid_json", ""},
		{"missing model", "/v1/completions", `{"prompt":"hi"}`, nil, 400, "missing_required_parameter", "model"},
		{"model of the wrong type", "/v1/completions", `{"model":7,"prompt":"hi"}`, nil, 400, "invalid_type", "model"},
		{"missing prompt", "/v1/completions", `{"model":"m"}`, nil, 400, "missing_required_parameter", "prompt"},
		{"prompt object", "/v1/completions", `{"model":"m","prompt":{"a":1}}`, nil, 400, "invalid_type", "prompt"},
		{"empty prompt array", "/v1/completions", `{"model":"m","prompt":[]}`, nil, 400, "invalid_value", "prompt"},
		{"batch mixing strings and ids", "/v1/completions", `{"model":"m","prompt":["a",[1]]}`, nil, 400, "invalid_type", "prompt[1]"},
		{"negative token id", "/v1/completions", `{"model":"m","prompt":[1,-2]}`, nil, 400, "invalid_value", "prompt[1]"},
		{"fractional token id", "/v1/completions", `{"model":"m","prompt":[1.5]}`, nil, 400, "invalid_value", "prompt[0]"},
		{"zero max_tokens", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":0}`, nil, 400, "invalid_value", "max_tokens"},
		{"negative max_tokens", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":-3}`, nil, 400, "invalid_value", "max_tokens"},
		{"max_tokens of the wrong type", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":"ten"}`, nil, 400, "invalid_type", "max_tokens"},
		{"stream of the wrong type", "/v1/completions", `{"model":"m","prompt":"hi","stream":"yes"}`, nil, 400, "invalid_type", "stream"},
		{"zero max_completion_tokens", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_completion_tokens":0}`, nil, 400, "invalid_value", "max_completion_tokens"},
		{"missing messages", "/v1/chat/completions", `{"model":"m"}`, nil, 400, "missing_required_parameter", "messages"},
		{"empty messages", "/v1/chat/completions", `{"model":"m","messages":[]}`, nil, 400, "invalid_value", "messages"},
		{"messages not an array", "/v1/chat/completions", `{"model":"m","messages":"hi"}`, nil, 400, "invalid_type", "messages"},
		{"message without role", "/v1/chat/completions", `{"model":"m","messages":[{"content":"hi"}]}`, nil, 400, "missing_required_parameter", "messages[0].role"},
		{"content part without a type", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":[{"text":"a"}]}]}`, nil, 400, "invalid_type", "messages[0].content[0]"},
		{"embeddings without input", "/v1/embeddings", `{"model":"m"}`, nil, 400, "missing_required_parameter", "input"},
		{"responses without input", "/v1/responses", `{"model":"m"}`, nil, 400, "missing_required_parameter", "input"},
		{"zero max_output_tokens", "/v1/responses", `{"model":"m","input":"hi","max_output_tokens":0}`, nil, 400, "invalid_value", "max_output_tokens"},
		{"numeric content", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":5}]}`, nil, 400, "invalid_type", "messages[0].content"},
		{"prompt over the token limit", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("word ", 60) + `"}`, nil, 400, "context_length_exceeded", "prompt"},
		{"body over the size limit", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 4096) + `"}`, nil, 413, "request_too_large", ""},
		{"unknown class header", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderClass: "gold"}, 400, "unknown_class", "x-switchyard-class"},
		{"unknown class in the body", "/v1/completions", `{"model":"m","prompt":"hi","switchyard":{"class":"gold"}}`, nil, 400, "unknown_class", "x-switchyard-class"},
		{"negative deadline header", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderDeadlineMS: "-5"}, 400, "invalid_value", "x-switchyard-deadline-ms"},
		{"non-numeric deadline header", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderDeadlineMS: "soon"}, 400, "invalid_value", "x-switchyard-deadline-ms"},
		{"negative deadline in the body", "/v1/completions", `{"model":"m","prompt":"hi","switchyard":{"deadline_ms":-1}}`, nil, 400, "invalid_value", "switchyard.deadline_ms"},
		{"non-numeric deadline in the body", "/v1/completions", `{"model":"m","prompt":"hi","switchyard":{"deadline_ms":"soon"}}`, nil, 400, "invalid_type", "switchyard.deadline_ms"},
		{"non-numeric priority", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderPriority: "high"}, 400, "invalid_value", "x-switchyard-priority"},
		{"bad worker id", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderWorker: "w 1"}, 400, "invalid_value", "x-switchyard-worker"},
		{"bad allowed worker id", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderAllowedWorkers: "w1,w.2"}, 400, "invalid_value", "x-switchyard-allowed-workers"},
		{"model nobody serves", "/v1/completions", `{"model":"nobody","prompt":"hi"}`, nil, 404, "model_not_found", "model"},
		{"allowed workers that do not serve the model", "/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderAllowedWorkers: "w2"}, 400, "invalid_constraint", "x-switchyard-allowed-workers"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, h, body := post(t, base+tc.path, tc.body, tc.headers)
			require.Equal(t, tc.status, status, "body: %s", body)
			assert.Equal(t, "application/json", h.Get("Content-Type"))
			e := apiErr(t, body)
			assert.Equal(t, tc.code, deref(e.Code))
			assert.Equal(t, tc.param, deref(e.Param))
			assert.NotEmpty(t, e.Message)
			assert.NotEmpty(t, e.Type)
		})
	}
}

func TestUnknownPathsAndMethodsGetOpenAIShapedErrors(t *testing.T) {
	s, reg := newTestServer(t, DefaultConfig(), Deps{Admitter: admitNever(t), Workers: staticWorkers{}})
	base := startServer(t, s)
	resp, err := http.Get(base + "/v1/completions")
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
	assert.Equal(t, "POST", resp.Header.Get("Allow"))
	assert.Equal(t, "method_not_allowed", deref(apiErr(t, string(b)).Code))

	status, _, body := post(t, base+"/v1/audio/speech", `{}`, nil)
	assert.Equal(t, http.StatusNotFound, status)
	assert.Equal(t, "not_found", deref(apiErr(t, body).Code))

	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_http_responses_total HTTP responses by route and status code.
# TYPE switchyard_http_responses_total counter
switchyard_http_responses_total{code="404",route="other"} 1
switchyard_http_responses_total{code="405",route="other"} 1
`), "switchyard_http_responses_total"), "responses are counted by route and code; pre-resolved series are not exported until used")
}

func TestAdmissionErrorsMapToDesignStatusCodes(t *testing.T) {
	cases := []struct {
		err        error
		status     int
		code       string
		retryAfter bool
	}{
		{fmt.Errorf("admit: %w", scheduler.ErrDeadlineExceeded), 429, "deadline_exceeded", false},
		{fmt.Errorf("admit: %w", scheduler.ErrQueueFull), 429, "queue_full", true},
		{fmt.Errorf("admit: %w", scheduler.ErrNoEndpoints), 503, "no_endpoints", true},
		{fmt.Errorf("admit: %w", scheduler.ErrInvalidConstraint), 400, "invalid_constraint", false},
		{fmt.Errorf("admit: %w", scheduler.ErrOwnershipMoved), 503, "ownership_moved", true},
		{errors.New("boom"), 500, "internal_error", false},
	}
	for _, tc := range cases {
		t.Run(tc.code, func(t *testing.T) {
			s, _ := newTestServer(t, DefaultConfig(), Deps{
				Admitter: &fakeAdmitter{admit: func(context.Context, *scheduler.Request) (Ticket, error) { return nil, tc.err }},
				Workers:  staticWorkers{{ID: "w1", URL: "http://127.0.0.1:1", Model: "m", BlockSize: 16}},
			})
			status, h, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
			require.Equal(t, tc.status, status, body)
			assert.Equal(t, tc.code, deref(apiErr(t, body).Code))
			if tc.retryAfter {
				assert.Equal(t, "1", h.Get("Retry-After"))
			} else {
				assert.Empty(t, h.Get("Retry-After"))
			}
		})
	}
}

func TestTheAdmittedRequestCarriesClassHintsDeadlineHashesAndOverlaps(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	pol, err := ParsePolicy([]byte(`
default_class: a
classes: [{name: a, priority: 3, priority_jump: 1.5, deadline_ms: 9000}, {name: b}]
`))
	require.NoError(t, err)
	got := make(chan scheduler.Request, 1)
	idx := &fakeIndex{overlaps: []scheduler.Overlap{{Worker: "w2", Blocks: 2}}}
	up := newUpstream(t, 2)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
			got <- *r
			return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: "w2", WorkerURL: up.URL()}}, nil
		}},
		Workers: staticWorkers{
			{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 4},
			{ID: "w2", URL: up.URL(), Model: "m", BlockSize: 4},
			{ID: "w3", URL: up.URL(), Model: "other", BlockSize: 4},
		},
		Index:  idx,
		Policy: pol,
		Now:    func() time.Time { return t0 },
	})
	base := startServer(t, s)

	prompt := "one two three four five six seven eight nine ten"
	status, h, body := post(t, base+"/v1/completions",
		`{"model":"m","prompt":"`+prompt+`","max_tokens":7,"switchyard":{"priority":9,"deadline_ms":100}}`,
		map[string]string{HeaderAllowedWorkers: "w2, w3"})
	require.Equal(t, 200, status, body)
	r := <-got
	assert.Equal(t, "a", r.Class)
	assert.Equal(t, int32(9), r.StrictPriority, "the body hint overrides the class default priority")
	assert.InDelta(t, 1.5, r.PriorityJump, 1e-9, "class default priority jump")
	assert.Equal(t, t0, r.Ingress)
	assert.Equal(t, t0.Add(100*time.Millisecond), r.Due, "the body deadline overrides the class default")
	tokens := tokenizer.Encode(prompt)
	assert.Equal(t, len(tokens), r.PromptTokens)
	assert.Equal(t, kvindex.SequenceHashes(tokens, 4, kvindex.ModelSeed("m")), r.BlockHashes, "hashed at the workers' block size, seeded by the model name")
	assert.Equal(t, []scheduler.Overlap{{Worker: "w2", Blocks: 2}}, r.Overlaps)
	assert.Equal(t, []string{"w2"}, r.Allowed, "the allow-list is narrowed to the workers serving the model")
	assert.Equal(t, 7, r.ExpectedOutputTokens)
	assert.Equal(t, r.ID, h.Get(HeaderRequestID))
	assert.Equal(t, "w2", h.Get(HeaderRoutedWorker))
	assert.Equal(t, r.BlockHashes, idx.predicted["w2"], "the routing decision is recorded as a prediction")
	assert.NotContains(t, up.lastBody.Load(), "switchyard", "the hint object is not forwarded to the worker")
	assert.Contains(t, up.lastBody.Load(), `"max_tokens":7`)
}

func TestHeaderHintsOverrideBodyHintsAndZeroDeadlineMeansNone(t *testing.T) {
	b := &hintBody{Class: "a", Worker: "w1", DeadlineMS: ptr(int64(50))}
	h := http.Header{}
	h.Set(HeaderClass, "b")
	h.Set(HeaderDeadlineMS, "0")
	h.Set(HeaderWorker, "w2")
	got, apiErr := parseHints(b, h)
	require.Nil(t, apiErr)
	assert.Equal(t, "b", got.class)
	assert.Equal(t, "w2", got.worker)
	require.NotNil(t, got.deadline)
	assert.Equal(t, time.Duration(0), *got.deadline)
}

func ptr[T any](v T) *T { return &v }

// FuzzDecodeRequest: parsing arbitrary bodies never panics, and every
// refusal is a 400 naming what is wrong.
func FuzzDecodeRequest(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"hi"}`,
		`{"model":"m","prompt":[1,2,3],"max_tokens":5,"stream":true}`,
		`{"model":"m","prompt":["x"]}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}]}`,
		`{"model":"m","prompt":"hi","switchyard":{"class":"a","priority":1,"deadline_ms":10,"worker":"w1","allowed_workers":["w1"]}}`,
		`{"model":"m","prompt":[-1]}`,
		`{"model":`, `[]`, `null`, `{"prompt":{}}`, "",
	} {
		f.Add([]byte(seed), true)
		f.Add([]byte(seed), false)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := endpointCompletions
		if chat {
			ep = endpointChat
		}
		p, apiErr := parseRequest(ep, body, http.Header{})
		if apiErr != nil {
			if apiErr.Status != http.StatusBadRequest || apiErr.Message == "" || !errors.Is(apiErr, ErrBadRequest) {
				t.Fatalf("refusal is not a described 400: %+v", apiErr)
			}
			var e errorBody
			if err := json.Unmarshal(apiErr.body(), &e); err != nil {
				t.Fatalf("error body is not JSON: %v", err)
			}
			return
		}
		if p.model == "" || p.maxTokens < 0 || p.input == nil {
			t.Fatalf("accepted an invalid request: %+v", p)
		}
	})
}

// FuzzDecodePolicy: parsing arbitrary policy files never panics, and an
// accepted policy is one the scheduler accepts.
func FuzzDecodePolicy(f *testing.F) {
	example, err := os.ReadFile(filepath.Join("testdata", "policy.yaml"))
	if err != nil {
		f.Fatal(err)
	}
	for _, seed := range []string{
		string(example),
		"classes: [{name: a}]",
		"classes: [{name: a, policy: wspt, quantum: 1, limits: {requests: 0}}]",
		"default_class: b\nclasses: [{name: a}, {name: b}]\nrules: [{class: a, match: {model: 'x*'}}]",
		"classes: [{name: a, qantum: 3}]", "classes: [", "", "- 1", "classes: 5",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, doc []byte) {
		p, err := ParsePolicy(doc)
		if err != nil {
			if !errors.Is(err, ErrBadPolicy) {
				t.Fatalf("error does not wrap ErrBadPolicy: %v", err)
			}
			return
		}
		if len(p.Classes) == 0 || !p.HasClass(p.DefaultClass) {
			t.Fatalf("accepted a policy without a usable default class: %+v", p)
		}
		for _, c := range p.Classes {
			if err := c.Validate(); err != nil {
				t.Fatalf("accepted a class the scheduler rejects: %v", err)
			}
		}
		for _, r := range p.Rules {
			if !p.HasClass(r.Class) {
				t.Fatalf("accepted a rule for unknown class %q", r.Class)
			}
		}
	})
}
