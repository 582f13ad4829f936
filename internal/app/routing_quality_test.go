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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// A worker at its cap holds the conversation's prefix: the router sends the
// next turn elsewhere, and the live counters and /debug/cluster say that it
// could have reached the cache and why it did not.
func TestAWorkerAtItsCapMakesTheLiveRouterCountAMissForCap(t *testing.T) {
	c := newTestCluster(t, 0)
	for _, id := range []string{"w1", "w2"} {
		cfg := testWorkerConfig()
		cfg.ID = id
		cfg.EtcdEndpoints, cfg.NATSURL = c.etcd.Endpoints, c.nats.URL
		if id == "w1" {
			cfg.Engine.MaxNumSeqs = 1 // one request at a time
			cfg.Engine.Speedup = 1    // slow enough to hold a long stream
		}
		c.workers = append(c.workers, startWorker(t, cfg))
	}
	r := c.startReplica("r1")
	c.waitOwned(defaultClasses, "r1")
	base := "http://" + r.status.HTTPAddr
	testenv.Eventually(t, 10*time.Second, func() bool {
		n, err := r.status.SchedulableWorkers(testenv.Context(t))
		return err == nil && n == 2
	}, "both workers schedulable")

	send := func(ctx context.Context, prompt, worker string, maxTokens int, stream bool) *http.Response {
		body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":%d,"stream":%t}`, testModel, prompt, maxTokens, stream)
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", "application/json")
		if worker != "" {
			req.Header.Set("X-Switchyard-Worker", worker)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		require.Equal(t, http.StatusOK, resp.StatusCode)
		return resp
	}
	conversation := strings.Repeat("the conversation so far, turn after turn ", 16)

	// Turn 1 on w1: w1 now holds the conversation's prefix.
	resp := send(testenv.Context(t), conversation, "w1", 1, false)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	// A long stream fills w1's one slot; read its first event only.
	hold, release := context.WithCancel(testenv.Context(t))
	defer release()
	long := send(hold, "an unrelated long answer", "w1", 4000, true)
	defer long.Body.Close()
	_, err := bufio.NewReader(long.Body).ReadString('\n')
	require.NoError(t, err)

	// Turn 2 could reach w1's prefix; w1 is at its cap, so it runs on w2.
	resp = send(testenv.Context(t), conversation+"and one more question", "", 1, false)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	require.Equal(t, "w2", resp.Header.Get("X-Switchyard-Routed-Worker"))
	release()

	require.Positive(t, reasonValue(t, r.reg, metrics.NameRouterDecisionMissedTokens, "cap"), "the reachable prefix on w1 is counted missed for cap")
	require.Equal(t, 1.0, reasonValue(t, r.reg, metrics.NameRouterDecisionShortfalls, "cap"))
	require.Equal(t, 1.0, metricValue(r.reg, metrics.NameRouterDecisionShortfalls), "no other shortfall: the pinned turns passed over no holder")

	var doc clusterDoc
	get, err := http.Get(base + "/debug/cluster")
	require.NoError(t, err)
	require.NoError(t, json.NewDecoder(get.Body).Decode(&doc))
	get.Body.Close()
	var found bool
	for _, d := range doc.Decisions {
		if d.Shortfall == "cap" {
			found = true
			require.Equal(t, "w2", d.Worker)
			require.Greater(t, d.ReachableTokens, d.AchievedTokens)
		}
	}
	require.True(t, found, "the decision list shows the cap shortfall: %+v", doc.Decisions)
}

// reasonValue sums the series of name whose reason label is reason.
func reasonValue(t *testing.T, reg prometheus.Gatherer, name, reason string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == reason {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
