package app

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

func TestASuspectWorkerLeavesTheSchedulersSetUntilItsSuspicionExpiresOrItRecovers(t *testing.T) {
	cfg := gossip.DefaultConfig()
	cfg.NodeName = "r1"
	g, err := gossip.New(cfg, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
	reg := prometheus.NewRegistry()
	s := newWorkerSuspects(g, 10*time.Second, zap.NewNop(), reg)
	now := time.Unix(1000, 0)
	s.now = func() time.Time { return now }
	ws := []scheduler.Worker{{ID: "w1"}, {ID: "w2"}, {ID: "w3"}}
	ids := func(ws []scheduler.Worker) []string {
		var out []string
		for _, w := range ws {
			out = append(out, w.ID)
		}
		return out
	}
	require.Equal(t, []string{"w1", "w2", "w3"}, ids(s.filter(ws)))
	require.False(t, s.refresh(), "nothing changed")

	s.Suspect("w2")
	require.True(t, s.Suspected("w2"))
	require.True(t, s.refresh(), "a new suspect changes the set")
	require.Equal(t, []string{"w1", "w3"}, ids(s.filter(ws)))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_router_workers_suspected", nil))
	require.False(t, s.refresh())

	now = now.Add(10 * time.Second)
	require.True(t, s.refresh(), "the suspicion expired")
	require.Equal(t, []string{"w1", "w2", "w3"}, ids(s.filter(ws)))

	s.Suspect("w3")
	require.Equal(t, []string{"w1", "w2"}, ids(s.filter(ws)))
	now = now.Add(time.Second)
	s.Recovered("w3")
	require.False(t, s.Suspected("w3"), "a success after the suspicion ends it")
	require.True(t, s.refresh())
	require.Equal(t, []string{"w1", "w2", "w3"}, ids(s.filter(ws)))

	now = now.Add(time.Second)
	for _, w := range ws {
		s.Suspect(w.ID)
	}
	require.Equal(t, []string{"w1", "w2", "w3"}, ids(s.filter(ws)), "every worker suspect: none is taken away")
}
