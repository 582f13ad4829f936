package bench

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkSimMooncake1k simulates the first 1000 requests of the public
// Mooncake conversation trace on 8 workers with the KV-aware policy, behind
// one router replica and behind eight (cluster admission, gossip on), and
// reports simulated seconds per wall second.
func BenchmarkSimMooncake1k(b *testing.B) {
	f, err := os.Open(sharedTrace(b, "conversation_trace.jsonl"))
	if err != nil {
		b.Fatal(err)
	}
	src, err := NewMooncakeReader(f, DefaultMooncakeOptions())
	if err != nil {
		b.Fatal(err)
	}
	reqs, err := ReadAll(src, 1000)
	_ = f.Close()
	if err != nil {
		b.Fatal(err)
	}
	for _, replicas := range []int{1, 8} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) {
			cfg := DefaultSimConfig()
			cfg.Replicas = replicas
			b.ReportAllocs()
			b.ResetTimer()
			var simulated float64
			start := time.Now()
			for i := 0; i < b.N; i++ {
				rep, err := RunSim(context.Background(), cfg, reqs, nil)
				if err != nil {
					b.Fatal(err)
				}
				simulated += rep.SimulatedS
			}
			wall := time.Since(start).Seconds()
			b.ReportMetric(simulated/wall, "sim-s/wall-s")
			b.ReportMetric(float64(len(reqs)*b.N)/wall, "requests/s")
		})
	}
}
