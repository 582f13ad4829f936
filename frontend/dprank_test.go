package frontend

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

func TestTheChosenDataParallelRankIsPinnedWithVLLMsHeader(t *testing.T) {
	// One API server for every rank, as vLLM with --data-parallel-size.
	ranks := make(chan string, 8)
	up := newUpstream(t, 2)
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ranks <- r.Header.Get(HeaderDPRank)
		up.serve(w, r)
	}))
	t.Cleanup(api.Close)
	next := make(chan string, 8)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
			w := <-next
			return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: w, WorkerURL: api.URL}}, nil
		}},
		Workers: staticWorkers{
			{ID: "e-dp0", URL: api.URL, Model: "m", BlockSize: 4, DPRank: 0, DPSize: 2},
			{ID: "e-dp1", URL: api.URL, Model: "m", BlockSize: 4, DPRank: 1, DPSize: 2},
			{ID: "plain", URL: api.URL, Model: "m", BlockSize: 4},
		},
	})
	base := startServer(t, s)
	for _, c := range []struct{ worker, header string }{{"e-dp1", "1"}, {"e-dp0", "0"}, {"plain", ""}} {
		next <- c.worker
		status, _, body := post(t, base+"/v1/chat/completions", `{"model":"m","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, http.StatusOK, status, body)
		assert.Equal(t, c.header, <-ranks, "request granted to %s", c.worker)
	}
}
