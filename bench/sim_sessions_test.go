package bench

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// agentTrace is agent-like sessions: up to 20 turns 50-500 ms apart, each
// turn's prompt extending the previous turn's.
func agentTrace(t *testing.T) []TraceRequest {
	t.Helper()
	sc := DefaultSyntheticConfig()
	sc.Requests, sc.Rate, sc.Turns = 600, 120, 20
	sc.ThinkTime, sc.ThinkTimeMax = 50*time.Millisecond, 500*time.Millisecond
	sc.InputTokens, sc.OutputTokens, sc.PrefixGroups = 256, 64, 4
	reqs, err := GenerateSynthetic(sc)
	require.NoError(t, err)
	return reqs
}

func TestAgentTurnGapsAreDrawnBetweenThinkTimeAndItsMax(t *testing.T) {
	last := map[string]time.Duration{}
	n := 0
	for _, r := range agentTrace(t) {
		if prev, ok := last[r.Session]; ok {
			gap := r.Arrival - prev
			require.GreaterOrEqual(t, gap, 50*time.Millisecond-time.Microsecond)
			require.LessOrEqual(t, gap, 500*time.Millisecond+time.Microsecond)
			n++
		}
		last[r.Session] = r.Arrival
	}
	require.Greater(t, n, 100, "the trace has multi-turn sessions")
}

func TestSessionAffinityKeepsTurnsOnTheirWorkerWhenKVEventsLagTheTurns(t *testing.T) {
	reqs := agentTrace(t)
	run := func(sessions bool) SimSessionReport {
		cfg := DefaultSimConfig()
		cfg.Workers, cfg.Replicas, cfg.Admission = 4, 3, SimPerReplica
		// KV events take a second and predictions expire before the next
		// turn: only the session table remembers the previous worker.
		cfg.EventDelay, cfg.PredictTTL = time.Second, 40*time.Millisecond
		cfg.Sessions = sessions
		rep, err := RunSim(context.Background(), cfg, reqs, nil)
		require.NoError(t, err)
		return rep.Sessions
	}
	off, on := run(false), run(true)
	require.Equal(t, off.Turns, on.Turns)
	require.Zero(t, off.Preferred, "no affinity without sessions")
	require.Equal(t, on.Turns, on.Preferred, "every later turn's entry replica knew its session's worker (gossip beats the turn gap)")
	require.Greater(t, on.HitRate, off.HitRate+0.2, "sessions on %+v, off %+v", on, off)
	require.Equal(t, on.Turns-on.Moved, on.Stayed, "a preferred turn either stayed or moved")
}
