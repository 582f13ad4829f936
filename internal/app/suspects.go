package app

import (
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/scheduler"
)

// workerSuspects is the frontend's Suspects port over gossip: this
// replica's own health records (a worker it marked suspect after
// consecutive first-byte timeouts, or saw recover) go out through gossip,
// and every replica's, joined, decide which workers the scheduler is not
// given (filter). Safe for concurrent use: the request path calls Suspect,
// Recovered and Suspected; the membership service calls refresh and filter.
type workerSuspects struct {
	g   *gossip.Gossip
	ttl time.Duration
	now func() time.Time
	log *zap.Logger

	mu    sync.Mutex
	local map[string]gossip.Health // this replica's records
	// view is the joined records (gossip's and the newest local ones) as
	// of the last change or refresh; the request path reads it.
	view atomic.Pointer[map[string]gossip.Health]
	// skipped is the suspect set filter last applied (membership service
	// only).
	skipped []string
	gauge   prometheus.Gauge
}

func newWorkerSuspects(g *gossip.Gossip, ttl time.Duration, log *zap.Logger, reg prometheus.Registerer) *workerSuspects {
	s := &workerSuspects{g: g, ttl: ttl, now: time.Now, log: log, local: map[string]gossip.Health{},
		gauge: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: "switchyard_router_workers_suspected",
			Help: "Registered workers this replica's scheduler skips because some replica suspects their engine hangs (consecutive first-byte timeouts)."})}
	s.view.Store(&map[string]gossip.Health{})
	return s
}

// Suspect implements frontend.Suspects.
func (s *workerSuspects) Suspect(worker string) {
	s.record(worker, func(h *gossip.Health, now int64) { h.SuspectSince = now })
	s.log.Warn("worker marked suspect after consecutive first-byte timeouts; every replica skips it",
		zap.String("worker", worker), zap.Duration("ttl", s.ttl))
}

// Recovered implements frontend.Suspects.
func (s *workerSuspects) Recovered(worker string) {
	s.record(worker, func(h *gossip.Health, now int64) { h.RecoveredAt = now })
}

// Suspected implements frontend.Suspects: one atomic load and a map read.
func (s *workerSuspects) Suspected(worker string) bool {
	return (*s.view.Load())[worker].Suspected(s.now(), s.ttl)
}

func (s *workerSuspects) record(worker string, set func(*gossip.Health, int64)) {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	h := s.local[worker]
	set(&h, now.UnixNano())
	s.local[worker] = h
	s.g.SetLocalHealth(s.local)
	s.publishLocked()
}

// refresh drops local records too old to matter, joins the gossiped
// records into the view, and reports whether the suspect set differs from
// the one filter last applied.
func (s *workerSuspects) refresh() bool {
	now := s.now()
	s.mu.Lock()
	pruned := false
	for w, h := range s.local {
		if now.UnixNano() >= max(h.SuspectSince, h.RecoveredAt)+int64(s.ttl) {
			delete(s.local, w)
			pruned = true
		}
	}
	if pruned {
		s.g.SetLocalHealth(s.local)
	}
	s.publishLocked()
	s.mu.Unlock()
	return !slices.Equal(s.suspects(now), s.skipped)
}

func (s *workerSuspects) publishLocked() {
	view := s.g.HealthRecords()
	for w, h := range s.local {
		view[w] = view[w].Join(h)
	}
	s.view.Store(&view)
}

// suspects lists the workers suspected at now, sorted.
func (s *workerSuspects) suspects(now time.Time) []string {
	var out []string
	for w, h := range *s.view.Load() {
		if h.Suspected(now, s.ttl) {
			out = append(out, w)
		}
	}
	slices.Sort(out)
	return out
}

// filter returns ws without the suspect workers, unless that would leave
// none: a tier whose every worker looks hung keeps serving on all of them
// (a suspicion then only costs the first-byte timeouts it already costs).
// It remembers the set it applied for refresh.
func (s *workerSuspects) filter(ws []scheduler.Worker) []scheduler.Worker {
	sus := s.suspects(s.now())
	s.skipped = sus
	if len(sus) == 0 {
		s.gauge.Set(0)
		return ws
	}
	out := make([]scheduler.Worker, 0, len(ws))
	for _, w := range ws {
		if _, found := slices.BinarySearch(sus, w.ID); !found {
			out = append(out, w)
		}
	}
	if len(out) == 0 {
		s.gauge.Set(0)
		return ws
	}
	s.gauge.Set(float64(len(ws) - len(out)))
	return out
}
