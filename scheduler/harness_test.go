package scheduler

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/internal/clock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// outcome is what a Responder received.
type outcome struct {
	grant Grant
	err   error
}

// harness drives one Core under a fake clock and records every response.
type harness struct {
	t       *testing.T
	clock   *clock.Fake
	core    *Core
	remote  map[string]WorkerLoad // what the fake LoadView reports
	got     map[string][]outcome
	order   []string // request IDs in grant order
	refuse  map[string]bool
	classOf map[string]string
	arrived int
}

func (h *harness) RemoteLoad(w string) WorkerLoad { return h.remote[w] }

func newHarness(t *testing.T, workers []Worker, classes ...ClassConfig) *harness {
	t.Helper()
	h := &harness{
		t:       t,
		clock:   clock.NewFake(t0),
		remote:  map[string]WorkerLoad{},
		got:     map[string][]outcome{},
		refuse:  map[string]bool{},
		classOf: map[string]string{},
	}
	h.core = NewCore(DefaultConfig(), h.clock, h, rand.New(rand.NewPCG(1, 2)))
	h.core.SetWorkers(workers)
	h.core.SetClasses(classes)
	return h
}

func workers(n, maxRunning int) []Worker {
	ws := make([]Worker, n)
	for i := range ws {
		ws[i] = Worker{ID: fmt.Sprintf("w%d", i), URL: fmt.Sprintf("http://w%d", i), BlockSize: 16, KVBlocks: 1000, MaxRunning: maxRunning}
	}
	return ws
}

func classCfg(name string, p Policy) ClassConfig {
	return ClassConfig{Name: name, Quantum: 256, Policy: p, Limits: Limits{Requests: Unlimited, ISLTokens: Unlimited, CachedTokens: Unlimited}}
}

func req(id, cls string, isl int) *Request {
	return &Request{ID: id, Class: cls, PromptTokens: isl, Ingress: t0}
}

func (h *harness) enqueue(r *Request) {
	h.t.Helper()
	h.arrived++
	h.core.Enqueue(r, func(g Grant, err error) bool {
		h.got[r.ID] = append(h.got[r.ID], outcome{g, err})
		if err == nil {
			if h.refuse[r.ID] {
				return false
			}
			h.order = append(h.order, r.ID)
		}
		return true
	})
}

// one returns the single outcome of id, failing if there is not exactly one.
func (h *harness) one(id string) outcome {
	h.t.Helper()
	require.Lenf(h.t, h.got[id], 1, "request %s must be completed exactly once", id)
	return h.got[id][0]
}

func (h *harness) granted(id string) Grant {
	h.t.Helper()
	o := h.one(id)
	require.NoErrorf(h.t, o.err, "request %s must be granted", id)
	return o.grant
}

func (h *harness) rejected(id string, target error) RejectError {
	h.t.Helper()
	o := h.one(id)
	require.Errorf(h.t, o.err, "request %s must be rejected", id)
	require.ErrorIs(h.t, o.err, target)
	var rej *RejectError
	require.True(h.t, errors.As(o.err, &rej))
	return *rej
}

func (h *harness) pending(id string) {
	h.t.Helper()
	require.Emptyf(h.t, h.got[id], "request %s must still be queued", id)
}

func (h *harness) counters(cls string) Counters {
	return h.core.Snapshot().Classes[cls].Counters
}

// occupy books a never-finishing request on every worker with MaxRunning 1,
// so later arrivals queue. It returns the bookings to free.
func (h *harness) occupy(cls string, n int) []BookingID {
	h.t.Helper()
	var ids []BookingID
	for i := range n {
		id := fmt.Sprintf("occupy-%s-%d", cls, i)
		r := req(id, cls, 16)
		if i < len(h.core.workers) {
			r.Pinned = h.core.workers[i].ID
		}
		h.enqueue(r)
		b := h.granted(id).Booking
		h.core.Ack(b)
		ids = append(ids, b)
	}
	return ids
}
