package scheduler

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// model is the property test's independent record of what happened.
type model struct {
	t        *testing.T
	rng      *rand.Rand
	clock    *clock.Fake
	core     *Core
	remote   map[string]WorkerLoad
	reqs     map[string]*Request
	got      map[string]int // responses per request
	queued   map[string]bool
	live     map[BookingID]string // grants we hold, by booking → worker
	counts   map[string]*Counters // expected counters per class
	nextID   int
	version  uint64   // bumped on every remote load change
	pool     []Worker // all workers that may ever be registered
	checkErr error
}

func (m *model) RemoteLoad(w string) WorkerLoad { return m.remote[w] }

// versionedModel is the model seen through a VersionedLoadView, so the Core
// caches remote load and memoizes blocked classes.
type versionedModel struct{ *model }

func (v versionedModel) LoadVersion() uint64 { return v.version }

func (m *model) expect(cls string) *Counters {
	c := m.counts[cls]
	if c == nil {
		c = &Counters{Rejected: map[Reason]uint64{}}
		m.counts[cls] = c
	}
	return c
}

func (m *model) fail(format string, args ...any) {
	if m.checkErr == nil {
		m.checkErr = fmt.Errorf(format, args...)
	}
}

func propertyClasses(rng *rand.Rand) []ClassConfig {
	out := []ClassConfig{
		{Name: "interactive", Quantum: 64 + rng.Int64N(512), Policy: PolicyFCFS,
			Limits: Limits{Requests: 3, ISLTokens: Unlimited, CachedTokens: Unlimited}},
		{Name: "batch", Quantum: 16 + rng.Int64N(256), Policy: PolicyWSPT,
			Limits:            Limits{Requests: Unlimited, ISLTokens: 4000, CachedTokens: 2000},
			BusyPrefillTokens: 3000, BusyDecodeFraction: 0.9},
		{Name: "lifo", Quantum: 128, Policy: PolicyLCFS,
			Limits: Limits{Requests: 5, ISLTokens: 20000, CachedTokens: Unlimited}},
		{Name: "zero", Quantum: 128, Policy: PolicyFCFS,
			Limits: Limits{Requests: 0, ISLTokens: Unlimited, CachedTokens: Unlimited}},
	}
	return out
}

func (m *model) randomRequest() *Request {
	rng := m.rng
	m.nextID++
	id := fmt.Sprintf("r%d", m.nextID)
	if len(m.queued) > 0 && rng.IntN(30) == 0 {
		for q := range m.queued { // duplicate a queued ID: must be rejected
			id = q
			break
		}
	}
	classes := []string{"interactive", "batch", "lifo", "zero", "unknown"}
	r := &Request{
		ID:             id,
		Class:          classes[rng.IntN(len(classes))],
		StrictPriority: int32(rng.IntN(3)),
		PriorityJump:   rng.Float64()*4 - 1,
		Ingress:        m.clock.Now().Add(-time.Duration(rng.IntN(3000)) * time.Millisecond),
		PromptTokens:   rng.IntN(1200),
		Attempt:        rng.IntN(4) / 3,
		Probe:          rng.IntN(20) == 0,
	}
	if rng.IntN(3) == 0 {
		r.Due = m.clock.Now().Add(time.Duration(rng.IntN(8000)-500) * time.Millisecond)
	}
	fam := uint64(rng.IntN(4))
	r.BlockHashes = seqHashes(fam, r.PromptTokens/16)
	for range rng.IntN(3) {
		w := m.pool[rng.IntN(len(m.pool))]
		r.Overlaps = append(r.Overlaps, Overlap{Worker: w.ID, Blocks: rng.IntN(len(r.BlockHashes) + 5)})
	}
	switch rng.IntN(8) {
	case 0:
		r.Pinned = m.pool[rng.IntN(len(m.pool))].ID
	case 1:
		r.Pinned = "ghost"
	case 2, 3:
		for range 1 + rng.IntN(3) {
			r.Allowed = append(r.Allowed, m.pool[rng.IntN(len(m.pool))].ID)
		}
	}
	r.ExpectedOutputTokens = rng.IntN(300)
	return r
}

