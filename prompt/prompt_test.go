package prompt

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/tokenizer/chat"
	"github.com/switchyard/switchyard/wire"
)

func parse(t testing.TB, k Kind, fields string) *Input {
	t.Helper()
	var f Fields
	require.NoError(t, json.Unmarshal([]byte(fields), &f))
	in, err := Parse(k, &f)
	require.NoError(t, err)
	return in
}

func registry(t testing.TB, tokenizers map[string]string, reg prometheus.Registerer) *Registry {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Tokenizers = tokenizers
	r, err := NewRegistry(cfg, Deps{}, zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	return r
}

func TestNonTextPartsBecomePlaceholdersOfTheirContentAndTextPartsJoinWithNewlines(t *testing.T) {
	msg := func(url string) string {
		return `{"messages":[{"role":"user","content":[{"type":"text","text":"look at"},{"type":"image_url","image_url":{"url":"` + url + `"}},{"type":"text","text":"and say"}]}]}`
	}
	a := parse(t, KindChat, msg("data:image/png;base64,AAAA"))
	b := parse(t, KindChat, msg("data:image/png;base64,AAAA"))
	c := parse(t, KindChat, msg("data:image/png;base64,BBBB"))
	lines := strings.Split(a.Messages[0].Content, "\n")
	require.Len(t, lines, 3, "three parts, joined with newlines as vLLM joins text parts")
	assert.Equal(t, "look at", lines[0])
	assert.Regexp(t, `^<\|switchyard:image:[0-9a-f]{16}\|>$`, lines[1])
	assert.Equal(t, "and say", lines[2])
	assert.Equal(t, a.Messages[0].Content, b.Messages[0].Content, "the same image gives the same placeholder")
	assert.NotEqual(t, a.Messages[0].Content, c.Messages[0].Content, "a different image does not")
	for typ, kind := range map[string]string{"input_audio": "audio", "video_url": "video", "file": "file", "input_image": "image", "my_part": "my_part"} {
		in := parse(t, KindChat, `{"messages":[{"role":"user","content":[{"type":"`+typ+`","x":1}]}]}`)
		assert.Contains(t, in.Messages[0].Content, "<|switchyard:"+kind+":", typ)
	}
}

func TestEveryCompletionPromptFormParses(t *testing.T) {
	cases := map[string][]Prompt{
		`{"prompt":"hi"}`:                             {{Text: "hi"}},
		`{"prompt":["a","b"]}`:                        {{Text: "a"}, {Text: "b"}},
		`{"prompt":[1,2,3]}`:                          {{IDs: []uint32{1, 2, 3}, IsIDs: true}},
		`{"prompt":[[1,2],[3]]}`:                      {{IDs: []uint32{1, 2}, IsIDs: true}, {IDs: []uint32{3}, IsIDs: true}},
		`{"prompt":"caf\u00e9 \"q\""}`:                {{Text: `café "q"`}},
		`{"prompt":[4294967295]}`:                     {{IDs: []uint32{4294967295}, IsIDs: true}},
		`{"prompt":["x"],"add_special_tokens":false}`: {{Text: "x"}},
	}
	for fields, want := range cases {
		assert.Equal(t, want, parse(t, KindCompletion, fields).Prompts, fields)
	}
	assert.False(t, parse(t, KindCompletion, `{"prompt":"x","add_special_tokens":false}`).AddSpecial)
	for fields, param := range map[string]string{
		`{}`:                        "prompt",
		`{"prompt":[]}`:             "prompt",
		`{"prompt":["a",1]}`:        "prompt[1]",
		`{"prompt":[[1],"a"]}`:      "prompt[1]",
		`{"prompt":[[]]}`:           "prompt[0]",
		`{"prompt":[1,4294967296]}`: "prompt[1]",
		`{"prompt":{}}`:             "prompt",
	} {
		var f Fields
		require.NoError(t, json.Unmarshal([]byte(fields), &f))
		_, err := Parse(KindCompletion, &f)
		var re *RequestError
		require.ErrorAs(t, err, &re, fields)
		assert.Equal(t, param, re.Param, fields)
		assert.ErrorIs(t, err, ErrBadRequest)
	}
}

func TestResponsesInputBecomesChatMessages(t *testing.T) {
	in := parse(t, KindResponse, `{"instructions":"be brief","input":[
		{"role":"user","content":[{"type":"input_text","text":"weather?"},{"type":"input_image","image_url":"http://x/y.png"}]},
		{"type":"function_call","call_id":"c1","name":"get_weather","arguments":"{\"city\":\"Paris\"}"},
		{"type":"function_call_output","call_id":"c1","output":"sunny"},
		{"type":"message","role":"assistant","content":[{"type":"output_text","text":"It is sunny."}]}],
		"tools":[{"type":"function","name":"get_weather","parameters":{"type":"object"}},{"type":"web_search"}]}`)
	roles := []string{}
	for _, m := range in.Messages {
		roles = append(roles, m.Role)
	}
	assert.Equal(t, []string{"system", "user", "assistant", "tool", "assistant"}, roles)
	assert.Contains(t, in.Messages[1].Content, "<|switchyard:image:")
	assert.True(t, in.Messages[2].NullContent, "a function call is an assistant turn without content")
	assert.Contains(t, string(in.Messages[2].Raw), `"tool_calls"`)
	assert.Contains(t, string(in.Messages[3].Raw), `"tool_call_id":"c1"`)
	require.Len(t, in.Tools, 1, "only function tools enter the template")
	assert.JSONEq(t, `{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}`, string(in.Tools[0]))

	s := parse(t, KindResponse, `{"input":"hello"}`)
	require.Len(t, s.Messages, 1)
	assert.Equal(t, Message{Role: "user", Content: "hello", Raw: s.Messages[0].Raw}, s.Messages[0])
}

func TestLocalTokenizationAddsBOSToCompletionsButNotToChats(t *testing.T) {
	dir := testenv.Llama3Dir(t)
	r := registry(t, map[string]string{"llama": dir}, nil)
	m, path := r.Model("llama")
	require.NotNil(t, m)
	assert.Equal(t, PathLocal, path)
	require.Equal(t, []uint32{128000}, m.BOS, "Llama 3 adds <|begin_of_text|>")
	tok, err := tokenizer.Open(filepath.Join(dir, "tokenizer.json"))
	require.NoError(t, err)

	res, err := r.Tokenize(context.Background(), "llama", parse(t, KindCompletion, `{"prompt":"Hello world"}`), nil)
	require.NoError(t, err)
	assert.Equal(t, append([]uint32{128000}, tok.Encode("Hello world")...), res.IDs.Slice())
	res, err = r.Tokenize(context.Background(), "llama", parse(t, KindCompletion, `{"prompt":"Hello world","add_special_tokens":false}`), nil)
	require.NoError(t, err)
	assert.Equal(t, tok.Encode("Hello world"), res.IDs.Slice())

	chatIn := parse(t, KindChat, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hi"}]}`)
	res, err = r.Tokenize(context.Background(), "llama", chatIn, nil)
	require.NoError(t, err)
	text, err := m.Template.Render(chatIn)
	require.NoError(t, err)
	assert.True(t, strings.HasPrefix(text, "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nbe brief<|eot_id|>"), text)
	assert.True(t, strings.HasSuffix(text, "<|start_header_id|>assistant<|end_header_id|>\n\n"), "the generation prompt is added by default")
	assert.Equal(t, tok.Encode(text), res.IDs.Slice(), "the template writes BOS, the tokenizer adds none")
	assert.Equal(t, uint32(128000), res.IDs.Slice()[0])
	assert.NotEqual(t, uint32(128000), res.IDs.Slice()[1], "BOS once, not twice")
}

func TestBatchedPromptsHashTheFirstAndBookEveryToken(t *testing.T) {
	r := registry(t, map[string]string{"m": "tiktoken:cl100k_base"}, nil)
	m, _ := r.Model("m")
	require.NotNil(t, m)
	res, err := r.Tokenize(context.Background(), "m", parse(t, KindCompletion, `{"prompt":["one two three","four five six seven eight"]}`), nil)
	require.NoError(t, err)
	a, b := m.Encode("one two three"), m.Encode("four five six seven eight")
	assert.Equal(t, a, res.IDs.Slice(), "the prefix is the first prompt's")
	assert.Equal(t, len(a)+len(b), res.Total, "the load is every prompt's")
	assert.Equal(t, max(len(a), len(b)), res.Longest)

	ids, err := r.Tokenize(context.Background(), "m", parse(t, KindCompletion, `{"prompt":[[1,2,3],[4,5]]}`), nil)
	require.NoError(t, err)
	assert.Equal(t, Result{IDs: tokenizer.IDs{Head: []uint32{1, 2, 3}}, Total: 5, Longest: 3}, ids, "token ids need no tokenizer")
}

func TestToolsAndToolCallsEnterTheTemplate(t *testing.T) {
	// A template that shows what it is given: the tool definitions, each
	// call with its arguments (a JSON string in the request, an object for
	// the template, as vLLM passes them), and the tool message's call id.
	tmpl, err := chat.Parse(`{%- if tools %}TOOLS {{ tools | tojson }}
{% endif -%}
{%- for m in messages %}[{{ m.role }}]{% if m.tool_calls %}{% for c in m.tool_calls %} CALL {{ c.function.name }} {{ c.function.arguments | tojson }} {{ c.function.arguments.city }}{% endfor %}{% else %}{{ m.content }}{% endif %}{% if m.tool_call_id %} (for {{ m.tool_call_id }}){% endif %}
{% endfor %}`)
	require.NoError(t, err)
	ct := &chatTemplate{t: tmpl, vars: map[string]any{}}
	in := parse(t, KindChat, `{"messages":[{"role":"user","content":"weather in Paris?"},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"sunny"}],
		"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}]}`)
	text, err := ct.Render(in)
	require.NoError(t, err)
	// (trim_blocks, as transformers renders, eats the newline after each
	// block tag; the tool shows "description": null as vLLM's pydantic
	// model_dump hands it to the template.)
	assert.Equal(t, `TOOLS [{"type": "function", "function": {"name": "get_weather", "description": null, "parameters": {"type": "object"}}}]
[user]weather in Paris?[assistant] CALL get_weather {"city": "Paris"} Paris[tool]sunny (for c1)`, text)
}

// vllmTokenizer is a real HTTP server answering vLLM's POST /tokenize with
// a real tokenizer (chats rendered with ChatML).
func vllmTokenizer(t *testing.T, tok *tokenizer.Model, fail *atomic.Bool) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		if r.URL.Path != "/tokenize" || r.Method != http.MethodPost || fail.Load() {
			http.Error(w, `{"error":{"message":"no"}}`, http.StatusNotFound)
			return
		}
		var req struct {
			Model               string           `json:"model"`
			Prompt              *string          `json:"prompt"`
			Messages            []map[string]any `json:"messages"`
			AddGenerationPrompt bool             `json:"add_generation_prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Model == "" {
			http.Error(w, "bad request", http.StatusBadRequest)
			return
		}
		var ids []uint32
		if req.Prompt != nil {
			ids = tok.Encode(*req.Prompt)
		} else {
			msgs := make([]any, len(req.Messages))
			for i, m := range req.Messages {
				msgs[i] = m
			}
			text, err := chat.ChatML().Render(chat.Input{Messages: msgs, AddGenerationPrompt: req.AddGenerationPrompt})
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			ids = tok.Encode(text)
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"count": len(ids), "max_model_len": 8192, "tokens": ids})
	}))
	t.Cleanup(srv.Close)
	return srv, &calls
}

func TestAModelWithoutATokenizerAsksItsEngineThenCachesTheAnswer(t *testing.T) {
	tok, err := tokenizer.Open("tiktoken:cl100k_base")
	require.NoError(t, err)
	var fail atomic.Bool
	srv, calls := vllmTokenizer(t, tok, &fail)
	reg := prometheus.NewRegistry()
	now := time.Unix(1000, 0)
	cfg := DefaultConfig()
	r, err := NewRegistry(cfg, Deps{Now: func() time.Time { return now }}, zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	ctx := context.Background()

	in := parse(t, KindChat, `{"messages":[{"role":"user","content":"What is a switchyard?"}]}`)
	res, err := r.Tokenize(ctx, "remote", in, []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, PathEngine, res.Path)
	want := tok.Encode("<|im_start|>user\nWhat is a switchyard?<|im_end|>\n<|im_start|>assistant\n")
	assert.Equal(t, want, res.IDs.Slice(), "the engine's ids")
	_, err = r.Tokenize(ctx, "remote", parse(t, KindChat, `{"messages":[{"role":"user","content":"What is a switchyard?"}]}`), []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, int64(1), calls.Load(), "the same prompt part is answered from the cache")

	comp, err := r.Tokenize(ctx, "remote", parse(t, KindCompletion, `{"prompt":"plain text"}`), []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, tok.Encode("plain text"), comp.IDs.Slice())

	fail.Store(true)
	other := parse(t, KindCompletion, `{"prompt":"an engine that refuses"}`)
	res, err = r.Tokenize(ctx, "remote", other, []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, PathApproximate, res.Path, "a failed engine call falls back to approximate hashing")
	before := calls.Load()
	_, err = r.Tokenize(ctx, "remote", parse(t, KindCompletion, `{"prompt":"another one"}`), []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, before, calls.Load(), "within the back-off the engine is not asked again")
	now = now.Add(cfg.EngineBackoff)
	fail.Store(false)
	res, err = r.Tokenize(ctx, "remote", other, []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, PathEngine, res.Path, "after the back-off the engine is asked again")

	assert.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_router_tokenize_total Requests tokenized, by model and path (local, fetched, engine, approximate).
# TYPE switchyard_router_tokenize_total counter
switchyard_router_tokenize_total{model="remote",path="approximate"} 2
switchyard_router_tokenize_total{model="remote",path="engine"} 4
`)))
}

