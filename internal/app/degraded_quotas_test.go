package app

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// /debug/cluster shows the degraded quota policy next to degraded and
// degraded_modes: the policy file's (split by default), the divisor (the
// replicas this one sees alive, sampled while it is not degraded) and the
// effective class limits a degraded admission would enforce.
func TestDebugClusterShowsTheDegradedQuotaPolicyItsDivisorAndTheEffectiveLimits(t *testing.T) {
	c := newTestCluster(t, 1)
	a, _ := c.startReplica("r1"), c.startReplica("r2")
	c.waitOwned(defaultClasses, "r1", "r2")

	body, doc := awaitDebugCluster(t, a.status.HTTPAddr, func(doc clusterDoc) bool { return doc.Quotas.Divisor == 2 },
		"the divisor to count both replicas")

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
