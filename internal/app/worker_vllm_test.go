package app

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
)

// kvRecorder is an enginekv.Handler keeping what a subscriber delivers.
type kvRecorder struct {
	mu      sync.Mutex
	batches []enginekv.Batch
	resets  []enginekv.ResetReason
}

func (r *kvRecorder) Batch(b enginekv.Batch) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.batches = append(r.batches, b)
}

func (r *kvRecorder) Reset(reason enginekv.ResetReason) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.resets = append(r.resets, reason)
	r.batches = nil
}

// stored returns the stored events seen since the last reset.
func (r *kvRecorder) stored() []enginekv.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []enginekv.Event
	for _, b := range r.batches {
		for _, ev := range b.Events {
			if ev.Kind == enginekv.BlockStored {
				out = append(out, ev)
			}
		}
	}
	return out
}

func (r *kvRecorder) resetReasons() []enginekv.ResetReason {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.resets)
}

func storedBlocks(evs []enginekv.Event) (hashes []uint64, tokens []uint32) {
	for _, ev := range evs {
		hashes = append(hashes, ev.BlockHashes...)
		tokens = append(tokens, ev.TokenIDs...)
	}
	return hashes, tokens
}

// untilDelivered sends fresh prompts until cond holds: until the
// subscriber's subscription reaches the PUB socket, events go to nobody (as
// with any PUB), and a cached prompt would produce none.
func untilDelivered(t *testing.T, url string, rec *kvRecorder, cond func() bool) {
	t.Helper()
	n := 0
	testenv.Eventually(t, 10*time.Second, func() bool {
		n++
		fresh := make([]uint32, 16)
		for i := range fresh {
			fresh[i] = uint32(50000 + 16*n + i)
		}
		complete(t, url, fresh)
		return cond()
	}, "an event delivered to the subscriber")
}

func vllmWorkerConfig(t *testing.T) WorkerConfig {
	cfg := testWorkerConfig()
	cfg.Protocol = ProtocolVLLM
	p, r := testenv.FreePort(t), testenv.FreePort(t)
	for r == p {
		r = testenv.FreePort(t)
	}
	cfg.VLLM.EventsBind = fmt.Sprintf("tcp://127.0.0.1:%d", p)
	cfg.VLLM.ReplayBind = fmt.Sprintf("tcp://127.0.0.1:%d", r)
	cfg.VLLM.Encoding = "array"
	cfg.Engine.BlockSize = 16
	return cfg
}

