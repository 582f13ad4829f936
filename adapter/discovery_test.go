package adapter

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseModelsReadsTheBaseItsContextLengthAndTheLoRAsWithTheirParent(t *testing.T) {
	ms, err := ParseModels([]byte(vllmModels))
	require.NoError(t, err)
	assert.Equal(t, "meta-llama/Llama-3.1-8B-Instruct", ms.Base)
	assert.Equal(t, 8192, ms.MaxModelLen)
	assert.Equal(t, []string{"sql-lora"}, ms.Others)
	assert.Equal(t, []string{"sql-lora"}, ms.LoRAs)
}

func TestParseModelsKeepsAliasesOfTheBaseAsFurtherNames(t *testing.T) {
	ms, err := ParseModels([]byte(`{"data":[{"id":"a","parent":null,"max_model_len":4096},{"id":"b","parent":null},{"id":"a"},{"id":"l","parent":"a"}]}`))
	require.NoError(t, err)
	assert.Equal(t, "a", ms.Base)
	assert.Equal(t, []string{"b", "l"}, ms.Others)
	assert.Equal(t, []string{"l"}, ms.LoRAs)
}

func TestParseModelsRejectsGarbageAndAbsurdValues(t *testing.T) {
	for name, body := range map[string]string{
		"not json":          `<html>`,
		"no data":           `{"object":"list"}`,
		"empty data":        `{"data":[]}`,
		"empty id":          `{"data":[{"id":""}]}`,
		"negative len":      `{"data":[{"id":"m","max_model_len":-1}]}`,
		"fractional len":    `{"data":[{"id":"m","max_model_len":1.5}]}`,
		"huge len":          `{"data":[{"id":"m","max_model_len":1e30}]}`,
		"string len":        `{"data":[{"id":"m","max_model_len":"8192"}]}`,
		"data is an object": `{"data":{"id":"m"}}`,
		"newline in the id": `{"data":[{"id":"m\nx"}]}`,
	} {
		_, err := ParseModels([]byte(body))
		assert.Truef(t, errors.Is(err, ErrMalformed), "%s: %v", name, err)
	}
}

func TestParseCacheConfigReadsBlockSizeAndGPUBlocksFromVLLMsInfoMetric(t *testing.T) {
	c, err := ParseCacheConfig([]byte(vllmMetrics(0, 0, 0)))
	require.NoError(t, err)
	assert.Equal(t, CacheConfig{BlockSize: 16, NumGPUBlocks: 2048}, c)
	// Before the profile run vLLM exports num_gpu_blocks="None".
	c, err = ParseCacheConfig([]byte("vllm:cache_config_info{block_size=\"32\",num_gpu_blocks=\"None\"} 1\n"))
	require.NoError(t, err)
	assert.Equal(t, CacheConfig{BlockSize: 32}, c)
}

func TestParseCacheConfigRejectsMissingMetricsGarbageAndAbsurdLabels(t *testing.T) {
	for name, text := range map[string]string{
		"absent":         "vllm:num_requests_running 1\n",
		"not metrics":    "{\"a\":1}\n",
		"bad block size": "vllm:cache_config_info{block_size=\"sixteen\"} 1\n",
		"huge":           "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=\"1e20\"} 1\n",
		"negative":       "vllm:cache_config_info{block_size=\"-16\"} 1\n",
		"bad line":       "vllm:cache_config_info{block_size=\"16\" 1\n",
	} {
		_, err := ParseCacheConfig([]byte(text))
		assert.Truef(t, errors.Is(err, ErrMalformed), "%s: %v", name, err)
	}
}

// sglangServerInfo is shaped like SGLang's /get_server_info: its server
// arguments, the scheduler info merged in, and internal_states per DP rank.
const sglangServerInfo = `{"model_path":"/models/qwen2.5-7b","tokenizer_path":"/models/qwen2.5-7b",
 "served_model_name":"Qwen/Qwen2.5-7B-Instruct","page_size":1,"context_length":null,
 "max_running_requests":null,"chunked_prefill_size":8192,"mem_fraction_static":0.88,
 "enable_metrics":true,"kv_events_config":"{\"publisher\":\"zmq\"}",
 "max_total_num_tokens":500000,"max_req_input_len":32762,
 "internal_states":[{"attention_backend":"flashinfer","max_total_num_tokens":500000,"last_gen_throughput":12.5}],
 "version":"0.5.4"}`

func TestParseServerInfoReadsSGLangsPagePoolAndName(t *testing.T) {
	s, err := ParseServerInfo([]byte(sglangServerInfo))
	require.NoError(t, err)
	assert.Equal(t, "Qwen/Qwen2.5-7B-Instruct", s.ServedModelName)
	assert.Equal(t, 1, s.PageSize)
	assert.Equal(t, 500000, s.MaxTotalNumTokens)
	assert.Equal(t, 500000, s.KVBlocks())
	assert.Equal(t, 8192, s.ChunkedPrefill)
	assert.Equal(t, 0, s.ContextLength)

	// Only in internal_states, name from model_path, -1 for "no limit".
	s, err = ParseServerInfo([]byte(`{"model_path":"/m","page_size":64,"max_running_requests":-1,
		"internal_states":[{"max_total_num_tokens":6400}],"context_length":32768}`))
	require.NoError(t, err)
	assert.Equal(t, ServerInfo{ServedModelName: "/m", PageSize: 64, MaxTotalNumTokens: 6400, ContextLength: 32768}, s)
	assert.Equal(t, 100, s.KVBlocks())
}

