package app

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/wire"
)

const testModel = "sim-model"

// runningWorker is a worker started in-process by a test. The cluster tests
// (cluster_test.go) start their workers with the same helpers.
type runningWorker struct {
	url    string
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan error
}

func testWorkerConfig() WorkerConfig {
	cfg := DefaultWorkerConfig()
	cfg.ID = "w1"
	cfg.Cluster = "test"
	cfg.Model = testModel
	cfg.Listen = "127.0.0.1:0"
	cfg.Engine.NumBlocks = 4096
	cfg.Engine.Speedup = 100
	return cfg
}

// startWorker runs RunWorker until the test ends (or stop is called).
func startWorker(t *testing.T, cfg WorkerConfig) *runningWorker {
	t.Helper()
	ready := make(chan string, 1)
	cfg.Ready = func(url string) { ready <- url }
	ctx, cancel := context.WithCancel(context.Background())
	w := &runningWorker{reg: prometheus.NewRegistry(), cancel: cancel, done: make(chan error, 1)}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	go func() { w.done <- RunWorker(ctx, cfg, log, w.reg) }()
	select {
	case w.url = <-ready:
	case err := <-w.done:
		cancel()
		t.Fatalf("worker did not start: %v", err)
	}
	t.Cleanup(func() { _ = w.stop() })
	return w
}

// stop cancels the worker and returns RunWorker's result.
func (w *runningWorker) stop() error {
	w.cancel()
	err, ok := <-w.done
	if ok {
		close(w.done)
	}
	return err
}

func (w *runningWorker) client() openai.Client {
	return openai.NewClient(option.WithBaseURL(w.url+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// metric reads a worker metric from the registry, summed over its series.
func (w *runningWorker) metric(t *testing.T, name string) float64 {
	t.Helper()
	mfs, err := w.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var sum float64
		for _, m := range mf.GetMetric() {
			sum += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
		return sum
	}
	t.Fatalf("metric %s not found", name)
	return 0
}

// workerLongPrompt is about 700 tokens of text.
func workerLongPrompt(topic string) string {
	var b strings.Builder
	for i := range 120 {
		fmt.Fprintf(&b, "%s paragraph %d explains routing, caching and batching. ", topic, i)
	}
	return b.String()
}

func TestWorkerServesTheOfficialOpenAIClient(t *testing.T) {
	w := startWorker(t, testWorkerConfig())
	client := w.client()
	ctx := testenv.Context(t)

	t.Run("completions without streaming", func(t *testing.T) {
		c, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     testModel,
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Say hello")},
			MaxTokens: openai.Int(5),
		})
		require.NoError(t, err)
		require.Len(t, c.Choices, 1)
		assert.Equal(t, "text_completion", string(c.Object))
		assert.NotEmpty(t, c.Choices[0].Text)
		assert.Equal(t, "length", string(c.Choices[0].FinishReason))
		assert.Equal(t, int64(5), c.Usage.CompletionTokens)
		assert.Equal(t, int64(len(simTokens(t, testModel, prompt.KindCompletion, `{"prompt":"Say hello"}`))), c.Usage.PromptTokens)
	})

	t.Run("completions streaming with usage", func(t *testing.T) {
		s := client.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         testModel,
			Prompt:        openai.CompletionNewParamsPromptUnion{OfArrayOfTokens: []int64{300, 301, 302, 303}},
			MaxTokens:     openai.Int(7),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		var text strings.Builder
		var usage openai.CompletionUsage
		chunks := 0
		for s.Next() {
			c := s.Current()
			for _, ch := range c.Choices {
				text.WriteString(ch.Text)
				chunks++
			}
			if c.Usage.TotalTokens > 0 {
				usage = c.Usage
			}
		}
		require.NoError(t, s.Err())
		assert.Equal(t, 7, chunks, "one chunk per token")
		assert.Equal(t, int64(7), usage.CompletionTokens)
		assert.Equal(t, int64(4), usage.PromptTokens, "token-array prompts are used as they are")
		assert.NotEmpty(t, text.String())
	})

	t.Run("chat without streaming", func(t *testing.T) {
		c, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:     testModel,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.SystemMessage("be brief"), openai.UserMessage("Hello")},
			MaxTokens: openai.Int(4),
		})
		require.NoError(t, err)
		require.Len(t, c.Choices, 1)
		assert.Equal(t, "assistant", string(c.Choices[0].Message.Role))
		assert.NotEmpty(t, c.Choices[0].Message.Content)
		want := simTokens(t, testModel, prompt.KindChat, `{"messages":[{"role":"system","content":"be brief"},{"role":"user","content":"Hello"}]}`)
		assert.Equal(t, int64(len(want)), c.Usage.PromptTokens, "chat prompts use the model's template and tokenizer")
	})

	t.Run("chat streaming with usage", func(t *testing.T) {
		s := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:         testModel,
			Messages:      []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Stream please")},
			MaxTokens:     openai.Int(6),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		acc := openai.ChatCompletionAccumulator{}
		for s.Next() {
			acc.AddChunk(s.Current())
		}
		require.NoError(t, s.Err())
		require.Len(t, acc.Choices, 1)
		assert.NotEmpty(t, acc.Choices[0].Message.Content)
		assert.Equal(t, "length", acc.Choices[0].FinishReason)
		assert.Equal(t, int64(6), acc.Usage.CompletionTokens)
	})

	t.Run("a repeated long prompt reports cached tokens", func(t *testing.T) {
		p := workerLongPrompt("cache")
		params := openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(2),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(p)}}
		first, err := client.Completions.New(ctx, params)
		require.NoError(t, err)
		second, err := client.Completions.New(ctx, params)
		require.NoError(t, err)
		assert.Zero(t, first.Usage.PromptTokensDetails.CachedTokens)
		n := len(simTokens(t, testModel, prompt.KindCompletion, `{"prompt":"`+p+`"}`))
		assert.Equal(t, int64((n-1)/16*16), second.Usage.PromptTokensDetails.CachedTokens,
			"every full block but a last one that must be recomputed")
	})
}