func TestAnEngineThatDoesNotAnswerInTimeFallsBackToApproximate(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	cfg := DefaultConfig()
	cfg.EngineTimeout = 20 * time.Millisecond
	r, err := NewRegistry(cfg, Deps{}, zaptest.NewLogger(t), nil)
	require.NoError(t, err)
	res, err := r.Tokenize(context.Background(), "slow", parse(t, KindCompletion, `{"prompt":"hello"}`), []string{srv.URL})
	require.NoError(t, err)
	assert.Equal(t, PathApproximate, res.Path)
}

func TestApproximateHashingKeepsEqualPrefixesEqual(t *testing.T) {
	r := registry(t, nil, nil)
	shared := strings.Repeat("You are a helpful assistant. ", 20)
	a, err := r.Tokenize(context.Background(), "none", parse(t, KindCompletion, `{"prompt":"`+shared+`first"}`), nil)
	require.NoError(t, err)
	b, err := r.Tokenize(context.Background(), "none", parse(t, KindCompletion, `{"prompt":"`+shared+`second question"}`), nil)
	require.NoError(t, err)
	assert.Equal(t, PathApproximate, a.Path)
	n := len(shared) / approxBytes
	assert.Equal(t, a.IDs.Slice()[:n], b.IDs.Slice()[:n], "the shared text gives shared pseudo-tokens")
	assert.NotEqual(t, a.IDs.Slice()[n:], b.IDs.Slice()[n:len(a.IDs.Slice())])
	assert.Equal(t, (len(shared)+len("first")+3)/4, a.Total, "one pseudo-token per 4 bytes")
}