func (m *model) enqueue(r *Request) {
	refuse := m.rng.IntN(15) == 0
	_, dup := m.queued[r.ID]
	key := r.ID
	if dup {
		key = fmt.Sprintf("%s#dup%d", r.ID, m.nextID)
	}
	m.reqs[key] = r
	cls := r.Class
	known := cls != "unknown"
	if known && !r.Probe {
		if r.Attempt > 0 {
			m.expect(cls).Retried++
		} else {
			m.expect(cls).Received++
		}
	}
	registered := m.core.Workers()
	m.core.Enqueue(r, func(g Grant, err error) bool {
		m.got[key]++
		if m.got[key] > 1 {
			m.fail("request %s completed %d times", key, m.got[key])
		}
		delete(m.queued, key)
		exp := m.expect(cls)
		if err != nil {
			var rej *RejectError
			switch {
			case errors.Is(err, ErrCancelled):
				if !r.Probe {
					exp.Cancelled++
				}
			case errors.As(err, &rej):
				if known && !r.Probe {
					exp.Rejected[rej.Reason]++
				}
			default:
				m.fail("request %s: unexpected error %v", key, err)
			}
			return true
		}
		if !r.Allows(g.Worker) {
			m.fail("request %s granted on %s against pin %q / allow %v", key, g.Worker, r.Pinned, r.Allowed)
		}
		ws := m.core.Workers()
		i := slices.IndexFunc(ws, func(w Worker) bool { return w.ID == g.Worker })
		if i < 0 {
			m.fail("request %s granted on unregistered worker %s", key, g.Worker)
		} else if mr := ws[i].MaxRunning; mr > 0 {
			if n := m.core.Load(g.Worker).ActiveRequests + m.remote[g.Worker].ActiveRequests; n > mr {
				m.fail("worker %s runs %d > MaxRunning %d", g.Worker, n, mr)
			}
		}
		if refuse {
			if !r.Probe {
				exp.Cancelled++
			}
			return false
		}
		if !r.Probe {
			exp.Admitted++
		}
		m.live[g.Booking] = g.Worker
		return true
	})
	if m.got[key] == 0 {
		m.queued[key] = true
		// limits are checked before adding: what is queued now fits
		snap := m.core.Snapshot().Classes[cls]
		for _, c := range propertyClasses(m.rng) {
			if c.Name != cls {
				continue
			}
			n := len(registered)
			if c.Limits.Requests != Unlimited && snap.QueueDepth > c.Limits.Requests*n {
				m.fail("class %s queue depth %d over limit %d×%d", cls, snap.QueueDepth, c.Limits.Requests, n)
			}
			if c.Limits.ISLTokens != Unlimited && snap.PendingTokens > int64(c.Limits.ISLTokens*n) {
				m.fail("class %s pending tokens %d over limit %d×%d", cls, snap.PendingTokens, c.Limits.ISLTokens, n)
			}
			if c.Limits.Requests == 0 {
				m.fail("zero-limit class %s queued request %s", cls, key)
			}
		}
	}
}

