package scheduler

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSoftSessionStaysOnItsWorkerWhileItCostsLessThanTheMargin(t *testing.T) {
	h := ttftHarness(t, workers(3, 0), nil, classCfg("c", PolicyFCFS))
	// w1 is a little busier than the idle others: without a session the
	// request goes to an idle worker, with one it stays on w1.
	h.remote["w1"] = WorkerLoad{ActiveRequests: 1, PrefillTokens: 500, DecodeBlocks: 50}
	plain := req("plain", "c", 640)
	plain.BlockHashes = seqHashes(1, 40)
	h.enqueue(plain)
	require.NotEqual(t, "w1", h.granted("plain").Worker)

	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Session = SessionAffinity{Worker: "w1", MarginRatio: 0.5}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestSoftSessionMovesWhenItsWorkerIsSaturated(t *testing.T) {
	h := ttftHarness(t, workers(2, 0), nil, classCfg("c", PolicyFCFS))
	h.remote["w0"] = WorkerLoad{ActiveRequests: 8, PrefillTokens: 50000, DecodeBlocks: 800}
	r := req("r", "c", 640)
	r.BlockHashes = seqHashes(1, 40)
	r.Session = SessionAffinity{Worker: "w0", MarginRatio: 0.5, MarginCost: 100}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestSoftSessionMovesOffAFullWorker(t *testing.T) {
	h := newHarness(t, workers(2, 1), classCfg("c", PolicyFCFS))
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1}
	r := req("r", "c", 64)
	r.Session = SessionAffinity{Worker: "w0", MarginRatio: 100}
	h.enqueue(r)
	require.Equal(t, "w1", h.granted("r").Worker)
}

func TestHardSessionWaitsForItsWorkerInsteadOfMoving(t *testing.T) {
	h := ttftHarness(t, workers(2, 1), nil, classCfg("c", PolicyFCFS))
	h.remote["w0"] = WorkerLoad{ActiveRequests: 1}
	r := req("r", "c", 64)
	r.Session = SessionAffinity{Worker: "w0", Hard: true}
	h.enqueue(r)
	h.pending("r")
	h.remote["w0"] = WorkerLoad{}
	h.core.SetWorkers(workers(2, 1)) // any change that makes the Core look again
	h.core.Tick()
	require.Equal(t, "w0", h.granted("r").Worker)
}

func TestHardSessionFallsBackWhenItsWorkerLeft(t *testing.T) {
	h := newHarness(t, workers(2, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 64)
	r.Session = SessionAffinity{Worker: "gone", Hard: true}
	h.enqueue(r)
	require.Contains(t, []string{"w0", "w1"}, h.granted("r").Worker)
}

func TestSessionOutsideTheAllowedWorkersIsIgnored(t *testing.T) {
	h := newHarness(t, workers(3, 0), classCfg("c", PolicyFCFS))
	r := req("r", "c", 64)
	r.Allowed = []string{"w1", "w2"}
	r.Session = SessionAffinity{Worker: "w0", Hard: true}
	h.enqueue(r)
	require.Contains(t, []string{"w1", "w2"}, h.granted("r").Worker)
}

func TestSessionTableExpiresEntriesAfterTheirTTL(t *testing.T) {
	tb := NewSessionTable(10, time.Minute)
	tb.Record(1, "w0", t0, t0.Add(time.Minute))
	w, ok := tb.Lookup(1, t0.Add(59*time.Second))
	require.True(t, ok)
	require.Equal(t, "w0", w)
	_, ok = tb.Lookup(1, t0.Add(time.Minute))
	require.False(t, ok, "an entry is gone at its expiry")
	require.Equal(t, 0, tb.Len())

	tb.Record(2, "w0", t0, t0.Add(time.Second))
	tb.Record(3, "w1", t0, t0.Add(time.Hour))
	require.Equal(t, 1, tb.Sweep(t0.Add(2*time.Second)))
	require.Equal(t, map[string]int{"w1": 1}, tb.PerWorker())
}

func TestSessionTableEvictsTheLeastRecentlyRoutedBeyondItsBound(t *testing.T) {
	tb := NewSessionTable(3, time.Hour)
	for i := range 3 {
		tb.Record(uint64(i), fmt.Sprintf("w%d", i), t0, t0.Add(time.Hour))
	}
	tb.Record(0, "w0", t0.Add(time.Second), t0.Add(time.Hour)) // 0 is routed again: 1 is now the oldest
	tb.Record(9, "w9", t0.Add(time.Second), t0.Add(time.Hour))
	require.Equal(t, 3, tb.Len())
	require.Equal(t, uint64(1), tb.Evicted())
	_, ok := tb.Lookup(1, t0)
	require.False(t, ok)
	for _, id := range []uint64{0, 2, 9} {
		_, ok := tb.Lookup(id, t0)
		require.Truef(t, ok, "session %d", id)
	}
}

func TestSessionTableKeepsTheLaterRoutingDecision(t *testing.T) {
	tb := NewSessionTable(10, time.Hour)
	require.True(t, tb.Record(1, "w1", t0.Add(2*time.Second), t0.Add(time.Hour)))
	require.False(t, tb.Record(1, "w0", t0.Add(time.Second), t0.Add(time.Hour)), "a stale copy loses")
	w, _ := tb.Lookup(1, t0)
	require.Equal(t, "w1", w)
	require.True(t, tb.Record(1, "w2", t0.Add(3*time.Second), t0.Add(time.Hour)))
	w, _ = tb.Lookup(1, t0)
	require.Equal(t, "w2", w)
	require.Equal(t, map[string]int{"w2": 1}, tb.PerWorker())
}

func TestSessionTableFreesTheSessionsOfAWorkerThatLeft(t *testing.T) {
	tb := NewSessionTable(10, time.Hour)
	tb.Record(1, "w0", t0, t0.Add(time.Hour))
	tb.Record(2, "w0", t0, t0.Add(time.Hour))
	tb.Record(3, "w1", t0, t0.Add(time.Hour))
	require.Equal(t, 2, tb.DropWorker("w0"))
	_, ok := tb.Lookup(1, t0)
	require.False(t, ok)
	require.Equal(t, 1, tb.Len())
	require.Equal(t, map[string]int{"w1": 1}, tb.PerWorker())
}
