package scheduler

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// replicaSet is several Cores sharing a fake clock and a gossip that
// carries each one's bookings to the others only when published, on top of
// a standing background load that every view shows.
type replicaSet struct {
	t          *testing.T
	clock      *clock.Fake
	cores      []*Core
	views      []*RemoteLoads
	ws         []Worker
	background map[string]WorkerLoad
	seq        int
	shared     []Overlap // every new conversation's prefix reports (a shared system prompt)
	prefix     []uint64  // every new conversation's first block hashes (nil: its own from the first)
}

func newReplicaSet(t *testing.T, n int, ws []Worker, mutate func(*Config)) *replicaSet {
	t.Helper()
	rs := &replicaSet{t: t, clock: clock.NewFake(t0), ws: ws, background: map[string]WorkerLoad{}}
	for i := range n {
		cfg := DefaultConfig()
		if mutate != nil {
			mutate(&cfg)
		}
		v := &RemoteLoads{}
		c := NewCore(cfg, rs.clock, v, rand.New(rand.NewPCG(uint64(i)+1, 9)))
		c.SetWorkers(ws)
		c.SetClasses([]ClassConfig{classCfg("a", PolicyFCFS)})
		rs.cores = append(rs.cores, c)
		rs.views = append(rs.views, v)
	}
	return rs
}

// publish is one gossip round: every replica's view becomes the background
// plus the others' current bookings, and every replica drains, as a live
// replica does after each round.
func (rs *replicaSet) publish() {
	for r, v := range rs.views {
		loads := map[string]WorkerLoad{}
		for _, w := range rs.ws {
			l := rs.background[w.ID]
			for o, c := range rs.cores {
				if o != r {
					l = l.Add(c.Load(w.ID))
				}
			}
			loads[w.ID] = l
		}
		v.Store(loads)
	}
	for _, c := range rs.cores {
		c.Drain()
	}
}

// newConversation is a request whose prompt no worker holds.
func (rs *replicaSet) newConversation(isl int) *Request {
	rs.seq++
	return &Request{
		ID: fmt.Sprintf("r%d", rs.seq), Class: "a", Ingress: rs.clock.Now(), PromptTokens: isl,
		BlockHashes: append(append([]uint64(nil), rs.prefix...), seqHashes(uint64(rs.seq)*7919, isl/16-len(rs.prefix))...), ExpectedOutputTokens: 200,
		Overlaps: append([]Overlap(nil), rs.shared...),
	}
}

// admit enqueues r at replica i and returns its grant.
func (rs *replicaSet) admit(i int, r *Request) Grant {
	rs.t.Helper()
	var got Grant
	rs.cores[i].Enqueue(r, func(g Grant, err error) bool {
		require.NoError(rs.t, err)
		got = g
		return true
	})
	require.NotEmpty(rs.t, got.Worker, "request %s was not admitted at once", r.ID)
	return got
}

// burst has every replica admit one new conversation at the same instant,
// gossips the bookings 5 ms later, completes them 5 ms after that, lets
// 500 ms pass and returns how many of the burst each worker received.
func (rs *replicaSet) burst() map[string]int {
	grants := make([]Grant, len(rs.cores))
	for i := range rs.cores {
		grants[i] = rs.admit(i, rs.newConversation(4000))
	}
	rs.clock.Advance(5 * time.Millisecond)
	rs.publish()
	rs.clock.Advance(5 * time.Millisecond)
	per := map[string]int{}
	for i, g := range grants {
		per[g.Worker]++
		rs.cores[i].FirstToken(g.Booking)
		rs.cores[i].Finish(g.Booking)
	}
	rs.publish()
	rs.clock.Advance(500 * time.Millisecond)
	return per
}

func maxPile(per map[string]int) int {
	m := 0
	for _, n := range per {
		m = max(m, n)
	}
	return m
}

// A standing load that makes worker w0 the cheapest, w7 the dearest.
func (rs *replicaSet) staircase() {
	for i, w := range rs.ws {
		rs.background[w.ID] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 300 * i, DecodeBlocks: 100}
	}
	rs.publish()
}

// requireBurstsSpread sends three bursts that teach each replica what it
// cannot see, then twenty more, none of which may go whole to one worker
// and which must mostly spread over three or four.
func (rs *replicaSet) requireBurstsSpread(t *testing.T) {
	t.Helper()
	for range 3 {
		rs.burst()
	}
	piles := 0
	for range 20 {
		per := rs.burst()
		require.Less(t, maxPile(per), 4, "the whole burst went to one worker: %v", per)
		piles += maxPile(per)
	}
	require.LessOrEqual(t, piles, 20*2, "bursts of 4 should mostly spread over 3 or 4 workers")
}

