package gossip

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func sampleDigest() *digestMsg {
	return &digestMsg{From: "r1", Timestamp: 99, Origins: map[string]originSummary{
		"r1":   {Newest: 1_700_000_000_000, Count: 3, Hash: 1 << 63},
		"r2":   {Floor: 10, Newest: 12, Count: 1, Hash: 7},
		"gone": {Floor: 40, Newest: 40},
	}}
}

func sampleFetch() *fetchMsg {
	return &fetchMsg{From: "r2", Origins: []fetchOrigin{
		{Origin: "r1", Bits: 0, Buckets: []bucketSummary{{Newest: 5, Hash: 9}}},
		{Origin: "r3", Bits: 2, Buckets: []bucketSummary{{Newest: 1, Hash: 2}, {}, {Newest: 1 << 62, Hash: 4}, {Newest: 3}}},
	}}
}

func sampleAnswer() *answerMsg {
	s := sampleState()
	delete(s.Origins, "r3")
	delete(s.Floors, "r3")
	delete(s.Floors, "gone")
	s.setFloor("r1", 3)
	return &answerMsg{From: "r3", State: s}
}

func TestRepairMessagesRoundTrip(t *testing.T) {
	m, err := decodeRepair(appendDigest(nil, sampleDigest()))
	require.NoError(t, err)
	require.Equal(t, kindDigest, m.kind)
	require.Equal(t, sampleDigest(), m.digest)

	m, err = decodeRepair(appendFetch(nil, sampleFetch()))
	require.NoError(t, err)
	require.Equal(t, kindFetch, m.kind)
	require.Equal(t, sampleFetch(), m.fetch)

	m, err = decodeRepair(appendAnswer(nil, sampleAnswer()))
	require.NoError(t, err)
	require.Equal(t, kindAnswer, m.kind)
	require.Equal(t, "r3", m.answer.From)
	require.True(t, m.answer.State.Equal(sampleAnswer().State))
}

func TestRepairDecoderRejectsOldVersionsAndCorruptInput(t *testing.T) {
	digest := appendDigest(nil, sampleDigest())
	fetch := appendFetch(nil, sampleFetch())
	withVersion := func(b []byte, v byte) []byte {
		c := append([]byte(nil), b...)
		c[2] = v
		return c
	}
	hugeBuckets := appendHeader(nil, kindFetch)
	hugeBuckets = appendString(hugeBuckets, "r2")
	hugeBuckets = append(hugeBuckets, 1, 1, 'o', maxBucketBits) // one origin "o", 256 buckets
	hugeBuckets = append(hugeBuckets, make([]byte, 8+9)...)     // but room for one
	bits9 := appendFetch(nil, &fetchMsg{From: "r", Origins: []fetchOrigin{{Origin: "o", Bits: 0, Buckets: []bucketSummary{{}}}}})
	bits9[4+2+1+2] = maxBucketBits + 1
	cases := map[string]struct {
		in   []byte
		want error
	}{
		"digest of version 3":  {withVersion(digest, broadcastVersion), ErrMalformed},
		"future version":       {withVersion(fetch, codecVersion+1), ErrVersion},
		"foreign":              {[]byte("SX\x04\x05"), ErrForeign},
		"truncated digest":     {digest[:len(digest)-1], ErrMalformed},
		"trailing byte":        {append(append([]byte(nil), fetch...), 0), ErrMalformed},
		"empty sender":         {appendDigest(nil, &digestMsg{}), ErrMalformed},
		"too many buckets":     {hugeBuckets, ErrMalformed},
		"bucket bits":          {bits9, ErrMalformed},
		"huge origin count":    {append(appendString(appendHeader(nil, kindDigest), "r"), 0, 0xff, 0xff, 0xff, 0x0f), ErrMalformed},
		"answer without state": {appendString(appendHeader(nil, kindAnswer), "r"), ErrMalformed},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := decodeRepair(c.in)
			require.ErrorIs(t, err, c.want)
		})
	}
}

