package app

import (
	"fmt"
	"net/http"
	"slices"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/tenant"
)

// A tenant that spent its requests-per-minute bucket is still refused after
// its class's owner stops gracefully: the owner carries the bucket's level
// to the next owner (through etcd) instead of the next owner starting it
// full.
func TestASpentRequestsBucketStaysSpentWhenItsOwnerStopsGracefully(t *testing.T) {
	const rpm = 3
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    default_class: interactive
    quota: {requests_per_minute: %d}
`, tenant.HashKey("sk-acme"), rpm))
	c := newTestCluster(t, 1)
	withKeys := func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys }
	reps := []*runningReplica{
		c.startReplicaWith("r1", "127.0.0.1:0", withKeys),
		c.startReplicaWith("r2", "127.0.0.1:0", withKeys),
		c.startReplicaWith("r3", "127.0.0.1:0", withKeys),
	}
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")
	ownerID := reps[0].status.Owners()["interactive"].Replica
	owner := reps[slices.IndexFunc(reps, func(r *runningReplica) bool { return r.status.ID == ownerID })]
	var entries []*runningReplica
	for _, r := range reps {
		if r != owner {
			entries = append(entries, r)
		}
	}
	complete := func(r *runningReplica, i int) error {
		cl := keyedClient(r, "sk-acme")
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("request %d via %s", i, r.status.ID))},
			MaxTokens: openai.Int(2),
		})
		return err
	}
	refused := func(r *runningReplica, when string) {
		t.Helper()
		err := complete(r, 99)
		require.Error(t, err, "%s, a request via %s must be refused: the bucket is spent", when, r.status.ID)
		status, code := apiStatus(t, err)
		require.Equal(t, http.StatusTooManyRequests, status, "%s, via %s", when, r.status.ID)
		require.Equal(t, "quota_exceeded", code)
	}
	for i := range rpm {
		require.NoError(t, complete(entries[i%2], i))
	}
	refused(entries[0], "before the move")

	owner.stop(t)
	c.mu.Lock()
	delete(c.replicas, ownerID)
	c.mu.Unlock()
	c.waitOwned(defaultClasses, entries[0].status.ID, entries[1].status.ID)
	require.NotEqual(t, ownerID, entries[0].status.Owners()["interactive"].Replica)
	for _, r := range entries {
		refused(r, "after the move")
	}
}
