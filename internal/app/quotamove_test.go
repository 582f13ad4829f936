package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
	"github.com/switchyard/switchyard/wire"
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

// The same after a crash: the owner saved the spent bucket to etcd within
// -bucket-sync-interval, and the next owner starts from that save.
func TestASpentRequestsBucketStaysSpentWhenItsOwnerCrashes(t *testing.T) {
	const rpm = 3
	ids, class, policy, c := startOwnerTestCluster(t, 20)
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    default_class: %s
    quota: {requests_per_minute: %d}
`, tenant.HashKey("sk-acme"), class, rpm))
	etcdURL, err := url.Parse(c.etcd.Endpoints[0])
	require.NoError(t, err)
	natsURL, err := url.Parse(c.nats.URL)
	require.NoError(t, err)
	etcdProxy, natsProxy := testenv.StartProxy(t, etcdURL.Host), testenv.StartProxy(t, natsURL.Host)
	const ttl = 2 * time.Second
	base := func(cfg *ReplicaConfig) {
		cfg.PolicyYAML, cfg.Session.TTL, cfg.Tenants.KeysFile = policy, ttl, keys
	}
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		base(cfg)
		cfg.EtcdEndpoints = []string{"http://" + etcdProxy.Addr()}
		cfg.NATSURL = "nats://" + natsProxy.Addr()
	})
	r2 := c.startReplicaWith("r2", "127.0.0.1:0", base)
	r3 := c.startReplicaWith("r3", "127.0.0.1:0", base)
	c.waitPlaced([]string{class}, ids...)
	require.Equal(t, "r1", r2.status.Owners()[class].Replica)

	complete := func(r *runningReplica, i int) error {
		cl := keyedClient(r, "sk-acme")
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("request %d via %s", i, r.status.ID))},
			MaxTokens: openai.Int(2),
		})
		return err
	}
	for i := range rpm {
		require.NoError(t, complete([]*runningReplica{r2, r3}[i%2], i))
	}
	cli := c.etcd.Client(t)
	testenv.Eventually(t, 10*time.Second, func() bool {
		resp, err := cli.Get(testenv.Context(t), wire.NewKeys("test").Prefix()+"buckets/"+class)
		require.NoError(t, err)
		var saved []scheduler.TenantBucket
		if len(resp.Kvs) == 1 {
			require.NoError(t, json.Unmarshal(resp.Kvs[0].Value, &saved))
		}
		return len(saved) == 1 && saved[0].Tenant == "acme" && saved[0].Requests < 1
	}, "the owner saved the spent bucket")

	r1.crashed = true // cut from etcd and NATS: no hand-off, no final save
	etcdProxy.Cut()
	natsProxy.Cut()
	testenv.Eventually(t, 15*time.Second, func() bool {
		o := r2.status.Owners()[class]
		return o.Replica != "" && o.Replica != "r1"
	}, "the class moves")
	err = complete(r2, 99)
	require.Error(t, err, "the bucket is still spent at the next owner")
	status, code := apiStatus(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, "quota_exceeded", code)
}
