package scheduler

import (
	"fmt"
	"math"
	"testing"

	"github.com/stretchr/testify/require"
)

// pdFleet is both-workers b0.., prefill workers p0.. and decode workers d0...
func pdFleet(both, prefill, decode, maxRunning int) []Worker {
	var ws []Worker
	add := func(prefix, role string, n int) {
		for i := range n {
			id := fmt.Sprintf("%s%d", prefix, i)
			ws = append(ws, Worker{ID: id, URL: "http://" + id, BlockSize: 16, KVBlocks: 1000, MaxRunning: maxRunning, Role: role})
		}
	}
	add("b", "", both)
	add("p", RolePrefill, prefill)
	add("d", RoleDecode, decode)
	return ws
}

func TestDecider(t *testing.T) {
	th := DefaultDisaggMinTokens(DefaultTTFTModel(), DefaultDisaggConfig())
	require.Greater(t, th, 0)
	require.Less(t, th, 10000)

	h := newHarness(t, pdFleet(1, 2, 2, 0), classCfg("c", PolicyFCFS))
	require.Equal(t, th, h.core.DisaggThreshold("c"))

	h.enqueue(req("short", "c", th-1))
	g := h.granted("short")
	require.Equal(t, "b0", g.Worker)
	require.False(t, g.Disaggregated())
	require.Equal(t, DecisionShort, g.Decision)

	h.enqueue(req("long", "c", th+100))
	g = h.granted("long")
	require.True(t, g.Disaggregated())
	require.Equal(t, DecisionLong, g.Decision)
	require.Contains(t, []string{"p0", "p1"}, g.Worker)
	require.Contains(t, []string{"d0", "d1"}, g.Decode.Worker)
	require.Equal(t, "http://"+g.Decode.Worker, g.Decode.URL)
	require.Positive(t, g.Decode.Transfer)

	// The prefill worker holds the prompt's prefill; the decode worker
	// holds its output and no prefill.
	pl, dl := h.core.Load(g.Worker), h.core.Load(g.Decode.Worker)
	require.Equal(t, th+100, pl.PrefillTokens)
	require.Zero(t, dl.PrefillTokens)
	require.Equal(t, 1, pl.ActiveRequests)
	require.Equal(t, 1, dl.ActiveRequests)

	counts := h.core.DisaggCounts()
	require.Equal(t, uint64(1), counts[DecisionShort])
	require.Equal(t, uint64(1), counts[DecisionLong])

	// One finish frees both.
	h.core.Finish(g.Booking)
	require.Zero(t, h.core.Load(g.Worker).ActiveRequests)
	require.Zero(t, h.core.Load(g.Decode.Worker).ActiveRequests)
	require.Equal(t, 1, h.core.Bookings()) // "short" only
}

func TestDeciderCachedPrefixRunsAggregated(t *testing.T) {
	h := newHarness(t, pdFleet(1, 1, 1, 0), classCfg("c", PolicyFCFS))
	th := h.core.DisaggThreshold("c")
	r := req("warm", "c", th+64)
	r.BlockHashes = make([]uint64, (th+64)/16)
	for i := range r.BlockHashes {
		r.BlockHashes[i] = uint64(i + 1)
	}
	// The prefill worker and the both-worker hold all but 64 tokens: the
	// uncached part is short wherever it runs.
	r.Overlaps = []Overlap{{Worker: "p0", Blocks: th / 16}, {Worker: "b0", Blocks: th / 16}}
	h.enqueue(r)
	g := h.granted("warm")
	require.False(t, g.Disaggregated())
	require.Equal(t, DecisionShort, g.Decision)
}

