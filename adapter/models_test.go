package adapter

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/wire"
)

func TestAVLLMModelListGivesTheRootAndEveryCardForTheRouters(t *testing.T) {
	ms, err := ParseModels([]byte(vllmModels))
	require.NoError(t, err)
	assert.Equal(t, testSalt, ms.Root, "the base model's root salts its blocks")
	assert.Equal(t, []wire.ModelCard{
		{ID: testModel, Root: testSalt, Created: 1733000000, MaxModelLen: 8192},
		{ID: "sql-lora", Root: "/loras/sql", Parent: testModel, Created: 1733000000},
	}, ms.Cards)
}

func TestAModelListWithoutRootsOrTimesStillParses(t *testing.T) {
	ms, err := ParseModels([]byte(`{"data":[{"id":"m","created":"yesterday"},{"id":"alias","root":null}]}`))
	require.NoError(t, err)
	assert.Empty(t, ms.Root)
	assert.Equal(t, []wire.ModelCard{{ID: "m"}, {ID: "alias"}}, ms.Cards, "a created that is no count is dropped, not refused")
}

func TestTheEnginesPrefixHitRateIsReadFromEitherEnginesMetrics(t *testing.T) {
	sglang := `# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="m"} 2
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="m"} 0
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="m"} 0.4
`
	l, err := ParseLoadMetrics([]byte(sglang), FlavorSGLang)
	require.NoError(t, err)
	assert.InDelta(t, 0.4, l.PrefixHitRate, 1e-9)

	l, err = ParseLoadMetrics([]byte(vllmMetrics(1, 0, 0.5)), FlavorVLLM)
	require.NoError(t, err)
	assert.InDelta(t, 0.3, l.PrefixHitRate, 1e-9, "360 of 1200 queried tokens hit")

	noHits := `# TYPE vllm:num_requests_running gauge
vllm:num_requests_running 0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting 0
`
	l, err = ParseLoadMetrics([]byte(noHits), FlavorVLLM)
	require.NoError(t, err)
	assert.Zero(t, l.PrefixHitRate, "not exported: 0, as before")

	_, err = ParseLoadMetrics([]byte(noHits+"# TYPE vllm:gpu_prefix_cache_hit_rate gauge\nvllm:gpu_prefix_cache_hit_rate 3\n"), FlavorVLLM)
	require.ErrorIs(t, err, ErrMalformed, "a rate above 1 is refused")
}