func FuzzDecodeRepair(f *testing.F) {
	f.Add(appendDigest(nil, sampleDigest()))
	f.Add(appendFetch(nil, sampleFetch()))
	f.Add(appendAnswer(nil, sampleAnswer()))
	f.Add([]byte{'S', 'G', codecVersion, byte(kindFetch), 1, 'r', 1, 1, 'o', 8})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := decodeRepair(p)
		if err != nil {
			if !errors.Is(err, ErrMalformed) && !errors.Is(err, ErrVersion) && !errors.Is(err, ErrForeign) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		var again []byte
		switch m.kind {
		case kindDigest:
			again = appendDigest(nil, m.digest)
		case kindFetch:
			again = appendFetch(nil, m.fetch)
		case kindAnswer:
			again = appendAnswer(nil, m.answer)
		}
		m2, err := decodeRepair(again)
		require.NoError(t, err, "re-encoded %s does not decode", m.kind)
		switch m.kind {
		case kindDigest:
			require.Equal(t, m.digest, m2.digest)
		case kindFetch:
			require.Equal(t, m.fetch, m2.fetch)
		case kindAnswer:
			require.Equal(t, m.answer.From, m2.answer.From)
			require.True(t, m.answer.State.Equal(m2.answer.State))
		}
	})
}

func TestCorruptRepairMessagesAreCountedAndNeverReachTheOwner(t *testing.T) {
	g := newIdle(t, nil)
	fetch := appendFetch(nil, sampleFetch())
	g.delegate.NotifyMsg(fetch[:len(fetch)-2])                          // truncated fetch
	g.delegate.NotifyMsg(appendDigest(nil, sampleDigest()))             // digest outside push-pull
	g.delegate.MergeRemoteState(fetch, false)                           // fetch where a digest belongs
	g.delegate.MergeRemoteState(appendDigest(nil, &digestMsg{}), false) // no sender
	require.Equal(t, 2.0, counter(t, g.m.decodeErrors.WithLabelValues("message")))
	require.Equal(t, 2.0, counter(t, g.m.decodeErrors.WithLabelValues("state")))
	require.Empty(t, g.inbox)
}

// correctState draws a state as correct origins write it: an entry's value
// is a function of its version, so equal versions never disagree.
func correctState(r *rand.Rand, workers int) State {
	var s State
	for o := range 3 {
		origin := fmt.Sprintf("o%d", o)
		if r.IntN(5) == 0 {
			s.setFloor(origin, uint64(r.IntN(10)))
		}
		for w := range workers {
			if r.IntN(2) == 0 {
				continue
			}
			if s.Origins == nil {
				s.Origins = map[string]map[string]Entry{}
			}
			if s.Origins[origin] == nil {
				s.Origins[origin] = map[string]Entry{}
			}
			v := uint64(1 + r.IntN(40))
			s.Origins[origin][fmt.Sprintf("w%d", w)] = Entry{Version: v, Load: WorkerLoad{ActiveRequests: int(v) + w}}
		}
	}
	return s.clone()
}

// idleOwner is an owner without memberlist: handleDigest and friends queue
// their messages on its Gossip's outbox.
func idleOwner(t *testing.T, name string, s State) *owner {
	g := newIdle(t, func(c *Config) { c.NodeName = name })
	return &owner{g: g, self: name, state: s, version: 1000, departing: map[string]time.Time{}}
}

// deliver decodes every message o queued for its peer and hands it to the
// peer's owner, as memberlist and the inbox would.
func deliver(t *testing.T, from, to *owner) int {
	n := 0
	for {
		select {
		case m := <-from.g.outbox:
			require.Equal(t, to.self, m.to)
			rm, err := decodeRepair(m.msg)
			require.NoError(t, err)
			to.handle(inboxItem{kind: rm.kind, repair: &rm})
			n++
		default:
			return n
		}
	}
}

// pushPull runs one push-pull between a and b and the fetches it causes.
func pushPull(t *testing.T, a, b *owner) {
	da, err := decodeRepair(a.encodeDigest(1))
	require.NoError(t, err)
	db, err := decodeRepair(b.encodeDigest(1))
	require.NoError(t, err)
	b.handleDigest(da.digest)
	a.handleDigest(db.digest)
	for deliver(t, a, b)+deliver(t, b, a) > 0 {
	}
}