func (m *model) randomBooking() (BookingID, bool) {
	if len(m.live) == 0 {
		return 0, false
	}
	ids := make([]BookingID, 0, len(m.live))
	for id := range m.live {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids[m.rng.IntN(len(ids))], true
}

func (m *model) randomWorkers() []Worker {
	var ws []Worker
	for _, w := range m.pool {
		if m.rng.IntN(4) != 0 {
			w.MaxRunning = m.rng.IntN(4)
			ws = append(ws, w)
		}
	}
	return ws
}

func (m *model) step() {
	rng := m.rng
	switch op := rng.IntN(100); {
	case op < 40:
		m.enqueue(m.randomRequest())
	case op < 47:
		if len(m.queued) > 0 {
			keys := make([]string, 0, len(m.queued))
			for k := range m.queued {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			m.core.Cancel(m.reqs[keys[rng.IntN(len(keys))]].ID)
		}
		m.core.Cancel("never-enqueued")
	case op < 65:
		if id, ok := m.randomBooking(); ok {
			switch rng.IntN(5) {
			case 0:
				m.core.Ack(id)
			case 1:
				m.core.FirstToken(id)
			case 2:
				m.core.Renew([]BookingID{id})
			case 3:
				m.core.Rollback(id)
				delete(m.live, id)
			default:
				m.core.Finish(id)
				delete(m.live, id)
			}
		}
	case op < 80:
		m.clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		m.core.Tick()
	case op < 85:
		m.core.SetWorkers(m.randomWorkers())
	case op < 92:
		w := m.pool[rng.IntN(len(m.pool))]
		if rng.IntN(2) == 0 {
			delete(m.remote, w.ID)
		} else {
			m.remote[w.ID] = WorkerLoad{ActiveRequests: rng.IntN(3), PrefillTokens: rng.IntN(2000), DecodeBlocks: rng.IntN(300)}
		}
		m.version++
		m.core.Drain() // gossip delivered: the contract is to call Drain
	case op < 94:
		m.core.SetClasses(propertyClasses(m.rng))
	case op < 96:
		m.core.Adopt(BookingRecord{RequestID: "adopted", Class: "batch", Worker: m.pool[rng.IntN(len(m.pool))].ID,
			BlockHashes: seqHashes(1, 3), PromptTokens: 50, ExpectedOutputTokens: 10})
	default:
		if id, ok := m.randomBooking(); ok { // a mark for a booking that is gone
			m.core.Finish(id)
			m.core.Finish(id)
			delete(m.live, id)
		}
	}
}

// checkInvariants runs after every step.
func (m *model) checkInvariants() {
	total := 0
	for _, w := range m.pool {
		total += m.core.Load(w.ID).ActiveRequests
	}
	if total != m.core.Bookings() {
		m.fail("ledger active %d != bookings %d", total, m.core.Bookings())
	}
	if m.core.Queued() != len(m.queued) {
		m.fail("core queues %d, model %d", m.core.Queued(), len(m.queued))
	}
	// Every turn drains completely: re-evaluating every class from scratch
	// (no memo) finds nothing that could run now.
	c := m.core
	c.gen++
	for _, cls := range c.ring {
		cls.blocked = false
		if e, _ := c.candidate(cls); e != nil {
			m.fail("class %s left %s queued although it can run", cls.cfg.Name, e.req.ID)
		}
	}
}

func (m *model) settle() {
	keys := make([]string, 0, len(m.queued))
	for k := range m.queued {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		m.core.Cancel(m.reqs[k].ID)
	}
	for id := range m.live {
		m.core.Finish(id)
	}
	m.clock.Advance(DefaultConfig().BookingExpiry + time.Minute) // adopted bookings expire
	m.core.Tick()
}

func TestPropertyEveryRequestEndsOnceCountersMatchAndTheLedgerEmpties(t *testing.T) {
	for seed := range uint64(150) {
		rng := rand.New(rand.NewPCG(seed, 77))
		m := &model{
			t: t, rng: rng, clock: clock.NewFake(t0), remote: map[string]WorkerLoad{},
			reqs: map[string]*Request{}, got: map[string]int{}, queued: map[string]bool{},
			live: map[BookingID]string{}, counts: map[string]*Counters{},
		}
		for i := range 6 {
			m.pool = append(m.pool, Worker{ID: fmt.Sprintf("w%d", i), URL: "http://w", BlockSize: 16, KVBlocks: 400})
		}
		var view LoadView = m
		if seed%2 == 1 {
			view = versionedModel{m}
		}
		m.core = NewCore(DefaultConfig(), m.clock, view, rand.New(rand.NewPCG(seed, 5)))
		m.core.SetClasses(propertyClasses(rng))
		m.core.SetWorkers(m.randomWorkers())
		for range 400 {
			m.step()
			m.checkInvariants()
			require.NoError(t, m.checkErr, "seed %d", seed)
		}
		m.settle()
		require.NoError(t, m.checkErr, "seed %d", seed)

		for key := range m.reqs {
			require.Equalf(t, 1, m.got[key], "seed %d: request %s must end in exactly one outcome", seed, key)
		}
		snap := m.core.Snapshot()
		for name, exp := range m.counts {
			if name == "unknown" {
				continue
			}
			got := snap.Classes[name].Counters
			require.Equalf(t, exp.Received, got.Received, "seed %d class %s received", seed, name)
			require.Equalf(t, exp.Retried, got.Retried, "seed %d class %s retried", seed, name)
			require.Equalf(t, exp.Admitted, got.Admitted, "seed %d class %s admitted", seed, name)
			require.Equalf(t, exp.Cancelled, got.Cancelled, "seed %d class %s cancelled", seed, name)
			for _, r := range Reasons {
				require.Equalf(t, exp.Rejected[r], got.Rejected[r], "seed %d class %s rejected %s", seed, name, r)
			}
			var rejected uint64
			for _, v := range got.Rejected {
				rejected += v
			}
			require.Equalf(t, got.Received+got.Retried, got.Admitted+got.Cancelled+rejected,
				"seed %d class %s: every counted request has one counted outcome", seed, name)
		}
		require.Zero(t, m.core.Bookings(), "seed %d: ledger returns to empty", seed)
		require.Zero(t, m.core.Queued())
		for id, l := range snap.Workers {
			require.Equalf(t, WorkerLoad{}, l, "seed %d: worker %s load", seed, id)
		}
		_, ok := m.core.NextWake()
		require.False(t, ok, "seed %d: nothing left to wake for", seed)
	}
}
