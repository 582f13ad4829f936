package metrics

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Routing quality (NewRouting, built by NewRouter; the names are in
// names.go). Per routing decision, three figures in prompt tokens:
// reachable (the deepest prefix any registered worker held), achieved (the
// chosen worker's) and realised (what the engine reported cached). Missed
// tokens are reachable − achieved by the reason the deepest holder was
// passed over; lost tokens are achieved − realised by the reason the
// engine had less than predicted.
const (
	routingHelpRealisedWhenReported    = " Counted only for responses whose usage reports cached tokens."
	routingHelpShortfallReasonsMissed  = " Reasons: load, cap, pinned, allowed."
	routingHelpShortfallReasonsLost    = " Reasons: evicted (the index's events said the worker held them), mispredicted (only the router's prediction did)."
	routingHelpShortfallReasonsCounted = " Reasons: load, cap, pinned, allowed (reachable > achieved); evicted, mispredicted (achieved > realised)."
)

// Reasons of the lost-tokens counter (achieved > realised).
const (
	LossEvicted      = "evicted"
	LossMispredicted = "mispredicted"
)

// Routing holds the routing-quality counters of the entry replica, labelled
// by model and class; the shortfall families add a reason.
type Routing struct {
	Decisions       *prometheus.CounterVec // every grant the entry replica proxied
	KVOptimal       *prometheus.CounterVec // grants whose achieved == reachable
	ReachableTokens *prometheus.CounterVec
	AchievedTokens  *prometheus.CounterVec
	RealisedTokens  *prometheus.CounterVec
	RealisedReports *prometheus.CounterVec // decisions whose engine reported cached tokens
	MissedTokens    *prometheus.CounterVec // reachable − achieved, by reason
	LostTokens      *prometheus.CounterVec // achieved − realised, by reason
	Shortfalls      *prometheus.CounterVec // decisions falling short, by reason

	seen sync.Map // model + "\x00" + class → struct{}: series created (Init)
}

// Routing reasons: why achieved fell below reachable (the scheduler's
// Shortfall labels), and why realised fell below achieved.
var (
	MissedReasons = []string{"load", "cap", "pinned", "allowed"}
	LostReasons   = []string{LossEvicted, LossMispredicted}
)

// Init creates every series of one (model, class) at zero the first time
// the pair is seen, so rates and alerts see the first shortfall and the
// reason series exist before it. Cheap after the first call: one map load.
func (r *Routing) Init(model, class string) {
	if _, done := r.seen.LoadOrStore(model+"\x00"+class, struct{}{}); done {
		return
	}
	for _, v := range []*prometheus.CounterVec{r.Decisions, r.KVOptimal, r.ReachableTokens, r.AchievedTokens, r.RealisedTokens, r.RealisedReports} {
		v.WithLabelValues(model, class)
	}
	for _, reason := range MissedReasons {
		r.MissedTokens.WithLabelValues(model, class, reason)
		r.Shortfalls.WithLabelValues(model, class, reason)
	}
	for _, reason := range LostReasons {
		r.LostTokens.WithLabelValues(model, class, reason)
		r.Shortfalls.WithLabelValues(model, class, reason)
	}
}

// NewRouting registers the routing-quality counters on reg.
func NewRouting(reg prometheus.Registerer) *Routing {
	f := promauto.With(reg)
	reason := []string{LabelModel, LabelClass, LabelReason}
	return &Routing{
		Decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisions, Help: "Routing decisions (grants) the entry replica proxied, retries included.",
		}, streamLabels),
		KVOptimal: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionKVOptimal, Help: "Routing decisions whose chosen worker held the deepest cached prefix any worker held.",
		}, streamLabels),
		ReachableTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionReachableTokens, Help: "Prompt tokens the deepest-holding worker had cached, per decision.",
		}, streamLabels),
		AchievedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionAchievedTokens, Help: "Prompt tokens the chosen worker had cached, per decision.",
		}, streamLabels),
		RealisedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionRealisedTokens, Help: "Prompt tokens the engine reported cached, per decision." + routingHelpRealisedWhenReported,
		}, streamLabels),
		RealisedReports: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionRealisedReports, Help: "Decisions whose response reported cached tokens (the realised figure exists).",
		}, streamLabels),
		MissedTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionMissedTokens, Help: "Reachable minus achieved prompt tokens, by why the deepest holder was passed over." + routingHelpShortfallReasonsMissed,
		}, reason),
		LostTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionLostTokens, Help: "Achieved minus realised prompt tokens, by why the engine had less." + routingHelpShortfallReasonsLost,
		}, reason),
		Shortfalls: f.NewCounterVec(prometheus.CounterOpts{
			Name: NameRouterDecisionShortfalls, Help: "Decisions that fell short, by reason." + routingHelpShortfallReasonsCounted,
		}, reason),
	}
}