func TestWorkerRegistersInEtcdPublishesOnNATSAndDeregistersOnStop(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	nt := testenv.StartNATS(t)
	cli := etcd.Client(t)
	nc := nt.Conn(t)
	subj := wire.NewSubjects("test")
	kvSub, err := nc.SubscribeSync(subj.KV("w1"))
	require.NoError(t, err)
	loadSub, err := nc.SubscribeSync(subj.Load("w1"))
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	cfg := testWorkerConfig()
	cfg.EtcdEndpoints = etcd.Endpoints
	cfg.NATSURL = nt.URL
	w := startWorker(t, cfg)
	ctx := testenv.Context(t)
	key := wire.NewKeys("test").Worker("w1")

	resp, err := cli.Get(ctx, key)
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the worker is registered once ready")
	info, err := wire.DecodeWorkerInfo(resp.Kvs[0].Value)
	require.NoError(t, err)
	assert.Equal(t, w.url, info.URL)
	assert.Equal(t, testModel, info.Model)
	assert.Equal(t, 16, info.BlockSize)
	assert.Equal(t, 4096, info.KVBlocks)
	assert.True(t, info.PublishesEvents)
	assert.NotZero(t, resp.Kvs[0].Lease, "the workerRegistration is lease-bound")

	p := workerLongPrompt("events")
	client := w.client()
	_, err = client.Completions.New(ctx, openai.CompletionNewParams{Model: testModel, MaxTokens: openai.Int(3),
		Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String(p)}})
	require.NoError(t, err)

	// The prompt's blocks arrive as stored events keyed like the router's hashes.
	want := kvindex.SequenceHashes(simTokens(t, testModel, prompt.KindCompletion, `{"prompt":"`+p+`"}`), 16, kvindex.ModelSeed(testModel))
	stored := map[uint64]bool{}
	var lastID uint64
	var instance uint64
	for !hasAllHashes(stored, want) {
		msg, err := kvSub.NextMsg(5 * time.Second)
		require.NoError(t, err, "kv events did not arrive")
		b, err := wire.DecodeKVEventBatch(msg.Data)
		require.NoError(t, err)
		assert.Equal(t, lastID+1, b.FirstID, "event ids continue")
		lastID, instance = b.LastID(), b.Instance
		for _, ev := range b.Events {
			if ev.Kind == wire.KVStored {
				for _, h := range ev.Hashes {
					stored[h] = true
				}
			}
		}
	}

	// A dump, in small chunks, holds the same blocks.
	inbox := nats.NewInbox()
	dumpSub, err := nc.SubscribeSync(inbox)
	require.NoError(t, err)
	require.NoError(t, nc.PublishRequest(subj.KVDump("w1"), inbox, wire.EncodeKVDumpRequest(&wire.KVDumpRequest{MaxBlocksPerChunk: 8})))
	dumped := map[uint64]bool{}
	for seq := uint32(0); ; seq++ {
		msg, err := dumpSub.NextMsg(5 * time.Second)
		require.NoError(t, err, "dump chunk %d did not arrive", seq)
		c, err := wire.DecodeKVDumpChunk(msg.Data)
		require.NoError(t, err)
		assert.Equal(t, seq, c.Seq)
		assert.LessOrEqual(t, len(c.Hashes), 8)
		assert.Equal(t, instance, c.Instance)
		assert.GreaterOrEqual(t, c.AsOfID, lastID)
		for _, h := range c.Hashes {
			dumped[h] = true
		}
		if c.Final {
			break
		}
	}
	assert.True(t, hasAllHashes(dumped, want), "the dump holds the prompt's blocks")

	msg, err := loadSub.NextMsg(5 * time.Second)
	require.NoError(t, err, "no load report")
	lr, err := wire.DecodeLoadReport(msg.Data)
	require.NoError(t, err)
	assert.Equal(t, "w1", lr.Worker)
	assert.Equal(t, 4096, lr.KVBlocksTotal)

	require.NoError(t, w.stop())
	resp, err = cli.Get(ctx, key)
	require.NoError(t, err)
	assert.Empty(t, resp.Kvs, "the workerRegistration is gone once the worker stopped")
}

