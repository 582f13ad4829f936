package frontend

import (
	"bufio"
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/scheduler"
)

// hookTicket is a fakeTicket whose marks run a hook first, standing in for
// an admission actor that is slow to take them.
type hookTicket struct {
	*fakeTicket
	onDispatched, onFirstToken func()
}

func (t *hookTicket) Dispatched() {
	if t.onDispatched != nil {
		t.onDispatched()
	}
	t.fakeTicket.Dispatched()
}

func (t *hookTicket) FirstToken() {
	if t.onFirstToken != nil {
		t.onFirstToken()
	}
	t.fakeTicket.FirstToken()
}

// waitUntil polls cond until it holds or a generous bound passes; the bound
// only turns a wrong ordering (which would wait forever) into a failure.
func waitUntil(cond func() bool) bool {
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if cond() {
			return true
		}
	}
	return false
}

func TestTheRequestReachesTheWorkerWithoutWaitingForTheDispatchMark(t *testing.T) {
	up := newUpstream(t, 2)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	var sawRequest atomic.Bool
	tk := &hookTicket{fakeTicket: &fakeTicket{}}
	tk.onDispatched = func() { sawRequest.Store(waitUntil(func() bool { return up.requests.Load() == 1 })) }
	adm := &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		tk.grant = scheduler.Grant{RequestID: r.ID, Worker: "w1", WorkerURL: up.URL(), Booking: 1}
		return tk, nil
	}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: adm, Workers: ws})

	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, body)
	assert.True(t, sawRequest.Load(), "the worker had the request while the dispatch mark was still being delivered")
	assert.Equal(t, int32(1), tk.dispatched.Load())
	assert.Equal(t, int32(1), tk.finished.Load())
	assert.False(t, tk.aborted.Load())
}

func TestTheFirstEventReachesTheClientWithoutWaitingForTheFirstTokenMark(t *testing.T) {
	up := newUpstream(t, 3)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	var clientHasFirst, markWaited atomic.Bool
	tk := &hookTicket{fakeTicket: &fakeTicket{}}
	tk.onFirstToken = func() { markWaited.Store(waitUntil(clientHasFirst.Load)) }
	adm := &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		tk.grant = scheduler.Grant{RequestID: r.ID, Worker: "w1", WorkerURL: up.URL(), Booking: 1}
		return tk, nil
	}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: adm, Workers: ws})

	resp, err := http.Post(startServer(t, s)+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	require.NoError(t, err)
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "), line)
	clientHasFirst.Store(true)
	var rest strings.Builder
	_, err = br.WriteTo(&rest)
	require.NoError(t, err)
	assert.True(t, strings.HasSuffix(strings.TrimSpace(rest.String()), "data: [DONE]"), rest.String())
	assert.True(t, markWaited.Load(), "the client read the first event while the first-token mark was still being delivered")
	assert.Equal(t, int32(1), tk.first.Load())
	assert.Equal(t, int32(1), tk.finished.Load())
	assert.False(t, tk.aborted.Load())
}