func TestReplicasDecidingABurstOnTheSameStaleViewDoNotAllPickOneWorker(t *testing.T) {
	rs := newReplicaSet(t, 4, workers(8, 0), nil)
	rs.staircase()
	rs.requireBurstsSpread(t)
	for _, c := range rs.cores {
		require.InDelta(t, 3, c.herd.est, 0.01, "each decision is blind to the other three replicas' bookings")
	}
}

func TestWithoutTheHerdBandTheSameBurstAllGoesToTheCheapestWorker(t *testing.T) {
	// The control of the test above: the cost alone herds.
	rs := newReplicaSet(t, 4, workers(8, 0), func(c *Config) { c.TTFT.Herd = 0 })
	rs.staircase()
	for range 23 {
		require.Equal(t, map[string]int{"w0": 4}, rs.burst())
	}
}

func TestReplicasDecidingFurtherApartThanTheWindowKeepTheCheapestWorker(t *testing.T) {
	rs := newReplicaSet(t, 4, workers(8, 0), nil)
	rs.staircase()
	for range 10 {
		var grants []Grant
		for i := range rs.cores {
			// Each decides 200 ms after the previous one (window 100 ms)
			// and its booking is gossiped 5 ms later.
			g := rs.admit(i, rs.newConversation(4000))
			grants = append(grants, g)
			rs.clock.Advance(5 * time.Millisecond)
			rs.publish()
			rs.clock.Advance(195 * time.Millisecond)
		}
		for i, g := range grants {
			rs.cores[i].FirstToken(g.Booking)
			rs.cores[i].Finish(g.Booking)
		}
		rs.publish()
		rs.clock.Advance(200 * time.Millisecond)
	}
	for _, c := range rs.cores {
		require.Zero(t, c.herd.est, "no decision was blind to another")
		c.herdBegin(rs.newConversation(4000))
		require.Zero(t, c.herd.band)
	}
}

func TestALoneReplicaDecidesTheSameWithAndWithoutTheHerdBand(t *testing.T) {
	picks := func(herd float64) []string {
		rs := newReplicaSet(t, 1, workers(8, 0), func(c *Config) { c.TTFT.Herd = herd })
		rs.staircase()
		rng := rand.New(rand.NewPCG(4, 4))
		var out []string
		var live []Grant
		for range 300 {
			rs.clock.Advance(time.Duration(rng.IntN(20)) * time.Millisecond)
			switch x := rng.IntN(3); {
			case x < 2 || len(live) == 0:
				r := rs.newConversation(500 + rng.IntN(8000))
				g := rs.admit(0, r)
				out = append(out, g.Worker)
				live = append(live, g)
			default:
				j := rng.IntN(len(live))
				rs.cores[0].FirstToken(live[j].Booking)
				rs.cores[0].Finish(live[j].Booking)
				live = append(live[:j], live[j+1:]...)
			}
			if rng.IntN(4) == 0 {
				rs.publish() // gossip rounds go on, with nothing from other replicas
			}
		}
		return out
	}
	with, without := picks(2), picks(0)
	require.Equal(t, without, with)
}

func TestABurstSharingAPrefixWithPartOfALargeFleetSpreadsOverItsHolders(t *testing.T) {
	// 32 workers, the 8 cheapest holding a 4-block system prompt: more
	// holders than a burst of 4 blind decisions can fill, so the prompt
	// tells them apart no more than none. Before, its holders kept exact
	// costs while every other worker drew, and every replica sent its new
	// conversation to the cheapest holder.
	rs := newReplicaSet(t, 4, workers(32, 0), nil)
	rs.staircase()
	for i := range 8 {
		rs.shared = append(rs.shared, Overlap{Worker: fmt.Sprintf("w%d", i), Blocks: 4})
	}
	rs.requireBurstsSpread(t)
}

func TestAPrefixOnFewerWorkersThanTheBurstKeepsItsHoldersExact(t *testing.T) {
	// One worker, the dearest, holds most of the prompt: it is placed by
	// its cache on every replica, band or not.
	rs := newReplicaSet(t, 4, workers(8, 0), nil)
	rs.staircase()
	for range 3 {
		rs.burst()
	}
	rs.shared = []Overlap{{Worker: "w7", Blocks: 240}}
	for range 5 {
		require.Equal(t, map[string]int{"w7": 4}, rs.burst())
	}
}

func TestHerdCommonIsTheDepthTheBurstsFanoutOfWorkersHold(t *testing.T) {
	for _, tc := range []struct {
		name   string
		depths []int32
		n      int
		est    float64
		want   int
	}{
		{"no reports", nil, 8, 3, 0},
		{"every worker holds the system prompt", []int32{2, 2, 5, 2, 2, 2, 2, 2}, 8, 20, 2},
		{"a few holders, a large fleet", []int32{2, 2, 2}, 256, 3, 0},
		{"as many holders as the fanout", []int32{2, 2, 2, 2}, 256, 3, 2},
		{"a fractional estimate rounds up", []int32{2, 2, 2, 2}, 256, 3.2, 0},
		{"the fanout-th deepest", []int32{9, 1, 3, 1, 7, 1}, 256, 2, 3},
		{"alone", []int32{4}, 256, 0, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := herdCommon(tc.depths, tc.n, tc.est, nil)
			require.Equal(t, tc.want, got)
		})
	}
}

