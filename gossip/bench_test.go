package gossip

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/internal/testenv"
)

// BenchmarkConvergence5Replicas measures how long a load change at one
// replica takes to be visible at all four others (goal: 500 ms). One
// iteration is one change.
func BenchmarkConvergence5Replicas(b *testing.B) {
	rs := startCluster(b, 5, nil)
	b.ReportAllocs()
	b.ResetTimer()
	lat := convergence(b, rs)
	b.StopTimer()
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max_ms")
}

// convergence sets a load at rs[0] b.N times and returns, sorted, how long
// each change took to reach every other replica.
func convergence(b *testing.B, rs []*replica) []time.Duration {
	var lat []time.Duration
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
	slices.Sort(lat)
	return lat
}

// BenchmarkBandwidth1000Workers measures the bytes each replica writes to
// the network (UDP and TCP: everything memberlist sends, i.e. probes,
// labels, encryption, compression, our payloads and relays) with 1000
// workers, while every replica's ledger changes the load of `changes` random
// workers per 50 ms interval. One iteration is one interval.
//
// Push-pull runs every 10 s, so a short run may not include one;
// push_pull_uncompressed_B/s/replica bounds its long-run share from the
// encoded size of a full state in which every replica has load on every
// worker (each replica sends about two states per interval: one it
// initiates, one it answers); BenchmarkPushPullBandwidth1000Workers measures
// the real, compressed figure. lag_mean_ms is the mean propagation lag of
// the changes received during the run. Every replica also publishes index
// digests for all 1000 workers (a random 64-bit engine instance each, as real
// engines have) whose event ids all advance every digest interval, the
// worst case of a fleet where every worker stores or evicts blocks each
// second. Goal: ≤ 200 KB/s per replica.
func BenchmarkBandwidth1000Workers(b *testing.B) {
	for _, n := range []int{3, 8} {
		for _, changes := range []int{0, 20, 100} {
			b.Run(fmt.Sprintf("replicas=%d/changes=%d", n, changes), func(b *testing.B) {
				benchBandwidth(b, n, 1000, changes, nil)
			})
		}
	}
}

// BenchmarkPushPullBandwidth1000Workers measures what push-pull really puts
// on the wire (memberlist compresses and encrypts it): every replica has load
// on all 1000 workers and push-pull runs every second; nothing else changes.
// push_pull_at_default_B/s/replica scales the stream bytes to the default
// interval.
func BenchmarkPushPullBandwidth1000Workers(b *testing.B) {
	for _, n := range []int{3, 8} {
		b.Run(fmt.Sprintf("replicas=%d", n), func(b *testing.B) {
			rs := startCluster(b, n, func(c *Config) { c.PushPullInterval = time.Second })
			for i, r := range rs {
				loads := make(map[string]WorkerLoad, 1000)
				for w := range 1000 {
					loads[fmt.Sprintf("worker-%04d", w)] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 100*i + w, DecodeBlocks: w % 300}
				}
				r.SetLocalLoads(loads)
			}
			testenv.Eventually(b, 60*time.Second, func() bool {
				for _, r := range rs {
					for w := range 1000 {
						if r.RemoteLoad(fmt.Sprintf("worker-%04d", w)).ActiveRequests != n-1 {
							return false
						}
					}
				}
				return true
			}, "every replica holds every other's 1000 workers")
			stream := func() (sum float64) {
				for _, r := range rs {
					sum += counter(b, r.m.transportSent.WithLabelValues("stream"))
				}
				return sum
			}
			tick := time.NewTicker(rs[0].cfg.Interval)
			defer tick.Stop()
			s0, start := stream(), time.Now()
			b.ResetTimer()
			for range b.N {
				<-tick.C
			}
			b.StopTimer()
			perReplica := (stream() - s0) / time.Since(start).Seconds() / float64(n)
			b.ReportMetric(perReplica, "stream_B/s/replica")
			b.ReportMetric(perReplica*time.Second.Seconds()/DefaultConfig().PushPullInterval.Seconds(), "push_pull_at_default_B/s/replica")
		})
	}
}

