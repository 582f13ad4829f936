package kvindex

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func TestAnEnginesFirstBatchFromIDOneAppliesWithoutADump(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	h := chain(1, 3)
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 9, 1, stored(nil, h[:2]...)))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 9, 2, stored(ptr(h[1]), h[2])))
	d, ok := ix.Digest("a")
	require.True(t, ok)
	require.Equal(t, Digest{Worker: "a", Instance: 9, LastID: 2, Blocks: 3, Synced: true}, d)
	require.Empty(t, ix.NeedingDump(nil))
}

func TestFirstContactInTheMiddleOfAStreamNeedsADump(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 5, stored(nil, chain(1, 2)...)))
	require.Equal(t, []string{"a"}, ix.NeedingDump(nil))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "first_contact"}))
	select {
	case <-ix.ResyncNotify():
	default:
		t.Fatal("the repair loop was not kicked")
	}
}

func TestAGapResetsTheWorkerAndTheDumpReplaysOnlyLaterBufferedEvents(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	h := chain(1, 6)
	mustApply(t, ix, "a", 9, 1, stored(nil, h[0]))
	// Event 2 is lost; event 3 reveals the gap.
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 3, stored(ptr(h[1]), h[2])))
	require.Zero(t, ix.Blocks("a"), "a reset drops the worker's entries at once")
	require.Empty(t, ix.Lookup(h, nil))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "gap"}))

	// Events arriving while the dump is in flight are kept.
	require.Equal(t, OutcomeBuffered, mustApply(t, ix, "a", 9, 4, stored(ptr(h[2]), h[3]), stored(ptr(h[3]), h[4])))
	require.Equal(t, OutcomeBuffered, mustApply(t, ix, "a", 9, 6, removed(h[4])))

	// The dump reflects the worker as of event 4: events 3 and 4 are in it,
	// 5 and 6 must come from the buffer.
	o := ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 4, Hashes: h[:4]})
	require.Equal(t, OutcomeApplied, o)
	require.Equal(t, sortedHashes(h[:4]), sortedHashes(ix.WorkerHashes("a", nil)),
		"event 5 stored h4 and event 6 removed it again")
	d, _ := ix.Digest("a")
	require.Equal(t, Digest{Worker: "a", Instance: 9, LastID: 6, Blocks: 4, Synced: true}, d)
	require.Empty(t, ix.NeedingDump(nil))
}

func TestAStoredChainWithAnUnknownParentIsAGap(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	h := chain(1, 3)
	mustApply(t, ix, "a", 9, 1, stored(nil, h[0]))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 2, stored(ptr(h[1]), h[2])))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "unknown_parent"}))
	require.True(t, ix.NeedsDump("a"))
}

func TestAnEngineRestartFromIDOneReplacesTheOldBlocksWithoutADump(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	h := chain(1, 4)
	mustApply(t, ix, "a", 9, 1, stored(nil, h[:3]...))
	mustApply(t, ix, "a", 9, 2, removed(h[2]))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 10, 1, stored(nil, h[3])))
	require.Equal(t, []uint64{h[3]}, ix.WorkerHashes("a", nil))
	d, _ := ix.Digest("a")
	require.Equal(t, Digest{Worker: "a", Instance: 10, LastID: 1, Blocks: 1, Synced: true}, d)
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "instance"}))
}

func TestAnEngineRestartSeenMidStreamNeedsADump(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 2)...))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 10, 3, stored(nil, chain(2, 1)...)))
	require.Zero(t, ix.Blocks("a"))
}

func TestIDsGoingBackWithinAnInstanceReset(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 2)...), stored(nil, chain(2, 2)...))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 2, stored(nil, chain(3, 1)...)))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "id_back"}))
}

func TestAHeartbeatRevealsALostTrailingBatch(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 1)...))
	require.Equal(t, OutcomeIgnored, mustApply(t, ix, "a", 9, 2), "an empty batch right after the last id is nothing new")
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 3), "an empty batch past a missing id is a gap")
}

func TestRemovedAndClearedEventsDropEntries(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	h := chain(1, 4)
	mustApply(t, ix, "a", 9, 1, stored(nil, h...))
	mustApply(t, ix, "b", 9, 1, stored(nil, h[:2]...))
	mustApply(t, ix, "a", 9, 2, removed(h[3], chain(99, 1)[0]))
	require.Equal(t, 3, ix.Blocks("a"), "removing an unknown hash is harmless")
	mustApply(t, ix, "a", 9, 3, wire.KVEvent{Kind: wire.KVCleared})
	require.Zero(t, ix.Blocks("a"))
	require.Equal(t, []Match{{"b", 2}}, ix.Lookup(h, nil))
	d, _ := ix.Digest("a")
	require.True(t, d.Synced, "a cleared cache is a known state, not a gap")
	require.Equal(t, 4.0, testenv.MetricValue(t, reg, "switchyard_index_events_applied_total", map[string]string{"kind": "stored"})-2)
	require.Equal(t, 2.0, testenv.MetricValue(t, reg, "switchyard_index_events_applied_total", map[string]string{"kind": "removed"}))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_events_applied_total", map[string]string{"kind": "cleared"}))
}

