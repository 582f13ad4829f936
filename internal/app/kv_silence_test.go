package app

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/adapter"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// Two vLLM-protocol engines behind adapters, both registered as publishing
// KV events; v2's adapter listens for them where nothing publishes. While
// both serve prompts, the router flags v2's event path as silent (on
// /debug/cluster and in the gauge) and not v1's.
func TestAWorkerWhoseKVEventsNeverReachTheIndexIsFlaggedSilentAndOneWhoseEventsDoIsNot(t *testing.T) {
	r := startSilentPair(t)
	doc, _ := serveUntilSilent(t, r)

	v1, v2 := workerDocOf(doc, "v1"), workerDocOf(doc, "v2")
	require.Equal(t, "ok", v1.KVEvents, "v1's events reach the index: %+v", v1.KVEventsDetail)
	require.Positive(t, v1.KVEventsDetail.BlocksStored)
	require.Zero(t, v2.KVEventsDetail.BlocksStored)
	require.GreaterOrEqual(t, v2.KVEventsDetail.PromptBlocks, uint64(4))
	require.NotEmpty(t, v2.KVEventsDetail.Since)
	require.Contains(t, v2.KVEventsDetail.Why, "prompt blocks")
	require.Equal(t, 1.0, testenv.MetricValue(t, r.reg, metrics.NameRouterKVSilentWorkers, nil))
}

func workerDocOf(doc clusterDoc, id string) workerDoc {
	for _, w := range doc.Workers {
		if w.ID == id {
			return w
		}
	}
	return workerDoc{}
}

// startSilentPair starts two vLLM-protocol engines behind adapters, v1
// whose events flow and v2 whose adapter listens for them where nothing
// publishes, and a replica judging silence over 2 s and 4 blocks.
func startSilentPair(t *testing.T) *runningReplica {
	t.Helper()
	c := newTestCluster(t, 0)
	startVLLMEngineWithAdapter(t, c, "v1", nil)
	startVLLMEngine(t, c, "v2", nil, func(a *adapter.Config) {
		a.KVEvents = fmt.Sprintf("tcp://127.0.0.1:%d", testenv.FreePort(t))
	})
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		cfg.Ingest.SilentWindow, cfg.Ingest.SilentBlocks = 2*time.Second, 4
	})
	c.waitOwned([]string{"interactive"}, "r1")
	awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool { return len(d.Workers) == 2 }, "both adapters' workers")
	return r
}

// servePinned sends r a new prompt (every block computed, none cached)
// pinned to worker; n makes it new.
func servePinned(ctx context.Context, r *runningReplica, worker string, n int) error {
	prompt := strings.Repeat(fmt.Sprintf("Request %d to %s asks about switchyard track %d. ", n, worker, n*13), 12)
	cl := r.client()
	_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
		MaxTokens: openai.Int(2),
	}, option.WithHeader("x-switchyard-worker", worker))
	return err
}

// serveUntilSilent sends new prompts pinned to v1 and v2 until r's
// /debug/cluster calls v2's event path silent, and returns that document
// and how many prompts each worker got.
func serveUntilSilent(t *testing.T, r *runningReplica) (clusterDoc, int) {
	t.Helper()
	ctx := testenv.Context(t)
	var doc clusterDoc
	n := 0
	testenv.Eventually(t, 30*time.Second, func() bool {
		n++
		for _, w := range []string{"v1", "v2"} {
			require.NoError(t, servePinned(ctx, r, w, n), "pinned to %s", w)
		}
		_, doc = awaitDebugCluster(t, r.status.HTTPAddr, func(clusterDoc) bool { return true }, "the document")
		return workerDocOf(doc, "v2").KVEvents == "silent"
	}, "v2's event path flagged silent: %+v", &doc)
	return doc, n
}
