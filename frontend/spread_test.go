package frontend

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

func TestLightLoadSpreadsFirstTurnsOverEquallyGoodIdleWorkers(t *testing.T) {
	var entries staticWorkers
	var workers []scheduler.Worker
	for i := range 3 {
		up := newUpstream(t, 2)
		id := fmt.Sprintf("w%d", i+1)
		entries = append(entries, WorkerEntry{ID: id, URL: up.URL(), Model: "m", BlockSize: 16})
		workers = append(workers, scheduler.Worker{ID: id, URL: up.URL(), BlockSize: 16, KVBlocks: 4096})
	}
	pol := DefaultPolicy()
	actor := startActor(t, pol, workers)
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: entries, Policy: pol})
	base := startServer(t, s)
	got := map[string]int{}
	const turns = 30
	for i := range turns {
		// One at a time, each finished before the next: a human pace.
		status, h, body := post(t, base+"/v1/chat/completions",
			fmt.Sprintf(`{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"conversation %d opens with its own question"}]}`, i), nil)
		require.Equal(t, http.StatusOK, status, body)
		got[h.Get(HeaderRoutedWorker)]++
	}
	t.Logf("first turns per worker: %v", got)
	for _, w := range entries {
		assert.Positive(t, got[w.ID], "%s got none of %d first turns: %v", w.ID, turns, got)
		assert.LessOrEqual(t, got[w.ID], turns*6/10, "%s got more than 60%%: %v", w.ID, got)
	}
}

func TestAnEnginesErrorResponseNamesTheEngine(t *testing.T) {
	for _, status := range []int{http.StatusBadRequest, http.StatusInternalServerError} {
		up := newUpstream(t, 2)
		up.failStatus.Store(int32(status))
		ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
		s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantInOrder(&grantRecorder{}, ws...), Workers: ws})
		base := startServer(t, s)
		got, h, body := post(t, base+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
		assert.GreaterOrEqual(t, got, 400, body)
		assert.Equal(t, "w1", h.Get(HeaderRoutedWorker), "status %d: the error says which engine answered it", status)
	}
}