// sampledKeeps stands for a sampled index (kvindex.Sampled): it keeps
// about one block hash in eight, chosen by the hash alone.
func sampledKeeps(h uint64) bool { return mix64(h^0x5a17)%8 == 0 }

// lastKeptDepth is the depth a sampled index reports for a worker holding
// all of hashes: one past the last position it keeps, 0 when none.
func lastKeptDepth(hashes []uint64, keeps func(uint64) bool) int {
	d := 0
	for i, h := range hashes {
		if keeps(h) {
			d = i + 1
		}
	}
	return d
}

// sampledSystemPrompt makes every new conversation of rs start with the
// same 32 blocks, held by every worker and reported, as a sampled index
// reports them, short of their end; it returns the reported depth.
func (rs *replicaSet) sampledSystemPrompt() int {
	rs.t.Helper()
	rs.prefix = seqHashes(1, 32)
	d := lastKeptDepth(rs.prefix, sampledKeeps)
	require.True(rs.t, d > 0 && d < 32, "the index must keep a block of the prompt, and report it short of its end: depth %d", d)
	rs.shared = rs.shared[:0]
	for _, w := range rs.ws {
		rs.shared = append(rs.shared, Overlap{Worker: w.ID, Blocks: d})
	}
	return d
}

func TestABurstOverASharedPrefixASampledIndexReportsShortSpreadsOverTheFleet(t *testing.T) {
	// Four owners decide a burst of new conversations on the same stale
	// view. Every conversation starts with the same 32 blocks, on every
	// worker, which a sampled index reports some blocks short of their
	// end. Keyed by the block after the report (inside the shared prompt),
	// every conversation drew the same worker on every owner: each burst
	// went whole to one worker (map[wN:4]). Keyed by the first block the
	// index keeps past the report, each conversation draws by its own.
	rs := newReplicaSet(t, 4, workers(32, 0), func(c *Config) { c.IndexKeeps = sampledKeeps })
	rs.staircase()
	rs.sampledSystemPrompt()
	rs.requireBurstsSpread(t)
}

func TestABurstSharingANewPrefixPastTheSampledReportStaysTogether(t *testing.T) {
	// The same owners and shared prompt, and then a document no worker
	// holds, the same in every request of the burst (questions on one new
	// document): its first kept block keys every request alike, so every
	// owner sends its request to the same worker, and the document is
	// computed once.
	rs := newReplicaSet(t, 4, workers(32, 0), func(c *Config) { c.IndexKeeps = sampledKeeps })
	rs.staircase()
	rs.sampledSystemPrompt()
	for range 3 {
		rs.burst()
	}
	doc := seqHashes(2, 64)
	require.Positive(t, lastKeptDepth(doc, sampledKeeps), "the index must keep a block of the document")
	rs.prefix = append(rs.prefix, doc...)
	for range 5 {
		per := rs.burst()
		require.Len(t, per, 1, "the burst on one new document was split: %v", per)
	}
}

func TestTheRendezvousKeyIsTheFirstBlockTheIndexKeepsPastTheDeepestReport(t *testing.T) {
	hs := []uint64{10, 11, 12, 13, 14, 15}
	even := func(h uint64) bool { return h%2 == 0 }
	none := func(uint64) bool { return false }
	for _, tc := range []struct {
		name    string
		deepest int
		keeps   func(uint64) bool
		want    int
	}{
		{"every block kept: the block after the report", 3, nil, 3},
		{"nothing reported, every block kept", 0, nil, 0},
		{"the report ends before a kept block", 2, even, 2},
		{"the report ends before an unkept block", 3, even, 4},
		{"no kept block past the report: the last block", 5, even, 5},
		{"nothing kept: the last block", 0, none, 5},
		{"a report past the prompt: the last block", 9, nil, 5},
		{"a report past the prompt, sampled", 9, even, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, herdKeyBlock(hs, tc.deepest, tc.keeps))
		})
	}
}

func TestABurstInALargeFleetDoesNotPileOnTheFewHoldersOfAShallowPrefix(t *testing.T) {
	// 64 workers, four owners: the two cheapest hold one block of every
	// new conversation's prompt (a population's first block, on fewer
	// workers than the burst). Exempt from the draw, they kept exact costs
	// while everyone else was raised by theirs, and every owner sent its
	// conversation to the cheapest of them (map[w0:4]). One block saves
	// less prefill than the least draw: they draw like the rest.
	rs := newReplicaSet(t, 4, workers(64, 0), nil)
	rs.staircase()
	rs.shared = []Overlap{{Worker: "w0", Blocks: 1}, {Worker: "w1", Blocks: 1}}
	rs.requireBurstsSpread(t)
}