func TestMoreBlocksThanTheWorkerCanHoldMeansMissedRemovals(t *testing.T) {
	ix, reg, _ := newTestIndex(t, func(c *Config) { c.CapacitySlackPercent = 0 })
	require.NoError(t, ix.SetCapacity("a", 4))
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 4)...))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 2, stored(nil, chain(2, 1)...)))
	require.Zero(t, ix.Blocks("a"))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "over_capacity"}))

	o := ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 2, Hashes: chain(3, 6)})
	require.Equal(t, OutcomeApplied, o)
	require.Equal(t, 4, ix.Blocks("a"), "a dump is cut at the capacity")
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_dropped_total", map[string]string{"kind": "dump_blocks_over_capacity"}))
}

func TestAHoleInTheBufferedBatchesAsksForAnotherDump(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 3, stored(nil, chain(1, 1)...))
	mustApply(t, ix, "a", 9, 7, stored(nil, chain(2, 1)...))
	o := ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 4, Hashes: chain(3, 2)})
	require.Equal(t, OutcomeResync, o, "events 5 and 6 are in neither the dump nor the buffer")
	require.True(t, ix.NeedsDump("a"))
	require.Equal(t, OutcomeApplied, ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 7, Hashes: chain(4, 2)}))
	require.Equal(t, sortedHashes(chain(4, 2)), sortedHashes(ix.WorkerHashes("a", nil)))
}

func TestBufferedBatchesOfThePreviousInstanceAreSkippedAfterTheDump(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 4, stored(nil, chain(1, 1)...)) // old instance, first contact
	mustApply(t, ix, "a", 10, 2, stored(nil, chain(2, 1)...))
	o := ix.ApplyDump(&Dump{Worker: "a", Instance: 10, AsOfID: 1, Hashes: chain(3, 1)})
	require.Equal(t, OutcomeApplied, o)
	require.Equal(t, sortedHashes(append(chain(3, 1), chain(2, 1)...)), sortedHashes(ix.WorkerHashes("a", nil)))
}

func TestOverflowingTheDumpBufferIsCountedAndRepairedByTheNextDump(t *testing.T) {
	ix, reg, _ := newTestIndex(t, func(c *Config) { c.MaxBufferedBatches = 2 })
	mustApply(t, ix, "a", 9, 3, stored(nil, chain(1, 1)...))
	mustApply(t, ix, "a", 9, 4, stored(nil, chain(2, 1)...))
	mustApply(t, ix, "a", 9, 5, stored(nil, chain(3, 1)...))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_dropped_total", map[string]string{"kind": "buffered_batches"}))
	require.Equal(t, OutcomeResync, ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 3}))
	require.Equal(t, OutcomeApplied, ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 5, Hashes: chain(4, 3)}))
	require.Equal(t, 3, ix.Blocks("a"))
}

func TestADumpNobodyWaitsForIsIgnored(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	require.Equal(t, OutcomeIgnored, ix.ApplyDump(&Dump{Worker: "ghost", Instance: 1, AsOfID: 3}))
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 1)...))
	require.Equal(t, OutcomeIgnored, ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 3, Hashes: chain(2, 5)}))
	require.Equal(t, 1, ix.Blocks("a"))
}

func TestBatchesWithEventIDZeroAreRejected(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	_, err := ix.ApplyBatch(batch("a", 1, 0, stored(nil, 1)))
	require.ErrorIs(t, err, wire.ErrMalformed)
}

func TestWorkersBeyondTheLimitAreRefused(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 1 })
	mustApply(t, ix, "a", 1, 1)
	_, err := ix.ApplyBatch(batch("b", 1, 1))
	require.ErrorIs(t, err, ErrTooManyWorkers)
}

func TestConfigValidationNamesTheBadField(t *testing.T) {
	c := DefaultConfig()
	require.NoError(t, c.Validate())
	c.MaxWorkers = 70000
	require.ErrorContains(t, c.Validate(), "MaxWorkers")
}

