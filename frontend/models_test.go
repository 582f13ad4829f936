package frontend

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/wire"
)

// aliasWorkers is one vLLM engine serving a base model under two names
// and a LoRA adapter, registered by an adapter that read its /v1/models.
func aliasWorkers(url string) staticWorkers {
	return staticWorkers{{ID: "w1", URL: url, Model: "m", Models: []string{"other", "sql-lora"}, BlockSize: 4, MaxModelLen: 8192,
		Salt: "/models/m", Cards: []wire.ModelCard{
			{ID: "m", Root: "/models/m", Created: 1733000000, MaxModelLen: 8192},
			{ID: "other", Root: "/models/m", Created: 1733000001, MaxModelLen: 8192},
			{ID: "sql-lora", Root: "/loras/sql", Parent: "m", Created: 1733000002},
		}}}
}

func TestEveryAliasOfAnEngineHashesAPromptUnderTheEnginesRoot(t *testing.T) {
	up := newUpstream(t, 2)
	ws := aliasWorkers(up.URL())
	var mu sync.Mutex
	var got []scheduler.Request
	adm := &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		mu.Lock()
		got = append(got, *r)
		mu.Unlock()
		return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: "w1", WorkerURL: up.URL()}}, nil
	}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: adm, Workers: ws, Prompts: toyPrompts(t, "m", "other", "sql-lora")})
	base := startServer(t, s)
	prompt := "one two three four five six seven eight nine"
	for _, model := range []string{"m", "other", "sql-lora"} {
		status, _, body := post(t, base+"/v1/completions", `{"model":"`+model+`","max_tokens":2,"prompt":"`+prompt+`"}`, nil)
		require.Equal(t, http.StatusOK, status, body)
	}
	require.Len(t, got, 3)
	tokens := tokenizer.Encode(prompt)
	root := kvindex.SequenceHashes(tokens, 4, kvindex.ModelSeed("/models/m"))
	assert.Equal(t, root, got[0].BlockHashes, "the base name hashes under the root")
	assert.Equal(t, root, got[1].BlockHashes, "an alias hashes as the base does: it hits the same blocks")
	assert.Equal(t, kvindex.SequenceHashes(tokens, 4, kvindex.ModelSeed("sql-lora")), got[2].BlockHashes, "a LoRA adapter keeps its own name")
}

func TestModelsPassesThroughTheEnginesRootParentContextAndCreated(t *testing.T) {
	up := newUpstream(t, 2)
	ws := aliasWorkers(up.URL())
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
	base := startServer(t, s)
	resp, err := http.Get(base + "/v1/models")
	require.NoError(t, err)
	defer resp.Body.Close()
	var list modelList
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&list))
	require.Len(t, list.Data, 3)
	byID := map[string]modelObject{}
	for _, m := range list.Data {
		byID[m.ID] = m
	}
	assert.Equal(t, modelObject{ID: "m", Object: "model", Created: 1733000000, OwnedBy: "switchyard", Root: "/models/m", MaxModelLen: 8192, Workers: 1}, byID["m"])
	assert.Equal(t, "/models/m", byID["other"].Root)
	assert.Equal(t, "m", byID["sql-lora"].Parent)
	assert.Equal(t, int64(1733000002), byID["sql-lora"].Created)
}
