package frontend

import (
	"context"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// startActor runs a real scheduler actor with classes and workers until the
// test ends.
func startActor(t *testing.T, pol *Policy, workers []scheduler.Worker) *scheduler.Actor {
	t.Helper()
	cfg := scheduler.DefaultConfig()
	cfg.SnapshotInterval = time.Millisecond
	core := scheduler.NewCore(cfg, clock.Real{}, nil, rand.New(rand.NewPCG(1, 2)))
	a := scheduler.NewActor(core, nil, zaptest.NewLogger(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
	a.SetClasses(pol.Classes) // synchronous with the running actor
	a.SetWorkers(workers)
	return a
}

// actorHarness is a frontend over a real actor and one real upstream worker
// that admits one request at a time (MaxRunning 1).
type actorHarness struct {
	actor *scheduler.Actor
	up    *upstream
	base  string
}

func newActorHarness(t *testing.T, policyYAML string) *actorHarness {
	t.Helper()
	pol, err := ParsePolicy([]byte(policyYAML))
	require.NoError(t, err)
	up := newUpstream(t, 3)
	up.gate = make(chan struct{})
	actor := startActor(t, pol, []scheduler.Worker{{ID: "w1", URL: up.URL(), BlockSize: 16, KVBlocks: 1024, MaxRunning: 1}})
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: NewLocalAdmitter(actor),
		Workers:  staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}},
		Policy:   pol,
	})
	return &actorHarness{actor: actor, up: up, base: startServer(t, s)}
}

// occupy starts a request that holds the only worker slot until release is
// called; it returns when the worker has it.
func (h *actorHarness) occupy(t *testing.T) (release func()) {
	t.Helper()
	done := postInBackground(h.base+"/v1/completions", `{"model":"m","prompt":"first"}`, nil)
	testenv.Eventually(t, 5*time.Second, func() bool { return h.up.requests.Load() == 1 }, "the first request reached the worker")
	var once sync.Once
	return func() {
		once.Do(func() {
			close(h.up.gate)
			assert.Equal(t, 200, <-done, "the occupying request completed")
		})
	}
}

func (h *actorHarness) class(t *testing.T, name string) scheduler.ClassSnapshot {
	snap, err := h.actor.Flush(context.Background())
	require.NoError(t, err)
	return snap.Classes[name]
}

func TestADeadlineThatCannotBeMetIsRejectedWith429DeadlineExceeded(t *testing.T) {
	h := newActorHarness(t, "classes: [{name: default}]")
	release := h.occupy(t)
	defer release()

	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"late"}`, map[string]string{HeaderDeadlineMS: "30"})
	require.Equal(t, http.StatusTooManyRequests, status, body)
	assert.Equal(t, "deadline_exceeded", deref(apiErr(t, body).Code))
	c := h.class(t, "default")
	assert.Equal(t, uint64(1), c.Counters.Rejected[scheduler.ReasonDueTimePassed])
	assert.Equal(t, 0, c.QueueDepth)
}

func TestAClientCancellingWhileQueuedFreesEverything(t *testing.T) {
	h := newActorHarness(t, "classes: [{name: default}]")
	release := h.occupy(t)

	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"queued"}`))
	require.NoError(t, err)
	clientDone := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		clientDone <- err
	}()
	testenv.Eventually(t, 5*time.Second, func() bool { return h.class(t, "default").QueueDepth == 1 }, "the second request is queued")
	cancel()
	require.Error(t, <-clientDone)
	testenv.Eventually(t, 5*time.Second, func() bool { return h.class(t, "default").Counters.Cancelled == 1 }, "the queued request was cancelled")
	assert.Equal(t, 0, h.class(t, "default").QueueDepth)

	release()
	testenv.Eventually(t, 5*time.Second, func() bool {
		snap, err := h.actor.Flush(context.Background())
		return err == nil && snap.Bookings == 0
	}, "the ledger is empty again")
	assert.Equal(t, int32(1), h.up.requests.Load(), "the cancelled request never reached a worker")
	c := h.class(t, "default")
	assert.Equal(t, uint64(2), c.Counters.Received)
	assert.Equal(t, uint64(1), c.Counters.Admitted)
}