// tokenizerFiles serves Llama 3's files as an adapter would, from a server
// that start makes (httptest.NewServer, or NewTLSServer for an HTTPS one).
func tokenizerFiles(t *testing.T, dir string, start func(http.Handler) *httptest.Server) (*httptest.Server, wire.TokenizerSource) {
	t.Helper()
	names := []string{"tokenizer.json", "tokenizer_config.json"}
	var files [][]byte
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		require.NoError(t, err)
		files = append(files, b)
	}
	srv := start(http.StripPrefix("/tokenizer/", http.FileServer(http.Dir(dir))))
	t.Cleanup(srv.Close)
	return srv, wire.TokenizerSource{URL: srv.URL + "/tokenizer", Files: names, SHA256: Digest(names, files)}
}

// infoOf is r's ModelInfo of model (the zero value while it has none).
func infoOf(r *Registry, model string) ModelInfo {
	for _, mi := range r.Info() {
		if mi.Model == model {
			return mi
		}
	}
	return ModelInfo{}
}

func runRegistry(t *testing.T, r *Registry) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

func TestARouterFetchesAWorkersAdvertisedTokenizerAndChecksItsDigest(t *testing.T) {
	dir := testenv.Llama3Dir(t)
	_, src := tokenizerFiles(t, dir, httptest.NewServer)
	r := registry(t, nil, nil)
	runRegistry(t, r)
	bad := src
	bad.SHA256 = strings.Repeat("0", 64)
	r.SetAdvertised(map[string][]wire.TokenizerSource{"llama": {src}, "evil": {bad}})

	require.Eventually(t, func() bool { _, p := r.Model("llama"); return p == PathFetched }, 60*time.Second, 10*time.Millisecond,
		"the advertised files are fetched and loaded")
	local, err := OpenSpec(dir, 0)
	require.NoError(t, err)
	res, err := r.Tokenize(context.Background(), "llama", parse(t, KindChat, `{"messages":[{"role":"user","content":"Hello there"}]}`), nil)
	require.NoError(t, err)
	assert.Equal(t, PathFetched, res.Path)
	text, err := local.Template.Render(parse(t, KindChat, `{"messages":[{"role":"user","content":"Hello there"}]}`))
	require.NoError(t, err)
	assert.Equal(t, local.Encode(text), res.IDs.Slice(), "fetched files tokenize exactly as the same files on disk")

	var evil ModelInfo
	require.Eventually(t, func() bool { evil = infoOf(r, "evil"); return evil.Error != "" }, 60*time.Second, 10*time.Millisecond)
	assert.Contains(t, evil.Error, "digest mismatch")
	m, _ := r.Model("evil")
	assert.Nil(t, m, "files whose digest differs from the advertised one are refused")
	res, err = r.Tokenize(context.Background(), "evil", parse(t, KindCompletion, `{"prompt":"hi"}`), nil)
	require.NoError(t, err)
	assert.Equal(t, PathApproximate, res.Path)
	llama := infoOf(r, "llama")
	assert.Equal(t, ModelInfo{Model: "llama", Source: SourceWorker, Spec: "fetched:" + src.URL, Path: "fetched", Digest: src.SHA256,
		Describe: llama.Describe}, llama)
}

