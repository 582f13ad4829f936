package app

import (
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/frontend"
)

// sessionTurn sends one completion of session key to replica r and returns
// the worker that served it.
func sessionTurn(t *testing.T, r *runningReplica, key, prompt string) string {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"prompt":%q,"max_tokens":2}`, testModel, prompt)
	req, err := http.NewRequest(http.MethodPost, "http://"+r.status.HTTPAddr+"/v1/completions", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Session-Id", key)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", out)
	w := resp.Header.Get(frontend.HeaderRoutedWorker)
	require.NotEmpty(t, w)
	return w
}

// sessionCluster is three replicas over three workers that publish no KV
// events: nothing but the gossiped session map can tell a replica where a
// session's previous turn ran. Affinity is hard: soft affinity lets a
// session go when its worker's predicted TTFT exceeds the best's by half,
// and on a loaded test machine one slow first token calibrates a worker
// that far up; these tests are about the gossiped map, not the margin
// (frontend's session tests cover it).
func sessionCluster(t *testing.T) (map[string]*runningWorker, []*runningReplica) {
	c := routerTestCluster(t)
	ws := map[string]*runningWorker{}
	for i := 1; i <= 3; i++ {
		id := fmt.Sprintf("w%d", i)
		ws[id] = c.addWorker(id, func(cfg *WorkerConfig) { cfg.NATSURL = "" })
	}
	hard := func(cfg *ReplicaConfig) {
		cfg.PolicyYAML = append(slices.Clone(defaultPolicyYAML), "\nsessions:\n  affinity: hard\n"...)
	}
	rs := []*runningReplica{c.startReplicaWith("r1", "127.0.0.1:0", hard), c.startReplicaWith("r2", "127.0.0.1:0", hard),
		c.startReplicaWith("r3", "127.0.0.1:0", hard)}
	c.waitOwned(defaultClasses, "r1", "r2", "r3")
	for _, r := range rs {
		awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool { return len(d.Workers) == 3 && len(d.Members) == 3 },
			"three workers and three gossip members")
	}
	return ws, rs
}

// sessionOutcomes is switchyard_router_session_requests_total{outcome} at r.
func sessionOutcomes(t *testing.T, r *runningReplica, outcome string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "switchyard_router_session_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "outcome" && l.GetValue() == outcome {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}

func TestASessionsNextTurnsAtOtherReplicasLandOnItsWorkerWithoutAnyKVEvent(t *testing.T) {
	_, rs := sessionCluster(t)
	for s := range 6 {
		key := fmt.Sprintf("agent-%d", s)
		first := sessionTurn(t, rs[s%3], key, fmt.Sprintf("turn one of session %d", s))
		for k := 1; k <= 2; k++ {
			// The other replicas learn the session by gossip; no KV event
			// can have told them anything (the workers publish none).
			awaitDebugCluster(t, rs[(s+k)%3].status.HTTPAddr, func(d clusterDoc) bool { return d.Sessions >= s+1 },
				fmt.Sprintf("session %d gossiped", s))
		}
		for k := 1; k <= 2; k++ {
			// Prompts that share no prefix with the first turn: neither the
			// index nor a prediction points at the first turn's worker.
			got := sessionTurn(t, rs[(s+k)%3], key, fmt.Sprintf("%d: an unrelated tool result, call %d", k, s))
			require.Equalf(t, first, got, "session %d turn %d at replica %s", s, k+1, rs[(s+k)%3].status.ID)
		}
	}
	for _, r := range rs {
		_, d := awaitDebugCluster(t, r.status.HTTPAddr, func(clusterDoc) bool { return true }, "the document")
		for _, w := range d.Workers {
			require.Zerof(t, w.Indexed, "replica %s indexed KV blocks of %s: the test must run without KV events", r.status.ID, w.ID)
		}
		require.Equal(t, 6, d.Sessions, "replica %s", r.status.ID)
	}
	hits := 0.0
	for _, r := range rs {
		hits += sessionOutcomes(t, r, "hit")
	}
	require.Equal(t, 12.0, hits, "every later turn counted as a hit")
}

func TestAWorkerThatLeavesFreesItsSessionsOnEveryReplica(t *testing.T) {
	ws, rs := sessionCluster(t)
	first := sessionTurn(t, rs[0], "agent", "turn one")
	for _, r := range rs {
		awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool { return d.SessionsByWorker[first] == 1 }, "the session gossiped")
	}
	require.NoError(t, ws[first].stop())
	for _, r := range rs {
		awaitDebugCluster(t, r.status.HTTPAddr, func(d clusterDoc) bool { return len(d.Workers) == 2 && d.SessionsByWorker[first] == 0 },
			"the worker and its sessions gone")
	}
	next := sessionTurn(t, rs[1], "agent", "turn two")
	require.NotEqual(t, first, next)
	// The move reaches the third replica by gossip, like the first turn did.
	awaitDebugCluster(t, rs[2].status.HTTPAddr, func(d clusterDoc) bool { return d.SessionsByWorker[next] == 1 }, "the move gossiped")
	require.Equal(t, next, sessionTurn(t, rs[2], "agent", "turn three"), "the session sticks to its new worker")
}
