package gossip

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestFiveReplicasConvergeAfterALoadChange(t *testing.T) {
	rs := startCluster(t, 5, nil)
	want := WorkerLoad{ActiveRequests: 3, PrefillTokens: 900, DecodeBlocks: 40}
	start := time.Now()
	rs[0].SetLocalLoads(map[string]WorkerLoad{"w1": want, "w2": {ActiveRequests: 1}})
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, r := range rs[1:] {
			if r.RemoteLoad("w1") != want {
				return false
			}
		}
		return true
	}, "every other replica sees r0's load on w1")
	t.Logf("first change converged on 5 replicas in %v (goal 500ms)", time.Since(start))

	// A second origin's load on the same worker adds up; a replica never
	// counts its own contribution as remote.
	other := WorkerLoad{ActiveRequests: 2, PrefillTokens: 100, DecodeBlocks: 5}
	start = time.Now()
	rs[3].SetLocalLoads(map[string]WorkerLoad{"w1": other})
	rs[0].SetLocalLoads(map[string]WorkerLoad{"w1": want}) // w2 goes idle
	sum := want.add(other)
	testenv.Eventually(t, 20*time.Second, func() bool {
		return rs[1].RemoteLoad("w1") == sum && rs[2].RemoteLoad("w1") == sum && rs[4].RemoteLoad("w1") == sum &&
			rs[0].RemoteLoad("w1") == other && rs[3].RemoteLoad("w1") == want &&
			rs[1].RemoteLoad("w2") == WorkerLoad{}
	}, "loads from r0 and r3 sum on the others; each sees only the other's on itself; w2 went idle")
	t.Logf("second change converged on 5 replicas in %v (goal 500ms)", time.Since(start))
}

func TestKilledReplicasLoadDisappearsAfterTheGracePeriod(t *testing.T) {
	clock := newManualClock()
	fast := func(c *Config) {
		c.ProbeInterval = 200 * time.Millisecond
		c.ProbeTimeout = 100 * time.Millisecond
		c.SuspicionMult = 2
		c.GracePeriod = time.Minute
	}
	a := testConfig("a")
	fast(&a)
	ra := startReplica(t, a, WithClock(clock))
	b := testConfig("b")
	fast(&b)
	b.Join = []string{ra.Addr()}
	b.SkipLeave = true
	rb := startReplica(t, b, WithClock(clock))

	load := WorkerLoad{ActiveRequests: 4, PrefillTokens: 10, DecodeBlocks: 2}
	rb.SetLocalLoads(map[string]WorkerLoad{"w1": load})
	testenv.Eventually(t, 20*time.Second, func() bool { return ra.RemoteLoad("w1") == load }, "a sees b's load")

	rb.stop() // shuts memberlist down without leaving: a crash
	testenv.Eventually(t, 30*time.Second, func() bool {
		return len(ra.Members()) == 1 && counter(t, ra.m.departing) == 1
	}, "a's failure detector declares b dead and a schedules the removal")
	require.Equal(t, load, ra.RemoteLoad("w1"), "within the grace period b's load still counts")

	clock.Advance(time.Minute)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return ra.RemoteLoad("w1") == WorkerLoad{} && counter(t, ra.m.departing) == 0
	}, "after the grace period b's load is gone")
}

func TestForeignNodeCannotJoinOrInjectState(t *testing.T) {
	cases := map[string]struct {
		mutate func(*Config)
		reason string // what a logs when it rejects the foreign node
	}{
		"wrong label": {func(c *Config) { c.ClusterLabel = "another-cluster" }, "unacceptable label"},
		"wrong key":   {func(c *Config) { c.SecretKey = []byte("fedcba9876543210") }, "no installed keys could decrypt"},
		"no key":      {func(c *Config) { c.SecretKey = nil }, "remote state is not encrypted"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			a := startReplica(t, testConfig("a"))
			fc := testConfig("foreign")
			tc.mutate(&fc)
			fc.Join = []string{a.Addr()}
			foreign := startReplica(t, fc)
			foreign.SetLocalLoads(map[string]WorkerLoad{"w1": {ActiveRequests: 100}})

			testenv.Eventually(t, 20*time.Second, func() bool {
				return counter(t, foreign.m.joinFailures) >= 2 && a.logs.FilterMessageSnippet(tc.reason).Len() >= 1
			}, "the foreign node's joins fail and a logs %q", tc.reason)

			// A correctly configured node joins and gossips meanwhile: once a
			// sees its load, a would have seen the foreign load too had it
			// got in.
			good := testConfig("good")
			good.Join = []string{a.Addr()}
			g := startReplica(t, good)
			mine := WorkerLoad{ActiveRequests: 1}
			g.SetLocalLoads(map[string]WorkerLoad{"w1": mine})
			testenv.Eventually(t, 20*time.Second, func() bool { return a.RemoteLoad("w1") == mine }, "a sees the good node's load")

			require.Equal(t, mine, a.RemoteLoad("w1"), "the foreign load never reached a")
			require.ElementsMatch(t, []string{"a", "good"}, memberNames(a.Members()))
			require.Len(t, foreign.Members(), 1, "the foreign node is alone")
			require.Equal(t, WorkerLoad{}, foreign.RemoteLoad("w1"), "and learned nothing")
		})
	}
}

