package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// engineCore is a Core over n idle workers whose view carries engine
// reports, under a fake clock.
func engineCore(t testing.TB, sel Selector, n int) (*Core, *RemoteLoads, *clock.Fake) {
	t.Helper()
	clk := clock.NewFake(t0)
	view := &RemoteLoads{}
	cfg := DefaultConfig()
	cfg.Selector = sel
	cfg.TTFT.Herd = 0 // exact comparisons below
	c := NewCore(cfg, clk, view, rand.New(rand.NewPCG(4, 4)))
	c.SetWorkers(workers(n, 0))
	c.SetClasses([]ClassConfig{classCfg("c", PolicyFCFS)})
	return c, view, clk
}

func selectID(t *testing.T, c *Core, r *Request) string {
	t.Helper()
	i, ok := c.selectWorker(r, &c.classes["c"].cfg)
	require.True(t, ok)
	return c.workers[i].ID
}

func TestAWorkerWhoseEngineReportsALongUnbookedQueueLosesToAnIdleOne(t *testing.T) {
	for _, sel := range []Selector{SelectorTTFT, SelectorBlocks} {
		t.Run(sel.String(), func(t *testing.T) {
			c, view, clk := engineCore(t, sel, 2)
			// w0 holds most of the prompt; without reports it wins.
			r := req("r", "c", 4096)
			r.BlockHashes = seqHashes(1, 256)
			r.Overlaps = []Overlap{{Worker: "w0", Blocks: 128}}
			require.Equal(t, "w0", selectID(t, c, r), "the cached worker wins while nothing is known against it")

			// w0's engine runs 60 requests and queues 40 that no router
			// booked (direct traffic), its pool 90% full.
			view.StoreEngine(map[string]EngineLoad{"w0": {Running: 60, Waiting: 40, KVUsage: 0.9, At: clk.Now()}})
			require.Equal(t, "w1", selectID(t, c, r), "the idle worker wins over an engine with a long queue")
			g := WorkerLoad{}
			assert.Equal(t, g, c.workers[0].projectLoad(), "a report books nothing: gossip still shares bookings only")
			assert.Equal(t, 100, c.workers[0].costLoad().ActiveRequests)
			assert.Equal(t, 900, c.workers[0].costLoad().DecodeBlocks)
		})
	}
}

func TestAStaleEngineReportIsIgnored(t *testing.T) {
	c, view, clk := engineCore(t, SelectorTTFT, 2)
	r := req("r", "c", 4096)
	r.BlockHashes = seqHashes(1, 256)
	r.Overlaps = []Overlap{{Worker: "w0", Blocks: 128}}

	busy := EngineLoad{Running: 60, Waiting: 40, KVUsage: 0.9}
	busy.At = clk.Now().Add(-DefaultEngineMaxAge - time.Millisecond)
	view.StoreEngine(map[string]EngineLoad{"w0": busy})
	require.Equal(t, "w0", selectID(t, c, r), "a report older than the bound does not count")
	require.False(t, c.workers[0].engine.on)

	// A fresh report counts until it ages out, with no new report and no
	// new version of the view: the worker is not pinned busy by it.
	busy.At = clk.Now()
	view.StoreEngine(map[string]EngineLoad{"w0": busy})
	require.Equal(t, "w1", selectID(t, c, r))
	clk.Advance(DefaultEngineMaxAge - time.Millisecond)
	require.Equal(t, "w1", selectID(t, c, r), "still fresh")
	clk.Advance(time.Millisecond)
	require.Equal(t, "w0", selectID(t, c, r), "stale: the cached worker wins again")
	require.False(t, c.workers[0].engine.on)
	checkIndex(t, c)

	// The bound is the view's.
	view.MaxEngineAge.Store(int64(10 * time.Second))
	busy.At = clk.Now().Add(-5 * time.Second)
	view.StoreEngine(map[string]EngineLoad{"w0": busy})
	require.Equal(t, "w1", selectID(t, c, r), "within a longer bound the report counts")
}