func hasAllHashes(set map[uint64]bool, hs []uint64) bool {
	for _, h := range hs {
		if !set[h] {
			return false
		}
	}
	return true
}

func TestShutdownDeregistersFirstAndDrainsInFlightStreams(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	cli := etcd.Client(t)
	cfg := testWorkerConfig()
	cfg.EtcdEndpoints = etcd.Endpoints
	cfg.Engine.Speedup = 1 // ~6 ms per token: the stream outlives the stop request
	w := startWorker(t, cfg)
	ctx := testenv.Context(t)

	body := `{"model":"sim-model","prompt":"drain me","max_tokens":40,"stream":true}`
	resp, err := http.Post(w.url+"/v1/completions", "application/json", strings.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	sc := bufio.NewScanner(resp.Body)
	require.True(t, nextSSEData(sc) != "", "first chunk")

	stopped := make(chan error, 1)
	go func() { stopped <- w.stop() }()
	testenv.Eventually(t, 5*time.Second, func() bool {
		r, err := cli.Get(ctx, wire.NewKeys("test").Worker("w1"))
		return err == nil && len(r.Kvs) == 0
	}, "the worker deregisters as soon as it is asked to stop")

	tokens := 1
	for {
		d := nextSSEData(sc)
		require.NotEmpty(t, d, "the stream ended without [DONE]")
		if d == "[DONE]" {
			break
		}
		tokens++
	}
	assert.Equal(t, 40, tokens, "the in-flight stream completes during the grace period")
	assert.NoError(t, <-stopped)
}

// nextSSEData returns the next SSE data payload, or "" at the end.
func nextSSEData(sc *bufio.Scanner) string {
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
			return d
		}
	}
	return ""
}