func TestResetWorkersAreHiddenAtOnceAndClearedTogetherByOneScan(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	shared := chain(1, 3)
	mustApply(t, ix, "a", 9, 1, stored(nil, shared...))
	mustApply(t, ix, "b", 9, 1, stored(nil, shared[:2]...))
	mustApply(t, ix, "c", 9, 1, stored(nil, shared[:1]...))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 3))
	require.Equal(t, OutcomeResync, mustApply(t, ix, "b", 9, 3))
	require.Equal(t, []Match{{"c", 1}}, ix.Lookup(shared, nil), "reset workers vanish from lookups at once")
	require.Zero(t, ix.Blocks("a"))
	require.Empty(t, ix.WorkerHashes("a", nil))

	require.Equal(t, 5, ix.ClearStale(), "one pass removes both workers' hidden entries")
	require.Zero(t, ix.ClearStale(), "nothing is left to clear")
	require.Equal(t, 1, ix.TotalBlocks())
	require.Equal(t, OutcomeApplied, ix.ApplyDump(&Dump{Worker: "a", Instance: 9, AsOfID: 3, Hashes: shared[:1]}))
	require.Equal(t, []Match{{"a", 1}, {"c", 1}}, sortedMatches(ix.Lookup(shared, nil)))
}

func TestTwoLoadReportsAheadOfTheIndexRevealALostTrailingBatch(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 2)...))
	require.Equal(t, OutcomeIgnored, ix.NoteLastEventID("a", 9, 1), "a report matching the index")
	require.Equal(t, OutcomeIgnored, ix.NoteLastEventID("a", 9, 2), "one report ahead may just have overtaken its batch")
	mustApply(t, ix, "a", 9, 2, removed(chain(1, 2)[1]))
	require.Equal(t, OutcomeIgnored, ix.NoteLastEventID("a", 9, 2), "the batch arrived")
	require.Equal(t, OutcomeIgnored, ix.NoteLastEventID("a", 9, 3))
	require.Equal(t, OutcomeResync, ix.NoteLastEventID("a", 9, 3), "still behind on the second report")
	require.True(t, ix.NeedsDump("a"))
	require.Equal(t, OutcomeIgnored, ix.NoteLastEventID("a", 10, 5), "another instance is the batches' business")
}

func TestIndexCountersAreExportedUnderTheirNames(t *testing.T) {
	ix, reg, _ := newTestIndex(t)
	mustApply(t, ix, "a", 9, 1, stored(nil, chain(1, 3)...), removed(chain(1, 3)[2]))
	mustApply(t, ix, "a", 9, 5)
	want := `
# HELP switchyard_index_blocks Exact (block, worker) entries in the index.
# TYPE switchyard_index_blocks gauge
switchyard_index_blocks 0
# HELP switchyard_index_events_applied_total KV block events applied to the index, by kind (stored and removed count blocks, cleared counts events).
# TYPE switchyard_index_events_applied_total counter
switchyard_index_events_applied_total{kind="cleared"} 0
switchyard_index_events_applied_total{kind="removed"} 1
switchyard_index_events_applied_total{kind="stored"} 3
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"switchyard_index_events_applied_total", "switchyard_index_blocks"))
	require.Equal(t, 1.0, testenv.MetricValue(t, reg, "switchyard_index_event_gaps_total", map[string]string{"reason": "gap"}))
}

func TestDroppingEntriesWithNoIDLeftFallsBackToAnImmediateScan(t *testing.T) {
	ix, _, _ := newTestIndex(t, func(c *Config) { c.MaxWorkers = 1 }) // ids for one worker plus one retired
	h := chain(1, 4)
	mustApply(t, ix, "a", 9, 1, stored(nil, h...))
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 10, 1, stored(nil, h[:1]...)), "restart: the old id is retired")
	require.Equal(t, OutcomeApplied, mustApply(t, ix, "a", 11, 1, stored(nil, h[:2]...)), "restart again before any ClearStale")
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(h, nil))
	require.Equal(t, sortedHashes(h[:2]), sortedHashes(ix.WorkerHashes("a", nil)))
	require.Equal(t, 4, ix.ClearStale(), "only the first restart's entries waited for the scan")
	require.Equal(t, []Match{{"a", 2}}, ix.Lookup(h, nil))
}

func TestEventCountsSayWhatAWorkersStreamBroughtAndWhyItWasLastReset(t *testing.T) {
	ix, _, _ := newTestIndex(t)
	require.Equal(t, EventCounts{}, ix.EventCounts("a"), "a worker never seen has no counts")
	h := chain(1, 4)
	mustApply(t, ix, "a", 9, 1, stored(nil, h[:2]...))
	mustApply(t, ix, "a", 9, 2) // a heartbeat: a batch, no blocks
	require.Equal(t, EventCounts{Batches: 2, Stored: 2}, ix.EventCounts("a"))

	// A chain whose parent the index never saw stores nothing.
	require.Equal(t, OutcomeResync, mustApply(t, ix, "a", 9, 2, stored(ptr(chain(7, 1)[0]), h[2])))
	require.Equal(t, EventCounts{Batches: 3, Stored: 2, Resets: 1, LastReset: "unknown_parent"}, ix.EventCounts("a"))
}