func TestDeciderClassThresholdAndFleets(t *testing.T) {
	never := classCfg("never", PolicyFCFS)
	never.DisaggMinTokens = -1
	always := classCfg("always", PolicyFCFS)
	always.DisaggMinTokens = 1
	h := newHarness(t, pdFleet(1, 1, 1, 0), never, always)
	h.enqueue(req("n", "never", 100000))
	require.Equal(t, "b0", h.granted("n").Worker)
	h.enqueue(req("a", "always", 10))
	require.True(t, h.granted("a").Disaggregated())

	// Only prefill and decode workers: a long prefill runs on a pair.
	h = newHarness(t, pdFleet(0, 1, 1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("big", "c", 100000))
	g := h.granted("big")
	require.Equal(t, DecisionOnlyPairs, g.Decision)
	require.Equal(t, "p0", g.Worker)
	require.Equal(t, "d0", g.Decode.Worker)

	// No decode worker among the allowed: aggregated on a both-worker.
	h = newHarness(t, pdFleet(1, 1, 1, 0), classCfg("c", PolicyFCFS))
	r := req("nd", "c", 100000)
	r.Allowed = []string{"b0", "p0"}
	h.enqueue(r)
	g = h.granted("nd")
	require.Equal(t, "b0", g.Worker)
	require.Equal(t, DecisionNoPair, g.Decision)

	// A fleet without roles decides nothing.
	h = newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	h.enqueue(req("plain", "c", 100000))
	require.Equal(t, DecisionNone, h.granted("plain").Decision)
}

func TestDeciderWithoutBothWorkersRunsShortPrefillsOnARoleWorker(t *testing.T) {
	h := newHarness(t, pdFleet(0, 2, 2, 1), classCfg("c", PolicyFCFS))
	th := h.core.DisaggThreshold("c")
	// A short prompt whose prefix d1 holds: aggregated on d1, chosen by
	// the selector's cache hit (the load-chosen decode worker is d0: both
	// are idle and d0 comes first).
	hashes := make([]uint64, 4)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	r := req("warm", "c", 64)
	r.BlockHashes = hashes
	r.Overlaps = []Overlap{{Worker: "d1", Blocks: 4}}
	h.enqueue(r)
	g := h.granted("warm")
	require.False(t, g.Disaggregated())
	require.Equal(t, DecisionShort, g.Decision)
	require.Equal(t, "d1", g.Worker)
	require.Equal(t, uint64(1), h.core.DisaggCounts()[DecisionShort])
	require.Zero(t, h.core.DisaggCounts()[DecisionOnlyPairs])

	// d1 is full (MaxRunning 1): the next short one runs on d0, the one
	// after on a prefill worker: no decode worker is free.
	h.enqueue(req("s2", "c", th/2))
	require.Equal(t, "d0", h.granted("s2").Worker)
	h.enqueue(req("s3", "c", th/2))
	g = h.granted("s3")
	require.Contains(t, []string{"p0", "p1"}, g.Worker)
	require.Equal(t, DecisionShort, g.Decision)

	// A long one needs a decode worker: it waits.
	h.enqueue(req("long", "c", th+100))
	h.pending("long")

	// A threshold of 1 pairs everything (the simulator's "decider off").
	always := classCfg("c", PolicyFCFS)
	always.DisaggMinTokens = 1
	h = newHarness(t, pdFleet(0, 1, 1, 0), always)
	h.enqueue(req("tiny", "c", 1))
	require.True(t, h.granted("tiny").Disaggregated())
}

func TestPairWaitsForBothCaps(t *testing.T) {
	// Worker caps apply to both workers: the decode worker full, the pair waits.
	h := newHarness(t, pdFleet(0, 1, 1, 1), classCfg("c", PolicyFCFS))
	h.enqueue(req("one", "c", 1000))
	g := h.granted("one")
	h.core.Ack(g.Booking)
	h.enqueue(req("two", "c", 1000))
	h.pending("two")
	h.core.FirstToken(g.Booking) // the prefill finished; decode still runs
	h.pending("two")
	h.core.Finish(g.Booking)
	require.True(t, h.granted("two").Disaggregated())
}

func TestPairCancelAndExpiryFreeBoth(t *testing.T) {
	h := newHarness(t, pdFleet(0, 1, 1, 0), classCfg("c", PolicyFCFS))
	h.refuse["gone"] = true
	h.enqueue(req("gone", "c", 1000)) // the requester left: rolled back
	require.Zero(t, h.core.Bookings())

	h.enqueue(req("lost", "c", 1000))
	require.True(t, h.granted("lost").Disaggregated())
	require.Equal(t, 2, h.core.Bookings())
	h.core.CancelAttempt("lost", 0)
	require.Zero(t, h.core.Bookings())

	h.enqueue(req("late", "c", 1000))
	g := h.granted("late")
	h.core.Ack(g.Booking)
	h.clock.Advance(h.core.Config().BookingExpiry / 2)
	h.core.Renew([]BookingID{g.Booking}) // renews both
	h.clock.Advance(h.core.Config().BookingExpiry/2 + 1)
	h.core.Tick()
	require.Equal(t, 2, h.core.Bookings())
	h.clock.Advance(h.core.Config().BookingExpiry)
	h.core.Tick()
	require.Zero(t, h.core.Bookings())
}

func TestPairAdoptedAsOne(t *testing.T) {
	h := newHarness(t, pdFleet(0, 1, 1, 0), classCfg("c", PolicyFCFS))
	r := req("moved", "c", 1000)
	r.ExpectedOutputTokens = 100
	h.enqueue(r)
	g := h.granted("moved")
	rec, ok := h.core.Booking(g.Booking)
	require.True(t, ok)
	require.Equal(t, "d0", rec.Decode.Worker)
	require.Equal(t, 100, rec.ExpectedOutputTokens)

	h2 := newHarness(t, pdFleet(0, 1, 1, 0), classCfg("c", PolicyFCFS))
	id := h2.core.Adopt(rec)
	require.Equal(t, 2, h2.core.Bookings())
	require.Equal(t, h.core.Load("p0"), h2.core.Load("p0"))
	require.Equal(t, h.core.Load("d0"), h2.core.Load("d0"))
	h2.core.Finish(id)
	require.Zero(t, h2.core.Bookings())
}

func TestPairTenantAndClassCountOnce(t *testing.T) {
	h := newHarness(t, pdFleet(0, 2, 2, 0), classCfg("c", PolicyFCFS))
	q := TenantQuota{Concurrent: 1}
	a := req("a", "c", 1000)
	a.Tenant = Tenant{ID: "t", Quota: q}
	h.enqueue(a)
	g := h.granted("a")
	require.True(t, g.Disaggregated())
	snap := h.core.Snapshot()
	require.Len(t, snap.Tenants, 1)
	require.Equal(t, 1, snap.Tenants[0].InFlight)
	require.Equal(t, uint64(1), snap.Classes["c"].Counters.Admitted)
	b := req("b", "c", 1000)
	b.Tenant = Tenant{ID: "t", Quota: q}
	h.enqueue(b)
	require.ErrorIs(t, h.one("b").err, ErrQuotaExceeded) // the pair holds one slot
	h.core.Finish(g.Booking)
	for _, ts := range h.core.Snapshot().Tenants {
		require.Zero(t, ts.InFlight)
	}
}

func TestPlacementRoundTrip(t *testing.T) {
	for _, c := range []struct{ p, d int }{{0, 0}, {5, -1}, {1<<placementShift - 2, 7}, {3, 1<<placementShift - 2}} {
		for _, dec := range Decisions {
			var x int
			if c.d >= 0 {
				x = placePair(c.p, c.d, dec)
			} else {
				x = placeOne(c.p, dec)
			}
			p, d, got := unplace(x)
			require.Equal(t, c.p, p)
			require.Equal(t, c.d, d)
			require.Equal(t, dec, got)
		}
	}
	linear := DefaultTTFTModel()
	linear.Prefill[0] = 0
	require.Equal(t, math.MaxInt, DefaultDisaggMinTokens(linear, DisaggConfig{TransferSetupMs: 1, TransferMsPerToken: 1}))
}

// BenchmarkPlacement compares the decider's pair selection with today's
// single selection on the same fleet size: 8 both-workers (single) against
// 2 both + 3 prefill + 3 decode (pair), a 2,048-token prompt with a
// 1,024-token prefix cached on one worker of each (pair-decode-cached: on
// a prefill and a decode worker).
func BenchmarkPlacement(b *testing.B) {
	prompt := 2048
	hashes := make([]uint64, prompt/16)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	run := func(b *testing.B, ws []Worker, cached ...string) {
		c := NewCore(DefaultConfig(), nil, nil, nil)
		c.SetWorkers(ws)
		cls := classCfg("c", PolicyFCFS)
		c.SetClasses([]ClassConfig{cls})
		r := &Request{ID: "r", Class: "c", PromptTokens: prompt, BlockHashes: hashes, ExpectedOutputTokens: 128}
		for _, w := range cached {
			r.Overlaps = append(r.Overlaps, Overlap{Worker: w, Blocks: 64})
		}
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, ok := c.selectPlacement(r, &cls); !ok {
				b.Fatal("no placement")
			}
		}
	}
	b.Run("single", func(b *testing.B) { run(b, pdFleet(8, 0, 0, 0), "b3") })
	b.Run("pair", func(b *testing.B) { run(b, pdFleet(2, 3, 3, 0), "p1") })
	// The prefix cached on a decode worker too: the decider weighs the
	// transfer of what that worker lacks.
	b.Run("pair-decode-cached", func(b *testing.B) { run(b, pdFleet(2, 3, 3, 0), "p1", "d2") })
}

