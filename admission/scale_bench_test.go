package admission

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/testenv"
)

// BenchmarkOwnerAdmitRate is how many admission round trips one class owner
// answers per second: entry replicas, each with `clients` goroutines in a
// closed loop, admit through one owner over NATS on loopback (admit, then
// the lifecycle marks dispatched and finished, as a routed request sends
// them). The NATS server, the entries and the owner share the process, so
// process-cpu-µs/admit is an upper bound on the owner's own CPU per
// admission. One iteration is one admission.
func BenchmarkOwnerAdmitRate(b *testing.B) {
	for _, entries := range []int{1, 4} {
		b.Run(fmt.Sprintf("entries=%d/clients=16", entries), func(b *testing.B) {
			h := newBenchHarness(b)
			h.start("owner", nil)
			var clients []*replica
			for e := range entries {
				clients = append(clients, h.start(fmt.Sprintf("entry-%d", e), nil))
			}
			h.own("gold", "owner", 1)
			ctx := context.Background()
			jobs := make(chan struct{})
			var wg sync.WaitGroup
			for _, r := range clients {
				for range 16 {
					wg.Go(func() {
						for range jobs {
							tk, err := r.client.Admit(ctx, request("gold", 0))
							if err != nil {
								b.Error(err)
								continue
							}
							tk.Dispatched()
							tk.Finish(false)
						}
					})
				}
			}
			cpu0, t0 := testenv.ProcessCPU(), time.Now()
			b.ResetTimer()
			for range b.N {
				jobs <- struct{}{}
			}
			close(jobs)
			wg.Wait()
			b.StopTimer()
			elapsed, cpu := time.Since(t0), testenv.ProcessCPU()-cpu0
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "admits/s")
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "process-cpu-µs/admit")
		})
	}
}