// Every exchange moves, for each bucket that differs, the entries of the
// side that is not behind to the other, so every exchange that finds a
// difference adds to one side's state, and the states meet after a few
// exchanges: two when both sides bucket alike, more when the bucket count
// (chosen from the entry counts) changes between exchanges.
func TestPushPullRepairConverges(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	rounds := map[int]int{}
	a, b := idleOwner(t, "a", State{}), idleOwner(t, "b", State{})
	for i := range 600 {
		workers := []int{4, 40, 300}[i%3]
		sa, sb := correctState(r, workers), correctState(r, workers)
		want := Merge(sa, sb)
		a.state, b.state = sa, sb
		n := 0
		for ; n < 6 && (!a.state.Equal(want) || !b.state.Equal(want)); n++ {
			pushPull(t, a, b)
		}
		require.Truef(t, a.state.Equal(want) && b.state.Equal(want), "case %d: not converged after %d exchanges", i, n)
		rounds[n]++
		pushPull(t, a, b)
		require.Zero(t, len(a.g.outbox)+len(b.g.outbox), "in sync: nothing more is fetched")
	}
	t.Logf("exchanges to converge: %v", rounds)
	require.Greater(t, rounds[1]+rounds[2], 570, "nearly always within two exchanges")
}

func TestInSyncPushPullFetchesNothingAndAHoleFetchesOneBucket(t *testing.T) {
	s := State{Origins: map[string]map[string]Entry{"o": {}}}
	for w := range 1000 {
		s.Origins["o"][fmt.Sprintf("worker-%04d", w)] = Entry{Version: uint64(100 + w), Load: WorkerLoad{ActiveRequests: w}}
	}
	a, b := idleOwner(t, "a", s.clone()), idleOwner(t, "b", s.clone())
	pushPull(t, a, b)
	require.Zero(t, counter(t, a.g.m.fetches.WithLabelValues(fetchRequested))+counter(t, b.g.m.fetches.WithLabelValues(fetchRequested)))

	// b lost one old change (a hole below its newest version).
	b.state.Origins["o"]["worker-0007"] = Entry{Version: 50, Load: WorkerLoad{ActiveRequests: 99}}
	pushPull(t, a, b)
	require.True(t, a.state.Equal(b.state))
	require.Equal(t, s.Origins["o"]["worker-0007"], b.state.Origins["o"]["worker-0007"])
	fetched := counter(t, b.g.m.fetchedEntries.WithLabelValues("new")) + counter(t, b.g.m.fetchedEntries.WithLabelValues("known"))
	require.Positive(t, fetched)
	require.Less(t, fetched, 1000/workersPerBucket*2.0, "one bucket's entries, not the origin's")
}

func TestDigestIsBoundedByOriginsNotWorkers(t *testing.T) {
	full := benchState(8, 10_000)
	d := (&owner{self: "x", state: full}).encodeDigest(1)
	require.Less(t, len(d), 8*64, "8 origins in under 64 bytes each")
	require.Greater(t, len(appendState(nil, 1, full)), 8*10_000*20)
}

// benchState is replicas × workers entries with realistic values.
func benchState(replicas, workers int) State {
	rng := rand.New(rand.NewPCG(uint64(replicas), uint64(workers)))
	full := State{Origins: map[string]map[string]Entry{}}
	version := uint64(time.Now().UnixNano())
	for i := range replicas {
		es := make(map[string]Entry, workers)
		for w := range workers {
			es[fmt.Sprintf("worker-%05d", w)] = Entry{Version: version - uint64(rng.IntN(int(time.Minute))),
				Load:   WorkerLoad{ActiveRequests: 1 + rng.IntN(8), PrefillTokens: rng.IntN(8192), DecodeBlocks: rng.IntN(400)},
				Digest: Digest{LastEventID: uint64(rng.IntN(1 << 20)), Blocks: rng.IntN(4096), Instance: rng.Uint64()}}
		}
		full.Origins[fmt.Sprintf("replica-%d", i)] = es
	}
	return full
}

