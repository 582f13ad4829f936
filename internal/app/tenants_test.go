package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// writeKeys writes a keys file for tenants (id → key) and returns its path.
func writeKeys(t *testing.T, body string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys.yaml")
	require.NoError(t, os.WriteFile(path, []byte(body), 0o600))
	return path
}

func keyedClient(r *runningReplica, key string) openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+r.status.HTTPAddr+"/v1/"), option.WithAPIKey(key), option.WithMaxRetries(0))
}

// apiStatus returns the HTTP status and error code of an OpenAI client error.
func apiStatus(t *testing.T, err error) (int, string) {
	t.Helper()
	var apiErr *openai.Error
	require.True(t, errors.As(err, &apiErr), "want an API error, got %v", err)
	return apiErr.StatusCode, apiErr.Code
}

// tenantInflight is the tenant's queued plus booked requests in r's scheduler.
func tenantInflight(t *testing.T, r *runningReplica, id string) int {
	t.Helper()
	n := 0
	require.NoError(t, r.status.actor.Do(testenv.Context(t), func(c *scheduler.Core) { n = c.TenantInflight(id) }))
	return n
}

func TestAKeysFileClosesTheAPIOfEveryReplica(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    models: [%s]
    classes: [interactive]
`, tenant.HashKey("sk-acme"), testModel))
	c := newTestCluster(t, 1)
	withKeys := func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys }
	a := c.startReplicaWith("r1", "127.0.0.1:0", withKeys)
	c.waitOwned(defaultClasses, "r1")
	ctx := testenv.Context(t)
	params := openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello")},
		MaxTokens: openai.Int(2),
	}

	wrong := keyedClient(a, "sk-wrong")
	_, err := wrong.Completions.New(ctx, params)
	status, code := apiStatus(t, err)
	require.Equal(t, http.StatusUnauthorized, status)
	require.Equal(t, "invalid_api_key", code)

	// No key at all: the official client always sends one, so plain HTTP.
	resp, err := http.Post("http://"+a.status.HTTPAddr+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","prompt":"x"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	foreign := params
	foreign.Model = "someone-elses-model"
	cl := keyedClient(a, "sk-acme")
	_, err = cl.Completions.New(ctx, foreign)
	status, code = apiStatus(t, err)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "model_not_allowed", code)

	_, err = cl.Completions.New(ctx, params, option.WithHeader("x-switchyard-class", "realtime"))
	status, code = apiStatus(t, err)
	require.Equal(t, http.StatusForbidden, status)
	require.Equal(t, "class_not_allowed", code)

	_, err = cl.Completions.New(ctx, params, option.WithHeader("x-switchyard-class", "interactive"))
	require.NoError(t, err)
}

// holdStream starts a long streaming completion through r and returns once
// its first event arrived; cancel ends it.
func holdStream(t *testing.T, r *runningReplica, key string, i int) (end func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cl := keyedClient(r, key)
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("held stream %d", i))},
		MaxTokens: openai.Int(20000),
	})
	if !stream.Next() {
		cancel()
		t.Fatalf("stream %d via %s: %v", i, r.status.ID, stream.Err())
	}
	return func() {
		cancel()
		_ = stream.Close()
	}
}

// startHeldStreamsCluster starts two slow workers (streams that last
// minutes, room for five each) and three replicas r1..r3 reading keys, and
// waits until every default class is placed.
func startHeldStreamsCluster(t *testing.T, keys string) (*testCluster, []*runningReplica) {
	t.Helper()
	c := newTestCluster(t, 0)
	for i := 1; i <= 2; i++ {
		cfg := testWorkerConfig()
		cfg.ID = fmt.Sprintf("w%d", i)
		cfg.EtcdEndpoints, cfg.NATSURL = c.etcd.Endpoints, c.nats.URL
		cfg.Engine.Speedup = 1         // the held streams last minutes
		cfg.Engine.NumBlocks = 1 << 16 // and fit: five on each worker
		c.workers = append(c.workers, startWorker(t, cfg))
	}
	withKeys := func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys }
	reps := []*runningReplica{
		c.startReplicaWith("r1", "127.0.0.1:0", withKeys),
		c.startReplicaWith("r2", "127.0.0.1:0", withKeys),
		c.startReplicaWith("r3", "127.0.0.1:0", withKeys),
	}
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")
	return c, reps
}

func TestATenantsConcurrencyQuotaHoldsAcrossReplicasAndAnOwnershipMove(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    default_class: interactive
    quota: {concurrent: 10}
`, tenant.HashKey("sk-acme")))
	c, reps := startHeldStreamsCluster(t, keys)
	ownerID := reps[0].status.Owners()["interactive"].Replica
	var owner *runningReplica
	var entries []*runningReplica
	for _, r := range reps {
		if r.status.ID == ownerID {
			owner = r
		} else {
			entries = append(entries, r)
		}
	}
	// Ten streams through the two replicas that do not own the class, so
	// they survive the owner leaving.
	var cancels []func()
	defer func() {
		for _, cancel := range cancels {
			cancel()
		}
	}()
	for i := range 10 {
		cancels = append(cancels, holdStream(t, entries[i%2], "sk-acme", i))
	}
	require.Equal(t, 10, tenantInflight(t, owner, "acme"))

	eleventh := func(r *runningReplica) error {
		cl := keyedClient(r, "sk-acme")
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("one too many via " + r.status.ID)},
			MaxTokens: openai.Int(2),
		})
		return err
	}
	for _, r := range reps {
		err := eleventh(r)
		require.Error(t, err, "the 11th request via %s must be refused", r.status.ID)
		status, code := apiStatus(t, err)
		require.Equal(t, http.StatusTooManyRequests, status, "via %s", r.status.ID)
		require.Equal(t, "quota_exceeded", code)
	}

	// The owner leaves: the class moves to one of the others, and the
	// entries re-home the ten bookings there.
	owner.stop(t)
	c.mu.Lock()
	delete(c.replicas, ownerID)
	c.mu.Unlock()
	survivors := []string{entries[0].status.ID, entries[1].status.ID}
	c.waitOwned(defaultClasses, survivors...)
	newOwnerID := entries[0].status.Owners()["interactive"].Replica
	newOwner := entries[slices.IndexFunc(entries, func(r *runningReplica) bool { return r.status.ID == newOwnerID })]
	testenv.Eventually(t, 15*time.Second, func() bool {
		n := tenantInflight(t, newOwner, "acme")
		return n == 10
	},
		"the new owner %s rebuilt the tenant's concurrency from the adopted bookings", newOwnerID)
	for _, r := range entries {
		err := eleventh(r)
		require.Error(t, err, "after the move, the 11th request via %s must be refused", r.status.ID)
		status, code := apiStatus(t, err)
		require.Equal(t, http.StatusTooManyRequests, status)
		require.Equal(t, "quota_exceeded", code)
	}

	// One stream ends: one request fits again.
	cancels[0]()
	testenv.Eventually(t, 15*time.Second, func() bool { return tenantInflight(t, newOwner, "acme") == 9 }, "a slot freed")
	require.NoError(t, eleventh(entries[1]))
}