func memberNames(ms []Member) []string {
	out := make([]string, len(ms))
	for i, m := range ms {
		out[i] = m.Name
	}
	return out
}

type sinkRecorder struct {
	mu    sync.Mutex
	calls []predictionCall
}

type predictionCall struct {
	worker  string
	hashes  []uint64
	expires time.Time
}

func (s *sinkRecorder) sink(worker string, hashes []uint64, expires time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls = append(s.calls, predictionCall{worker, slices.Clone(hashes), expires})
}

func (s *sinkRecorder) snapshot() []predictionCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.calls)
}

func TestPredictionAtOneReplicaReachesAnotherReplicasSink(t *testing.T) {
	rs := startCluster(t, 3, nil)
	sinks := make([]*sinkRecorder, len(rs))
	for i, r := range rs {
		sinks[i] = &sinkRecorder{}
		r.SetPredictionSink(sinks[i].sink)
	}
	hashes := []uint64{11, 22, 33}
	before := time.Now()
	rs[0].Predict("w7", hashes, 5*time.Second)

	for _, i := range []int{1, 2} {
		testenv.Eventually(t, 20*time.Second, func() bool { return len(sinks[i].snapshot()) > 0 }, "r%d's sink gets the prediction", i)
		calls := sinks[i].snapshot()
		require.Len(t, calls, 1, "delivered once despite relays")
		require.Equal(t, "w7", calls[0].worker)
		require.Equal(t, hashes, calls[0].hashes)
		require.True(t, calls[0].expires.After(before.Add(4*time.Second)), "expiry carries the ttl")
	}
	require.Empty(t, sinks[0].snapshot(), "the predicting replica's own sink is not called")
}

func TestLongPredictionIsSplitAndArrivesWhole(t *testing.T) {
	rs := startCluster(t, 2, nil)
	rec := &sinkRecorder{}
	rs[1].SetPredictionSink(rec.sink)
	hashes := make([]uint64, 1000)
	for i := range hashes {
		hashes[i] = uint64(i)*7919 + 1
	}
	rs[0].Predict("w1", hashes, time.Minute)
	got := func() []uint64 {
		var all []uint64
		for _, c := range rec.snapshot() {
			require.Equal(t, "w1", c.worker)
			all = append(all, c.hashes...)
		}
		return all
	}
	testenv.Eventually(t, 20*time.Second, func() bool { return len(got()) >= len(hashes) }, "every chunk arrives")
	require.ElementsMatch(t, hashes, got(), "the chunks cover every hash exactly once (in any order)")
	require.Greater(t, len(rec.snapshot()), 1, "the prediction was split to fit messages")
}

func TestDigestsReachOtherReplicas(t *testing.T) {
	rs := startCluster(t, 2, func(c *Config) { c.DigestInterval = 10 * time.Millisecond })
	rs[0].SetDigests(map[string]Digest{"w1": {LastEventID: 42, Blocks: 300}})
	testenv.Eventually(t, 20*time.Second, func() bool {
		return rs[1].RemoteDigests()["r0"]["w1"] == Digest{LastEventID: 42, Blocks: 300}
	}, "r1 sees r0's digest for w1")
	require.Empty(t, rs[0].RemoteDigests(), "a replica's own digests are not remote")
}

