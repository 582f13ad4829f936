package app

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// /debug/cluster shows the degraded quota policy next to degraded and
// degraded_modes: the policy file's (split by default), the divisor (the
// replicas this one sees alive, sampled while it is not degraded) and the
// effective class limits a degraded admission would enforce.
func TestDebugClusterShowsTheDegradedQuotaPolicyItsDivisorAndTheEffectiveLimits(t *testing.T) {
	c := newTestCluster(t, 1)
	a, _ := c.startReplica("r1"), c.startReplica("r2")
	c.waitOwned(defaultClasses, "r1", "r2")

	var body []byte
	var doc clusterDoc
	testenv.Eventually(t, 15*time.Second, func() bool {
		resp, err := http.Get("http://" + a.status.HTTPAddr + "/debug/cluster")
		if err != nil {
			return false
		}
		body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		doc = clusterDoc{}
		return json.Unmarshal(body, &doc) == nil && doc.Quotas.Divisor == 2
	}, "the divisor to count both replicas in %s", &body)

	dq := doc.Quotas
	require.Equal(t, "split", dq.Policy, "the default")
	require.False(t, dq.Frozen, "not degraded: the divisor follows the replicas alive")
	// deploy/policy.yaml: interactive queues 64 requests and 262144 prompt
	// tokens per worker, cached tokens unlimited.
	require.Equal(t, degradedLimitsDoc{Requests: 32, ISLTokens: 131072, CachedTokens: -1}, dq.Classes["interactive"])
	require.Len(t, dq.Classes, len(defaultClasses))
	require.NotNil(t, dq.Tenants, "an open API has no tenants, shown as an empty map")

	var raw map[string]json.RawMessage
	require.NoError(t, json.Unmarshal(body, &raw))
	require.Contains(t, raw, "degraded_quotas", "snake_case, next to degraded and degraded_modes")
}
