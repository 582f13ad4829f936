package adapter

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

const (
	testModel = "meta-llama/Llama-3.1-8B-Instruct"
	testBS    = 16
)

func testShape() Shape { return Shape{Model: testModel, BlockSize: testBS, MaxEntries: 1 << 16} }

func TestARouterIndexEndsWithExactlyTheSwitchyardHashesOfTheStoredPrompts(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}

	a := newPrompt(1, 4, testBS)
	b := a.extend(2, 3) // shares a's 4 blocks
	c := newPrompt(3, 2, testBS)
	// a arrives in two stores (the second chained on the first), b only
	// stores its 3 new blocks on top of a's, c in one go.
	f.batch(a.stored(0, 2))
	f.batch(a.stored(2, 4), c.stored(0, 2))
	f.batch(b.stored(4, 7))

	want := slices.Concat(b.want(testModel, 7), c.want(testModel, 2))
	router.holdsExactly(t, "w1", want, "after three batches")
	// The chain is the router's own: a request for b's tokens matches 7 deep.
	matches := router.ix.Lookup(kvindex.SequenceHashes(b.tokens, testBS, kvindex.ModelSeed(testModel)), nil)
	require.Len(t, matches, 1)
	assert.Equal(t, "w1", matches[0].Worker)
	assert.Equal(t, 7, matches[0].Blocks)
}

func TestRemovalsTakeOnlyTheRemovedBlocksOutOfTheRouterIndex(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	a := newPrompt(1, 5, testBS)
	c := newPrompt(2, 2, testBS)
	f.batch(a.stored(0, 5), c.stored(0, 2))
	f.batch(a.removed(3, 5), c.removed(0, 2))
	router.holdsExactly(t, "w1", a.want(testModel, 3), "after removing a's tail and all of c")
	assert.Equal(t, 3, m.Blocks())
}

func TestAResetClearsTheRouterIndexUnderANewInstanceAndLiveEventsRebuildIt(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	a := newPrompt(1, 4, testBS)
	f.batch(a.stored(0, 4))
	router.holdsExactly(t, "w1", a.want(testModel, 4), "before the reset")
	before, _ := m.Position()

	m.Reset(enginekv.ResetReason(1))
	after, last := m.Position()
	assert.NotEqual(t, before, after, "a reset starts a new instance")
	assert.Equal(t, uint64(1), last, "the new instance's first event is Cleared, id 1")
	router.holdsExactly(t, "w1", nil, "after the reset")

	// The engine still holds a, but the mirror forgot it: a store on top of
	// it cannot be rehashed and is skipped; a fresh prompt is mirrored.
	f.batch(a.extend(9, 1).stored(4, 5))
	c := newPrompt(2, 3, testBS)
	f.batch(c.stored(0, 3))
	router.holdsExactly(t, "w1", c.want(testModel, 3), "rebuilt from live events")
}

func TestARouterThatJoinsLateRepairsFromTheMirrorsDump(t *testing.T) {
	n := testenv.StartNATS(t)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	a := newPrompt(1, 6, testBS)
	c := newPrompt(2, 3, testBS)
	f.batch(a.stored(0, 6))
	f.batch(c.stored(0, 3), a.removed(5, 6))
	// This router saw none of it: the next heartbeat is a first contact at
	// an id past 1, so it fetches kvdump.w1.
	router := startRouterIndex(t, n, "w1", 2048)
	router.holdsExactly(t, "w1", slices.Concat(a.want(testModel, 5), c.want(testModel, 3)), "after the dump")
	// And it follows live events after the dump.
	f.batch(c.removed(1, 3))
	router.holdsExactly(t, "w1", slices.Concat(a.want(testModel, 5), c.want(testModel, 1)), "after the dump and a removal")
}

