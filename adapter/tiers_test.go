package adapter

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
)

// vllmCPUStored is vLLM's offloading connector's report of blocks copied to
// host memory: map events, no token ids, no parent.
func vllmCPUStored(hashes []uint64) map[string]any {
	return map[string]any{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": nil,
		"token_ids": []uint32{}, "block_size": testBS, "lora_id": nil, "medium": "CPU"}
}

// sglangHostStored is SGLang's hierarchical cache writing blocks to pinned
// host memory: tagged arrays with tokens and signed hashes.
func sglangHostStored(p prompt, from, to int) []any {
	hs := make([]int64, 0, to-from)
	for _, h := range p.engine[from:to] {
		hs = append(hs, -int64(h>>1))
	}
	var parent any
	if from > 0 {
		parent = -int64(p.engine[from-1] >> 1)
	}
	return []any{"BlockStored", hs, parent, p.tokens[from*p.bs : to*p.bs], p.bs, nil, "CPU_PINNED"}
}

func TestOverZMQCPUTierBlocksAreMirroredAsTheWorkersCPUStreamAndGPUBlocksStayApart(t *testing.T) {
	p := startPublisher(t)
	etcd := testenv.StartEtcd(t)
	n := testenv.StartNATS(t)
	eng := startFakeEngine(t)
	cfg := testAdapterConfig(eng, etcd, n)
	cfg.KVEvents, cfg.KVReplay, cfg.KVTopic = p.pubEP, p.replay, "kv"
	cfg.KVTiers, cfg.KVTierBlocks = "cpu", "cpu=4096"
	router := startRouterIndex(t, n, "w1", 2048)
	cpu := kvindex.TierStream("w1", kvindex.TierCPU)
	require.NoError(t, router.ix.SetCapacity(cpu, 4096))
	ra := startAdapterReal(t, cfg, etcd, n)
	testenv.Eventually(t, 10*time.Second, func() bool { return ra.a.ready() == "" }, "adapter ready")
	p.do(t, "waitsub")

	a := newPrompt(1, 4, testBS)
	c := newPrompt(2, 2, testBS)
	p.add(t, vllmArrayStored(a.stored(0, 4))) // computed on GPU
	p.add(t, vllmCPUStored(a.engine))         // offloaded to host memory (vLLM)
	p.add(t, map[string]any{"type": "BlockRemoved", "block_hashes": a.engine[2:4], "medium": "GPU"})
	p.add(t, sglangHostStored(c, 0, 2)) // SGLang's host tier, with tokens
	p.add(t, map[string]any{"type": "BlockStored", "block_hashes": []uint64{99}, "parent_block_hash": nil,
		"token_ids": c.tokens[:testBS], "block_size": testBS, "lora_id": nil, "medium": "NVME"})
	for i := range 5 {
		p.do(t, fmt.Sprintf("pub %d", i))
	}
	router.holdsExactly(t, "w1", a.want(testSalt, 2), "the GPU tier lost the evicted blocks")
	router.holdsExactly(t, cpu, slices.Concat(a.want(testSalt, 4), c.want(testSalt, 2)), "the CPU tier holds both engines' styles")

	got := map[string]int{}
	for _, m := range router.ix.Lookup(a.want(testSalt, 4), nil) {
		got[m.Worker] = m.Blocks
	}
	assert.Equal(t, map[string]int{"w1": 2, cpu: 4}, got, "a lookup sees each tier's depth")

	watcher := etcd.Client(t)
	testenv.Eventually(t, 5*time.Second, func() bool { return registered(t, watcher, "w1") != nil }, "registration")
	assert.Equal(t, map[string]int{"cpu": 4096}, registered(t, watcher, "w1").TierBlocks)

	_, body := httpGet(t, ra.url+"/metrics")
	assert.Contains(t, string(body), `switchyard_adapter_kv_skipped_blocks_total{reason="medium_unknown",tier="cpu"} 1`)
	assert.Contains(t, string(body), `switchyard_adapter_kv_skipped_blocks_total{reason="medium_unknown"} 1`)
	assert.Contains(t, string(body), `switchyard_adapter_kv_skipped_blocks_total{reason="medium"} 6`, "the GPU mirror skips the CPU blocks")
	assert.True(t, strings.Contains(string(body), `switchyard_adapter_kv_mirrored_blocks{tier="cpu"} 6`), "the CPU mirror's size")
}

func TestTierFlagsAreCheckedUpFront(t *testing.T) {
	cfg := DefaultConfig()
	cfg.EngineURL, cfg.ID = "http://127.0.0.1:1", "w"
	cfg.KVTiers = "cpu"
	require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "tiers without events")
	cfg.KVEvents = "tcp://127.0.0.1:5557"
	require.NoError(t, cfg.Validate())
	for _, bad := range []struct{ tiers, blocks string }{{"gpu", ""}, {"cpu,cpu", ""}, {"cpu", "cpu=0"}, {"cpu", "nvme=3"}} {
		cfg.KVTiers, cfg.KVTierBlocks = bad.tiers, bad.blocks
		require.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, "%+v", bad)
	}
}