// benchBandwidth runs the load-change workload; mutate (nil for none)
// adjusts every replica's config.
func benchBandwidth(b *testing.B, replicas, workers, changes int, mutate func(*Config)) {
	rs := startCluster(b, replicas, mutate)
	names := make([]string, workers)
	for i := range names {
		names[i] = fmt.Sprintf("worker-%04d", i)
	}
	// Replicas start idle (idle workers are not gossiped); the changes below
	// load them up over the run.
	loads := make([]map[string]WorkerLoad, replicas)
	for i := range loads {
		loads[i] = make(map[string]WorkerLoad, workers)
	}
	sent := func() (wire, stream, payload, lagSum, lagCount float64) {
		for _, r := range rs {
			stream += counter(b, r.m.transportSent.WithLabelValues("stream"))
			wire += counter(b, r.m.transportSent.WithLabelValues("packet")) + counter(b, r.m.transportSent.WithLabelValues("stream"))
			payload += counter(b, r.m.broadcastBytes)
			s, c := histogram(b, r.reg, "switchyard_gossip_propagation_lag_seconds")
			lagSum += s
			lagCount += c
		}
		return
	}
	rng := rand.New(rand.NewPCG(uint64(replicas), uint64(changes)))
	instances := make([]uint64, workers)
	for i := range instances {
		instances[i] = rng.Uint64()
	}
	digests := func(step int) map[string]Digest {
		d := make(map[string]Digest, workers)
		for i, w := range names {
			d[w] = Digest{LastEventID: uint64(1000 + 50*step + i%7), Blocks: 4000 + i%97, Instance: instances[i]}
		}
		return d
	}
	interval := rs[0].cfg.Interval
	perDigest := max(1, int(rs[0].cfg.DigestInterval/interval))
	tick := time.NewTicker(interval)
	defer tick.Stop()
	wire0, stream0, payload0, lagSum0, lagCount0 := sent()
	start := time.Now()
	b.ReportAllocs()
	b.ResetTimer()
	for n := range b.N {
		if n%perDigest == 0 {
			d := digests(n / perDigest)
			for _, r := range rs {
				r.SetDigests(d)
			}
		}
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
	wire1, stream1, payload1, lagSum1, lagCount1 := sent()

	full := State{Origins: map[string]map[string]Entry{}}
	version := uint64(time.Now().UnixNano())
	for i := range replicas {
		es := make(map[string]Entry, workers)
		for _, w := range names {
			es[w] = Entry{Version: version - uint64(rng.IntN(int(time.Minute))),
				Load:   WorkerLoad{ActiveRequests: 1 + rng.IntN(8), PrefillTokens: rng.IntN(8192), DecodeBlocks: rng.IntN(400)},
				Digest: Digest{LastEventID: uint64(rng.IntN(1 << 20)), Blocks: rng.IntN(4096), Instance: rng.Uint64()}}
		}
		full.Origins[fmt.Sprintf("replica-%d", i)] = es
	}
	stateBytes := float64(len(appendState(nil, 0, full)))
	b.ReportMetric((wire1-wire0)/elapsed/float64(replicas), "wire_B/s/replica")
	b.ReportMetric((payload1-payload0)/elapsed/float64(replicas), "payload_B/s/replica")
	// TCP streams carry push-pull (and, from codec 4, its fetches): scaled
	// from the configured push-pull interval to the default one.
	stream := (stream1 - stream0) / elapsed / float64(replicas)
	b.ReportMetric(stream, "stream_B/s/replica")
	b.ReportMetric(stream*rs[0].cfg.PushPullInterval.Seconds()/DefaultConfig().PushPullInterval.Seconds(), "stream_at_default_B/s/replica")
	b.ReportMetric(2*stateBytes/rs[0].cfg.PushPullInterval.Seconds(), "push_pull_uncompressed_B/s/replica")
	if lagCount1 > lagCount0 {
		b.ReportMetric((lagSum1-lagSum0)/(lagCount1-lagCount0)*1000, "lag_mean_ms")
	}
}

func histogram(t testing.TB, g prometheus.Gatherer, name string) (sum, count float64) {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetHistogram().GetSampleSum()
				count += float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum, count
}

// fullState is 8 origins × 1000 workers with realistic values.
func fullState() State {
	rng := rand.New(rand.NewPCG(1, 1))
	s := State{Origins: map[string]map[string]Entry{}}
	version := uint64(time.Now().UnixNano())
	for i := range 8 {
		es := make(map[string]Entry, 1000)
		for w := range 1000 {
			es[fmt.Sprintf("worker-%04d", w)] = Entry{Version: version - uint64(rng.IntN(int(time.Minute))),
				Load:   WorkerLoad{ActiveRequests: rng.IntN(8), PrefillTokens: rng.IntN(8192), DecodeBlocks: rng.IntN(400)},
				Digest: Digest{LastEventID: uint64(rng.IntN(1 << 20)), Blocks: rng.IntN(4096), Instance: rng.Uint64()}}
		}
		s.Origins[fmt.Sprintf("replica-%d", i)] = es
	}
	return s
}

// BenchmarkStateCodec encodes and decodes the push-pull state of 8 replicas
// × 1000 workers.
func BenchmarkStateCodec(b *testing.B) {
	s := fullState()
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		buf = appendState(buf[:0], 1, s)
		if _, _, _, _, err := decodeMessage(buf); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(buf)), "state_B")
	b.ReportMetric(float64(len(buf))/8000, "B/entry")
}

// BenchmarkMergeState joins one origin's full 1000-worker update into the
// 8-origin state, as a push-pull does per origin.
func BenchmarkMergeState(b *testing.B) {
	s := fullState()
	upd := State{Origins: map[string]map[string]Entry{"replica-3": {}}}
	for w, e := range s.Origins["replica-3"] {
		e.Version++
		upd.Origins["replica-3"][w] = e
	}
	b.ReportAllocs()
	for b.Loop() {
		s.join(upd, nil)
	}
	b.ReportMetric(1000, "entries/op")
}
