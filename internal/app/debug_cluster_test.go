package app

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/tenant"
)

// awaitDebugCluster polls addr's /debug/cluster until the document decodes
// and ready holds, and returns its body and document; what shows that it
// does not hold is named by what.
func awaitDebugCluster(t *testing.T, addr string, ready func(clusterDoc) bool, what string) ([]byte, clusterDoc) {
	t.Helper()
	var body []byte
	var doc clusterDoc
	testenv.Eventually(t, 15*time.Second, func() bool {
		resp, err := http.Get("http://" + addr + "/debug/cluster")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		doc = clusterDoc{}
		return json.Unmarshal(body, &doc) == nil && ready(doc)
	}, what+" in %s", &body)
	return body, doc
}

func TestDebugClusterNamesEveryReplicaAddressAndVersionInSnakeCase(t *testing.T) {
	c := newTestCluster(t, 1)
	a, _ := c.startReplica("r1"), c.startReplica("r2")
	c.waitOwned(defaultClasses, "r1", "r2")

	body, doc := awaitDebugCluster(t, a.status.HTTPAddr, func(doc clusterDoc) bool {
		return len(doc.Replicas) == 2 && len(doc.Members) == 2 && len(doc.Workers) == 1 && doc.Workers[0].Health == "healthy"
	}, "two replicas, two gossip members and one healthy worker")

	require.Empty(t, regexp.MustCompile(`"[A-Z][A-Za-z]*":`).FindAllString(string(body), -1), "every key is snake_case")
	require.Equal(t, "r1", doc.Self)
	require.Equal(t, "ready", doc.State)
	require.Equal(t, "connected", doc.NATS)
	for _, r := range doc.Replicas {
		require.NotEmpty(t, r.HTTPAddr, r.ID)
		require.NotEmpty(t, r.Version, r.ID)
		require.True(t, r.Ready, r.ID)
	}
	for _, m := range doc.Members {
		require.NotEmpty(t, m.HTTPAddr, "gossip member %s advertises its API", m.Name)
		require.NotEmpty(t, m.Version, "gossip member %s advertises its build", m.Name)
	}
	require.NotNil(t, doc.Workers[0].Reported)
	require.Equal(t, a.status.HTTPAddr, doc.HTTPAddr)
}

func TestDebugClusterShowsTenantsAgainstQuotasWorkersCalibrationAndDecisionCandidates(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf("tenants:\n  - id: acme\n    keys: [%q]\n    quota: {concurrent: 4, requests_per_minute: 6}\nadmins:\n  - id: ops\n    keys: [%q]\n",
		tenant.HashKey("sk-acme"), tenant.HashKey("sk-admin")))
	c := newTestCluster(t, 2)
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys })
	c.waitOwned(defaultClasses, "r1")

	// The same prompt on w1, then pinned to w2: the second decision weighs
	// both.
	acme := keyedClient(r, "sk-acme")
	prompt := strings.Repeat("a prompt two workers are weighed for ", 20)
	for _, w := range []string{"w1", "w2"} {
		_, err := acme.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
			MaxTokens: openai.Int(2),
		}, option.WithHeader("x-switchyard-worker", w))
		require.NoError(t, err, "pinned to %s", w)
	}

	var body []byte
	var doc clusterDoc
	var pinned frontend.Decision
	testenv.Eventually(t, 15*time.Second, func() bool {
		req, _ := http.NewRequest(http.MethodGet, "http://"+r.status.HTTPAddr+"/debug/cluster", nil)
		req.Header.Set("Authorization", "Bearer sk-admin")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		doc = clusterDoc{}
		if json.Unmarshal(body, &doc) != nil {
			return false
		}
		if len(doc.Tenants) == 0 || doc.Tenants[0].Use == nil { // the actor's snapshot lags its turns
			return false
		}
		for _, w := range doc.Workers {
			if w.Calibration.Marks == 0 {
				return false
			}
		}
		for _, d := range doc.Decisions {
			if d.Worker == "w2" && len(d.Candidates) >= 2 && d.RealisedTokens != nil {
				pinned = d
				return true
			}
		}
		return false
	}, "the pinned decision with two candidates, acme's use and both workers calibrated in %s", &body)
	require.Empty(t, regexp.MustCompile(`"[A-Z][A-Za-z]*":`).FindAllString(string(body), -1), "every key is snake_case")

	require.Equal(t, "w2", pinned.Candidates[0].Worker, "the winner first")
	require.Equal(t, "w1", pinned.Candidates[1].Worker, "then the holder of the prefix")
	require.Positive(t, pinned.Candidates[1].CachedTokens)
	for _, cd := range pinned.Candidates {
		require.Positive(t, cd.PredictedTTFTMs, "candidate %s has a predicted TTFT", cd.Worker)
	}
	require.Positive(t, pinned.TTFTMs, "the outcome's TTFT")

	require.Len(t, doc.Tenants, 1)
	acmeDoc := doc.Tenants[0]
	require.Equal(t, "acme", acmeDoc.ID)
	require.True(t, acmeDoc.Configured)
	require.Equal(t, quotaDoc{Concurrent: 4, RequestsPerMinute: 6}, acmeDoc.Quota)
	require.NotNil(t, acmeDoc.Use, "r1 owns every class: its scheduler accounts acme")
	require.NotNil(t, acmeDoc.Use.RequestsLeft)
	require.Less(t, *acmeDoc.Use.RequestsLeft, 6.0, "two requests came out of the bucket")
	require.Nil(t, acmeDoc.Use.TokensLeft, "no tokens quota: no level")

	for _, w := range doc.Workers {
		require.Positive(t, w.Calibration.Marks, "worker %s served a request: its first token calibrated it", w.ID)
		require.Positive(t, w.Calibration.Scale, w.ID)
		require.Equal(t, uint64(1), w.Cached.Reports, w.ID)
	}
	for name, cd := range doc.Classes {
		require.NotNil(t, cd.QueueByPriority, "class %s has a queue by tier, empty when idle", name)
	}
}
