package scheduler

import (
	"cmp"
	"fmt"
	"math"
	"math/bits"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
)

// diffPair is two Cores fed the same operations: a uses the selection
// index, b always the full scan (the selector as it was before the index).
type diffPair struct {
	t     *testing.T
	rng   *rand.Rand
	clock *clock.Fake
	view  *RemoteLoads
	a, b  *Core
	ws    []Worker
	// logs of every responder call, per Core, compared after each step
	logA, logB []string
	compared   int
	// live bookings: request ID → booking id in a and in b
	live  map[string][2]BookingID
	seq   int
	fams  [][]uint64
	calls map[string]int // what the comparison exercised
}

func newDiffPair(t *testing.T, seed uint64) *diffPair {
	rng := rand.New(rand.NewPCG(seed, 7))
	p := &diffPair{
		t: t, rng: rng, clock: clock.NewFake(t0), view: &RemoteLoads{},
		live: map[string][2]BookingID{}, calls: map[string]int{},
	}
	cfg := DefaultConfig()
	cfg.Selector = []Selector{SelectorBlocks, SelectorTTFT}[rng.IntN(2)]
	cfg.OverlapCredit = []float64{1, 1, 0.5, 2}[rng.IntN(4)]
	cfg.PrefillScale = []float64{1, 1, 0.5, 3}[rng.IntN(4)]
	cfg.TTFT.PrefillScale = []float64{1, 1, 0.5, 2}[rng.IntN(4)]
	cfg.TTFT.Externality = []float64{1, 1, 0, 2}[rng.IntN(4)]
	cfg.TTFT.Interference = []float64{0.02, 0, 0.1}[rng.IntN(3)]
	cfg.TTFT.CalibrationWindow = []int{32, 32, 4, 0}[rng.IntN(4)]
	cfg.TTFT.StepTokens = []int{8192, 8192, 512, 64}[rng.IntN(4)]
	cfg.TTFT.Herd = []float64{2, 2, 0, 20}[rng.IntN(4)]
	cfg.TTFT.HerdWindow = []float64{100, 1000, 1e7}[rng.IntN(3)]
	if rng.IntN(6) == 0 {
		cfg.TTFT.Decode = [3]float64{3, -5, 4} // step time falls with KV use: no pruning
	}
	if rng.IntN(10) == 0 {
		cfg.TTFT.Prefill = [3]float64{0.001, 0.01, 0} // strongly convex, no fixed part
	}
	var view LoadView = p.view
	if rng.IntN(5) == 0 {
		view = plainLoads{p.view}
	}
	p.a = NewCore(cfg, p.clock, view, rand.New(rand.NewPCG(seed, 1)))
	p.b = NewCore(cfg, p.clock, view, rand.New(rand.NewPCG(seed, 1)))
	p.b.scanOnly = true
	for i := range 4 {
		p.fams = append(p.fams, seqHashes(uint64(i+1), 200))
	}
	p.setWorkers()
	busy := classCfg("busy", PolicyWSPT)
	busy.BusyPrefillTokens = []int{0, 3000, 6000}[rng.IntN(3)]
	busy.BusyDecodeFraction = []float64{0, 0.5, 0.9}[rng.IntN(3)]
	classes := []ClassConfig{busy, classCfg("plain", PolicyFCFS)}
	p.a.SetClasses(classes)
	p.b.SetClasses(classes)
	return p
}

func (p *diffPair) setWorkers() {
	rng := p.rng
	n := []int{1, 2, 3, 5, 8, 12, 40, 70, 130}[rng.IntN(9)]
	uniform := rng.IntN(2) == 0
	p.ws = p.ws[:0]
	for i := range n {
		w := Worker{ID: fmt.Sprintf("w%03d", i), URL: "http://w", BlockSize: 16, KVBlocks: 2000}
		if !uniform {
			w.BlockSize = []int{16, 16, 32}[rng.IntN(3)]
			w.KVBlocks = []int{2000, 2000, 0, 300}[rng.IntN(4)]
		}
		w.MaxRunning = []int{0, 0, 0, 1, 3}[rng.IntN(5)]
		p.ws = append(p.ws, w)
	}
	if rng.IntN(4) == 0 { // workers leaving the fleet keep their bookings
		p.ws = p.ws[:max(1, len(p.ws)-2)]
	}
	p.a.SetWorkers(p.ws)
	p.b.SetWorkers(p.ws)
}