func TestLoRABlocksHashUnderTheAdaptersNameAndBaseBlocksUnderTheModel(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	base := newPrompt(1, 3, testBS)
	lora := newPrompt(1, 3, testBS) // the same tokens
	lora.lora, lora.loraID = "sql-lora", 1
	f.batch(base.stored(0, 3), lora.stored(0, 3))
	wantLoRA := kvindex.SequenceHashes(lora.tokens, testBS, kvindex.ModelSeed("sql-lora"))
	router.holdsExactly(t, "w1", slices.Concat(base.want(testModel, 3), wantLoRA), "base and LoRA blocks")
	assert.NotEqual(t, base.want(testModel, 3), wantLoRA, "same tokens, other namespace")
	assert.Equal(t, lora.want(testModel, 3), wantLoRA)
}

func TestBlocksTheMirrorCannotRehashAreSkippedAndCountedByReason(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	reg := prometheus.NewRegistry()
	m := startMirror(t, n, "w1", testShape(), reg)
	f := &feeder{h: m}
	good := newPrompt(1, 2, testBS)
	otherSize := newPrompt(2, 3, 32)
	cpu := newPrompt(3, 4, testBS)
	cpu.medium = "CPU"
	group := newPrompt(4, 5, testBS)
	group.groupID = 1
	unnamed := newPrompt(5, 6, testBS)
	unnamed.loraID = 7
	short := newPrompt(6, 7, testBS)
	bad := short.stored(0, 7)
	bad.TokenIDs = bad.TokenIDs[:len(bad.TokenIDs)-1]
	f.batch(good.stored(0, 2), otherSize.stored(0, 3), cpu.stored(0, 4), group.stored(0, 5), unnamed.stored(0, 6), bad)
	// A CPU-tier removal of a GPU-held hash must not remove it.
	rm := good.removed(0, 2)
	rm.Medium = "CPU"
	f.batch(rm)
	router.holdsExactly(t, "w1", good.want(testModel, 2), "only the good prompt")
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP switchyard_adapter_kv_skipped_blocks_total Stored blocks the mirror did not publish, by reason (block_size, kv_group, medium: another tier, medium_unknown, malformed, lora_without_name, unknown_parent, unconfigured).
# TYPE switchyard_adapter_kv_skipped_blocks_total counter
switchyard_adapter_kv_skipped_blocks_total{reason="block_size"} 3
switchyard_adapter_kv_skipped_blocks_total{reason="kv_group"} 5
switchyard_adapter_kv_skipped_blocks_total{reason="lora_without_name"} 6
switchyard_adapter_kv_skipped_blocks_total{reason="malformed"} 7
switchyard_adapter_kv_skipped_blocks_total{reason="medium"} 4
switchyard_adapter_kv_skipped_blocks_total{reason="medium_unknown"} 0
switchyard_adapter_kv_skipped_blocks_total{reason="unconfigured"} 0
switchyard_adapter_kv_skipped_blocks_total{reason="unknown_parent"} 0
# HELP switchyard_adapter_kv_skipped_removals_total Removed blocks (and clears) ignored because they concern another tier or KV group, by reason (medium, medium_unknown, kv_group).
# TYPE switchyard_adapter_kv_skipped_removals_total counter
switchyard_adapter_kv_skipped_removals_total{reason="kv_group"} 0
switchyard_adapter_kv_skipped_removals_total{reason="medium"} 2
switchyard_adapter_kv_skipped_removals_total{reason="medium_unknown"} 0
`), "switchyard_adapter_kv_skipped_blocks_total", "switchyard_adapter_kv_skipped_removals_total"))
}

func TestAnUnknownParentWhileTheMirrorIsExactStartsOverUnderANewInstance(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	reg := prometheus.NewRegistry()
	m := startMirror(t, n, "w1", testShape(), reg)
	f := &feeder{h: m} // sequence from 0: the mirror saw the engine's whole life
	a := newPrompt(1, 3, testBS)
	f.batch(a.stored(0, 3))
	router.holdsExactly(t, "w1", a.want(testModel, 3), "before")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.exact))
	before, _ := m.Position()

	orphan := newPrompt(2, 4, testBS)
	c := newPrompt(3, 2, testBS)
	f.batch(orphan.stored(2, 4), c.stored(0, 2)) // parent orphan.engine[1] was never stored
	after, _ := m.Position()
	assert.NotEqual(t, before, after)
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.repairs[repairUnknownParent]))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.m.exact))
	// The clear took a with it; c, after the repair in the same batch, stays.
	router.holdsExactly(t, "w1", c.want(testModel, 2), "after the repair")

	// No longer exact: the next orphan is skipped without another clear.
	f.batch(newPrompt(4, 3, testBS).stored(1, 3))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.repairs[repairUnknownParent]))
	assert.Equal(t, 4.0, testutil.ToFloat64(m.m.skipped[skipUnknownParent]))
	router.holdsExactly(t, "w1", c.want(testModel, 2), "after an inexact orphan")
}

func TestAMirrorJoiningMidStreamSkipsOrphansWithoutClearing(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m, seq: 500} // the engine published 500 batches before
	a := newPrompt(1, 3, testBS)
	f.batch(a.stored(0, 3))
	f.batch(newPrompt(2, 3, testBS).stored(1, 3))
	router.holdsExactly(t, "w1", a.want(testModel, 3), "the orphan skipped, a kept")
	assert.Equal(t, 0.0, testutil.ToFloat64(m.m.repairs[repairUnknownParent]))
}

func TestTheBoundedMapForgetsTheOldestBlocksAndRemovesThemOnRouters(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	reg := prometheus.NewRegistry()
	shape := testShape()
	shape.MaxEntries = 6
	m := startMirror(t, n, "w1", shape, reg)
	f := &feeder{h: m}
	a := newPrompt(1, 4, testBS)
	c := newPrompt(2, 4, testBS)
	f.batch(a.stored(0, 4))
	f.batch(a.removed(3, 4)) // leaves a stale fifo item behind
	f.batch(c.stored(0, 4))  // 7 entries: a[0] goes
	want := slices.Concat(a.want(testModel, 3)[1:], c.want(testModel, 4))
	router.holdsExactly(t, "w1", want, "a's oldest block forgotten")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.evictions))
	assert.Equal(t, 6, m.Blocks())
	// Storing a[0] again makes a 7th entry: the oldest live one, a[1], goes.
	f.batch(a.stored(0, 1))
	aw := a.want(testModel, 3)
	router.holdsExactly(t, "w1", slices.Concat([]uint64{aw[0], aw[2]}, c.want(testModel, 4)), "re-stored a[0] evicts a[1]")
	// a[2]'s parent a[1] is forgotten: a store on top of a[1] is an orphan.
	f.batch(a.stored(2, 3))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.skipped[skipUnknownParent]))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.m.repairs[repairUnknownParent]), "inexact after an eviction: no clear")
}

func TestASwitchyardHashThatSeveralEngineHashesMapToStaysUntilTheLastIsRemoved(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	// Same tokens, three engine hashes each (an engine that salts with
	// what its events do not carry): one Switchyard chain.
	a, b, c := newPrompt(7, 2, testBS), newPrompt(7, 2, testBS), newPrompt(7, 2, testBS)
	f.batch(a.stored(0, 2), b.stored(0, 2))
	f.batch(c.stored(0, 2))
	want := a.want(testModel, 2)
	router.holdsExactly(t, "w1", want, "one chain")
	assert.Equal(t, 2, m.Blocks())
	f.batch(a.removed(0, 2), c.removed(1, 2))
	router.holdsExactly(t, "w1", want, "b still holds both blocks")
	f.batch(b.removed(0, 2))
	router.holdsExactly(t, "w1", want[:1], "c still holds the first")
	f.batch(c.removed(0, 1))
	router.holdsExactly(t, "w1", nil, "no copy left")
	assert.Equal(t, 0, m.Blocks())
	assert.Equal(t, 2.0, testutil.ToFloat64(m.m.removed), "each of the two Switchyard hashes removed once")
}

func TestAnEngineHashStoredTwiceStaysUntilBothCopiesAreRemoved(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	a := newPrompt(1, 2, testBS)
	f.batch(a.stored(0, 2))
	f.batch(a.stored(0, 2)) // vLLM can cache one hash in two blocks
	f.batch(a.removed(0, 2))
	router.holdsExactly(t, "w1", a.want(testModel, 2), "one copy left")
	f.batch(a.removed(0, 2))
	router.holdsExactly(t, "w1", nil, "both copies gone")
}

func TestAnEngineClearEmptiesTheRouterIndexAndMakesTheMirrorExact(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m, seq: 10}
	a := newPrompt(1, 2, testBS)
	f.batch(a.stored(0, 2))
	assert.Equal(t, 0.0, testutil.ToFloat64(m.m.exact), "joined mid-stream")
	f.batch(enginekv.Event{Kind: enginekv.AllBlocksCleared})
	router.holdsExactly(t, "w1", nil, "after the engine's clear")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.exact))
}

func TestReconfiguringTheBlockSizeStartsOverAndRehashesWithTheNewSize(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	f := &feeder{h: m}
	f.batch(newPrompt(1, 2, testBS).stored(0, 2))
	require.NoError(t, m.Configure(Shape{Model: testModel, BlockSize: 32, MaxEntries: 100}))
	router.holdsExactly(t, "w1", nil, "the old blocks are gone")
	c := newPrompt(2, 2, 32)
	f.batch(c.stored(0, 2))
	router.holdsExactly(t, "w1", c.want(testModel, 2), "32-token blocks")
	assert.Equal(t, 1.0, testutil.ToFloat64(m.m.repairs[repairReconfigured]))
}

func TestAMalformedDumpRequestIsCountedAndUnanswered(t *testing.T) {
	n := testenv.StartNATS(t)
	m := startMirror(t, n, "w1", testShape(), prometheus.NewRegistry())
	nc := n.Conn(t)
	// The mirror subscribes in Run: a dump it answers shows it listens, so
	// none of the malformed requests below can be published before that.
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := nc.Request("sy."+testCluster+".kvdump.w1", wire.EncodeKVDumpRequest(&wire.KVDumpRequest{}), 200*time.Millisecond)
		return err == nil
	}, "the mirror answers dump requests")
	for _, body := range []string{"", "{", `{"version":99}`, `{"version":1,"max_blocks_per_chunk":-1}`} {
		require.NoError(t, nc.Publish("sy."+testCluster+".kvdump.w1", []byte(body)))
	}
	require.NoError(t, nc.Flush())
	testenv.Eventually(t, 5*1e9, func() bool { return testutil.ToFloat64(m.m.dumps[dumpMalformed]) == 4 }, "malformed dump requests counted")
}

func TestAnEngineHashStoredAgainWithOtherTokensMovesToTheNewHashOnRouters(t *testing.T) {
	n := testenv.StartNATS(t)
	router := startRouterIndex(t, n, "w1", 2048)
	reg := prometheus.NewRegistry()
	m := startMirror(t, n, "w1", testShape(), reg)
	f := &feeder{h: m}
	a := newPrompt(1, 2, testBS)
	b := newPrompt(2, 2, testBS)
	b.engine = a.engine // same engine hashes, other tokens
	f.batch(a.stored(0, 2))
	f.batch(b.stored(0, 2))
	router.holdsExactly(t, "w1", b.want(testModel, 2), "the newest mapping, and nothing of a")
	assert.Equal(t, 2.0, testutil.ToFloat64(m.m.conflicts))
	f.batch(b.removed(0, 2), b.removed(0, 2)) // both stores of each hash
	router.holdsExactly(t, "w1", nil, "nothing outlives the removals")
	assert.Equal(t, 0, m.Blocks())
}
