package app

import (
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// A simulated worker and a vLLM-protocol engine behind an adapter each
// serve one prompt twice: the router exports what each engine reports of
// its own load, with the prefix-cache hit rate the second request raised,
// and /debug/cluster shows the same figures.
func TestTheEnginesOwnLoadAndPrefixHitRateAreExportedPerWorker(t *testing.T) {
	c := newTestCluster(t, 1)
	startVLLMEngineWithAdapter(t, c, "v1", nil)
	r := c.startReplica("r1")
	c.waitOwned([]string{"interactive"}, "r1")
	awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool { return len(d.Workers) == 2 }, "both workers")

	cl, ctx := r.client(), testenv.Context(t)
	prompt := strings.Repeat("The same long prompt, served twice from the engine's prefix cache. ", 16)
	for _, w := range []string{"w1", "v1"} {
		for range 2 {
			_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				MaxTokens: openai.Int(2),
			}, option.WithHeader("x-switchyard-worker", w))
			require.NoError(t, err, "pinned to %s", w)
		}
	}
	for _, w := range []string{"w1", "v1"} {
		worker := map[string]string{metrics.LabelWorker: w}
		testenv.Eventually(t, 15*time.Second, func() bool {
			return testenv.MetricValue(t, r.reg, metrics.NameWorkerEnginePrefixHitRate, worker) > 0
		}, "%s's engine-reported prefix hit rate is exported", w)
		for _, name := range []string{metrics.NameWorkerEngineRunning, metrics.NameWorkerEngineWaiting, metrics.NameWorkerEngineKVUsage} {
			require.True(t, hasSeries(t, r, name, w), "%s has a %s series", w, name)
		}
	}
	_, doc := awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool {
		for _, w := range d.Workers {
			if w.Reported == nil || w.Reported.PrefixHitRate <= 0 {
				return false
			}
		}
		return true
	}, "every worker's reported prefix hit rate")
	require.Len(t, doc.Workers, 2)
}

func hasSeries(t *testing.T, r *runningReplica, name, worker string) bool {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == metrics.LabelWorker && l.GetValue() == worker {
					return true
				}
			}
		}
	}
	return false
}
