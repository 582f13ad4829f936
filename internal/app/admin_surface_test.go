package app

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"

	"github.com/switchyard/switchyard/tenant"
)

func TestAReplicaWithAKeysFileServesMetricsAndDebugOnlyToAnAdminKey(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf("tenants:\n  - id: acme\n    keys: [%q]\nadmins:\n  - id: prometheus\n    keys: [%q]\n",
		tenant.HashKey("sk-acme"), tenant.HashKey("sk-admin")))
	c := newTestCluster(t, 0)
	a := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Tenants.KeysFile = keys })
	get := func(path, key string) int {
		req, err := http.NewRequest(http.MethodGet, "http://"+a.status.HTTPAddr+path, nil)
		require.NoError(t, err)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, path := range []string{"/metrics", "/debug/cluster"} {
		require.Equal(t, http.StatusUnauthorized, get(path, ""), path)
		require.Equal(t, http.StatusForbidden, get(path, "sk-acme"), path)
		require.Equal(t, http.StatusOK, get(path, "sk-admin"), path)
	}
}

func TestTheRouterSaysAtStartupWhoCanReadTheAPIAndTheAdminRoutes(t *testing.T) {
	for _, c := range []struct {
		name      string
		adminAddr string
		keys      string // keys file body; "" none
		want      string
	}{
		{name: "no keys, no admin listener", want: "the OpenAI API, /metrics and /debug/* are open"},
		{name: "no keys, admin listener", adminAddr: "127.0.0.1:9090", want: "the OpenAI API is open"},
		{name: "keys without admins", keys: fmt.Sprintf("tenants:\n  - id: a\n    keys: [%q]\n", tenant.HashKey("a")),
			want: "/metrics and /debug/* refuse every request"},
		{name: "keys with admins", keys: fmt.Sprintf("admins:\n  - id: ops\n    keys: [%q]\n", tenant.HashKey("k")),
			want: "need an admin key"},
	} {
		t.Run(c.name, func(t *testing.T) {
			core, logs := observer.New(zap.InfoLevel)
			var store *tenant.Store
			if c.keys != "" {
				cfg := tenant.DefaultConfig()
				cfg.KeysFile = writeKeys(t, c.keys)
				var err error
				store, err = tenant.NewStore(cfg, zap.NewNop(), nil, nil)
				require.NoError(t, err)
			}
			warnAdminSurface(zap.New(core), c.adminAddr, store)
			require.Equal(t, 1, logs.Len())
			require.Contains(t, logs.All()[0].Message, c.want)
		})
	}
}
