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
