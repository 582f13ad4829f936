package app

// The local cluster (RunUp, the wiring of `make up`) on its real embedded
// tokenizer: every request form through a router to simulated workers,
// with the official OpenAI Go client.

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/prompt"
)

// startUp runs RunUp with one replica until the test ends and returns the
// replica's address.
func startUp(t *testing.T, mutate func(*UpConfig)) string {
	t.Helper()
	cfg := upTestConfig(t, 1, 2)
	if mutate != nil {
		mutate(&cfg)
	}
	up := startUpRun(t, cfg)
	t.Cleanup(func() { up.stop(t) })
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	addr := ""
	for addr == "" && up.lines.Scan() {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
	}
	require.NotEmpty(t, addr, "up prints the replica's endpoint")
	up.drain()
	return addr
}

// repeatPredictsTheCache waits until the router at addr indexes the blocks
// KV blocks its first chat stored (events says how they get there), sends
// params again, and checks that the router predicted exactly the tokens the
// engine served from its cache (why says what that shows).
func repeatPredictsTheCache(t *testing.T, cl openai.Client, addr string, params openai.ChatCompletionNewParams, blocks int, events, why string) {
	t.Helper()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return metricSum(t, addr, "switchyard_index_blocks", nil) >= float64(blocks)
	}, events)
	predicted0 := metricSum(t, addr, "switchyard_router_predicted_cached_tokens_total", nil)
	second, err := cl.Chat.Completions.New(testenv.Context(t), params)
	require.NoError(t, err)
	predicted := metricSum(t, addr, "switchyard_router_predicted_cached_tokens_total", nil) - predicted0
	cached := second.Usage.PromptTokensDetails.CachedTokens
	assert.Greater(t, cached, int64(1000), "the engine served the repeated conversation from its cache")
	assert.Equal(t, float64(cached), predicted, why)
}

