package app

import (
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/kvindex"
)

// stepClock is a hand-advanced kvindex.Clock.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *stepClock) After(time.Duration) <-chan time.Time { return make(chan time.Time) }

func (c *stepClock) advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// A routing decision's prediction lives -predict-ttl on a worker that
// publishes KV events and -predict-ttl-no-events on one that does not.
func TestPredictionsOnWorkersWithoutKVEventsLiveTheLongerTTL(t *testing.T) {
	clock := &stepClock{now: time.Unix(1_700_000_000, 0)}
	ix, err := kvindex.New(kvindex.DefaultConfig(), clock, zap.NewNop(), prometheus.NewRegistry())
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

	clock.advance(6 * time.Second)
	require.Equal(t, map[string]int{"quiet": 3}, depth(), "the short TTL ended on the publishing worker only")

	clock.advance(115 * time.Second)
	require.Empty(t, depth(), "the long TTL ended too")
}
