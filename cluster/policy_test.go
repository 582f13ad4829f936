package cluster

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func TestSeedConfigWritesOnlyWhenAbsentUnlessOverwriting(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	get := func() string {
		resp, err := client.Get(ctx, wire.NewKeys(testCluster).PolicyConfig())
		require.NoError(t, err)
		require.Len(t, resp.Kvs, 1)
		return string(resp.Kvs[0].Value)
	}
	ok, err := SeedConfig(ctx, client, testCluster, []byte("v1"), false)
	require.NoError(t, err)
	require.True(t, ok)
	ok, err = SeedConfig(ctx, client, testCluster, []byte("v2"), false)
	require.NoError(t, err)
	require.False(t, ok, "an existing config is not clobbered")
	require.Equal(t, "v1", get())
	ok, err = SeedConfig(ctx, client, testCluster, []byte("v3"), true)
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, "v3", get())
}

func TestConfigWatcherDeliversTheCurrentAndEveryLaterVersionInOrder(t *testing.T) {
	e := testenv.StartEtcd(t)
	client := e.Client(t)
	ctx := testenv.Context(t)
	_, err := SeedConfig(ctx, client, testCluster, []byte("v0"), false)
	require.NoError(t, err)

	var mu sync.Mutex
	var got []ConfigVersion
	w, err := NewConfigWatcher(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond},
		func(v ConfigVersion) { mu.Lock(); got = append(got, v); mu.Unlock() }, Deps{Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	runInBackground(t, w.Run)
	testenv.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 1 }, "current version delivered")

	for _, v := range []string{"v1", "v2", "v3"} {
		_, err := SeedConfig(ctx, client, testCluster, []byte(v), true)
		require.NoError(t, err)
	}
	_, err = client.Delete(ctx, wire.NewKeys(testCluster).PolicyConfig())
	require.NoError(t, err)
	_, err = SeedConfig(ctx, client, testCluster, []byte("v4"), false)
	require.NoError(t, err)
	testenv.Eventually(t, 5*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(got) == 5 }, "all versions delivered")
	mu.Lock()
	defer mu.Unlock()
	for i, v := range got {
		require.Equal(t, "v"+string(rune('0'+i)), string(v.Raw))
		if i > 0 {
			require.Greater(t, v.Revision, got[i-1].Revision)
		}
	}
}