func TestAWorkerMayAdvertiseOnlyBuiltInSpecs(t *testing.T) {
	r := registry(t, nil, nil)
	runRegistry(t, r)
	r.SetAdvertised(map[string][]wire.TokenizerSource{"sim": {{Spec: "tiktoken:o200k_base"}}, "sneaky": {{Spec: "/etc"}}})
	require.Eventually(t, func() bool { m, _ := r.Model("sim"); return m != nil }, 60*time.Second, 10*time.Millisecond)
	m, _ := r.Model("sneaky")
	assert.Nil(t, m)
	sneaky := infoOf(r, "sneaky")
	assert.Contains(t, sneaky.Error, "not built in")
}

func TestAFlagSpecThatDoesNotLoadIsAStartupErrorNamingIt(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Tokenizers = map[string]string{"m": filepath.Join(t.TempDir(), "missing")}
	_, err := NewRegistry(cfg, Deps{}, zap.NewNop(), nil)
	require.ErrorIs(t, err, ErrBadSpec)
	assert.Contains(t, err.Error(), "model m")
	cfg.Tokenizers = map[string]string{"m": "tiktoken:nope"}
	_, err = NewRegistry(cfg, Deps{}, zap.NewNop(), nil)
	require.ErrorIs(t, err, ErrBadSpec)
}

