package admission

import (
	"context"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
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

// BenchmarkAdmissionReplyOnTheTurn measures what the owner's scheduling
// turn spends on one admit reply (turn-ns/op): "inline" encodes and
// publishes it on the turn (before the hand-off), "handoff" queues it for
// Server.Run's replier and, outside the measured part, waits for the
// replier to take it. ns/op includes that wait.
func BenchmarkAdmissionReplyOnTheTurn(b *testing.B) {
	h := newBenchHarness(b)
	nc, err := nats.Connect(h.nats.URL)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	sub, err := nc.SubscribeSync("bench.reply")
	if err != nil {
		b.Fatal(err)
	}
	if err := nc.PublishRequest("bench.reply", "bench.inbox", []byte("x")); err != nil {
		b.Fatal(err)
	}
	m, err := sub.NextMsg(5 * time.Second)
	if err != nil {
		b.Fatal(err)
	}
	srv := NewServer("a", cluster, nc, nil, zap.NewNop(), NewMetrics(prometheus.NewRegistry()))
	out := &wire.AdmitReply{OK: true, Epoch: 3, Worker: "w0", WorkerURL: "http://127.0.0.1:1", Booking: 42, CachedTokens: 512, OverlapBlocks: 32, QueueWaitNano: 1000}
	b.Run("inline", func(b *testing.B) {
		b.ReportAllocs()
		var turn time.Duration
		for b.Loop() {
			t0 := time.Now()
			srv.reply(m, out)
			turn += time.Since(t0)
		}
		b.ReportMetric(float64(turn.Nanoseconds())/float64(b.N), "turn-ns/op")
	})
	b.Run("handoff", func(b *testing.B) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); _ = srv.Run(ctx) }()
		for { // wait until the replier takes replies
			srv.rmu.Lock()
			on := srv.replying
			srv.rmu.Unlock()
			if on {
				break
			}
			runtime.Gosched()
		}
		b.ReportAllocs()
		var turn time.Duration
		for b.Loop() {
			t0 := time.Now()
			srv.handOff(outgoingReply{m: m, out: out})
			turn += time.Since(t0)
			for len(srv.replies) > 0 { // one reply in flight, as on a turn that grants one
				runtime.Gosched()
			}
		}
		b.StopTimer()
		b.ReportMetric(float64(turn.Nanoseconds())/float64(b.N), "turn-ns/op")
		cancel()
		<-done
	})
}
