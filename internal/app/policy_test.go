package app

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/internal/testenv"
)

func TestTheBuiltInPolicyIsDeployPolicyYAML(t *testing.T) {
	raw, err := readRepoFile("deploy/policy.yaml")
	require.NoError(t, err)
	require.True(t, bytes.Equal(raw, defaultPolicyYAML), "internal/app/default_policy.yaml must be a copy of deploy/policy.yaml")
}

func TestAPolicyChangeInEtcdKeepsQueuedRequestsAndCounts(t *testing.T) {
	c := &testCluster{t: t, etcd: testenv.StartEtcd(t), nats: testenv.StartNATS(t), replicas: map[string]*runningReplica{}}
	cfg := testWorkerConfig()
	cfg.EtcdEndpoints, cfg.NATSURL = c.etcd.Endpoints, c.nats.URL
	cfg.Engine.MaxNumSeqs = 1 // one request at a time: the rest wait in the owner's queue
	cfg.Engine.Speedup = 20
	c.workers = append(c.workers, startWorker(t, cfg))
	policy := "default_class: gold\nclasses:\n  - name: gold\n    policy: fcfs\n    quantum: 1024\n"
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(rc *ReplicaConfig) { rc.PolicyYAML = []byte(policy) })
	c.waitOwned([]string{"gold"}, "r1")

	const n = 6
	wait := startCompletions([]*runningReplica{r}, n, 32)
	testenv.Eventually(t, 10*time.Second, func() bool { return r.status.Snapshot().Classes["gold"].QueueDepth >= 3 }, "requests queue")

	// An operator changes the policy: gold gets a new quantum and a class is added.
	updated := policy + "  - name: silver\n    policy: wspt\n    quantum: 256\n"
	_, err := cluster.SeedConfig(testenv.Context(t), c.etcd.Client(t), "test", []byte(updated), true)
	require.NoError(t, err)
	testenv.Eventually(t, 10*time.Second, func() bool { _, ok := r.status.Owners()["silver"]; return ok }, "the new class gets an owner")

	for _, err := range wait() {
		require.NoError(t, err, "no queued request is lost by the reload")
	}
	snap, err := r.status.Flush(testenv.Context(t))
	require.NoError(t, err)
	require.Equal(t, uint64(n), snap.Classes["gold"].Counters.Received, "counts survive the reload")
	require.Equal(t, uint64(n), snap.Classes["gold"].Counters.Admitted)

	cl := r.client()
	_, err = cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("for the new class")},
		MaxTokens: openai.Int(2),
	}, option.WithHeader("x-switchyard-class", "silver"))
	require.NoError(t, err, "the new class is served")
}

// readRepoFile reads a file relative to the module root.
func readRepoFile(rel string) ([]byte, error) {
	return os.ReadFile(filepath.Join("..", "..", rel))
}