func TestIncrementalChatTokenizationEqualsFullTokenization(t *testing.T) {
	m, err := OpenSpec("tiktoken:o200k_base", 1<<20)
	require.NoError(t, err)
	var msgs []string
	for turn := range 12 {
		msgs = append(msgs, `{"role":"user","content":"question `+strings.Repeat("x", turn)+` number `+string(rune('a'+turn))+`?"}`,
			`{"role":"assistant","content":"answer  with  spaces\n\n"}`)
		in := parse(t, KindChat, `{"messages":[`+strings.Join(msgs, ",")+`]}`)
		text, err := m.Template.Render(in)
		require.NoError(t, err)
		require.Equal(t, m.Encode(text), m.encodeChat(text), "turn %d", turn)
	}
}

func TestParseTokenizersReadsNameEqualsSpecLists(t *testing.T) {
	got, err := ParseTokenizers("a=tiktoken:o200k_base, b=/models/llama")
	require.NoError(t, err)
	assert.Equal(t, map[string]string{"a": "tiktoken:o200k_base", "b": "/models/llama"}, got)
	_, err = ParseTokenizers("nospec")
	assert.True(t, errors.Is(err, ErrBadSpec))
}

// FuzzParse: no request body makes the prompt parser panic; every refusal
// is a *RequestError naming a field.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi"}`, `{"prompt":[1,2]}`, `{"prompt":[[1],[2,3]]}`, `{"prompt":["a","b"]}`,
		`{"messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"x"}},{"type":"text","text":"a"}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[]}],"tools":[{"type":"function"}]}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"}],"instructions":"x"}`,
		`{"input":"x","chat_template_kwargs":{"a":1}}`, `{"messages":[{}]}`, `{"input":[{}]}`, `{}`,
	} {
		for k := KindCompletion; k <= KindResponse; k++ {
			f.Add([]byte(s), uint8(k))
		}
	}
	r, err := NewRegistry(DefaultConfig(), Deps{}, zap.NewNop(), nil)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte, k uint8) {
		var fl Fields
		if json.Unmarshal(body, &fl) != nil {
			return
		}
		kind := Kind(k%4 + 1)
		in, err := Parse(kind, &fl)
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) || re.Message == "" {
				t.Fatalf("refusal is not a described RequestError: %v", err)
			}
			return
		}
		if _, err := r.Tokenize(context.Background(), "m", in, nil); err != nil {
			t.Fatalf("approximate tokenization of an accepted prompt failed: %v", err)
		}
	})
}

