package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Routing quality (this file: NewRouting, built by NewRouter). Per routing
// decision, three figures in prompt tokens: reachable (the deepest prefix
// any registered worker held), achieved (the chosen worker's) and realised
// (what the engine reported cached). Missed tokens are reachable − achieved
// by the reason the deepest holder was passed over; lost tokens are
// achieved − realised by the reason the engine had less than predicted.
const (
	NameRouterDecisions                = "switchyard_router_decisions_total"
	NameRouterDecisionKVOptimal        = "switchyard_router_decision_kv_optimal_total"
	NameRouterDecisionReachableTokens  = "switchyard_router_decision_reachable_tokens_total"
	NameRouterDecisionAchievedTokens   = "switchyard_router_decision_achieved_tokens_total"
	NameRouterDecisionRealisedTokens   = "switchyard_router_decision_realised_tokens_total"
	NameRouterDecisionRealisedReports  = "switchyard_router_decision_realised_reports_total"
	NameRouterDecisionMissedTokens     = "switchyard_router_decision_missed_tokens_total"
	NameRouterDecisionLostTokens       = "switchyard_router_decision_lost_tokens_total"
	NameRouterDecisionShortfalls       = "switchyard_router_decision_shortfalls_total"
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
