package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
)

// fullView is a versioned LoadView that reports every worker full (busy
// true) or idle, so a benchmark can build a backlog and then release it in
// one Drain.
type fullView struct {
	busy    bool
	version uint64
}

func (v *fullView) RemoteLoad(string) WorkerLoad {
	if v.busy {
		return WorkerLoad{ActiveRequests: 1 << 22}
	}
	return WorkerLoad{}
}
func (v *fullView) LoadVersion() uint64 { return v.version }

// BenchmarkDrain measures a drain that is bound by the queue's heap: 10,000
// queued requests of one class, with mixed strict priorities, deadlines and
// arrival times, released at once onto 4 unlimited workers. ns/entry is
// the cost of popping, selecting, booking and answering one entry.
func BenchmarkDrain(b *testing.B) {
	const backlog = 10000
	clock := clock.NewFake(t0)
	view := &fullView{}
	c := NewCore(DefaultConfig(), clock, view, rand.New(rand.NewPCG(1, 1)))
	ws := make([]Worker, 4)
	for i := range ws {
		ws[i] = Worker{ID: fmt.Sprintf("worker-%d", i), URL: "http://w", BlockSize: 16, KVBlocks: 1 << 20, MaxRunning: 1 << 21}
	}
	c.SetWorkers(ws)
	c.SetClasses([]ClassConfig{classCfg("batch", PolicyFCFS)})
	rng := rand.New(rand.NewPCG(2, 2))
	reqs := make([]*Request, backlog)
	for i := range reqs {
		r := &Request{ID: fmt.Sprintf("q-%d", i), Class: "batch", PromptTokens: 64,
			StrictPriority: int32(rng.IntN(3)), Ingress: t0.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond)}
		if rng.IntN(2) == 0 {
			r.Due = t0.Add(time.Hour + time.Duration(rng.IntN(1e6))*time.Microsecond)
		}
		reqs[i] = r
	}
	granted := make([]BookingID, 0, backlog)
	respond := func(g Grant, err error) bool {
		if err == nil {
			granted = append(granted, g.Booking)
		}
		return true
	}
	b.ReportAllocs()
	b.ResetTimer()
	var drained, cpu time.Duration
	for range b.N {
		b.StopTimer()
		view.busy, view.version = true, view.version+1
		for _, r := range reqs {
			c.Enqueue(r, respond)
		}
		if c.Queued() != backlog {
			b.Fatalf("%d queued, want %d", c.Queued(), backlog)
		}
		view.busy, view.version = false, view.version+1
		b.StartTimer()
		start, cpu0 := time.Now(), testenv.ProcessCPU()
		c.Drain()
		drained += time.Since(start)
		cpu += testenv.ProcessCPU() - cpu0
		b.StopTimer()
		if len(granted) != backlog {
			b.Fatalf("%d granted, want %d", len(granted), backlog)
		}
		for _, id := range granted {
			c.Finish(id)
		}
		granted = granted[:0]
		b.StartTimer()
	}
	b.ReportMetric(float64(drained.Nanoseconds())/float64(b.N*backlog), "ns/entry")
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N*backlog), "cpu-ns/entry")
}

// BenchmarkDrainQueueHeap isolates the header-bound part of a drain: a
// class heap of 10,000 queued entries (mixed priorities, deadlines and
// scores) emptied in queue order, as popNext does. ns/entry is one pop.
func BenchmarkDrainQueueHeap(b *testing.B) {
	const backlog = 10000
	rng := rand.New(rand.NewPCG(3, 3))
	c := NewCore(DefaultConfig(), clock.NewFake(t0), nil, nil)
	c.SetClasses([]ClassConfig{classCfg("batch", PolicyFCFS)})
	cls := c.classes["batch"]
	es := make([]*entry, backlog)
	for i := range es {
		r := &Request{ID: fmt.Sprintf("q-%d", i), Class: "batch", StrictPriority: int32(rng.IntN(3)),
			Ingress: t0.Add(time.Duration(rng.IntN(1e6)) * time.Microsecond)}
		if rng.IntN(2) == 0 {
			r.Due = t0.Add(time.Hour + time.Duration(rng.IntN(1e6))*time.Microsecond)
		}
		es[i] = c.newEntry(r, nil, cls, t0)
	}
	var popped time.Duration
	b.ReportAllocs()
	for range b.N {
		for _, e := range es {
			cls.q.push(e)
		}
		start := time.Now()
		for len(cls.q) > 0 {
			cls.q.remove(0)
		}
		popped += time.Since(start)
	}
	b.ReportMetric(float64(popped.Nanoseconds())/float64(b.N*backlog), "ns/entry")
}