// FuzzDecodeTokenizeResponse: an engine's /tokenize answer never panics the
// decoder, and accepted ids are what the answer said.
func FuzzDecodeTokenizeResponse(f *testing.F) {
	for _, s := range []string{`{"count":2,"max_model_len":10,"tokens":[1,2]}`, `{"tokens":[]}`, `{"tokens":[-1]}`,
		`{"tokens":[4294967296]}`, `{"tokens":"x"}`, `{}`, `[]`, ``} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		ids, err := decodeTokenizeResponse(raw)
		if err != nil {
			if !errors.Is(err, ErrEngine) {
				t.Fatalf("error does not wrap ErrEngine: %v", err)
			}
			return
		}
		var v struct{ Tokens []int64 }
		if json.Unmarshal(raw, &v) != nil || len(v.Tokens) != len(ids) {
			t.Fatalf("accepted %q as %v", raw, ids)
		}
	})
}

func TestPlainMessagesRenderExactlyAsTheirDecodedObjects(t *testing.T) {
	// tojson of the whole message shows its keys in order: the fast path
	// for role-and-content messages must keep the client's order.
	tmpl, err := chat.Parse(`{% for m in messages %}{{ m | tojson }}|{{ m.content }}
{% endfor %}`)
	require.NoError(t, err)
	ct := &chatTemplate{t: tmpl, vars: map[string]any{}}
	in := parse(t, KindChat, `{"messages":[{"role":"user","content":"a \"quoted\" word"},{"content":"b","role":"assistant"},
		{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"u"}}]},
		{"role":"assistant","content":"c","name":"bot"},{"role":"user","content":null}]}`)
	plain := []bool{}
	for _, m := range in.Messages {
		plain = append(plain, m.plain)
	}
	assert.Equal(t, []bool{true, true, true, false, true}, plain)
	fast, err := ct.Render(in)
	require.NoError(t, err)
	for i := range in.Messages {
		in.Messages[i].plain = false
	}
	slow, err := ct.Render(in)
	require.NoError(t, err)
	assert.Equal(t, slow, fast)
	assert.Contains(t, fast, `{"role": "assistant", "content": "b"}`, "vLLM rebuilds messages as role, then content")
	assert.Contains(t, fast, `{"role": "assistant", "content": "c", "name": "bot"}`)
}