func TestManyWorkersAreSplitIntoShardsThatAllArrive(t *testing.T) {
	rs := startCluster(t, 2, nil)
	loads := make(map[string]WorkerLoad, 1000)
	for i := range 1000 {
		loads[fmt.Sprintf("worker-%04d", i)] = WorkerLoad{ActiveRequests: i%7 + 1, PrefillTokens: i, DecodeBlocks: i % 13}
	}
	rs[0].SetLocalLoads(loads)
	testenv.Eventually(t, 30*time.Second, func() bool {
		for w, l := range loads {
			if rs[1].RemoteLoad(w) != l {
				return false
			}
		}
		return true
	}, "all 1000 workers' loads arrive")
}

func TestRestartedReplicaRetractsItsEarlierIncarnationsLoad(t *testing.T) {
	rs := startCluster(t, 2, func(c *Config) { c.GracePeriod = time.Hour })
	load := WorkerLoad{ActiveRequests: 5}
	rs[1].SetLocalLoads(map[string]WorkerLoad{"w1": load})
	testenv.Eventually(t, 20*time.Second, func() bool { return rs[0].RemoteLoad("w1") == load }, "r0 sees r1's load")
	rs[1].stop()

	again := testConfig("r1")
	again.Join = []string{rs[0].Addr()}
	again.GracePeriod = time.Hour
	startReplica(t, again)
	testenv.Eventually(t, 20*time.Second, func() bool { return rs[0].RemoteLoad("w1") == WorkerLoad{} },
		"the new r1 (no bookings) overrides what its earlier incarnation said, long before any grace period")
}

func TestMembersCarryNodeMeta(t *testing.T) {
	rs := startCluster(t, 2, func(c *Config) { c.Meta.HTTPAddr = "127.0.0.1:" + c.NodeName })
	ms := rs[0].Members()
	require.Len(t, ms, 2)
	for _, m := range ms {
		require.Equal(t, m.Name, m.Meta.ReplicaID)
		require.Equal(t, "127.0.0.1:"+m.Name, m.Meta.HTTPAddr)
		require.Equal(t, "test", m.Meta.Version)
	}
	require.Contains(t, memberNames(ms), "r1")
}

func TestMemberlistLogLinesBecomeZapEntriesAtTheirLevel(t *testing.T) {
	core, logs := observer.New(zapcore.DebugLevel)
	g := newIdle(t, nil)
	l := newMemberlistLogger(zap.New(core), g.m.memberlistLogs, &g.mlogClosed)
	l.Printf("[ERR] memberlist: discarding packet with unacceptable label %q", "x")
	l.Printf("[WARN] memberlist: Got invalid checksum")
	l.Printf("[DEBUG] memberlist: Stream connection from=1.2.3.4")
	l.Printf("no level at all")

	entries := logs.All()
	require.Len(t, entries, 4)
	require.Equal(t, zapcore.ErrorLevel, entries[0].Level)
	require.Equal(t, `discarding packet with unacceptable label "x"`, entries[0].Message)
	require.Equal(t, zapcore.WarnLevel, entries[1].Level)
	require.Equal(t, zapcore.DebugLevel, entries[2].Level)
	require.Equal(t, zapcore.InfoLevel, entries[3].Level)
	for lvl, want := range map[string]float64{"error": 1, "warn": 1, "debug": 1, "info": 1} {
		require.Equal(t, want, counter(t, g.m.memberlistLogs.WithLabelValues(lvl)), lvl)
	}
}

func TestMemberlistLinesAfterRunReturnedAreCountedButNotLogged(t *testing.T) {
	// memberlist's probe goroutines may outlive its Shutdown; a line they
	// log then must not reach a logger whose owner is gone (zaptest's
	// panics: "Log in goroutine after Test... has completed").
	core, logs := observer.New(zapcore.DebugLevel)
	r := startCluster(t, 1, nil)[0]
	l := newMemberlistLogger(zap.New(core), r.m.memberlistLogs, &r.mlogClosed)
	l.Printf("[WARN] memberlist: a line while running")
	require.Len(t, logs.All(), 1, "a line while Run runs is logged")
	r.stop()
	before := counter(t, r.m.memberlistLogs.WithLabelValues("warn"))
	l.Printf("[WARN] memberlist: Was able to connect to r9 over TCP but UDP probes failed")
	require.Len(t, logs.All(), 1, "a line after Run returned reached the logger")
	require.Equal(t, before+1, counter(t, r.m.memberlistLogs.WithLabelValues("warn")))
}

func TestRunningMemberlistLogsThroughZap(t *testing.T) {
	rs := startCluster(t, 2, nil)
	total := 0.0
	for _, lvl := range []string{"debug", "info", "warn", "error"} {
		total += counter(t, rs[1].m.memberlistLogs.WithLabelValues(lvl))
	}
	require.Positive(t, total, "the joining member's memberlist logged through the adapter")
}

