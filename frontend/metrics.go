package frontend

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/scheduler"
)

// Session metric names (session.go).
const (
	metricSessionRequests = "switchyard_router_session_requests_total"
	metricSessionMoves    = "switchyard_router_session_moves_total"
	metricSessions        = "switchyard_router_sessions"
)

// sessionMetrics count how session affinity routed requests.
type sessionMetrics struct {
	requests *prometheus.CounterVec // outcome (hit, new, moved), source (header, prompt_cache_key, user)
	moves    *prometheus.CounterVec // reason (saturated, worker_gone, not_eligible)
}

func newSessionMetrics(reg prometheus.Registerer, table *scheduler.SessionTable) *sessionMetrics {
	f := promauto.With(reg)
	m := &sessionMetrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: metricSessionRequests,
			Help: "Requests that named a session, by outcome (hit: on the previous turn's worker; new: no previous turn known; moved: elsewhere, see switchyard_router_session_moves_total) and by where the session key came from."},
			[]string{"outcome", "source"}),
		moves: f.NewCounterVec(prometheus.CounterOpts{Name: metricSessionMoves,
			Help: "Session turns that left their previous worker, by reason: saturated (its cost exceeded the best by the margin, or it was full), worker_gone (it left the fleet), not_eligible (it does not serve the request's model or allow-list, or is suspected)."},
			[]string{"reason"}),
	}
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: metricSessions,
		Help: "Sessions in this replica's session table (routed here or learned by gossip, not yet expired or evicted)."},
		func() float64 { return float64(table.Len()) })
	for _, r := range []string{moveSaturated, moveWorkerGone, moveNotEligible} {
		m.moves.WithLabelValues(r)
	}
	return m
}
