package scheduler

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

// Unconstrained requests go through the selector index (selindex.go); it
// must hold each worker to MaxRunning exactly as the full scan does, with
// either cost, so a burst beyond the fleet's slots waits in the class queue.
func TestUnconstrainedRequestsThroughTheIndexNeverExceedMaxRunning(t *testing.T) {
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		t.Run(sel.String(), func(t *testing.T) {
			h := newHarness(t, workers(2, 2), classCfg("c", PolicyFCFS))
			h.core.cfg.Selector = sel
			for i := range 10 {
				h.enqueue(req(fmt.Sprintf("r%d", i), "c", 10))
			}
			perWorker := map[string]int{}
			for i := range 4 {
				perWorker[h.granted(fmt.Sprintf("r%d", i)).Worker]++
			}
			require.Equal(t, map[string]int{"w0": 2, "w1": 2}, perWorker)
			for i := 4; i < 10; i++ {
				h.pending(fmt.Sprintf("r%d", i))
			}
		})
	}
}
