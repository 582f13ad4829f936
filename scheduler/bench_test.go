package scheduler

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
)

// benchCore builds a Core with n workers, a little booked load spread over
// them, and (for backlog > 0) a blocked backlog in a second class: its
// entries may run only on w0, which is full, so every drain sees the backlog
// and skips it.
func benchCore(b *testing.B, n, backlog int) *Core { return benchCoreWith(b, n, backlog, nil) }

// benchCoreWith is benchCore with a remote-load view.
func benchCoreWith(b *testing.B, n, backlog int, view LoadView) *Core {
	b.Helper()
	clock := clock.NewFake(t0)
	c := NewCore(DefaultConfig(), clock, view, rand.New(rand.NewPCG(1, 1)))
	ws := make([]Worker, n)
	for i := range ws {
		ws[i] = Worker{ID: fmt.Sprintf("worker-%04d", i), URL: "http://w", BlockSize: 16, KVBlocks: 8192}
	}
	ws[0].MaxRunning = 1
	c.SetWorkers(ws)
	c.SetClasses([]ClassConfig{classCfg("interactive", PolicyWSPT), classCfg("batch", PolicyFCFS)})
	// background load: every 10th worker runs a request with a shared prefix
	for i := 0; i < n; i += 10 {
		c.Adopt(BookingRecord{RequestID: "bg", Class: "batch", Worker: ws[i].ID,
			BlockHashes: seqHashes(uint64(i%7), 64), PromptTokens: 1024, ExpectedOutputTokens: 256})
	}
	for i := range backlog {
		r := &Request{ID: fmt.Sprintf("backlog-%d", i), Class: "batch", PromptTokens: 512, Ingress: t0, Pinned: ws[0].ID}
		c.Enqueue(r, func(Grant, error) bool { return true })
	}
	if c.Queued() != backlog {
		b.Fatalf("backlog: %d queued, want %d", c.Queued(), backlog)
	}
	return c
}

// benchRequest is a typical chat request: 2k prompt tokens, 128 full blocks,
// cached to different depths on four workers.
func benchRequest(n int) *Request {
	r := &Request{ID: "bench", Class: "interactive", PromptTokens: 2048, Ingress: t0,
		BlockHashes: seqHashes(3, 128), ExpectedOutputTokens: 256}
	for i := range 4 {
		r.Overlaps = append(r.Overlaps, Overlap{Worker: fmt.Sprintf("worker-%04d", (i*37+5)%n), Blocks: 16 * (i + 1)})
	}
	return r
}

func BenchmarkAdmission(b *testing.B) {
	for _, tc := range []struct{ workers, backlog int }{{100, 0}, {1000, 0}, {1000, 10000}} {
		b.Run(fmt.Sprintf("workers=%d/backlog=%d", tc.workers, tc.backlog), func(b *testing.B) {
			c := benchCore(b, tc.workers, tc.backlog)
			benchAdmit(b, c, benchRequest(tc.workers), false)
		})
	}
	// The same request with a deeper prefix in host memory on each of its
	// holders: admit books it at its load cost (bookedTierCredit).
	b.Run("workers=100/backlog=0/lower-tier", func(b *testing.B) {
		c := benchCore(b, 100, 0)
		r := benchRequest(100)
		for _, o := range r.Overlaps {
			r.Overlaps = append(r.Overlaps, Overlap{Worker: o.Worker, Blocks: o.Blocks + 32, Tier: TierCPU})
		}
		benchAdmit(b, c, r, false)
	})
	b.Run("actor/workers=1000/backlog=0", func(b *testing.B) {
		c := benchCore(b, 1000, 0)
		a := NewActor(c, c.clock, nil)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- a.Run(ctx) }()
		defer func() {
			cancel()
			if err := <-done; err != nil {
				b.Error(err)
			}
		}()
		r := benchRequest(1000)
		b.ReportAllocs()
		b.ResetTimer()
		start, cpu := time.Now(), testenv.ProcessCPU()
		for b.Loop() {
			g, err := a.Admit(ctx, r) // two channel hand-offs around the Core's turn
			if err != nil {
				b.Fatal(err)
			}
			a.Finish(g.Booking)
		}
		reportRates(b, start, cpu)
	})
}

func BenchmarkSelect(b *testing.B) {
	b.Run("workers=1000", func(b *testing.B) {
		benchSelect(b, benchCore(b, 1000, 0), benchRequest(1000), 1000)
	})
}

// benchSelect measures the choice of a worker for r on c, whose n workers
// give the cost per worker considered.
func benchSelect(b *testing.B, c *Core, r *Request, n int) {
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
	b.ReportMetric(float64((testenv.ProcessCPU()-cpu).Nanoseconds())/float64(b.N)/float64(n), "cpu-ns/worker")
}