func complete(t *testing.T, url string, prompt []uint32) {
	t.Helper()
	body, err := json.Marshal(map[string]any{"model": testModel, "prompt": prompt, "max_tokens": 1})
	require.NoError(t, err)
	resp, err := http.Post(url+"/v1/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
}

func TestAVLLMProtocolWorkerPublishesVLLMEventsWithTokensUnderOpaqueHashes(t *testing.T) {
	cfg := vllmWorkerConfig(t)
	w := startWorker(t, cfg)
	rec := &kvRecorder{}
	sc := enginekv.DefaultSubscriberConfig()
	sc.Endpoint, sc.ReplayEndpoint = cfg.VLLM.EventsBind, cfg.VLLM.ReplayBind
	sub, err := enginekv.NewSubscriber(sc, rec, zaptest.NewLogger(t), prometheus.NewRegistry())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	subDone := make(chan error, 1)
	go func() { subDone <- sub.Run(ctx) }()
	defer func() { cancel(); require.NoError(t, <-subDone) }()

	prompt := make([]uint32, 64)
	for i := range prompt {
		prompt[i] = uint32(1000 + i)
	}
	untilDelivered(t, w.url, rec, func() bool { return len(rec.stored()) > 0 })
	complete(t, w.url, prompt)
	// The prompt's events (the fresh prompts' ones are told apart by their
	// tokens, all above 50000).
	ofPrompt := func() []enginekv.Event {
		var out []enginekv.Event
		for _, ev := range rec.stored() {
			if len(ev.TokenIDs) > 0 && ev.TokenIDs[0] < 50000 {
				out = append(out, ev)
			}
		}
		return out
	}
	testenv.Eventually(t, 10*time.Second, func() bool { hs, _ := storedBlocks(ofPrompt()); return len(hs) >= 4 }, "4 stored blocks")
	evs := ofPrompt()
	hashes, tokens := storedBlocks(evs)
	require.Equal(t, prompt, tokens, "the stored blocks carry the prompt's tokens in order")
	for i, ev := range evs {
		assert.Equal(t, 16, ev.BlockSize)
		assert.Equal(t, "GPU", ev.Medium)
		assert.Zero(t, ev.LoRAID)
		assert.Len(t, ev.TokenIDs, 16*len(ev.BlockHashes))
		if i == 0 {
			assert.False(t, ev.HasParent)
		} else {
			assert.True(t, ev.HasParent)
			prev := evs[i-1].BlockHashes
			assert.Equal(t, prev[len(prev)-1], ev.ParentHash, "parent_block_hash chains the engine hashes")
		}
	}
	for _, h := range kvindex.SequenceHashes(prompt, 16, kvindex.BaseSeed) {
		assert.NotContains(t, hashes, h, "engine hashes are not Switchyard's sequence hashes")
	}
	assert.Empty(t, rec.resetReasons())

	// A restart: the sequence starts again at 0 and the hashes of the same
	// prompt differ (a new per-process seed), as vLLM's do.
	require.NoError(t, w.stop())
	w2 := startWorker(t, cfg)
	untilDelivered(t, w2.url, rec, func() bool { return len(rec.resetReasons()) > 0 })
	assert.Equal(t, []enginekv.ResetReason{enginekv.ResetRestart}, rec.resetReasons())
	complete(t, w2.url, prompt[:32])
	var again []uint64
	testenv.Eventually(t, 10*time.Second, func() bool {
		for _, ev := range rec.stored() {
			if slices.Equal(ev.TokenIDs, prompt[:32]) {
				again = ev.BlockHashes
				return true
			}
		}
		return false
	}, "the restarted engine's store of the same two blocks")
	assert.NotEqual(t, hashes[:2], again, "a restarted engine hashes with a new seed")
}

func TestAVLLMProtocolWorkerServesVLLMsHealthModelsAndMetrics(t *testing.T) {
	cfg := vllmWorkerConfig(t)
	w := startWorker(t, cfg)
	get := func(path string) (int, string) {
		resp, err := http.Get(w.url + path)
		require.NoError(t, err)
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		resp.Body.Close()
		return resp.StatusCode, string(b)
	}
	code, body := get("/health")
	assert.Equal(t, http.StatusOK, code)
	assert.Empty(t, body)

	code, body = get("/v1/models")
	require.Equal(t, http.StatusOK, code)
	var models struct {
		Data []struct {
			ID          string `json:"id"`
			Root        string `json:"root"`
			OwnedBy     string `json:"owned_by"`
			MaxModelLen int    `json:"max_model_len"`
		} `json:"data"`
	}
	require.NoError(t, json.Unmarshal([]byte(body), &models))
	require.Len(t, models.Data, 1)
	assert.Equal(t, testModel, models.Data[0].ID)
	assert.Equal(t, testModel, models.Data[0].Root)
	assert.Equal(t, "vllm", models.Data[0].OwnedBy)
	assert.Equal(t, cfg.Engine.MaxModelLen, models.Data[0].MaxModelLen)

	complete(t, w.url, []uint32{1, 2, 3, 4, 5})
	code, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	for _, want := range []string{
		`vllm:num_requests_running{engine="0",model_name="sim-model"} 0`,
		`vllm:num_requests_waiting{engine="0",model_name="sim-model"} 0`,
		`vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"}`,
		`vllm:generation_tokens_total{engine="0",model_name="sim-model"} 1`,
		`block_size="16"`,
		`num_gpu_blocks="4096"`,
		`vllm:cache_config_info{`,
		enginekv.NamePubBatches,
		"switchyard_engine_kv_blocks_total", // the worker's own metrics stay
	} {
		assert.Contains(t, body, want)
	}
}

func TestTheVLLMProtocolRegistersNowhereItself(t *testing.T) {
	cfg := vllmWorkerConfig(t)
	cfg.NATSURL = "nats://127.0.0.1:4222"
	assert.ErrorContains(t, cfg.Validate(), "NATSURL")
	cfg = vllmWorkerConfig(t)
	cfg.EtcdEndpoints = []string{"127.0.0.1:2379"}
	assert.ErrorContains(t, cfg.Validate(), "EtcdEndpoints")
	cfg = vllmWorkerConfig(t)
	cfg.VLLM.Encoding = "yaml"
	assert.ErrorContains(t, cfg.Validate(), "yaml")
	cfg.Protocol = "sglang"
	assert.ErrorContains(t, cfg.Validate(), "Protocol")
}