func TestParseServerInfoRejectsGarbage(t *testing.T) {
	for name, body := range map[string]string{
		"not json":      `]`,
		"null":          `null`,
		"array":         `[1,2]`,
		"bad page size": `{"page_size":"16"}`,
		"huge pool":     `{"page_size":16,"max_total_num_tokens":1e40}`,
		"bad state":     `{"page_size":16,"internal_states":[{"max_total_num_tokens":-5}]}`,
	} {
		_, err := ParseServerInfo([]byte(body))
		assert.Truef(t, errors.Is(err, ErrMalformed), "%s: %v", name, err)
	}
}

func TestParseLoadMetricsSumsCountsOverLabelSetsAndAveragesUsage(t *testing.T) {
	l, err := ParseLoadMetrics([]byte(vllmMetrics(3, 2, 0.25)), FlavorVLLM)
	require.NoError(t, err)
	assert.Equal(t, Load{Running: 4, Waiting: 2, KVUsage: 0.25, HasUsage: true, PrefixHitRate: 0.3}, l)

	old := "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:gpu_cache_usage_perc 0.5\n"
	l, err = ParseLoadMetrics([]byte(old), FlavorVLLM)
	require.NoError(t, err)
	assert.Equal(t, Load{Running: 1, KVUsage: 0.5, HasUsage: true}, l, "older vLLM's gauge name")

	sg := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="q",engine_type="unified",tp_rank="0"} 5.0
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="q",engine_type="unified",tp_rank="0"} 7.0
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="q",engine_type="unified",tp_rank="0"} 0.75
`
	l, err = ParseLoadMetrics([]byte(sg), FlavorSGLang)
	require.NoError(t, err)
	assert.Equal(t, Load{Running: 5, Waiting: 7, KVUsage: 0.75, HasUsage: true}, l)
}

func TestParseLoadMetricsRejectsMissingCountsGarbageAndAbsurdNumbers(t *testing.T) {
	for name, text := range map[string]string{
		"no counts":     "vllm:kv_cache_usage_perc 0.1\n",
		"garbage":       "\x00\x01\x02",
		"negative":      "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n",
		"NaN":           "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n",
		"fraction":      "vllm:num_requests_running 1.5\nvllm:num_requests_waiting 0\n",
		"usage above 1": "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 7\n",
		"huge":          "vllm:num_requests_running 1e300\nvllm:num_requests_waiting 0\n",
		"type mismatch": "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running counter\n",
	} {
		_, err := ParseLoadMetrics([]byte(text), FlavorVLLM)
		assert.Truef(t, errors.Is(err, ErrMalformed), "%s: %v", name, err)
	}
}

func FuzzParseModels(f *testing.F) {
	f.Add([]byte(vllmModels))
	f.Add([]byte(`{"data":[{"id":"l","parent":"a"}]}`))
	f.Add([]byte(`{"data":[{"id":"a","max_model_len":1e308}]}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ms, err := ParseModels(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if ms.Base == "" || ms.MaxModelLen < 0 || len(ms.LoRAs) > len(ms.Others) {
			t.Fatalf("accepted an unusable answer: %+v", ms)
		}
	})
}

func FuzzParseCacheConfig(f *testing.F) {
	f.Add([]byte(vllmMetrics(1, 2, 0.5)))
	f.Add([]byte("vllm:cache_config_info{block_size=\"None\"} 1\n"))
	f.Add([]byte("# TYPE vllm:cache_config_info gauge\nvllm:cache_config_info{a=\"\\\"\"} NaN\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseCacheConfig(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if c.BlockSize < 0 || c.BlockSize > maxBlockSize || c.NumGPUBlocks < 0 || c.NumGPUBlocks > maxKVBlocks {
			t.Fatalf("accepted absurd values: %+v", c)
		}
	})
}

func FuzzParseServerInfo(f *testing.F) {
	f.Add([]byte(sglangServerInfo))
	f.Add([]byte(`{"served_model_name":["a","b"],"page_size":16}`))
	f.Add([]byte(`{"internal_states":"x"}`))
	f.Add([]byte(`{"page_size":16,"disaggregation_mode":"prefill","disaggregation_bootstrap_port":8998}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := ParseServerInfo(b)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if s.PageSize < 0 || s.MaxTotalNumTokens < 0 || s.KVBlocks() < 0 || len(s.ServedModelName) > maxNameLen {
			t.Fatalf("accepted absurd values: %+v", s)
		}
	})
}

func FuzzParseLoadMetrics(f *testing.F) {
	f.Add([]byte(vllmMetrics(3, 2, 0.25)), true)
	f.Add([]byte("sglang:num_running_reqs 1\nsglang:num_queue_reqs 2\nsglang:token_usage 0.1\n"), false)
	f.Add([]byte("vllm:num_requests_running{a=\"b\"} +Inf\n"), true)
	f.Fuzz(func(t *testing.T, b []byte, vllm bool) {
		fl := FlavorSGLang
		if vllm {
			fl = FlavorVLLM
		}
		l, err := ParseLoadMetrics(b, fl)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error not ErrMalformed: %v", err)
			}
			return
		}
		if l.Running < 0 || l.Waiting < 0 || l.KVUsage < 0 || l.KVUsage > 1 {
			t.Fatalf("accepted absurd values: %+v", l)
		}
	})
}
