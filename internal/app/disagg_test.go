package app

// Disaggregated prefill and decode end to end: a real replica over real
// simulated workers of each role speaking vLLM's two-leg protocol, with
// the official OpenAI Go client.

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

func roleWorker(role string) func(*WorkerConfig) {
	return func(cfg *WorkerConfig) {
		cfg.PD.Role = role
		cfg.PD.KVTransfer = wire.TransferVLLM
	}
}

// startPDOwner is startOwner with the decider's threshold set.
func (c *testCluster) startPDOwner(n, minTokens int) *runningReplica {
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Scheduler.Disagg.MinTokens = minTokens })
	c.waitOwned(defaultClasses, "r1")
	testenv.Eventually(c.t, 10*time.Second, func() bool {
		resp, err := http.Get("http://" + r.status.HTTPAddr + "/v1/models")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var list struct {
			Data []struct {
				Workers int `json:"switchyard_workers"`
			} `json:"data"`
		}
		return json.NewDecoder(resp.Body).Decode(&list) == nil && len(list.Data) == 1 && list.Data[0].Workers == n
	}, "the replica sees %d workers", n)
	return r
}

func labelled(reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}

func TestALongPromptGoesPrefillThenDecodeAndAShortOneRunsAggregated(t *testing.T) {
	c := routerTestCluster(t)
	both := c.addWorker("b1", nil)
	pre := c.addWorker("p1", roleWorker(wire.RolePrefill))
	dec := c.addWorker("d1", roleWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 64)
	cl := r.client()
	ctx := testenv.Context(t)

	// Long: prefill on p1 (one token, parameters held), decode on d1 (pulls
	// them: the parameters arrived intact), streamed to the client.
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a long shared context ", 60))},
		MaxTokens: openai.Int(6),
	})
	chunks := 0
	for stream.Next() {
		if len(stream.Current().Choices) > 0 {
			chunks++
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, 6, chunks)
	kv := "switchyard_worker_kv_transfers_total"
	require.Equal(t, 1.0, labelled(pre.reg, kv, map[string]string{"role": wire.RolePrefill, "outcome": "held"}))
	require.Equal(t, 1.0, labelled(pre.reg, kv, map[string]string{"outcome": "served"}))
	require.Equal(t, 1.0, labelled(dec.reg, kv, map[string]string{"role": wire.RoleDecode, "outcome": "pulled"}))
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated", "reason": "long_prefill"}))
	require.Zero(t, labelled(r.reg, metrics.NameDisaggRecomputes, nil))
	require.Zero(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))

	// Short: aggregated on the both-worker.
	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
		MaxTokens: openai.Int(4),
	})
	require.NoError(t, err)
	require.Equal(t, int64(4), comp.Usage.CompletionTokens)
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "aggregated", "reason": "short_prefill"}))
	require.Positive(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))
}