func TestDigestFramesEachFileByNameAndLength(t *testing.T) {
	// wire.TokenizerSource.SHA256: name, NUL, 8-byte little-endian length,
	// bytes, per file in order.
	frame := []byte("a.json\x00\x02\x00\x00\x00\x00\x00\x00\x00{}b\x00\x00\x00\x00\x00\x00\x00\x00\x00")
	sum := sha256.Sum256(frame)
	assert.Equal(t, hex.EncodeToString(sum[:]), Digest([]string{"a.json", "b"}, [][]byte{[]byte("{}"), nil}))
	assert.NotEqual(t, Digest([]string{"a", "b"}, [][]byte{[]byte("xy"), nil}), Digest([]string{"a", "b"}, [][]byte{[]byte("x"), []byte("y")}),
		"moving bytes between files changes the digest")
}

func TestTokenizerFilesAtAnHTTPSAdapterAreFetchedWithTheGivenTLSAndOnlyWithIt(t *testing.T) {
	dir := testenv.Llama3Dir(t)
	srv, src := tokenizerFiles(t, dir, httptest.NewTLSServer)
	trusting := srv.Client().Transport.(*http.Transport).TLSClientConfig

	// Without the adapter's CA the system's roots refuse it.
	untrusting := registry(t, nil, nil)
	runRegistry(t, untrusting)
	untrusting.SetAdvertised(map[string][]wire.TokenizerSource{"llama": {src}})
	var failed ModelInfo
	require.Eventually(t, func() bool { failed = infoOf(untrusting, "llama"); return failed.Error != "" }, 60*time.Second, 10*time.Millisecond)
	assert.Contains(t, failed.Error, "certificate")

	r, err := NewRegistry(DefaultConfig(), Deps{TLS: trusting}, zaptest.NewLogger(t), nil)
	require.NoError(t, err)
	runRegistry(t, r)
	r.SetAdvertised(map[string][]wire.TokenizerSource{"llama": {src}})
	require.Eventually(t, func() bool { _, p := r.Model("llama"); return p == PathFetched }, 60*time.Second, 10*time.Millisecond,
		"fetched over HTTPS with the given TLS configuration")
}
