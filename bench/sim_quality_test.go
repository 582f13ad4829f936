package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// capTrace: a long generation on prefix A, then, while it still runs, a
// short request on the same prefix.
func capTrace() []TraceRequest {
	return []TraceRequest{
		{Index: 0, InputLength: 1040, OutputLength: 4000, Segments: []Segment{{Seed: 7, Len: 1024}, {Seed: 70, Len: 16}}},
		{Index: 1, Arrival: 2 * time.Second, InputLength: 1040, OutputLength: 4, Segments: []Segment{{Seed: 7, Len: 1024}, {Seed: 71, Len: 16}}},
	}
}

func TestSimAWorkerCapMakesAchievedFallBelowReachableForCap(t *testing.T) {
	cfg := simTestConfig()
	cfg.MaxRunning = 1
	rep := runSim(t, cfg, capTrace())
	require.NotEqual(t, rep.Results[0].Worker, rep.Results[1].Worker, "the holder of prefix A is at its cap")

	q := rep.Quality
	require.Equal(t, uint64(2), q.Decisions)
	require.Equal(t, uint64(1), q.KVOptimal, "the first request had nothing to reach")
	require.Equal(t, uint64(1024), q.ReachableTokens, "the second could have had prefix A")
	require.Zero(t, q.AchievedTokens)
	require.Equal(t, map[string]uint64{"cap": 1024}, q.MissedTokens)
	require.Equal(t, uint64(1), q.Shortfalls["cap"])
	require.Equal(t, uint64(2), q.RealisedReports)
	require.Zero(t, q.RealisedTokens)
	require.Empty(t, q.LostTokens)
	require.InDelta(t, 0, q.AchievedRate, 1e-9)

	var md strings.Builder
	writeSimMarkdown(&md, []simRun{{cfg: cfg, report: rep}})
	require.Contains(t, md.String(), "| cap 1024 |", "the Markdown report names the reason")
}

func TestSimWithoutACapTheSecondRequestReachesThePrefixAndTheEngineConfirmsIt(t *testing.T) {
	cfg := simTestConfig()
	rep := runSim(t, cfg, capTrace())
	require.Equal(t, rep.Results[0].Worker, rep.Results[1].Worker)
	q := rep.Quality
	require.Equal(t, uint64(2), q.KVOptimal)
	require.Equal(t, uint64(1024), q.ReachableTokens)
	require.Equal(t, uint64(1024), q.AchievedTokens)
	require.Equal(t, uint64(1024), q.RealisedTokens, "the engine reused what the index said it held")
	require.Empty(t, q.MissedTokens)
	require.Empty(t, q.LostTokens)
	require.InDelta(t, 1, q.RealisedRate, 1e-9)
}