// A decode worker that already caches the prompt's prefix pulls less of
// it: among the nearly least loaded decode workers it wins, but not over
// one much less loaded.
func TestTheDecodeWorkerCachingThePromptWinsAmongTheNearlyLeastLoaded(t *testing.T) {
	long := func(id string) *Request {
		r := req(id, "c", 4096)
		r.BlockHashes = make([]uint64, 4096/16)
		for i := range r.BlockHashes {
			r.BlockHashes[i] = uint64(i + 1)
		}
		r.Overlaps = []Overlap{{Worker: "d1", Blocks: 128}} // half the prompt, on d1 only
		return r
	}
	cls := classCfg("c", PolicyFCFS)
	cls.DisaggMinTokens = 1

	h := newHarness(t, pdFleet(0, 1, 2, 0), cls)
	h.enqueue(long("warm"))
	g := h.granted("warm")
	require.True(t, g.Disaggregated())
	require.Equal(t, "d1", g.Decode.Worker, "equal loads: the decode worker caching half the prompt")

	// d1 far busier than d0 (each booking adds the prompt's 256 blocks of
	// 1000): the cache no longer outweighs the load.
	h = newHarness(t, pdFleet(0, 1, 2, 0), cls)
	for i := range 2 {
		r := req(fmt.Sprintf("busy%d", i), "c", 4096)
		r.Pinned = "d1"
		h.enqueue(r)
		h.granted(r.ID)
	}
	h.enqueue(long("cold"))
	g = h.granted("cold")
	require.True(t, g.Disaggregated())
	require.Equal(t, "d0", g.Decode.Worker, "d1 is over the margin: load wins")
}

