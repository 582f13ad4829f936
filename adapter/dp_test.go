package adapter

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// addRank buffers a batch stamped with a data-parallel rank, as each of
// vLLM's engine cores stamps its own.
func (p *pyPublisher) addRank(t *testing.T, rank int, events ...any) {
	t.Helper()
	b, err := json.Marshal(map[string]any{"events": events, "dp_rank": rank})
	require.NoError(t, err)
	p.do(t, "add "+string(b))
}

func TestOverZMQEachDataParallelRankIsAWorkerOfItsOwnWithItsOwnBlocks(t *testing.T) {
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	// vLLM's rank r binds the configured port + r.
	pubBase, replayBase := testenv.FreePort(t), testenv.FreePort(t)
	ep := func(port, r int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port+r) }
	pubs := []*pyPublisher{startPublisherAt(t, ep(pubBase, 0), ep(replayBase, 0)), startPublisherAt(t, ep(pubBase, 1), ep(replayBase, 1))}
	r0 := startRouterIndex(t, n, DPWorkerID("w1", 0), 2048)
	require.NoError(t, r0.ix.SetCapacity(DPWorkerID("w1", 1), 2048))
	for r := range 2 {
		cfg := testAdapterConfig(eng, etcd, n)
		cfg.KVEvents, cfg.KVReplay, cfg.KVTopic = ep(pubBase, 0), ep(replayBase, 0), "kv"
		cfg.DPRank, cfg.DPSize = r, 2
		ra := startAdapterReal(t, cfg, etcd, n)
		testenv.Eventually(t, 10*time.Second, func() bool { return ra.a.ready() == "" }, "adapter ready")
		pubs[r].do(t, "waitsub")
	}
	a := newPrompt(1, 3, testBS)
	c := newPrompt(2, 2, testBS)
	pubs[0].addRank(t, 0, vllmArrayStored(a.stored(0, 3)))
	pubs[1].addRank(t, 1, vllmArrayStored(c.stored(0, 2)))
	pubs[0].do(t, "pub 0")
	pubs[1].do(t, "pub 0")
	r0.holdsExactly(t, "w1-dp0", a.want(testSalt, 3), "rank 0's cache")
	r0.holdsExactly(t, "w1-dp1", c.want(testSalt, 2), "rank 1's cache, kept apart")

	watcher := etcd.Client(t)
	for r := range 2 {
		id := DPWorkerID("w1", r)
		testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, id) != nil }, "registration of "+id)
		info := registered(t, watcher, id)
		assert.Equal(t, r, info.DPRank, id)
		assert.Equal(t, 2, info.DPSize, id)
		assert.Equal(t, eng.srv.URL, info.URL, "every rank is reached through the one API server")
	}
	assert.Nil(t, registered(t, watcher, "w1"), "the engine itself is not a routing target")
}

func TestARanksEndpointsAreTheBaseOnesOffsetByTheRank(t *testing.T) {
	for _, c := range []struct {
		in   string
		r    int
		want string
	}{
		{"tcp://127.0.0.1:5557", 0, "tcp://127.0.0.1:5557"},
		{"tcp://127.0.0.1:5557", 3, "tcp://127.0.0.1:5560"},
		{"tcp://*:5557", 1, "tcp://*:5558"},
		{"tcp://[::1]:5557", 2, "tcp://[::1]:5559"},
		{"ipc:///tmp/kv", 2, "ipc:///tmp/kv_dp2"},
		{"", 2, ""},
	} {
		got, err := offsetPort(c.in, c.r)
		require.NoError(t, err, c.in)
		assert.Equal(t, c.want, got, c.in)
	}
	_, err := offsetPort("tcp://127.0.0.1:65535", 1)
	require.ErrorIs(t, err, ErrInvalidConfig)
	cfg := DefaultConfig()
	cfg.EngineURL, cfg.ID = "http://127.0.0.1:1", "w"
	for _, bad := range [][2]int{{1, 0}, {2, 2}, {-1, 2}, {0, -1}} {
		cfg.DPRank, cfg.DPSize = bad[0], bad[1]
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "rank %d of %d", bad[0], bad[1])
	}
}

func TestARanksLoadIsItsOwnEnginesSeriesOnly(t *testing.T) {
	text := []byte(vllmMetrics(3, 2, 0.25)) // engine "0": 3 running, 2 waiting; engine "1": 1 running
	all, err := ParseLoadMetrics(text, FlavorVLLM)
	require.NoError(t, err)
	assert.Equal(t, Load{Running: 4, Waiting: 2, KVUsage: 0.25, HasUsage: true, PrefixHitRate: 0.3}, all)
	for rank, want := range map[string]Load{
		"0": {Running: 3, Waiting: 2, KVUsage: 0.25, HasUsage: true, PrefixHitRate: 0.3}, // 240 of 800
		"1": {Running: 1, Waiting: 0, KVUsage: 0.25, HasUsage: true, PrefixHitRate: 0.3}, // 120 of 400
	} {
		got, err := parseLoadRank(text, FlavorVLLM, rank)
		require.NoError(t, err)
		assert.Equal(t, want, got, "rank %s", rank)
	}
	cfg := DefaultConfig()
	assert.Empty(t, cfg.rank(), "without data parallelism every engine counts")
	cfg.DPRank, cfg.DPSize = 1, 2
	assert.Equal(t, "1", cfg.rank())
}
