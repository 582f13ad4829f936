package frontend

import (
	"context"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// exactIndex is a fakeIndex whose engine events say every worker holds
// exact blocks of any prompt.
type exactIndex struct {
	fakeIndex
	exact int
}

func (e *exactIndex) ExactOverlap(string, []uint64) int { return e.exact }

// grantWith answers every admission with worker w and the given figures.
func grantWith(w WorkerEntry, reachable, achieved int, short scheduler.Shortfall) *fakeAdmitter {
	return &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		return &fakeTicket{grant: scheduler.Grant{RequestID: r.ID, Worker: w.ID, WorkerURL: w.URL, Booking: 1,
			CachedTokens: achieved, ReachableTokens: reachable, Shortfall: short}}, nil
	}}
}

// longPrompt is a completion request of about 80 prompt tokens (5 blocks).
func longPrompt() string {
	return `{"model":"m","prompt":"` + strings.Repeat("word ", 80) + `","max_tokens":2}`
}

func TestACappedHolderAndAWrongPredictionAreCountedWithTheirReasons(t *testing.T) {
	up := newUpstream(t, 2) // reports 32 cached tokens
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	reg := prometheus.NewRegistry()
	m := metrics.NewRouter(reg)
	// The owner chose w1 holding 48 tokens although another worker held 64
	// but was at its cap; the engine then had only 32 cached, and the
	// engine's events never said it held more than that: the router's
	// prediction was wrong.
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantWith(ws[0], 64, 48, scheduler.ShortfallCap), Workers: ws, Metrics: m,
		Index: &exactIndex{exact: 2}})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", longPrompt(), nil)
	require.Equal(t, 200, status, body)

	want := `
# HELP switchyard_router_decision_lost_tokens_total Achieved minus realised prompt tokens, by why the engine had less. Reasons: evicted (the index's events said the worker held them), mispredicted (only the router's prediction did).
# TYPE switchyard_router_decision_lost_tokens_total counter
switchyard_router_decision_lost_tokens_total{class="default",model="m",reason="evicted"} 0
switchyard_router_decision_lost_tokens_total{class="default",model="m",reason="mispredicted"} 16
# HELP switchyard_router_decision_missed_tokens_total Reachable minus achieved prompt tokens, by why the deepest holder was passed over. Reasons: load, cap, pinned, allowed.
# TYPE switchyard_router_decision_missed_tokens_total counter
switchyard_router_decision_missed_tokens_total{class="default",model="m",reason="allowed"} 0
switchyard_router_decision_missed_tokens_total{class="default",model="m",reason="cap"} 16
switchyard_router_decision_missed_tokens_total{class="default",model="m",reason="load"} 0
switchyard_router_decision_missed_tokens_total{class="default",model="m",reason="pinned"} 0
# HELP switchyard_router_decision_shortfalls_total Decisions that fell short, by reason. Reasons: load, cap, pinned, allowed (reachable > achieved); evicted, mispredicted (achieved > realised).
# TYPE switchyard_router_decision_shortfalls_total counter
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="allowed"} 0
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="cap"} 1
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="evicted"} 0
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="load"} 0
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="mispredicted"} 1
switchyard_router_decision_shortfalls_total{class="default",model="m",reason="pinned"} 0
# HELP switchyard_router_decisions_total Routing decisions (grants) the entry replica proxied, retries included.
# TYPE switchyard_router_decisions_total counter
switchyard_router_decisions_total{class="default",model="m"} 1
# HELP switchyard_router_decision_reachable_tokens_total Prompt tokens the deepest-holding worker had cached, per decision.
# TYPE switchyard_router_decision_reachable_tokens_total counter
switchyard_router_decision_reachable_tokens_total{class="default",model="m"} 64
# HELP switchyard_router_decision_achieved_tokens_total Prompt tokens the chosen worker had cached, per decision.
# TYPE switchyard_router_decision_achieved_tokens_total counter
switchyard_router_decision_achieved_tokens_total{class="default",model="m"} 48
# HELP switchyard_router_decision_realised_tokens_total Prompt tokens the engine reported cached, per decision. Counted only for responses whose usage reports cached tokens.
# TYPE switchyard_router_decision_realised_tokens_total counter
switchyard_router_decision_realised_tokens_total{class="default",model="m"} 32
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		metrics.NameRouterDecisionLostTokens, metrics.NameRouterDecisionMissedTokens, metrics.NameRouterDecisionShortfalls,
		metrics.NameRouterDecisions, metrics.NameRouterDecisionReachableTokens, metrics.NameRouterDecisionAchievedTokens,
		metrics.NameRouterDecisionRealisedTokens))
	require.Zero(t, testutil.ToFloat64(m.Routing.KVOptimal.WithLabelValues("m", "default")))

	ds := s.Decisions()
	require.Len(t, ds, 1)
	d := ds[0]
	require.Equal(t, "w1", d.Worker)
	require.Equal(t, "cap", d.Shortfall)
	require.Equal(t, "mispredicted", d.Loss)
	require.NotNil(t, d.RealisedTokens)
	require.Equal(t, 32, *d.RealisedTokens)
	tot := s.QualityTotals()
	require.Equal(t, uint64(1), tot.Decisions)
	require.Equal(t, map[string]uint64{"cap": 16}, tot.MissedTokens)
	require.Equal(t, map[string]uint64{"mispredicted": 16}, tot.LostTokens)
}

func TestAnEngineMissingBlocksItsEventsReportedIsAnEviction(t *testing.T) {
	up := newUpstream(t, 2) // reports 32 cached tokens
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	m := metrics.NewRouter(nil)
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantWith(ws[0], 64, 64, scheduler.ShortfallNone), Workers: ws, Metrics: m,
		Index: &exactIndex{exact: 4}})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", longPrompt(), nil)
	require.Equal(t, 200, status, body)
	require.Equal(t, 1.0, testutil.ToFloat64(m.Routing.KVOptimal.WithLabelValues("m", "default")))
	require.Equal(t, 32.0, testutil.ToFloat64(m.Routing.LostTokens.WithLabelValues("m", "default", "evicted")))
	require.Equal(t, "evicted", s.Decisions()[0].Loss)
}

func TestTheDecisionLogKeepsTheNewestDecisionsFirst(t *testing.T) {
	up := newUpstream(t, 1)
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantWith(ws[0], 0, 0, scheduler.ShortfallNone), Workers: ws})
	base := startServer(t, s)
	for range DecisionLogSize + 3 {
		status, _, body := post(t, base+"/v1/completions", longPrompt(), nil)
		require.Equal(t, 200, status, body)
	}
	ds := s.Decisions()
	require.Len(t, ds, DecisionLogSize)
	for i := 1; i < len(ds); i++ {
		require.False(t, ds[i].At.After(ds[i-1].At), "newest first")
	}
	require.Equal(t, uint64(DecisionLogSize+3), s.QualityTotals().Decisions)
}

func TestTheMetricsKnowEveryShortfallReasonTheSchedulerGives(t *testing.T) {
	var labels []string
	for _, s := range scheduler.Shortfalls {
		labels = append(labels, s.String())
	}
	require.ElementsMatch(t, labels, metrics.MissedReasons)
}

func TestADecisionShowsTheOwnersCandidatesOrElseTheOverlapsAndTheWinner(t *testing.T) {
	req := &scheduler.Request{PromptTokens: 100, BlockHashes: make([]uint64, 6),
		Overlaps: []scheduler.Overlap{{Worker: "w1", Blocks: 2}, {Worker: "w2", Blocks: 5}}}
	g := scheduler.Grant{Worker: "w0", PredictedTTFT: 30e6}
	g.Candidates[0] = scheduler.GrantCandidate{Worker: "w0", PredictedTTFT: 30e6}
	g.Candidates[1] = scheduler.GrantCandidate{Worker: "w2", CachedTokens: 80, PredictedTTFT: 12e6}
	g.NumCandidates = 2
	require.Equal(t, []Candidate{{Worker: "w0", PredictedTTFTMs: 30}, {Worker: "w2", CachedTokens: 80, PredictedTTFTMs: 12}},
		grantCandidates(req, g, 16), "the owner's candidates, as it weighed them")

	g.NumCandidates = 0 // an owner that sends none
	require.Equal(t, []Candidate{{Worker: "w2", CachedTokens: 80}, {Worker: "w1", CachedTokens: 32}, {Worker: "w0", PredictedTTFTMs: 30}},
		grantCandidates(req, g, 16), "the entry's overlaps, deepest first, and the winner")
}

func TestComputedBlocksAreThePromptsFullBlocksLessTheCachedOnes(t *testing.T) {
	realised := 40
	cases := []struct {
		name string
		d    Decision
		want int
	}{
		{"nothing cached", Decision{PromptTokens: 100}, 6},
		{"the engine's report wins over the prediction", Decision{PromptTokens: 100, AchievedTokens: 96, RealisedTokens: &realised}, 4},
		{"without a report, the prediction", Decision{PromptTokens: 100, AchievedTokens: 64}, 2},
		{"a prompt shorter than a block", Decision{PromptTokens: 15}, 0},
	}
	for _, c := range cases {
		require.Equal(t, c.want, computedBlocks(c.d, 16), c.name)
	}
	require.Zero(t, computedBlocks(Decision{PromptTokens: 100}, 0), "no block size, no blocks")
}
