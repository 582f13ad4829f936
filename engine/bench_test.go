package engine

import (
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// closedLoop keeps `concurrency` requests live in an engine driven in
// virtual time: each finished request is replaced after the step. Prompts
// are a shared 1024-token prefix (one of 8 groups) plus a unique 1024-token
// suffix, so about half of each prompt can hit the cache; outputs are
// 128–255 tokens.
type closedLoop struct {
	e        *Engine
	clock    *virtualClock
	prefixes [][]uint32
	next     int
	finished int
	// pull makes every request a decode-role one whose prompt but its last
	// token arrives by transfer (transfer_bench_test.go).
	pull bool
}

func newClosedLoop(b *testing.B, cfg Config, concurrency int, pull ...bool) *closedLoop {
	clock := &virtualClock{now: time.Unix(0, 0)}
	e, err := New(cfg, clock)
	if err != nil {
		b.Fatal(err)
	}
	l := &closedLoop{e: e, clock: clock, pull: len(pull) > 0 && pull[0]}
	for g := range 8 {
		l.prefixes = append(l.prefixes, prompt(uint32(g), 1024))
	}
	for range concurrency {
		l.submit(b)
	}
	return l
}

func (l *closedLoop) submit(b *testing.B) {
	i := l.next
	l.next++
	p := make([]uint32, 0, 2048)
	p = append(p, l.prefixes[i%len(l.prefixes)]...)
	for k := range 1024 {
		p = append(p, uint32(256+(i*1024+k)%49000))
	}
	var tr *Transfer
	if l.pull {
		cfg := l.e.Config()
		tr = &Transfer{Tokens: len(p) - 1, Delay: cfg.TransferTime(len(p) - 1)}
	}
	_, err := l.e.Submit(&Request{
		ID:        fmt.Sprint("r", i),
		Prompt:    p,
		MaxTokens: 128 + i%128,
		Transfer:  tr,
		OnDelta: func(d Delta) {
			if d.Finish != 0 {
				l.finished++
			}
		},
	})
	if err != nil {
		b.Fatal(err)
	}
}

// step runs one engine step and refills the loop.
func (l *closedLoop) step(b *testing.B) {
	next := l.e.Step(l.clock.now)
	if next.IsZero() {
		b.Fatal("closed loop went idle")
	}
	l.clock.now = next
	for ; l.finished > 0; l.finished-- {
		l.submit(b)
	}
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEngineStep measures one engine step (complete the batch in
// flight, deliver tokens, schedule the next) under a steady load of 128
// concurrent requests on the default 65,536-block pool.
func BenchmarkEngineStep(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Instance = 1
	l := newClosedLoop(b, cfg, 128)
	for range 2000 { // warm up into steady state
		l.step(b)
	}
	st0 := l.e.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l.step(b)
	}
	b.StopTimer()
	st := l.e.Stats()
	steps := float64(st.Steps - st0.Steps)
	b.ReportMetric(float64(st.OutputTokens-st0.OutputTokens)/steps, "tokens/step")
	b.ReportMetric(float64(st.Running), "running")
}

// BenchmarkSimulatedSecond measures the CPU one engine costs per second of
// simulated time at --speedup 10 under a steady, busy load (128 concurrent
// requests, 2k-token prompts half shared, 128–255 output tokens). Its
// inverse is how many such engines one core can run in real time.
func BenchmarkSimulatedSecond(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Instance = 1
	cfg.Speedup = 10
	l := newClosedLoop(b, cfg, 128)
	for range 2000 {
		l.step(b)
	}
	start := l.clock.now
	st0 := l.e.Stats()
	cpu0 := cpuTime()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		end := l.clock.now.Add(time.Second)
		for l.clock.now.Before(end) {
			l.step(b)
		}
	}
	b.StopTimer()
	cpu := (cpuTime() - cpu0).Seconds()
	sim := l.clock.now.Sub(start).Seconds()
	st := l.e.Stats()
	b.ReportMetric(cpu/sim, "cpu-s/sim-s")
	b.ReportMetric(sim/cpu, "engines/core")
	b.ReportMetric(float64(st.Steps-st0.Steps)/sim, "steps/sim-s")
	b.ReportMetric(float64(st.OutputTokens-st0.OutputTokens)/sim, "out-tok/sim-s")
	b.ReportMetric(st.PrefixHitRate, "prefix-hit-rate")
}

// BenchmarkEngineStepTiers measures an engine step on a pool small enough
// (20,000 blocks for 128 requests of 128+ blocks) that cached blocks are
// evicted all the time: without offloaded tiers (the baseline), with a
// host tier, and with a host tier and a disk tier below it. The tiers add
// an LRU move per evicted block and a lookup per admitted prompt block
// past the GPU hit.
func BenchmarkEngineStepTiers(b *testing.B) {
	for _, tc := range []struct {
		name       string
		host, disk int
	}{{"none", 0, 0}, {"host", 20000, 0}, {"host+disk", 20000, 80000}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Instance = 1
			cfg.NumBlocks, cfg.HostBlocks, cfg.DiskBlocks = 20000, tc.host, tc.disk
			l := newClosedLoop(b, cfg, 128)
			for range 2000 {
				l.step(b)
			}
			st0 := l.e.Stats()
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				l.step(b)
			}
			b.StopTimer()
			st := l.e.Stats()
			b.ReportMetric(float64(st.BlocksEvicted-st0.BlocksEvicted)/float64(st.Steps-st0.Steps), "evicted/step")
		})
	}
}

// BenchmarkNewEngines builds a fleet of idle engines with the simulator's
// pool (bench/sim.go: 1700 × 512 tokens in 16-token blocks) and reports the
// heap they hold: an engine that has served nothing should cost little, so
// a simulated fleet of thousands fits in memory.
func BenchmarkNewEngines(b *testing.B) {
	for _, engines := range []int{1000, 10000} {
		b.Run(fmt.Sprintf("engines=%d", engines), func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.NumBlocks = 1700 * 512 / cfg.BlockSize
			var heap uint64
			for b.Loop() {
				b.StopTimer()
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				b.StartTimer()
				fleet := make([]*Engine, engines)
				for i := range fleet {
					e, err := New(cfg, nil)
					if err != nil {
						b.Fatal(err)
					}
					fleet[i] = e
				}
				b.StopTimer()
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = after.HeapAlloc - before.HeapAlloc
				runtime.KeepAlive(fleet)
				b.StartTimer()
			}
			b.ReportMetric(float64(heap)/float64(engines), "heap-B/engine")
			b.ReportMetric(float64(heap)/(1<<20), "heap-MiB")
		})
	}
}
