package app

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvindex"
)

// A routing decision's prediction lives -predict-ttl on a worker that
// publishes KV events and -predict-ttl-no-events on one that does not.
func TestPredictionsOnWorkersWithoutKVEventsLiveTheLongerTTL(t *testing.T) {
	clk := clock.NewFake(time.Unix(1_700_000_000, 0))
	ix, err := kvindex.New(kvindex.DefaultConfig(), clk, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
	p := prefixIndex{ix: ix, ttl: 5 * time.Second, ttlNoEvents: 120 * time.Second,
		publishes: func(w string) bool { return w == "loud" }}

	prompt := []uint64{11, 22, 33}
	p.Predict("loud", prompt)
	p.Predict("quiet", prompt)
	depth := func() map[string]int {
		out := map[string]int{}
		for _, o := range p.Overlaps(nil, prompt) {
			out[o.Worker] = o.Blocks
		}
		return out
	}
	require.Equal(t, map[string]int{"loud": 3, "quiet": 3}, depth())

	clk.Advance(6 * time.Second)
	require.Equal(t, map[string]int{"quiet": 3}, depth(), "the short TTL ended on the publishing worker only")

	clk.Advance(115 * time.Second)
	require.Empty(t, depth(), "the long TTL ended too")
}