func TestAnEngineReportNeverLowersTheBookedLoadNorBlocksAWorker(t *testing.T) {
	c, view, clk := engineCore(t, SelectorBlocks, 1)
	c.workers[0].maxRunning = 2
	view.StoreEngine(map[string]EngineLoad{"w0": {Running: 5, Waiting: 9, KVUsage: 1, At: clk.Now()}})
	r := req("r", "c", 512)
	require.Equal(t, "w0", selectID(t, c, r), "a full engine report steers, it does not make a request wait")

	var b BookingID
	c.Enqueue(req("a", "c", 2048), func(g Grant, err error) bool { b = g.Booking; return err == nil })
	require.NotZero(t, b)
	view.StoreEngine(map[string]EngineLoad{"w0": {At: clk.Now()}}) // the engine has not seen it yet
	c.refreshRemote()
	assert.Equal(t, c.workers[0].projectLoad(), c.workers[0].costLoad(), "an idle report leaves the booking")
	assert.False(t, c.workers[0].engine.on)
}

func TestASoftSessionIsServedByTheIndexAndSticksWithinItsMargin(t *testing.T) {
	for _, sel := range []Selector{SelectorTTFT, SelectorBlocks} {
		t.Run(sel.String(), func(t *testing.T) {
			c, _, _ := engineCore(t, sel, 50)
			// w7 runs a request: dearer than the idle rest.
			c.Adopt(BookingRecord{RequestID: "bg", Class: "c", Worker: "w7", PromptTokens: 2048, ExpectedOutputTokens: 256})
			r := req("r", "c", 1024)
			r.Session = SessionAffinity{Worker: "w7"}
			require.True(t, c.indexable(r), "a soft session takes the index")
			require.NotEqual(t, "w7", selectID(t, c, r), "no margin: the cheaper idle worker wins")
			r.Session.MarginCost = 1e9
			require.Equal(t, "w7", selectID(t, c, r), "within the margin the session sticks")
			r.Session = SessionAffinity{Worker: "w7", Hard: true}
			require.False(t, c.indexable(r), "a hard session scans its one worker")
			require.Equal(t, "w7", selectID(t, c, r))
		})
	}
}

// BenchmarkSelectorEngineLoad measures a decision over 1,000 workers
// without engine reports (the selector as before) and with a fresh report
// on every worker, a tenth of them queueing, in one run. "uniform": every
// other engine reports the same load (1,000 exact ties, the worst case for
// the index's bound); "varied": their KV use differs a little, as real
// engines' does.
func BenchmarkSelectorEngineLoad(b *testing.B) {
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		for _, reports := range []string{"none", "uniform", "varied"} {
			b.Run(fmt.Sprintf("selector=%s/reports=%s/workers=1000", sel, reports), func(b *testing.B) {
				view := &RemoteLoads{}
				c := benchCoreWith(b, 1000, 0, view)
				c.cfg.Selector = sel
				if reports != "none" {
					view.MaxEngineAge.Store(int64(time.Hour)) // the fake clock does not move, but be explicit
					m := map[string]EngineLoad{}
					for i := range c.workers {
						l := EngineLoad{At: c.clock.Now(), Running: 1, KVUsage: 0.05}
						if reports == "varied" {
							l.KVUsage += float64(i%97) * 0.001
						}
						if i%10 == 3 {
							l.Running, l.Waiting, l.KVUsage = 8, 4, 0.6
						}
						m[c.workers[i].ID] = l
					}
					view.StoreEngine(m)
				}
				benchSelect(b, c, benchRequest(1000), 1000)
			})
		}
	}
}

// BenchmarkSelectSession measures a decision over 1,000 workers for a
// request without a session and with a soft one, through the full scan
// (what a session request took before the index served it) and the index,
// in one run.
func BenchmarkSelectSession(b *testing.B) {
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		for _, path := range []string{"scan", "index"} {
			for _, session := range []bool{false, true} {
				b.Run(fmt.Sprintf("selector=%s/path=%s/session=%v/workers=1000", sel, path, session), func(b *testing.B) {
					c := benchCore(b, 1000, 0)
					c.cfg.Selector = sel
					c.scanOnly = path == "scan"
					r := benchRequest(1000)
					if session {
						r.Session = SessionAffinity{Worker: "worker-0500", MarginRatio: 0.1}
					}
					benchSelect(b, c, r, 1000)
				})
			}
		}
	}
}