func (p *diffPair) request() *Request {
	rng := p.rng
	p.seq++
	r := &Request{
		ID: fmt.Sprintf("r%d", p.seq), Class: []string{"busy", "plain"}[rng.IntN(2)], Ingress: p.clock.Now(),
		PromptTokens:         []int{0, 1, 15, 100, 700, 2048, 5000}[rng.IntN(7)],
		ExpectedOutputTokens: []int{0, 16, 256, 4000}[rng.IntN(4)],
	}
	if rng.IntN(8) != 0 {
		fam := p.fams[rng.IntN(len(p.fams))]
		r.BlockHashes = fam[:min(len(fam), r.PromptTokens/16)]
	}
	for range rng.IntN(4) {
		w := fmt.Sprintf("w%03d", rng.IntN(len(p.ws)+2)) // sometimes unregistered
		r.Overlaps = append(r.Overlaps, Overlap{Worker: w, Blocks: rng.IntN(len(r.BlockHashes) + 3)})
	}
	if rng.IntN(4) == 0 && len(r.BlockHashes) > 0 {
		// A system prompt on a random half of the fleet: often more holders
		// than the herd's fanout, whose depth then draws like none.
		depth := 1 + rng.IntN(min(3, len(r.BlockHashes)))
		for _, w := range p.ws {
			if rng.IntN(2) == 0 {
				r.Overlaps = append(r.Overlaps, Overlap{Worker: w.ID, Blocks: depth})
			}
		}
	}
	if rng.IntN(4) == 0 { // a session, sometimes on an unregistered worker
		r.Session = SessionAffinity{
			Worker:      fmt.Sprintf("w%03d", rng.IntN(len(p.ws)+1)),
			Hard:        rng.IntN(5) == 0,
			MarginRatio: []float64{0, 0.1, 0.5}[rng.IntN(3)],
			MarginCost:  []float64{0, 5, 200}[rng.IntN(3)],
		}
	}
	switch rng.IntN(12) {
	case 0:
		r.Pinned = p.ws[rng.IntN(len(p.ws))].ID
	case 1:
		for range 1 + rng.IntN(3) {
			r.Allowed = append(r.Allowed, p.ws[rng.IntN(len(p.ws))].ID)
		}
	}
	return r
}

func (p *diffPair) responder(log *[]string, side int, r *Request) Responder {
	return func(g Grant, err error) bool {
		if err != nil {
			*log = append(*log, fmt.Sprintf("%s rejected %v", r.ID, ReasonOf(err)))
			return true
		}
		*log = append(*log, fmt.Sprintf("%s granted %s", r.ID, g.Worker))
		ids := p.live[r.ID]
		ids[side] = g.Booking
		p.live[r.ID] = ids
		return true
	}
}

