package admission

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard/scheduler"
)

// BenchmarkAdmitRemote measures one admission from an entry replica through
// the class owner over NATS on loopback to the grant, with 64 idle workers.
// The local sub-benchmark is the in-process baseline of the same run.
func BenchmarkAdmitRemote(b *testing.B) {
	for _, mode := range []string{"remote", "local"} {
		b.Run(mode, func(b *testing.B) {
			h := newBenchHarness(b)
			owner := h.start("a", nil)
			entry := h.start("b", nil)
			h.own("gold", "a", 1)
			cli := entry.client
			if mode == "local" {
				cli = owner.client
			}
			ctx := context.Background()
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				r := request("gold", 0)
				start := time.Now()
				tk, err := cli.Admit(ctx, r)
				lat = append(lat, time.Since(start))
				if err != nil {
					b.Fatal(err)
				}
				tk.Dispatched()
				tk.Finish(false)
			}
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
		})
	}
}

func newBenchHarness(b *testing.B) *harness {
	return newHarnessTB(b, []scheduler.ClassConfig{fcfs("gold")}, workers(8, 0))
}