func TestTwoTenantsWithWeightsThreeToOneShareAContendedClassThroughTheCluster(t *testing.T) {
	// One worker running one request at a time, a class with a quantum of
	// one token (so the share per turn is exact), and a backlog of equal
	// requests from both tenants queued behind an occupying stream.
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: heavy
    keys: [%q]
    weight: 3
  - id: light
    keys: [%q]
    weight: 1
  - id: occupier
    keys: [%q]
`, tenant.HashKey("sk-heavy"), tenant.HashKey("sk-light"), tenant.HashKey("sk-occupier")))
	c := newTestCluster(t, 0)
	wcfg := testWorkerConfig()
	wcfg.EtcdEndpoints, wcfg.NATSURL = c.etcd.Endpoints, c.nats.URL
	wcfg.Engine.MaxNumSeqs = 1
	wcfg.Engine.Speedup = 1 // the occupying stream outlasts the queueing of the backlog
	c.workers = append(c.workers, startWorker(t, wcfg))
	mutate := func(cfg *ReplicaConfig) {
		cfg.Tenants.KeysFile = keys
		cfg.PolicyYAML = []byte("default_class: shared\nclasses:\n  - name: shared\n    policy: fcfs\n    quantum: 1\n    limits: {requests: 100000}\n")
	}
	a := c.startReplicaWith("r1", "127.0.0.1:0", mutate)
	b := c.startReplicaWith("r2", "127.0.0.1:0", mutate)
	c.waitPlaced([]string{"shared"}, "r1", "r2")
	ownerID := a.status.Owners()["shared"].Replica
	owner := a
	if ownerID == "r2" {
		owner = b
	}
	testenv.Eventually(t, 15*time.Second, func() bool {
		n, err := owner.status.SchedulableWorkers(testenv.Context(t))
		return err == nil && n == 1
	}, "the owner schedules the worker")

	release := holdStream(t, a, "sk-occupier", 0)
	const perTenant = 80
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	errs := make(chan error, 2*perTenant)
	for i := range perTenant {
		for k, tn := range []string{"heavy", "light"} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r := []*runningReplica{a, b}[i%2]
				cl := keyedClient(r, "sk-"+tn)
				_, err := cl.Completions.New(context.Background(), openai.CompletionNewParams{
					Model:     openai.CompletionNewParamsModel(testModel),
					Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("req %03d %c", i, 'a'+k))},
					MaxTokens: openai.Int(1),
				})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				order = append(order, tn)
				mu.Unlock()
			}()
		}
	}
	testenv.Eventually(t, 90*time.Second, func() bool {
		snap, err := owner.status.Flush(testenv.Context(t))
		return err == nil && snap.Classes["shared"].QueueDepth == 2*perTenant
	}, "every request is queued at the owner")
	release()
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	// While both had a backlog (until the heavy tenant's last grant), the
	// shares are by weight.
	last := 0
	for i, tn := range order {
		if tn == "heavy" {
			last = i
		}
	}
	served := map[string]int{}
	for _, tn := range order[:last+1] {
		served[tn]++
	}
	ratio := float64(served["heavy"]) / float64(served["light"])
	t.Logf("grants until the heavy backlog ran out: %v (ratio %.2f)", served, ratio)
	require.InDelta(t, 3.0, ratio, 0.15, "within 5%% of 3:1")
}

func TestAStreamingTenantIsChargedTheSimulatedEnginesUsageThroughTheCluster(t *testing.T) {
	// The simulated engine generates 1500 tokens for a request without
	// max_tokens and has a context of 2000; the tenant may use 3000 tokens
	// a minute. Charged the router's default (256) per stream, as when it
	// never learnt a stream's usage, the tenant could run such streams
	// back to back. Charged the context while running and the engine's
	// usage (1500 and the prompt) after, the second does not fit.
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    models: [%s]
    default_class: interactive
    quota: {tokens_per_minute: 3000}
`, tenant.HashKey("sk-acme"), testModel))
	c := newTestCluster(t, 0)
	c.addWorker("w1", func(cfg *WorkerConfig) {
		cfg.DefaultMaxTokens = 1500
		cfg.Engine.MaxModelLen = 2000
	})
	a := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys })
	c.waitOwned(defaultClasses, "r1")
	stream := func() (int, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+a.status.HTTPAddr+"/v1/completions",
			strings.NewReader(`{"model":"`+testModel+`","prompt":"tell me a long story","stream":true}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer sk-acme")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, string(b)
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		status, _ := stream()
		return status == http.StatusOK
	}, "the replica serves the worker's model")
	status, body := stream()
	require.Equal(t, http.StatusTooManyRequests, status, "the first stream's 1500 tokens were charged: %s", body)
	require.Contains(t, body, "quota_exceeded")
}

func TestAStreamThatDidNotAskForUsageSeesNoUsageChunkThroughTheCluster(t *testing.T) {
	c := newTestCluster(t, 1)
	a := c.startOwner(1)
	resp, err := http.Post("http://"+a.status.HTTPAddr+"/v1/chat/completions", "application/json",
		strings.NewReader(`{"model":"`+testModel+`","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"n":2,"stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	require.NotContains(t, string(b), `"usage"`)
	require.Contains(t, string(b), `"index":1`, "both sequences stream")
	require.True(t, strings.HasSuffix(string(b), "data: [DONE]\n\n"))
}