func (p *diffPair) randomLive() (string, [2]BookingID, bool) {
	if len(p.live) == 0 {
		return "", [2]BookingID{}, false
	}
	keys := make([]string, 0, len(p.live))
	for k := range p.live {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	k := keys[p.rng.IntN(len(keys))]
	return k, p.live[k], true
}

func (p *diffPair) storeRemote() {
	loads := map[string]WorkerLoad{}
	for _, w := range p.ws {
		switch p.rng.IntN(5) {
		case 0:
			loads[w.ID] = WorkerLoad{ActiveRequests: 1 + p.rng.IntN(3), PrefillTokens: p.rng.IntN(4000), DecodeBlocks: p.rng.IntN(2500)}
		case 1:
			loads[w.ID] = WorkerLoad{DecodeBlocks: p.rng.IntN(50)} // blocks without requests: odd, but it arrives
		}
	}
	p.view.Store(loads)
	if p.rng.IntN(2) == 0 {
		return
	}
	// Engine reports: some fresh, some about to go stale, some stale.
	engine := map[string]EngineLoad{}
	for _, w := range p.ws {
		if p.rng.IntN(3) == 0 {
			age := []time.Duration{0, time.Second, DefaultEngineMaxAge - time.Millisecond, 3 * DefaultEngineMaxAge}[p.rng.IntN(4)]
			engine[w.ID] = EngineLoad{
				Running: p.rng.IntN(5), Waiting: []int{0, 0, 1, 6}[p.rng.IntN(4)],
				KVUsage: []float64{0, 0.1, 0.7, 1.2}[p.rng.IntN(4)], At: p.clock.Now().Add(-age),
			}
		}
	}
	p.view.StoreEngine(engine)
}

// step applies one random operation to both Cores and compares them.
func (p *diffPair) step() {
	rng := p.rng
	switch x := rng.IntN(100); {
	case x < 40: // a bare selection
		r := p.request()
		cls := p.a.classes[r.Class]
		ia, oka := p.a.selectWorker(r, &cls.cfg)
		ib, okb := p.b.selectWorker(r, &p.b.classes[r.Class].cfg)
		require.Equal(p.t, [2]any{ib, okb}, [2]any{ia, oka}, "selection of %+v", r)
		p.calls["select"]++
		if oka && p.a.indexable(r) {
			p.calls["indexed"]++
			if r.Session.Worker != "" {
				p.calls["indexed with a session"]++
			}
			if p.a.herd.band > 0 {
				p.calls["indexed with a herd band"]++
				if p.a.herd.common > 0 {
					p.calls["indexed with a herd band over a common prefix"]++
				}
			}
		}
	case x < 65:
		r := p.request()
		p.a.Enqueue(r, p.responder(&p.logA, 0, r))
		p.b.Enqueue(r, p.responder(&p.logB, 1, r))
		p.calls["enqueue"]++
	case x < 75:
		if k, ids, ok := p.randomLive(); ok {
			p.clock.Advance(time.Duration(rng.IntN(400)) * time.Millisecond)
			p.a.FirstToken(ids[0])
			p.b.FirstToken(ids[1])
			if rng.IntN(3) == 0 {
				delete(p.live, k)
			}
		}
	case x < 90:
		if k, ids, ok := p.randomLive(); ok {
			p.a.Finish(ids[0])
			p.b.Finish(ids[1])
			delete(p.live, k)
		}
	case x < 96:
		p.storeRemote()
	case x < 98:
		p.setWorkers()
	default:
		p.clock.Advance(time.Duration(rng.IntN(3000)) * time.Millisecond)
		p.a.Tick()
		p.b.Tick()
	}
	if len(p.logA) != len(p.logB) || !slices.Equal(p.logA[p.compared:], p.logB[p.compared:]) {
		require.Equal(p.t, p.logB[p.compared:], p.logA[p.compared:], "responder calls")
	}
	p.compared = len(p.logA)
	p.a.refreshRemote()
	p.b.refreshRemote()
	checkIndex(p.t, p.a)
}

// checkIndex asserts the index files every registered worker where its
// current load and scale put it. (Plain comparisons: it runs after every
// step of the differential test.)
func checkIndex(t *testing.T, c *Core) {
	t.Helper()
	ix := &c.ix
	if !ix.built || ix.sel != c.cfg.Selector {
		return
	}
	members, sum := 0, 0.0
	for i := range c.workers {
		s := &c.workers[i]
		st := &ix.slots[i]
		if st.slow != s.ledger.ttftSlow {
			t.Fatalf("worker %d filed with scale %v, ledger has %v", i, st.slow, s.ledger.ttftSlow)
		}
		idle := s.ledger.active == 0 && s.ledger.load() == (WorkerLoad{}) && s.remote == (WorkerLoad{}) && !s.engine.on
		if idle == st.loaded {
			t.Fatalf("worker %d: idle %v but filed loaded %v", i, idle, st.loaded)
		}
		if idle {
			b := st.bucket
			if b == nil || b.bits[i>>6]&(1<<(uint(i)&63)) == 0 {
				t.Fatalf("worker %d not in its bucket", i)
			}
			if b.fam.blockSize != s.blockSize || b.fam.kvBlocks != s.kvBlocks || b.slow != max(st.slow, 0) { // idle workers are filed as ttftCost prices them
				t.Fatalf("worker %d in the wrong bucket", i)
			}
			continue
		}
		key, q := c.loadedKey(s)
		if math.IsNaN(key) {
			key = math.Inf(-1)
		}
		if key != st.key {
			t.Fatalf("worker %d key %v, want %v", i, st.key, key)
		}
		if _, found := slices.BinarySearchFunc(ix.loaded, loadedEntry{key, int32(i)}, cmpLoaded); !found {
			t.Fatalf("worker %d not in the loaded order", i)
		}
		sum += q
		members++
	}
	if len(ix.loaded) != members || !slices.IsSortedFunc(ix.loaded, cmpLoaded) {
		t.Fatalf("loaded order: %d entries for %d loaded workers, sorted %v", len(ix.loaded), members, slices.IsSortedFunc(ix.loaded, cmpLoaded))
	}
	for _, f := range ix.families {
		if !slices.IsSortedFunc(f.buckets, func(a, b *idleBucket) int { return cmp.Compare(a.slow, b.slow) }) {
			t.Fatalf("family buckets out of scale order")
		}
		for _, b := range f.buckets {
			n := 0
			for _, w := range b.bits {
				n += bits.OnesCount64(w)
			}
			if n != b.n || n == 0 {
				t.Fatalf("bucket counts %d, holds %d", b.n, n)
			}
			members += n
		}
	}
	if members != len(c.workers) {
		t.Fatalf("%d workers filed, %d registered", members, len(c.workers))
	}
	if math.Abs(sum-ix.queueSum) > 1e-6*(1+math.Abs(sum)) {
		t.Fatalf("fleet booked prefill %v, want %v", ix.queueSum, sum)
	}
	if !ix.minDirty {
		for i := range ix.slots {
			if ix.slots[i].slow < ix.minSlow {
				t.Fatalf("least scale %v above worker %d's %v", ix.minSlow, i, ix.slots[i].slow)
			}
		}
	}
}

func TestTheIndexedSelectionChoosesWhatTheFullScanChooses(t *testing.T) {
	trials, steps := 200, 300
	if testing.Short() {
		trials = 60
	}
	total := map[string]int{}
	for seed := range uint64(trials) {
		p := newDiffPair(t, seed)
		for range steps {
			p.step()
		}
		for k, v := range p.calls {
			total[k] += v
		}
	}
	t.Logf("compared: %v", total)
	require.Greater(t, total["indexed"], trials*steps/10, "the index served too few of the selections")
	require.Greater(t, total["indexed with a herd band"], trials*steps/100, "too few selections drew in a herd band")
	require.Greater(t, total["indexed with a herd band over a common prefix"], trials*steps/400, "too few selections drew over a widely held prefix")
	require.Greater(t, total["indexed with a session"], trials*steps/100, "too few indexed selections carried a session")
}

func TestAnIdleFleetTieDrawsAmongAllIdleWorkersAsTheScanDoes(t *testing.T) {
	ws := workers(200, 0)
	mk := func(scan bool) *Core {
		c := NewCore(DefaultConfig(), clock.NewFake(t0), nil, rand.New(rand.NewPCG(3, 3)))
		c.scanOnly = scan
		c.SetWorkers(ws)
		c.SetClasses([]ClassConfig{classCfg("a", PolicyFCFS)})
		return c
	}
	a, b := mk(false), mk(true)
	seen := map[int]bool{}
	for i := range 2000 {
		r := req(fmt.Sprintf("r%d", i), "a", 100)
		ia, _ := a.selectWorker(r, &a.classes["a"].cfg)
		ib, _ := b.selectWorker(r, &b.classes["a"].cfg)
		require.Equal(t, ib, ia)
		seen[ia] = true
	}
	require.Greater(t, len(seen), 190, "ties must spread over the whole idle fleet")
}

func TestALoadedWorkerOutsideTheIndexBoundIsNeverChosen(t *testing.T) {
	// The lower bound must never exceed the exact cost: for random loaded
	// workers and requests without a prefix there, key + term ≤ cost.
	rng := rand.New(rand.NewPCG(5, 5))
	for _, sel := range []Selector{SelectorBlocks, SelectorTTFT} {
		cfg := DefaultConfig()
		cfg.Selector = sel
		c := NewCore(cfg, clock.NewFake(t0), nil, rand.New(rand.NewPCG(1, 1)))
		c.SetWorkers([]Worker{{ID: "w", URL: "u", BlockSize: 16, KVBlocks: 1000}})
		c.SetClasses([]ClassConfig{classCfg("a", PolicyFCFS)})
		c.ensureIndex()
		cls := &c.classes["a"].cfg
		s := &c.workers[0]
		for range 20000 {
			s.remote = WorkerLoad{ActiveRequests: rng.IntN(300), PrefillTokens: rng.IntN(200000), DecodeBlocks: rng.IntN(3000)}
			s.ledger.ttftSlow = rng.Float64()*3 - 0.9
			c.reindex(0)
			c.ensureIndex()
			c.ttft.load = rng.Float64() * 5
			r := &Request{ID: "x", Class: "a", PromptTokens: rng.IntN(100000), ExpectedOutputTokens: rng.IntN(5000)}
			r.BlockHashes = seqHashes(1, min(r.PromptTokens/16, 50))
			cost, ok := c.costOf(r, cls, s, 0, r.privateBlocks(16))
			require.True(t, ok)
			key, term := c.ix.slots[0].key, c.lowerBoundTerm(r)
			require.False(t, boundExceeds(key, term, cost), "%v: bound %v+%v above cost %v for %+v", sel, key, term, cost, s.remote)
		}
	}
}

func TestTheIndexIsRebuiltWhenTheSelectorChanges(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Selector = SelectorBlocks
	c := NewCore(cfg, clock.NewFake(t0), nil, rand.New(rand.NewPCG(1, 1)))
	c.SetWorkers(workers(20, 0))
	c.SetClasses([]ClassConfig{classCfg("a", PolicyFCFS)})
	c.Enqueue(req("r1", "a", 500), func(Grant, error) bool { return true })
	require.True(t, c.ix.built)
	require.Equal(t, SelectorBlocks, c.ix.sel)
	c.cfg.Selector = SelectorTTFT
	c.Enqueue(req("r2", "a", 500), func(g Grant, err error) bool { require.NoError(t, err); return true })
	require.Equal(t, SelectorTTFT, c.ix.sel)
	checkIndex(t, c)
}
