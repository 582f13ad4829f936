package scheduler

import (
	"fmt"
	"testing"
)

// BenchmarkSelectors compares the selectors' cost per decision on the same
// 1000-worker Core and request as BenchmarkSelect, in one run, and the whole
// admission turn (enqueue → select → book → respond → finish) with each.
func BenchmarkSelectors(b *testing.B) {
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		b.Run(fmt.Sprintf("select/selector=%s/workers=1000", sel), func(b *testing.B) {
			c := benchCore(b, 1000, 0)
			c.cfg.Selector = sel
			benchSelect(b, c, benchRequest(1000), 1000)
		})
		b.Run(fmt.Sprintf("admission/selector=%s/workers=1000", sel), func(b *testing.B) {
			c := benchCore(b, 1000, 0)
			c.cfg.Selector = sel
			benchAdmit(b, c, benchRequest(1000), true)
		})
	}
}