func TestClientDisconnectCancelsTheRequestAndFreesItsBlocks(t *testing.T) {
	cfg := testWorkerConfig()
	cfg.Engine.Speedup = 1 // 2000 tokens take ~12 s: only the cancel can end it in time
	w := startWorker(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	body := `{"model":"sim-model","prompt":"` + workerLongPrompt("gone") + `","max_tokens":2000,"stream":true}`
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.url+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	require.NotEmpty(t, nextSSEData(bufio.NewScanner(resp.Body)))
	require.Positive(t, w.metric(t, "switchyard_engine_kv_blocks_used"))

	cancel()
	testenv.Eventually(t, 5*time.Second, func() bool {
		return w.metric(t, "switchyard_engine_cancelled_requests_total") == 1
	}, "the engine cancels the request when its client goes away")
	assert.Zero(t, w.metric(t, "switchyard_engine_running_requests"))
	assert.Zero(t, w.metric(t, "switchyard_engine_kv_blocks_used"), "its blocks are free (cached ones stay reusable)")
}

func TestBadRequestsGetOpenAIShapedErrors(t *testing.T) {
	cfg := testWorkerConfig()
	cfg.MaxBodyBytes = 4096
	cfg.Engine.MaxModelLen = 1000
	w := startWorker(t, cfg)
	cases := []struct {
		name, path, body string
		status           int
		code, param      string
	}{
		{"invalid JSON", "/v1/completions", `{"model":`, 400, "invalid_json", ""},
		{"no model", "/v1/completions", `{"prompt":"x"}`, 400, "missing_required_parameter", "model"},
		{"unknown model", "/v1/completions", `{"model":"other","prompt":"x"}`, 404, "model_not_found", "model"},
		{"no prompt", "/v1/completions", `{"model":"sim-model"}`, 400, "missing_required_parameter", "prompt"},
		{"prompt of wrong type", "/v1/completions", `{"model":"sim-model","prompt":{}}`, 400, "invalid_type", "prompt"},
		{"a batch mixing strings and ids", "/v1/completions", `{"model":"sim-model","prompt":["a",[1]]}`, 400, "invalid_type", "prompt[1]"},
		{"negative token id", "/v1/completions", `{"model":"sim-model","prompt":[1,-2]}`, 400, "invalid_value", "prompt[1]"},
		{"zero max_tokens", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":0}`, 400, "invalid_value", "max_tokens"},
		{"too long", "/v1/completions", `{"model":"sim-model","prompt":"x","max_tokens":5000}`, 400, "context_length_exceeded", "max_tokens"},
		{"n above the bound", "/v1/completions", `{"model":"sim-model","prompt":"x","n":129}`, 400, "invalid_value", "n"},
		{"n of zero", "/v1/completions", `{"model":"sim-model","prompt":"x","n":0}`, 400, "invalid_value", "n"},
		{"best_of above n", "/v1/completions", `{"model":"sim-model","prompt":"x","n":2,"best_of":3}`, 400, "invalid_value", "best_of"},
		{"no messages", "/v1/chat/completions", `{"model":"sim-model","messages":[]}`, 400, "invalid_value", "messages"},
		{"content part without a type", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":[{"text":"a"}]}]}`, 400, "invalid_type", "messages[0].content[0]"},
		{"embeddings without input", "/v1/embeddings", `{"model":"sim-model"}`, 400, "missing_required_parameter", "input"},
		{"temperature above 2", "/v1/completions", `{"model":"sim-model","prompt":"x","temperature":2.5}`, 400, "invalid_value", "temperature"},
		{"completion logprobs", "/v1/completions", `{"model":"sim-model","prompt":"x","logprobs":5}`, 400, "invalid_value", "logprobs"},
		{"chat logprobs", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"a"}],"logprobs":true}`, 400, "invalid_value", "logprobs"},
		{"json response format", "/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"a"}],"response_format":{"type":"json_object"}}`, 400, "invalid_value", "response_format"},
		{"body too large", "/v1/completions", `{"model":"sim-model","prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, "body_too_large", ""},
		{"unknown route", "/v1/audio/speech", `{}`, 404, "not_found", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp, err := http.Post(w.url+c.path, "application/json", strings.NewReader(c.body))
			require.NoError(t, err)
			defer resp.Body.Close()
			assert.Equal(t, c.status, resp.StatusCode)
			var e struct {
				Error struct {
					Message string `json:"message"`
					Type    string `json:"type"`
					Param   any    `json:"param"`
					Code    string `json:"code"`
				} `json:"error"`
			}
			require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
			assert.Equal(t, c.code, e.Error.Code)
			assert.NotEmpty(t, e.Error.Message)
			assert.NotEmpty(t, e.Error.Type)
			if c.param != "" {
				assert.Equal(t, c.param, e.Error.Param)
			}
		})
	}
	assert.Equal(t, float64(len(cases)-1), w.metric(t, "switchyard_worker_http_requests_total"),
		"every rejected API request is counted (the unknown route is not an API request)")
}

func TestModelsHealthAndMetricsEndpoints(t *testing.T) {
	w := startWorker(t, testWorkerConfig())
	client := w.client()
	models, err := client.Models.List(testenv.Context(t))
	require.NoError(t, err)
	require.Len(t, models.Data, 1)
	assert.Equal(t, testModel, models.Data[0].ID)
	for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ready", "/metrics": "switchyard_engine_kv_blocks_total"} {
		resp, err := http.Get(w.url + path)
		require.NoError(t, err)
		b := new(strings.Builder)
		_, _ = bufio.NewReader(resp.Body).WriteTo(b)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, path)
		assert.Contains(t, b.String(), want, path)
	}
}

func TestTheSimulatedEngineServesNSequencesAndSumsTheirUsageAsVLLMDoes(t *testing.T) {
	w := startWorker(t, testWorkerConfig())
	var one, three struct {
		Choices []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	for _, c := range []struct {
		body string
		out  any
	}{
		{`{"model":"sim-model","prompt":"the same prompt","max_tokens":5}`, &one},
		{`{"model":"sim-model","prompt":"the same prompt","max_tokens":5,"n":3}`, &three},
	} {
		resp, err := http.Post(w.url+"/v1/completions", "application/json", strings.NewReader(c.body))
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
		require.NoError(t, json.Unmarshal(b, c.out))
	}
	require.Len(t, three.Choices, 3)
	for i, ch := range three.Choices {
		assert.Equal(t, i, ch.Index)
	}
	assert.Equal(t, one.Usage.PromptTokens, three.Usage.PromptTokens, "the prompt counts once")
	assert.Equal(t, 3*one.Usage.CompletionTokens, three.Usage.CompletionTokens, "every sequence's output counts")

	// Streamed: every choice index appears, and the usage chunk sums them.
	resp, err := http.Post(w.url+"/v1/chat/completions", "application/json", strings.NewReader(
		`{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":4,"n":2,"stream":true,"stream_options":{"include_usage":true}}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	seen := map[int]bool{}
	completion := 0
	sc := bufio.NewScanner(resp.Body)
	for d := nextSSEData(sc); d != "" && d != "[DONE]"; d = nextSSEData(sc) {
		var chunk struct {
			Choices []struct {
				Index int `json:"index"`
			} `json:"choices"`
			Usage *struct {
				CompletionTokens int `json:"completion_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(d), &chunk), d)
		for _, c := range chunk.Choices {
			seen[c.Index] = true
		}
		if chunk.Usage != nil {
			completion = chunk.Usage.CompletionTokens
		}
	}
	assert.Equal(t, map[int]bool{0: true, 1: true}, seen)
	assert.Equal(t, 8, completion)
}

func TestTheSimulatedWorkerRejectsSamplingItCannotHonourWithVLLMsMessages(t *testing.T) {
	w := startWorker(t, testWorkerConfig())
	chat := func(extra string) string {
		return `{"model":"sim-model","messages":[{"role":"user","content":"a"}],"max_tokens":2` + extra + `}`
	}
	completion := func(extra string) string { return `{"model":"sim-model","prompt":"a","max_tokens":2` + extra + `}` }
	rejected := []struct{ path, body, param, message string }{
		{"/v1/completions", completion(`,"temperature":3`), "temperature", "temperature must be in [0, 2], got 3.0. (parameter=temperature, value=3.0)"},
		{"/v1/chat/completions", chat(`,"temperature":-0.5`), "temperature", "temperature must be non-negative, got -0.5. (parameter=temperature, value=-0.5)"},
		{"/v1/completions", completion(`,"logprobs":3`), "logprobs", "Requested sample logprobs of 3, which is greater than max allowed: 0 (parameter=logprobs, value=3)"},
		{"/v1/completions", completion(`,"logprobs":-2`), "logprobs", "logprobs must be non-negative or -1, got -2. (parameter=logprobs, value=-2)"},
		{"/v1/chat/completions", chat(`,"logprobs":true,"top_logprobs":4`), "logprobs", "Requested sample logprobs of 4, which is greater than max allowed: 0 (parameter=logprobs, value=4)"},
		{"/v1/chat/completions", chat(`,"logprobs":true`), "logprobs", "the simulated engine computes no log probabilities: logprobs is not supported"},
		{"/v1/chat/completions", chat(`,"top_logprobs":2`), "top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true."},
		{"/v1/chat/completions", chat(`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{}}}`), "response_format",
			`response_format type "json_schema" is not supported by the simulated engine: it generates synthetic tokens and cannot constrain them (only "text")`},
	}
	for _, c := range rejected {
		resp, err := http.Post(w.url+c.path, "application/json", strings.NewReader(c.body))
		require.NoError(t, err)
		var e struct {
			Error struct {
				Message string `json:"message"`
				Param   string `json:"param"`
			} `json:"error"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&e))
		resp.Body.Close()
		require.Equal(t, http.StatusBadRequest, resp.StatusCode, c.body)
		require.Equal(t, c.param, e.Error.Param, c.body)
		require.Equal(t, c.message, e.Error.Message, c.body)
	}
	// What it can honour: any temperature vLLM accepts (the tokens are
	// synthetic either way), plain text, and no logprobs.
	for _, c := range []struct{ path, body string }{
		{"/v1/completions", completion(`,"temperature":0`)},
		{"/v1/completions", completion(`,"temperature":2,"logprobs":0`)},
		{"/v1/completions", completion(`,"logprobs":null`)},
		{"/v1/chat/completions", chat(`,"temperature":0.7,"logprobs":false,"response_format":{"type":"text"}`)},
	} {
		resp, err := http.Post(w.url+c.path, "application/json", strings.NewReader(c.body))
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, c.body)
	}
}
