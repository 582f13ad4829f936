package app

import (
	"context"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/kvingest"
)

// silenceSamplesPerWindow is how often within -ingest.silent-window the
// workers are sampled: often enough that a window starts close to its
// nominal length, rarely enough to cost nothing.
const silenceSamplesPerWindow = 8

// watchKVSilence samples, for every registered worker that publishes KV
// events, the prompt blocks this replica saw it compute and what its events
// brought the index, so that r.silence can flag a dead event path.
func (r *replica) watchKVSilence(ctx context.Context) error {
	// Wall time: the page shows the since time beside the replica's clock.
	clk := clock.Real{}
	tick := clk.NewTicker(max(r.cfg.Ingest.SilentWindow/silenceSamplesPerWindow, 10*time.Millisecond))
	defer tick.Stop()
	var samples []kvingest.SilenceSample
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
		samples = samples[:0]
		for _, it := range r.workers.Snapshot().Items {
			if !it.Info.PublishesEvents {
				continue
			}
			samples = append(samples, kvingest.SilenceSample{Worker: it.Info.ID,
				ServedBlocks: r.fe.WorkerServedBlocks(it.Info.ID), Events: r.ix.EventCounts(it.Info.ID)})
		}
		r.silence.Observe(clk.Now(), samples)
	}
}
