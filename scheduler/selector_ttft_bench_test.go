package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/testenv"
)

// BenchmarkSelectors compares the selectors' cost per decision on the same
// 1000-worker Core and request as BenchmarkSelect, in one run, and the whole
// admission turn (enqueue → select → book → respond → finish) with each.
func BenchmarkSelectors(b *testing.B) {
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		b.Run(fmt.Sprintf("select/selector=%s/workers=1000", sel), func(b *testing.B) {
			c := benchCore(b, 1000, 0)
			c.cfg.Selector = sel
			r := benchRequest(1000)
			cfg := &c.classes["interactive"].cfg
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu := time.Now(), testenv.ProcessCPU()
			for b.Loop() {
				if _, ok := c.selectWorker(r, cfg); !ok {
					b.Fatal("no worker selected")
				}
			}
			reportRates(b, start, cpu)
			b.ReportMetric(float64((testenv.ProcessCPU()-cpu).Nanoseconds())/float64(b.N)/1000, "cpu-ns/worker")
		})
		b.Run(fmt.Sprintf("admission/selector=%s/workers=1000", sel), func(b *testing.B) {
			c := benchCore(b, 1000, 0)
			c.cfg.Selector = sel
			r := benchRequest(1000)
			var g Grant
			var gerr error
			respond := func(x Grant, err error) bool { g, gerr = x, err; return true }
			b.ReportAllocs()
			b.ResetTimer()
			start, cpu := time.Now(), testenv.ProcessCPU()
			for b.Loop() {
				c.Enqueue(r, respond)
				if gerr != nil {
					b.Fatal(gerr)
				}
				c.FirstToken(g.Booking) // feeds the ttft selector's calibration
				c.Finish(g.Booking)
			}
			reportRates(b, start, cpu)
		})
	}
}