func TestAFullQueueIsRejectedWith429QueueFullAndRetryAfter(t *testing.T) {
	h := newActorHarness(t, "classes: [{name: default, limits: {requests: 1}}]")
	release := h.occupy(t)
	defer release()

	queued := make(chan int, 1)
	go func() {
		resp, err := http.Post(h.base+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"queued"}`))
		if err != nil {
			queued <- 0
			return
		}
		resp.Body.Close()
		queued <- resp.StatusCode
	}()
	testenv.Eventually(t, 5*time.Second, func() bool { return h.class(t, "default").QueueDepth == 1 }, "one request is queued")

	status, hdr, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"one too many"}`, nil)
	require.Equal(t, http.StatusTooManyRequests, status, body)
	e := apiErr(t, body)
	assert.Equal(t, "queue_full", deref(e.Code))
	assert.Contains(t, e.Message, "requests", "the message names the limit")
	assert.Equal(t, "1", hdr.Get("Retry-After"))

	release()
	assert.Equal(t, 200, <-queued, "the queued request runs once the worker is free")
}

func TestNoRegisteredWorkersIs503NoEndpoints(t *testing.T) {
	pol := DefaultPolicy()
	actor := startActor(t, pol, nil)
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: staticWorkers{}, Policy: pol})
	status, hdr, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	require.Equal(t, http.StatusServiceUnavailable, status, body)
	assert.Equal(t, "no_endpoints", deref(apiErr(t, body).Code))
	assert.NotEmpty(t, hdr.Get("Retry-After"))
}

func TestPinningAnUnregisteredWorkerIs400InvalidConstraint(t *testing.T) {
	h := newActorHarness(t, "classes: [{name: default}]")
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, map[string]string{HeaderWorker: "w9"})
	require.Equal(t, http.StatusBadRequest, status, body)
	assert.Equal(t, "invalid_constraint", deref(apiErr(t, body).Code))
}

func TestStreamsThroughARealActorLeaveTheLedgerEmpty(t *testing.T) {
	h := newActorHarness(t, "classes: [{name: default}]")
	close(h.up.gate)
	for i := 0; i < 5; i++ {
		status, _, body := post(t, h.base+"/v1/chat/completions", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, nil)
		require.Equal(t, 200, status, body)
	}
	testenv.Eventually(t, 5*time.Second, func() bool {
		snap, err := h.actor.Flush(context.Background())
		return err == nil && snap.Bookings == 0
	}, "every booking was finished")
	assert.Equal(t, uint64(5), h.class(t, "default").Counters.Admitted)
}

func TestRulesAndHintsChooseTheClassTheActorAdmitsIn(t *testing.T) {
	h := newActorHarness(t, `
default_class: interactive
classes: [{name: interactive}, {name: batch}, {name: voice}]
rules:
  - {class: batch, match: {header: {name: x-tenant, value: "batch-*"}}}
  - {class: voice, match: {user: "voice-*"}}
`)
	close(h.up.gate)
	send := func(body string, headers map[string]string) {
		status, _, resp := post(t, h.base+"/v1/completions", body, headers)
		require.Equal(t, 200, status, resp)
	}
	send(`{"model":"m","prompt":"a"}`, nil)
	send(`{"model":"m","prompt":"b"}`, map[string]string{"X-Tenant": "batch-7"})
	send(`{"model":"m","prompt":"c","user":"voice-1"}`, nil)
	send(`{"model":"m","prompt":"d","user":"voice-1"}`, map[string]string{HeaderClass: "batch"})
	send(`{"model":"m","prompt":"e","switchyard":{"class":"voice"}}`, nil)

	assert.Equal(t, uint64(1), h.class(t, "interactive").Counters.Admitted, "default class")
	assert.Equal(t, uint64(2), h.class(t, "batch").Counters.Admitted, "header rule, and a class header over a matching user rule")
	assert.Equal(t, uint64(2), h.class(t, "voice").Counters.Admitted, "user rule, and a body class hint")
}

// postInBackground posts a JSON body with the headers hdr from another
// goroutine and sends the response's status on the channel it returns (0
// when the request fails), after reading the whole body.
func postInBackground(url, body string, hdr map[string]string) <-chan int {
	done := make(chan int, 1)
	go func() {
		req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		if err != nil {
			done <- 0
			return
		}
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			done <- 0
			return
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		done <- resp.StatusCode
	}()
	return done
}