// benchAdmit measures admission turns of r on c (enqueue → drain → select →
// book → respond), each finished before the next; with firstToken each also
// reports its first token, which feeds the ttft selector's calibration.
func benchAdmit(b *testing.B, c *Core, r *Request, firstToken bool) {
	benchAdmitHerd(b, c, r, firstToken, 0)
}

// benchAdmitHerd is benchAdmit with the herd estimate held at herd (> 0:
// every selection draws in a band, as under bursts at several replicas;
// the benchmark's view never changes, so the Core would learn 0).
func benchAdmitHerd(b *testing.B, c *Core, r *Request, firstToken bool, herd float64) {
	var g Grant
	var gerr error
	respond := func(x Grant, err error) bool { g, gerr = x, err; return true }
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu := time.Now(), testenv.ProcessCPU()
	for b.Loop() {
		if herd > 0 {
			c.herd.est = herd
		}
		c.Enqueue(r, respond)
		if gerr != nil {
			b.Fatal(gerr)
		}
		if firstToken {
			c.FirstToken(g.Booking)
		}
		c.Finish(g.Booking)
	}
	reportRates(b, start, cpu)
}

// reportRates adds admissions per wall second and CPU ns per operation.
func reportRates(b *testing.B, start time.Time, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "ops/s")
	b.ReportMetric(float64((testenv.ProcessCPU()-cpu).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// BenchmarkAdmissionProduction is the path a replica runs: the remote load
// comes from the gossiped, versioned view (RemoteLoads, stored once per
// gossip round; every 5th worker carries other replicas' bookings), which
// lets the Core cache remote loads and skip a blocked backlog while the
// view does not change.
//
// Both selectors run it (the ttft turns also report a first token, which
// calibrates the worker, as a live turn does).
func BenchmarkAdmissionProduction(b *testing.B) {
	type tcase struct {
		view             string
		sel              Selector
		workers, backlog int
		herd             float64
		sampled          bool // the index keeps one hash in 8 (IndexKeeps)
	}
	var cases []tcase
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		for _, n := range []int{100, 1000} {
			for _, backlog := range []int{0, 10000} {
				cases = append(cases, tcase{"versioned", sel, n, backlog, 0, false})
			}
		}
	}
	// the ttft selector drawing in a herd band (three unseen bookings per
	// decision): every idle worker's draw is computed
	for _, n := range []int{100, 1000} {
		for _, backlog := range []int{0, 10000} {
			cases = append(cases, tcase{"versioned", SelectorTTFT, n, backlog, 3, false})
		}
	}
	// the same with a sampled index: the draw's key is searched for past
	// the deepest report among the kept hashes (herdKeyBlock)
	cases = append(cases, tcase{"versioned", SelectorTTFT, 1000, 0, 3, true})
	// the unversioned view production had before
	cases = append(cases, tcase{"plain", SelectorBlocks, 1000, 0, 0, false}, tcase{"plain", SelectorBlocks, 1000, 10000, 0, false})
	for _, tc := range cases {
		name := fmt.Sprintf("view=%s/selector=%s/workers=%d/backlog=%d", tc.view, tc.sel, tc.workers, tc.backlog)
		if tc.herd > 0 {
			name = fmt.Sprintf("view=%s/selector=%s/herd=%g/workers=%d/backlog=%d", tc.view, tc.sel, tc.herd, tc.workers, tc.backlog)
		}
		if tc.sampled {
			name += "/sample=8"
		}
		b.Run(name, func(b *testing.B) {
			view := &RemoteLoads{}
			loads := map[string]WorkerLoad{}
			for i := 0; i < tc.workers; i += 5 {
				loads[fmt.Sprintf("worker-%04d", i)] = WorkerLoad{ActiveRequests: 2, PrefillTokens: 512, DecodeBlocks: 300}
			}
			view.Store(loads)
			var lv LoadView = view
			if tc.view == "plain" {
				lv = plainLoads{view}
			}
			c := benchCoreWith(b, tc.workers, tc.backlog, lv)
			c.cfg.Selector = tc.sel
			if tc.sampled {
				c.cfg.IndexKeeps = sampledKeeps
			}
			benchAdmitHerd(b, c, benchRequest(tc.workers), tc.sel == SelectorTTFT, tc.herd)
		})
	}
}

// plainLoads hides the version: the Core must ask it on every selection.
type plainLoads struct{ v *RemoteLoads }

func (p plainLoads) RemoteLoad(w string) WorkerLoad { return p.v.RemoteLoad(w) }