// prompt is a request of n full 16-token blocks with the given overlaps.
func prompt(id string, blocks int, overlaps ...Overlap) *Request {
	r := req(id, "c", blocks*16)
	r.BlockHashes = make([]uint64, blocks)
	for i := range r.BlockHashes {
		r.BlockHashes[i] = uint64(i + 1)
	}
	r.Overlaps = overlaps
	return r
}

// A decode engine pulls only the blocks it lacks (engine.admitPull; vLLM's
// NixlConnector reads remote blocks for its unhashed blocks only): the
// grant's transfer, and the pair's predicted TTFT, count those tokens.
func TestThePredictedTransferCountsOnlyThePromptTheDecodeWorkerLacks(t *testing.T) {
	cls := classCfg("c", PolicyFCFS)
	cls.DisaggMinTokens = 1 // the operator's threshold: every request pairs
	cfg := DefaultConfig().Disagg

	cold := newHarness(t, pdFleet(0, 1, 1, 0), cls)
	cold.enqueue(prompt("cold", 256))
	gc := cold.granted("cold")
	require.True(t, gc.Disaggregated())
	require.Equal(t, cfg.TransferTime(4096), gc.Decode.Transfer, "nothing cached on the decode worker: the whole prompt moves")

	// d0 holds 224 of the prompt's 256 blocks: 512 tokens move.
	warm := newHarness(t, pdFleet(0, 1, 1, 0), cls)
	warm.enqueue(prompt("warm", 256, Overlap{Worker: "d0", Blocks: 224}))
	gw := warm.granted("warm")
	require.True(t, gw.Disaggregated())
	require.Equal(t, "d0", gw.Decode.Worker)
	require.Equal(t, cfg.TransferTime(512), gw.Decode.Transfer)
	require.Less(t, 3*gw.Decode.Transfer, gc.Decode.Transfer, "a much shorter transfer")
	require.Positive(t, gc.PredictedTTFT)
	require.Equal(t, gc.Decode.Transfer-gw.Decode.Transfer, gc.PredictedTTFT-gw.PredictedTTFT,
		"the pair's predicted TTFT adds the shorter transfer")

	// The whole prompt cached on d0: only the setup is left.
	full := newHarness(t, pdFleet(0, 1, 1, 0), cls)
	full.enqueue(prompt("full", 256, Overlap{Worker: "d0", Blocks: 256}))
	require.Equal(t, cfg.TransferTime(0), full.granted("full").Decode.Transfer)
}

