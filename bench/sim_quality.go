package bench

import (
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// SimQuality is a simulated run's routing quality: the same three figures
// per decision as a live router's switchyard_router_decision_* counters and
// its /debug/cluster "quality" totals (docs/metrics.md, "Routing quality"),
// with the same JSON keys, so live and simulated runs compare directly.
//
//   - reachable: the most prompt tokens any worker held cached, as the
//     admitting replica's index saw it (the request's deepest overlap);
//   - achieved: the chosen worker's cached tokens at the decision;
//   - realised: what the engine then reported cached.
//
// MissedTokens (reachable − achieved) and Shortfalls count by the
// scheduler's reason (load, cap, pinned, allowed); LostTokens (achieved −
// realised, when a block or more) by evicted (the engine's own events said
// the worker held the blocks) or mispredicted (only the router's
// prediction did). The baseline policies pin every request and look up no
// overlaps: their reachable equals achieved (0), only kv-aware runs measure
// what was missed.
type SimQuality struct {
	Decisions       uint64            `json:"decisions"`
	KVOptimal       uint64            `json:"kv_optimal"`
	ReachableTokens uint64            `json:"reachable_tokens"`
	AchievedTokens  uint64            `json:"achieved_tokens"`
	RealisedTokens  uint64            `json:"realised_tokens"`
	RealisedReports uint64            `json:"realised_reports"`
	MissedTokens    map[string]uint64 `json:"missed_tokens"`
	LostTokens      map[string]uint64 `json:"lost_tokens"`
	Shortfalls      map[string]uint64 `json:"shortfalls"`
	// AchievedRate is achieved over reachable tokens, RealisedRate
	// realised over achieved (1 when the denominator is 0).
	AchievedRate float64 `json:"achieved_rate"`
	RealisedRate float64 `json:"realised_rate"`
}

func newSimQuality() SimQuality {
	return SimQuality{MissedTokens: map[string]uint64{}, LostTokens: map[string]uint64{}, Shortfalls: map[string]uint64{}}
}

// simDecision is what a request's grant decided, kept until its engine
// reports the cached tokens.
type simDecision struct {
	achieved int
	exact    int // tokens the engine's events said the worker held
	decided  bool
}

// decided counts a grant's reachable and achieved figures for request q
// and notes what the engine's own events said the chosen worker held.
func (s *simulation) decided(q *simRequest, g scheduler.Grant) {
	reach := max(g.ReachableTokens, g.CachedTokens)
	qs := &s.quality
	qs.Decisions++
	qs.ReachableTokens += uint64(reach)
	qs.AchievedTokens += uint64(g.CachedTokens)
	if missed := reach - g.CachedTokens; missed > 0 {
		why := g.Shortfall.String()
		if why == "" {
			why = scheduler.ShortfallLoad.String()
		}
		qs.MissedTokens[why] += uint64(missed)
		qs.Shortfalls[why]++
	} else {
		qs.KVOptimal++
	}
	q.dec = simDecision{achieved: g.CachedTokens, decided: true}
	if len(q.hashes) > 0 {
		ix := s.replicas[q.entry].index
		n := ix.HeldDepth(g.Worker, q.hashes) // at the index's sampled resolution
		q.dec.exact = min(q.tr.InputLength, n*s.cfg.Engine.BlockSize)
	}
}

// realised completes q's decision with the engine's reported cached
// tokens: a shortfall of a block or more below achieved is a loss (an
// engine always recomputes at least the prompt's last token).
func (s *simulation) realised(q *simRequest, cached int) {
	if !q.dec.decided {
		return
	}
	q.dec.decided = false
	qs := &s.quality
	qs.RealisedTokens += uint64(cached)
	qs.RealisedReports++
	if lost := q.dec.achieved - cached; lost >= s.cfg.Engine.BlockSize {
		why := metrics.LossMispredicted
		if cached < q.dec.exact {
			why = metrics.LossEvicted
		}
		qs.LostTokens[why] += uint64(lost)
		qs.Shortfalls[why]++
	}
}

func (q SimQuality) withRates() SimQuality {
	q.AchievedRate, q.RealisedRate = 1, 1
	if q.ReachableTokens > 0 {
		q.AchievedRate = float64(q.AchievedTokens) / float64(q.ReachableTokens)
	}
	if q.AchievedTokens > 0 {
		q.RealisedRate = float64(q.RealisedTokens) / float64(q.AchievedTokens)
	}
	return q
}