func TestLateJoinerLearnsEveryOriginThroughRepairOnly(t *testing.T) {
	fast := func(c *Config) { c.PushPullInterval = 200 * time.Millisecond }
	rs := startCluster(t, 3, fast)
	for _, r := range rs {
		r.muteBroadcasts.Store(true) // every broadcast is lost
	}
	load := func(origin, w int) WorkerLoad { return WorkerLoad{ActiveRequests: 1 + origin, PrefillTokens: w} }
	for i, r := range rs {
		loads := map[string]WorkerLoad{}
		for w := range 200 {
			loads[fmt.Sprintf("worker-%03d", w)] = load(i, w)
		}
		r.SetLocalLoads(loads)
	}
	sumOf := func(w int, skip int) WorkerLoad {
		var sum WorkerLoad
		for i := range rs {
			if i != skip {
				sum = sum.add(load(i, w))
			}
		}
		return sum
	}

	late := testConfig("late")
	fast(&late)
	late.Join = []string{rs[1].Addr()}
	lr := startReplica(t, late)
	lr.muteBroadcasts.Store(true)
	testenv.Eventually(t, 30*time.Second, func() bool {
		for w := range 200 {
			if lr.RemoteLoad(fmt.Sprintf("worker-%03d", w)) != sumOf(w, -1) {
				return false
			}
		}
		return true
	}, "the late replica learns all three origins' 200 workers")
	for i, r := range rs {
		testenv.Eventually(t, 30*time.Second, func() bool { return r.RemoteLoad("worker-199") == sumOf(199, i) },
			"r%d learns the others' loads", i)
	}
	require.Positive(t, counter(t, lr.m.fetches.WithLabelValues(fetchReceived)))
	require.Positive(t, counter(t, lr.m.fetchedEntries.WithLabelValues("new")))
	require.Zero(t, counter(t, lr.m.relayed.WithLabelValues(kindLoads.String())), "no broadcast reached it")
}

func TestHolesBelowANewerBroadcastAreRepairedByPushPull(t *testing.T) {
	// Push-pull only on join and when the test asks (Join again).
	rs := startCluster(t, 2, func(c *Config) { c.PushPullInterval = time.Hour })
	r0, r1 := rs[0], rs[1]
	r0.muteBroadcasts.Store(true)
	loads := map[string]WorkerLoad{}
	for w := range 100 {
		loads[fmt.Sprintf("worker-%03d", w)] = WorkerLoad{ActiveRequests: 1, PrefillTokens: w}
	}
	r0.SetLocalLoads(loads)
	testenv.Eventually(t, 20*time.Second, func() bool { return r0.lostBroadcasts.Load() > 0 && r0.queue.NumQueued() == 0 },
		"r0's broadcasts of the 100 workers are lost")
	r0.muteBroadcasts.Store(false)
	loads = cloneLoads(loads)
	loads["worker-new"] = WorkerLoad{ActiveRequests: 7}
	r0.SetLocalLoads(loads)
	testenv.Eventually(t, 20*time.Second, func() bool { return r1.RemoteLoad("worker-new").ActiveRequests == 7 },
		"r1 gets the newest change by broadcast")
	missing := 0
	for w := range 100 {
		if r1.RemoteLoad(fmt.Sprintf("worker-%03d", w)) == (WorkerLoad{}) {
			missing++
		}
	}
	require.Greater(t, missing, 80, "r1 holds r0's newest version but lacks older changes")

	_, err := r1.ml.Load().Join([]string{r0.Addr()}) // a push-pull with r0
	require.NoError(t, err)
	testenv.Eventually(t, 20*time.Second, func() bool {
		for w, l := range loads {
			if r1.RemoteLoad(w) != l {
				return false
			}
		}
		return true
	}, "the push-pull's fetch fills the holes")
	require.NoError(t, testutil.GatherAndCompare(r1.reg, strings.NewReader(`
# HELP switchyard_gossip_fetches_total Repair fetches after a push-pull digest differed, by event (requested, answered, received, send_error, queue_full).
# TYPE switchyard_gossip_fetches_total counter
switchyard_gossip_fetches_total{event="answered"} 0
switchyard_gossip_fetches_total{event="queue_full"} 0
switchyard_gossip_fetches_total{event="received"} 1
switchyard_gossip_fetches_total{event="requested"} 1
switchyard_gossip_fetches_total{event="send_error"} 0
`), "switchyard_gossip_fetches_total"))
}

func cloneLoads(m map[string]WorkerLoad) map[string]WorkerLoad {
	out := make(map[string]WorkerLoad, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