// With the threshold derived from the timing model, the decider weighs the
// prefill's stall against the transfer of what the chosen decode worker
// lacks, not against a transfer as long as the uncached prefill.
func TestTheDerivedDeciderWeighsTheTransferTheDecodeWorkerNeeds(t *testing.T) {
	cfg := DefaultConfig()
	th := DefaultDisaggMinTokens(cfg.TTFT, cfg.Disagg)
	require.Less(t, th, 512)
	require.Greater(t, th, 416)

	// An 8,192-token prompt the prefill worker and the both-worker
	// mostly cache (512 uncached), the decode worker not at all: moving
	// 8,192 tokens costs more than the both-worker's 512-token prefill
	// stalls its batch, so it runs aggregated there.
	h := newHarness(t, pdFleet(1, 1, 1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(prompt("agg-warm", 512, Overlap{Worker: "p0", Blocks: 480}, Overlap{Worker: "b0", Blocks: 480}))
	g := h.granted("agg-warm")
	require.Equal(t, "b0", g.Worker)
	require.Equal(t, DecisionShort, g.Decision)

	// Only the prefill worker caches it: the aggregated run would compute
	// all 8,192 tokens in the both-worker's batch, which stalls it longer
	// than moving them takes, so it pairs (the prefill worker's cache
	// spares the pair's prefill, not the aggregated run's).
	for _, both := range []int{1, 0} {
		h = newHarness(t, pdFleet(both, 1, 1, 0), classCfg("c", PolicyFCFS))
		h.enqueue(prompt("prefill-warm", 512, Overlap{Worker: "p0", Blocks: 480}))
		g = h.granted("prefill-warm")
		require.True(t, g.Disaggregated(), "both-workers %d: %v", both, g.Decision)
		require.Equal(t, "p0", g.Worker)
	}

	// The same prefill with the decode worker holding the prompt pairs.
	h = newHarness(t, pdFleet(1, 1, 1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(prompt("both-warm", 512, Overlap{Worker: "p0", Blocks: 480}, Overlap{Worker: "d0", Blocks: 512}))
	g = h.granted("both-warm")
	require.Equal(t, DecisionLong, g.Decision)
	require.Equal(t, "d0", g.Decode.Worker)

	// 416 uncached tokens (below the threshold), 400 of them cached on
	// the decode worker (it ran the conversation's last turn): moving 16
	// tokens costs less than the prefill would stall a batch, so it pairs.
	h = newHarness(t, pdFleet(1, 1, 1, 0), classCfg("c", PolicyFCFS))
	h.enqueue(prompt("decode-warm", 26, Overlap{Worker: "d0", Blocks: 25}))
	g = h.granted("decode-warm")
	require.Equal(t, DecisionLong, g.Decision)
	require.Equal(t, cfg.Disagg.TransferTime(16), g.Decode.Transfer)

	// An operator's threshold is a threshold in tokens, as before.
	set := classCfg("c", PolicyFCFS)
	set.DisaggMinTokens = th
	h = newHarness(t, pdFleet(1, 1, 1, 0), set)
	h.enqueue(prompt("prefill-warm", 512, Overlap{Worker: "p0", Blocks: 480}))
	require.Equal(t, DecisionLong, h.granted("prefill-warm").Decision)
	h.enqueue(prompt("decode-warm", 26, Overlap{Worker: "d0", Blocks: 25}))
	require.Equal(t, DecisionShort, h.granted("decode-warm").Decision)
}

// TestASaturatedPrefillRoleOverflowsAsPrefillBusy: with every prefill
// worker full, a request the decider would pair runs aggregated on a
// worker that is free, and says why (not short_prefill: its prefill was
// never weighed).
func TestASaturatedPrefillRoleOverflowsAsPrefillBusy(t *testing.T) {
	for _, tc := range []struct {
		name       string
		both       int
		overflowTo string
	}{
		{"only pairs: on the decode worker", 0, "d"},
		{"with a both-worker: on it", 1, "b0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			always := classCfg("c", PolicyFCFS)
			always.DisaggMinTokens = 1
			ws := pdFleet(tc.both, 1, 2, 0)
			for i := range ws {
				if ws[i].Role == RolePrefill {
					ws[i].MaxRunning = 1
				}
			}
			h := newHarness(t, ws, always)
			h.enqueue(req("first", "c", 4096))
			g := h.granted("first")
			require.True(t, g.Disaggregated())
			require.Equal(t, "p0", g.Worker)

			h.enqueue(req("second", "c", 4096))
			g2 := h.granted("second")
			require.False(t, g2.Disaggregated())
			require.Equal(t, DecisionPrefillBusy, g2.Decision)
			require.Equal(t, "prefill_busy", g2.Decision.String())
			require.Contains(t, g2.Worker, tc.overflowTo)
			require.Equal(t, uint64(1), h.core.DisaggCounts()[DecisionPrefillBusy])
			require.Zero(t, h.core.DisaggCounts()[DecisionShort])
		})
	}
}
