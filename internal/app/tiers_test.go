package app

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
)

// Two engines speaking vLLM's protocol over real ZMQ, each with a GPU pool
// that holds one long prompt and a host tier that keeps what the GPU
// evicts; an adapter beside each mirrors both tiers (-kv-tiers cpu). A
// conversation's first turn lands on one engine; other prompts sent
// straight to that engine push its blocks down to host memory. The second
// turn still goes to that engine, priced at the load time rather than as
// a miss, and the engine serves the prefix from its host tier.
func TestAPrefixOffloadedToHostMemoryIsIndexedAsTheEnginesCPUTierAndStillWinsTheRoute(t *testing.T) {
	c := newTestCluster(t, 0)
	small := func(w *WorkerConfig) { w.Engine.NumBlocks, w.Engine.HostBlocks = 96, 4096 }
	tiers := func(a *adapter.Config) { a.KVTiers = "cpu" }
	engines := map[string]*vllmEngine{}
	for _, id := range []string{"v1", "v2"} {
		engines[id] = startVLLMEngine(t, c, id, small, tiers)
	}
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.PredictTTL = time.Nanosecond })
	c.waitOwned([]string{"interactive"}, "r1")
	awaitV1AndV2Registered(t, r)

	cl := r.client()
	ctx := testenv.Context(t)
	system := strings.Repeat("You are a careful assistant who answers questions about railway switchyards. ", 12)
	msgs := []openai.ChatCompletionMessageParamUnion{openai.SystemMessage(system), openai.UserMessage("How many tracks?")}
	var hr *http.Response
	resp, err := cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxTokens: openai.Int(4)},
		option.WithResponseInto(&hr))
	require.NoError(t, err)
	first := hr.Header.Get("X-Switchyard-Routed-Worker")
	turn1 := resp.Usage.PromptTokens
	require.Contains(t, engines, first)
	cpu := kvindex.TierStream(first, kvindex.TierCPU)

	// Other long prompts straight to the engine: its GPU pool (96 blocks)
	// evicts the conversation's blocks into the host tier.
	e := engines[first]
	for i := range 4 {
		other := make([]uint32, 80*16)
		for j := range other {
			other[j] = uint32(20000 + 5000*i + j)
		}
		complete(t, e.worker.url, other)
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		d, ok := r.status.ix.Digest(cpu)
		return ok && d.Blocks > 0
	}, "the router indexes %s", cpu)

	msgs = append(msgs, openai.AssistantMessage(resp.Choices[0].Message.Content), openai.UserMessage("And how long are they?"))
	resp, err = cl.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{Model: testModel, Messages: msgs, MaxTokens: openai.Int(4)},
		option.WithResponseInto(&hr))
	require.NoError(t, err)
	assert.Equal(t, first, hr.Header.Get("X-Switchyard-Routed-Worker"), "turn 2 follows its prefix into host memory")
	assert.GreaterOrEqual(t, resp.Usage.PromptTokensDetails.CachedTokens, turn1/16*16-16,
		"the engine loads turn 1's blocks back (all but the one it recomputes) instead of recomputing them")
	d, ok := r.status.ix.Digest(first)
	require.True(t, ok)
	assert.Positive(t, d.Blocks, "the loaded blocks are GPU blocks again")
}

// The simulated engine's disk tier below its host tier, published with
// medium DISK: an adapter with -kv-tiers cpu,disk mirrors it as the
// worker's --disk stream, and routers index it there. The engine's GPU
// pool and host tier are small, so a conversation's blocks pass through
// host memory to disk.
func TestBlocksTheHostTierEvictsReachTheRouterAsTheEnginesDiskTier(t *testing.T) {
	c := newTestCluster(t, 0)
	small := func(w *WorkerConfig) {
		w.Engine.NumBlocks, w.Engine.HostBlocks, w.Engine.DiskBlocks = 96, 32, 4096
	}
	tiers := func(a *adapter.Config) { a.KVTiers = "cpu,disk" }
	e := startVLLMEngine(t, c, "v1", small, tiers)
	r := c.startReplicaWith("r1", "127.0.0.1:0", nil)
	c.waitOwned([]string{"interactive"}, "r1")
	testenv.Eventually(t, 15*time.Second, func() bool {
		n, err := r.status.SchedulableWorkers(testenv.Context(t))
		return err == nil && n == 1
	}, "v1 registered")

	for i := range 6 {
		other := make([]uint32, 80*16)
		for j := range other {
			other[j] = uint32(20000 + 5000*i + j)
		}
		complete(t, e.worker.url, other)
	}
	disk := kvindex.TierStream("v1", kvindex.TierDisk)
	testenv.Eventually(t, 15*time.Second, func() bool {
		d, ok := r.status.ix.Digest(disk)
		return ok && d.Blocks > 0
	}, "the router indexes %s", disk)
	d, ok := r.status.ix.Digest(kvindex.TierStream("v1", kvindex.TierCPU))
	require.True(t, ok)
	assert.LessOrEqual(t, d.Blocks, 32, "the host tier stays bounded")
}