func upClient(addr string) openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+addr+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// metricSum scrapes addr's /metrics and sums the series of name whose labels
// include every pair of match.
func metricSum(t *testing.T, addr, name string, match map[string]string) float64 {
	t.Helper()
	mfs, err := scrape("http://" + addr + "/metrics")
	require.NoError(t, err)
	sum := 0.0
	mf := mfs[name]
	if mf == nil {
		return 0
	}
	for _, m := range mf.GetMetric() {
		ok := true
		for k, v := range match {
			found := false
			for _, l := range m.GetLabel() {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			ok = ok && found
		}
		if !ok {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		}
	}
	return sum
}

func longConversation() []openai.ChatCompletionMessageParamUnion {
	var sys strings.Builder
	for i := range 80 {
		sys.WriteString("Rule ")
		sys.WriteString(strings.Repeat("ab", i%7+1))
		sys.WriteString(": route every request to the worker that already holds its prefix, unless it is busy. ")
	}
	return []openai.ChatCompletionMessageParamUnion{
		openai.SystemMessage(sys.String()),
		openai.UserMessage("Which worker should take a request whose prefix is cached on two?"),
		openai.AssistantMessage("The less loaded of the two."),
		openai.UserMessage("And when both are busy?"),
	}
}

func TestTheLocalClusterRoutesOnTheRealTokenizerAndPredictsTheEnginesCachedTokens(t *testing.T) {
	addr := startUp(t, func(c *UpConfig) {
		// Predictions expire at once: the overlap the router sees for the
		// second request can only come from the worker's own KV events,
		// so a prediction equal to the engine's cached tokens means the
		// router hashed exactly the blocks the engine stored.
		c.Replica.PredictTTL = time.Millisecond
	})
	cl := upClient(addr)
	ctx := testenv.Context(t)
	params := openai.ChatCompletionNewParams{Model: "switchyard-sim", Messages: longConversation(), MaxTokens: openai.Int(4)}

	first, err := cl.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	raw, err := json.Marshal(params)
	require.NoError(t, err)
	var fields struct {
		Messages json.RawMessage `json:"messages"`
	}
	require.NoError(t, json.Unmarshal(raw, &fields))
	want := simTokens(t, "switchyard-sim", prompt.KindChat, `{"messages":`+string(fields.Messages)+`}`)
	require.Equal(t, int64(len(want)), first.Usage.PromptTokens, "the worker tokenized with o200k_base and ChatML")
	require.Greater(t, len(want), 1000)

	repeatPredictsTheCache(t, cl, addr, params, len(want)/16,
		"the worker's KV events reach the router's index", "the router predicted exactly the engine's cached tokens")
	assert.Equal(t, 2.0, metricSum(t, addr, "switchyard_router_tokenize_total",
		map[string]string{"model": "switchyard-sim", "path": "local"}), "both chats were tokenized by the router's own tokenizer")

	resp, err := http.Get("http://" + addr + "/debug/cluster")
	require.NoError(t, err)
	defer resp.Body.Close()
	var doc struct {
		Tokenizers []prompt.ModelInfo `json:"tokenizers"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&doc))
	require.NotEmpty(t, doc.Tokenizers)
	assert.Equal(t, prompt.ModelInfo{Model: "switchyard-sim", Source: prompt.SourceFlag, Spec: DefaultSimTokenizer, Path: "local",
		Describe: doc.Tokenizers[0].Describe}, doc.Tokenizers[0])
}

func TestEveryRequestFormReachesASimulatedWorkerThroughTheLocalCluster(t *testing.T) {
	addr := startUp(t, func(c *UpConfig) { c.Worker.Models = []string{"sim-alias"} })
	cl := upClient(addr)
	ctx := testenv.Context(t)

	t.Run("models lists every served name", func(t *testing.T) {
		list, err := cl.Models.List(ctx)
		require.NoError(t, err)
		var ids []string
		for _, m := range list.Data {
			ids = append(ids, m.ID)
		}
		assert.Equal(t, []string{"sim-alias", "switchyard-sim"}, ids)
	})

	t.Run("a chat with an image part", func(t *testing.T) {
		c, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: "switchyard-sim", MaxTokens: openai.Int(3),
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage([]openai.ChatCompletionContentPartUnionParam{
				openai.TextContentPart("What is in this picture?"),
				openai.ImageContentPart(openai.ChatCompletionContentPartImageImageURLParam{URL: "data:image/png;base64,iVBORw0KGgo="}),
			})}})
		require.NoError(t, err)
		assert.Equal(t, int64(3), c.Usage.CompletionTokens)
		assert.NotEmpty(t, c.Choices[0].Message.Content, "the output decodes to text with the model's tokenizer")
	})

	t.Run("batched completion prompts", func(t *testing.T) {
		c, err := cl.Completions.New(ctx, openai.CompletionNewParams{Model: "switchyard-sim", MaxTokens: openai.Int(2),
			Prompt: openai.CompletionNewParamsPromptUnion{OfArrayOfStrings: []string{"first prompt", "second, longer prompt of the batch"}}})
		require.NoError(t, err)
		require.Len(t, c.Choices, 2)
		assert.Equal(t, int64(0), c.Choices[0].Index)
		assert.Equal(t, int64(1), c.Choices[1].Index)
		a := simTokens(t, "switchyard-sim", prompt.KindCompletion, `{"prompt":"first prompt"}`)
		b := simTokens(t, "switchyard-sim", prompt.KindCompletion, `{"prompt":"second, longer prompt of the batch"}`)
		assert.Equal(t, int64(len(a)+len(b)), c.Usage.PromptTokens)
	})

	t.Run("an alias routes like the model", func(t *testing.T) {
		c, err := cl.Completions.New(ctx, openai.CompletionNewParams{Model: "sim-alias", MaxTokens: openai.Int(2),
			Prompt: openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello alias")}})
		require.NoError(t, err)
		assert.Equal(t, "sim-alias", c.Model)
	})

	t.Run("embeddings", func(t *testing.T) {
		e, err := cl.Embeddings.New(ctx, openai.EmbeddingNewParams{Model: "switchyard-sim",
			Input: openai.EmbeddingNewParamsInputUnion{OfArrayOfStrings: []string{"alpha", "beta", "alpha"}}})
		require.NoError(t, err)
		require.Len(t, e.Data, 3)
		assert.Len(t, e.Data[0].Embedding, 32)
		assert.Equal(t, e.Data[0].Embedding, e.Data[2].Embedding, "equal inputs embed equally")
		assert.NotEqual(t, e.Data[0].Embedding, e.Data[1].Embedding)
		assert.Positive(t, e.Usage.PromptTokens)
	})

	t.Run("responses", func(t *testing.T) {
		r, err := cl.Responses.New(ctx, responses.ResponseNewParams{Model: "switchyard-sim", MaxOutputTokens: openai.Int(5),
			Instructions: openai.String("be brief"),
			Input:        responses.ResponseNewParamsInputUnion{OfString: openai.String("Say something about switchyards.")}})
		require.NoError(t, err)
		assert.NotEmpty(t, r.OutputText())
		assert.Equal(t, int64(5), r.Usage.OutputTokens)
		want := simTokens(t, "switchyard-sim", prompt.KindResponse, `{"instructions":"be brief","input":"Say something about switchyards."}`)
		assert.Equal(t, int64(len(want)), r.Usage.InputTokens)
	})

	t.Run("streamed responses", func(t *testing.T) {
		s := cl.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "switchyard-sim", MaxOutputTokens: openai.Int(4),
			Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("Stream a reply.")}})
		var text strings.Builder
		var final responses.Response
		for s.Next() {
			ev := s.Current()
			switch ev.Type {
			case "response.output_text.delta":
				text.WriteString(ev.Delta)
			case "response.completed", "response.incomplete":
				final = ev.Response
			}
		}
		require.NoError(t, s.Err())
		assert.NotEmpty(t, text.String())
		assert.Equal(t, text.String(), final.OutputText(), "the deltas add up to the final text")
		assert.Equal(t, int64(4), final.Usage.OutputTokens)
	})
}

func TestARouterWithoutTheModelsTokenizerAsksTheEngineAndStillPredictsItsCache(t *testing.T) {
	// The worker runs Llama 3's tokenizer from a directory, which it does
	// not advertise (only built-in specs are): the router has no tokenizer
	// for the model and asks the worker's POST /tokenize.
	dir := testenv.Llama3Dir(t)
	c := routerTestCluster(t)
	c.addWorker("w1", func(cfg *WorkerConfig) { cfg.Tokenizer = dir })
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.PredictTTL = time.Millisecond })
	c.waitOwned(defaultClasses, "r1")
	addr := r.status.HTTPAddr
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, err := r.status.SchedulableWorkers(testenv.Context(t))
		return err == nil && n == 1
	}, "the replica sees the worker")
	cl := upClient(addr)
	ctx := testenv.Context(t)
	params := openai.ChatCompletionNewParams{Model: testModel, Messages: longConversation(), MaxTokens: openai.Int(4)}
	first, err := cl.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	require.Greater(t, first.Usage.PromptTokens, int64(1000))
	repeatPredictsTheCache(t, cl, addr, params, int(first.Usage.PromptTokens/16),
		"the worker's KV events reach the router's index", "the engine's ids, asked over /tokenize, hash to the blocks it stored")
	assert.Equal(t, 2.0, metricSum(t, addr, "switchyard_router_tokenize_total", map[string]string{"model": testModel, "path": "engine"}))
}

// `switchyard up -protocol vllm`: every worker speaks only vLLM's protocol
// and an adapter beside it joins it to the cluster. With predictions
// expiring at once, the router's predicted cached tokens for a repeated
// conversation can only come from the adapters' rehashed engine events, and
// they equal what the engine served from its cache.
func TestTheLocalClusterOnVLLMProtocolWorkersRoutesOnTheAdaptersEvents(t *testing.T) {
	addr := startUp(t, func(c *UpConfig) {
		c.Protocol = ProtocolVLLM
		c.ZMQPort = freePortRun(t, 4) // two workers' event and replay ports
		c.AdapterPort = 0
		c.Replica.PredictTTL = time.Millisecond
	})
	cl := upClient(addr)
	ctx := testenv.Context(t)
	params := openai.ChatCompletionNewParams{Model: "switchyard-sim", Messages: longConversation(), MaxTokens: openai.Int(4)}
	first, err := cl.Chat.Completions.New(ctx, params)
	require.NoError(t, err)
	require.Greater(t, first.Usage.PromptTokens, int64(1000))
	repeatPredictsTheCache(t, cl, addr, params, int(first.Usage.PromptTokens/16),
		"the engine's ZMQ events reach the router's index through its adapter", "the router predicted exactly the engine's cached tokens")
}

// freePortRun returns a free port p with p+1..p+n-1 free too.
func freePortRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		p := testenv.FreePort(t)
		ok := true
		for i := 1; i < n && ok; i++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p+i))
			if err != nil {
				ok = false
				continue
			}
			_ = l.Close()
		}
		if ok {
			return p
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}