func newIdle(t *testing.T, mutate func(*Config)) *Gossip {
	t.Helper()
	g, _ := newIdleWithRegistry(t, mutate)
	return g
}

func newIdleWithRegistry(t *testing.T, mutate func(*Config)) (*Gossip, *prometheus.Registry) {
	t.Helper()
	cfg := testConfig("idle")
	if mutate != nil {
		mutate(&cfg)
	}
	reg := prometheus.NewRegistry()
	g, err := New(cfg, zap.NewNop(), reg)
	require.NoError(t, err)
	return g, reg
}

func TestMalformedInputIsCountedAndNeverReachesTheOwner(t *testing.T) {
	g, reg := newIdleWithRegistry(t, nil)
	g.delegate.NotifyMsg([]byte("definitely not gossip"))
	g.delegate.NotifyMsg(appendState(nil, 0, sampleState())) // full state outside push-pull
	g.delegate.MergeRemoteState([]byte{'S', 'G', 1, byte(kindState), 0xff}, false)
	g.delegate.MergeRemoteState(appendLoads(nil, sampleLoads()), true) // loads where state belongs
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_gossip_decode_errors_total Gossip payloads rejected by a decoder, by payload (message, state, meta).
# TYPE switchyard_gossip_decode_errors_total counter
switchyard_gossip_decode_errors_total{payload="message"} 2
switchyard_gossip_decode_errors_total{payload="state"} 2
`), "switchyard_gossip_decode_errors_total"))
	require.Empty(t, g.inbox)
}

func TestCallbacksDropAndCountWhenTheInboxIsFull(t *testing.T) {
	g := newIdle(t, func(c *Config) { c.InboxSize = 2 })
	msg := appendLoads(nil, sampleLoads())
	for range 3 {
		g.delegate.NotifyMsg(msg) // must return at once though nobody reads the inbox
	}
	require.Len(t, g.inbox, 2)
	require.Equal(t, 1.0, counter(t, g.m.dropped.WithLabelValues(dropInboxFull)))
}

func TestPredictDropsAndCountsWhenItsQueueIsFull(t *testing.T) {
	g := newIdle(t, func(c *Config) { c.PredictionQueueSize = 1 })
	g.Predict("w", []uint64{1}, time.Second)
	g.Predict("w", []uint64{2}, time.Second)
	require.Len(t, g.preds, 1)
	require.Equal(t, 1.0, counter(t, g.m.dropped.WithLabelValues(dropPredictionFull)))
}

func TestRunTwiceIsRefused(t *testing.T) {
	r := startReplica(t, testConfig("once"))
	require.ErrorIs(t, r.Run(testenv.Context(t)), ErrAlreadyRunning)
}

func TestNodeMetaCallbackReturnsTheEncodedMeta(t *testing.T) {
	g := newIdle(t, nil)
	m, err := DecodeNodeMeta(g.delegate.NodeMeta(MaxMetaBytes))
	require.NoError(t, err)
	require.Equal(t, "idle", m.ReplicaID, "ReplicaID defaults to the node name")
	require.True(t, strings.HasPrefix(m.HTTPAddr, "127.0.0.1"))
}

// rawUserPacket is a memberlist user message carrying payload, as a node
// without label or key would send it.
func rawUserPacket(payload []byte) []byte {
	const userMsg = 8 // memberlist's messageType for user messages
	return append([]byte{userMsg}, payload...)
}

func sendUDP(t *testing.T, addr string, p []byte) {
	t.Helper()
	c, err := net.Dial("udp", addr)
	require.NoError(t, err)
	defer c.Close()
	_, err = c.Write(p)
	require.NoError(t, err)
}

func TestInjectedPacketsWithoutLabelOrKeyAreDiscarded(t *testing.T) {
	injected := &loadsMsg{Origin: "intruder", Version: 1, Timestamp: 1, Entries: []workerEntry{
		{Worker: "w1", Entry: Entry{Version: 1, Load: WorkerLoad{ActiveRequests: 100}}},
	}}
	pkt := rawUserPacket(appendLoads(nil, injected))

	// Control: a member with neither label nor key applies the packet, so
	// the packet itself is well-formed.
	openCfg := testConfig("open")
	openCfg.ClusterLabel, openCfg.SecretKey = "", nil
	open := startReplica(t, openCfg)
	sendUDP(t, open.Addr(), pkt)
	testenv.Eventually(t, 10*time.Second, func() bool { return open.RemoteLoad("w1").ActiveRequests == 100 },
		"a member without label and key accepts the injected load")

	a := startReplica(t, testConfig("a"))
	sendUDP(t, a.Addr(), pkt)
	labelled, err := memberlist.AddLabelHeaderToPacket(pkt, "switchyard-test")
	require.NoError(t, err)
	sendUDP(t, a.Addr(), labelled)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return a.logs.FilterMessageSnippet("discarding packet with unacceptable label").Len() >= 1 &&
			a.logs.FilterMessageSnippet("Decrypt packet failed").Len() >= 1
	}, "a discards the unlabelled packet and fails to decrypt the labelled one")
	require.Equal(t, WorkerLoad{}, a.RemoteLoad("w1"), "neither packet injected state")
}

func TestOverlongOrEmptyWorkerIDsAreDroppedAndCounted(t *testing.T) {
	g := newIdle(t, nil)
	long := strings.Repeat("w", maxNameLen+1)
	g.SetLocalLoads(map[string]WorkerLoad{long: {ActiveRequests: 1}, "ok": {ActiveRequests: 1}})
	g.SetDigests(map[string]Digest{"": {LastEventID: 1}})
	g.Predict(long, []uint64{1}, time.Second)
	require.Equal(t, map[string]WorkerLoad{"ok": {ActiveRequests: 1}}, *g.loads.Load())
	require.Empty(t, *g.digests.Load())
	require.Empty(t, g.preds)
	require.Equal(t, 3.0, counter(t, g.m.dropped.WithLabelValues(dropInvalidWorker)))
}

func TestEveryShardPartFitsAMessageAndTogetherTheyCarryAllEntries(t *testing.T) {
	for _, maxBytes := range []int{512, 1024} {
		t.Run(fmt.Sprint(maxBytes), func(t *testing.T) {
			g := newIdle(t, func(c *Config) { c.MaxMessageBytes = maxBytes; c.NodeName = strings.Repeat("n", maxNameLen) })
			o := &owner{g: g, self: g.cfg.NodeName, version: 1}
			values := make(map[string]Entry, 1000)
			for i := range 1000 {
				// Worst case: the longest names, large values.
				w := fmt.Sprintf("%0*d", maxNameLen, i)
				values[w] = Entry{Load: WorkerLoad{1 << 30, 1 << 30, 1 << 30}, Digest: Digest{LastEventID: 1 << 62, Blocks: 1 << 30}}
			}
			o.stamp(values)
			got := map[string]Entry{}
			for _, b := range g.queue.GetBroadcasts(0, 1<<30) {
				require.LessOrEqual(t, len(b), maxBytes)
				_, m, _, _, err := decodeMessage(b)
				require.NoError(t, err)
				for _, e := range m.Entries {
					got[e.Worker] = e.Entry
				}
			}
			require.Len(t, got, len(values))
			for w, e := range got {
				require.True(t, e.sameValue(values[w]), "worker %s", w)
				require.Equal(t, o.version, e.Version)
			}
		})
	}
}

// Reading the members while a restarted replica rejoins under the same name
// (memberlist rewrites that node's address and meta in its packet handler)
// must see the new meta and must not race. The race itself (reading
// memberlist's own node records, as Members did) was caught by the nemesis
// under -race; this test does not reproduce it reliably on that code, it
// guards the copy-on-notify table's behaviour.
func TestMembersCanBeReadWhileAReplicaRejoinsWithNewMeta(t *testing.T) {
	rs := startCluster(t, 2, func(c *Config) { c.GracePeriod = time.Hour })
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				_ = rs[0].Members()
			}
		}
	}()
	rs[1].stop()
	again := testConfig("r1")
	again.Join = []string{rs[0].Addr()}
	again.Meta.HTTPAddr = "127.0.0.1:9"
	startReplica(t, again)
	testenv.Eventually(t, 20*time.Second, func() bool {
		for _, m := range rs[0].Members() {
			if m.Name == "r1" && m.Meta.HTTPAddr == "127.0.0.1:9" {
				return true
			}
		}
		return false
	}, "r0 sees the rejoined r1's new meta")
	close(stop)
	<-done
	testenv.Eventually(t, 20*time.Second, func() bool { return rs[0].NumMembers() == 2 },
		"memberlist's own count to include the rejoined r1")
}
