package gossip

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/testenv"
)

// BenchmarkConvergence5Replicas measures how long a load change at one
// replica takes to be visible at all four others (goal: 500 ms). One
// iteration is one change.
func BenchmarkConvergence5Replicas(b *testing.B) {
	rs := startCluster(b, 5, nil)
	var lat []time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		want := WorkerLoad{ActiveRequests: i + 1}
		start := time.Now()
		rs[0].SetLocalLoads(map[string]WorkerLoad{"w-conv": want})
		for _, r := range rs[1:] {
			for r.RemoteLoad("w-conv") != want {
				if time.Since(start) > 30*time.Second {
					b.Fatalf("change %d did not converge within 30s", i)
				}
				time.Sleep(200 * time.Microsecond) // pacing the poll of a benchmark, not a test's progress
			}
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max_ms")
}

// BenchmarkBandwidth1000Workers measures the bytes each replica writes to
// the network (UDP and TCP, everything memberlist sends: probes, labels,
// encryption, our payloads, relays) with 1000 workers, while every replica's
// ledger changes the load of `changes` random workers per 50 ms interval. One
// iteration is one interval. Push-pull runs every 20 s, so a short run may
// not include one; push_pull_B/s/replica is its long-run share, computed
// from the measured state size (each replica sends about two states per
// interval: one it initiates, one it answers). Goal: ≤ 200 KB/s per replica.
func BenchmarkBandwidth1000Workers(b *testing.B) {
	for _, n := range []int{3, 8} {
		for _, changes := range []int{0, 20, 100} {
			b.Run(fmt.Sprintf("replicas=%d/changes=%d", n, changes), func(b *testing.B) {
				benchBandwidth(b, n, 1000, changes)
			})
		}
	}
}

func benchBandwidth(b *testing.B, replicas, workers, changes int) {
	rs := startCluster(b, replicas, nil)
	names := make([]string, workers)
	loads := make([]map[string]WorkerLoad, replicas)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%04d", i)
	}
	for i, r := range rs {
		loads[i] = make(map[string]WorkerLoad, workers)
		for _, w := range names {
			loads[i][w] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 512, DecodeBlocks: 40}
		}
		r.SetLocalLoads(loads[i])
	}
	testenv.Eventually(b, 60*time.Second, func() bool {
		for _, r := range rs {
			for _, w := range names {
				if r.RemoteLoad(w).ActiveRequests != replicas-1 {
					return false
				}
			}
		}
		return true
	}, "every replica sees every other's 1000 workers")

	sent := func() (wire, payload float64) {
		for _, r := range rs {
			wire += counter(b, r.m.transportSent.WithLabelValues("packet")) + counter(b, r.m.transportSent.WithLabelValues("stream"))
			payload += counter(b, r.m.broadcastBytes)
		}
		return wire, payload
	}
	rng := rand.New(rand.NewPCG(uint64(replicas), uint64(changes)))
	interval := rs[0].cfg.Interval
	tick := time.NewTicker(interval)
	defer tick.Stop()
	wire0, payload0 := sent()
	start := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		for i, r := range rs {
			for range changes {
				w := names[rng.IntN(workers)]
				loads[i][w] = WorkerLoad{ActiveRequests: 1 + rng.IntN(8), PrefillTokens: rng.IntN(8192), DecodeBlocks: rng.IntN(400)}
			}
			r.SetLocalLoads(loads[i])
		}
		<-tick.C
	}
	b.StopTimer()
	elapsed := time.Since(start).Seconds()
	wire1, payload1 := sent()
	stateBytes := float64(len(*rs[0].fullSt.Load()))
	b.ReportMetric((wire1-wire0)/elapsed/float64(replicas), "wire_B/s/replica")
	b.ReportMetric((payload1-payload0)/elapsed/float64(replicas), "payload_B/s/replica")
	b.ReportMetric(stateBytes, "state_B")
	b.ReportMetric(2*stateBytes/rs[0].cfg.PushPullInterval.Seconds(), "push_pull_B/s/replica")
}
