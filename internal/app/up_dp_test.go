package app

import (
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// `switchyard up -protocol vllm -dp-size 2` with two engines: each engine
// is one API server in front of two ranks, each rank registered by its own
// adapter as worker-i-dp<r> at the engine's URL. Routers see four routing
// targets; conversations routed through the real OpenAI client land on a
// rank; the API server honours the rank header and refuses a rank it does
// not have; /debug/cluster lists one engine row per engine with its ranks.
func TestUpWithDPSizeRegistersEveryRankAtItsEnginesURLAndDebugClusterGroupsThem(t *testing.T) {
	cfg := upTestConfig(t, 1, 2)
	cfg.Protocol = ProtocolVLLM
	cfg.DPSize = 2
	ports := freePortRun(t, 12) // 2 engines × 2 ranks × (event, replay), then 4 adapters
	cfg.ZMQPort, cfg.AdapterPort = ports, ports+8
	up := startUpRun(t, cfg)
	defer up.stop(t)

	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	var addr string
	sawDP := false
	for up.lines.Scan() && !strings.HasPrefix(up.lines.Text(), "Try:") {
		if m := endpoint.FindStringSubmatch(up.lines.Text()); m != nil {
			addr = m[1]
		}
		sawDP = sawDP || strings.Contains(up.lines.Text(), "2 data-parallel ranks")
	}
	up.drain()
	require.NotEmpty(t, addr)
	assert.True(t, sawDP, "the banner says the engines run ranks")

	_, doc := awaitDebugCluster(t, addr, func(d clusterDoc) bool { return len(d.Workers) == 4 }, "four ranks registered")
	require.Len(t, doc.Engines, 2, "one row per engine")
	for i, e := range doc.Engines {
		id := fmt.Sprintf("worker-%d", i+1)
		assert.Equal(t, id, e.ID)
		assert.Equal(t, 2, e.DPSize)
		assert.Equal(t, []string{id + "-dp0", id + "-dp1"}, e.Ranks, "its ranks beneath it, in rank order")
	}
	urls := map[string]string{}
	for _, w := range doc.Workers {
		assert.Equal(t, 2, w.DPSize)
		assert.Equal(t, fmt.Sprintf("%s-dp%d", w.Engine, w.DPRank), w.ID)
		if u, ok := urls[w.Engine]; ok {
			assert.Equal(t, u, w.URL, "a DP engine's ranks share its one URL")
		}
		urls[w.Engine] = w.URL
	}
	require.Len(t, urls, 2)
	assert.NotEqual(t, urls["worker-1"], urls["worker-2"])

	// Requests through the router land on ranks.
	cl := openai.NewClient(option.WithBaseURL("http://"+addr+"/v1"), option.WithAPIKey("none"))
	ctx := testenv.Context(t)
	ranks := regexp.MustCompile(`^worker-[12]-dp[01]$`)
	routed := map[string]bool{}
	for i := range 6 {
		var hr *http.Response
		resp, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: cfg.Worker.Model,
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage(fmt.Sprintf("conversation %d about switchyards", i))},
			MaxTokens: openai.Int(3)}, option.WithResponseInto(&hr))
		require.NoError(t, err)
		assert.EqualValues(t, 3, resp.Usage.CompletionTokens)
		assert.Regexp(t, ranks, hr.Header.Get("X-Switchyard-Routed-Worker"))
		routed[hr.Header.Get("X-Switchyard-Routed-Worker")] = true
	}
	// Each rank publishes its own events (on port + rank) and its adapter
	// follows them: the blocks of the requests pinned to a rank are
	// indexed under that rank.
	awaitDebugCluster(t, addr, func(d clusterDoc) bool {
		for _, w := range d.Workers {
			if routed[w.ID] && w.Indexed == 0 {
				return false
			}
		}
		return true
	}, "every rank routed to has its blocks indexed")

	// The engine's API server: a rank header picks the rank, a bad one is
	// refused as vLLM refuses it.
	post := func(rank string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, urls["worker-1"]+"/v1/completions",
			strings.NewReader(`{"model":"`+cfg.Worker.Model+`","prompt":"hello","max_tokens":2}`))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if rank != "" {
			req.Header.Set("X-data-parallel-rank", rank)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("1")
	assert.Equal(t, http.StatusOK, code, body)
	code, body = post("2")
	assert.Equal(t, http.StatusBadRequest, code)
	assert.Contains(t, body, "data parallel size 2")
	code, _ = post("")
	assert.Equal(t, http.StatusOK, code, "without a header the API server picks a rank")
}
