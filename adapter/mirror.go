package adapter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// MirrorConfig configures a Mirror.
type MirrorConfig struct {
	// Worker is the worker id the mirror publishes as.
	Worker string
	// Cluster names the NATS subject tree.
	Cluster string
	// HeartbeatInterval is the period of empty batches that reveal a lost
	// trailing batch to routers; the simulated worker reports its last
	// event id at the same period (its load reports, every 100 ms).
	HeartbeatInterval time.Duration
	// DumpChunkBlocks is the default number of hashes per dump reply chunk.
	DumpChunkBlocks int
	// MaxBatchHashes bounds the hashes of one published batch: a longer
	// engine batch is split, so a batch stays well under NATS' payload limit
	// (8 bytes a hash; the default 65536 is 512 KiB).
	MaxBatchHashes int
	// Tier is the storage tier the mirror follows (kvindex.TierGPU, the
	// zero value, or a lower one: then Worker is the tier's stream name,
	// kvindex.TierStream). Blocks of every other tier are skipped.
	Tier kvindex.Tier
	// Sample makes the published batches carry only the hashes
	// kvindex.Sampled keeps at this rate (0 or 1: every hash), for routers
	// whose -index.sample is at least this: they would drop the others on
	// arrival. Fewer bytes on NATS and less to decode on every router;
	// every event is still published (some with no hashes), so event ids
	// are unchanged. Dumps carry the same sampled view: a router finer than
	// the mirror (a misconfiguration it counts) then holds what the batches
	// tell it, and their removals reach every hash it holds; one at the
	// mirror's rate or coarser loses nothing (its sample keeps a subset).
	Sample int
}

// DefaultMirrorConfig returns the mirror's defaults.
func DefaultMirrorConfig() MirrorConfig {
	return MirrorConfig{Cluster: "default", HeartbeatInterval: 100 * time.Millisecond,
		DumpChunkBlocks: 4096, MaxBatchHashes: 1 << 16}
}

// Validate names the first bad field.
func (c MirrorConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Worker):
		return fmt.Errorf("%w: mirror Worker %q must be 1-128 of [A-Za-z0-9_-]", ErrInvalidConfig, c.Worker)
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: mirror Cluster %q must be 1-128 of [A-Za-z0-9_-]", ErrInvalidConfig, c.Cluster)
	case c.HeartbeatInterval <= 0:
		return fmt.Errorf("%w: mirror HeartbeatInterval %v must be positive", ErrInvalidConfig, c.HeartbeatInterval)
	case c.DumpChunkBlocks <= 0 || c.DumpChunkBlocks > wire.MaxBlocksPerMessage:
		return fmt.Errorf("%w: mirror DumpChunkBlocks %d must be in [1, %d]", ErrInvalidConfig, c.DumpChunkBlocks, wire.MaxBlocksPerMessage)
	case c.MaxBatchHashes <= 0 || c.MaxBatchHashes > wire.MaxBlocksPerMessage:
		return fmt.Errorf("%w: mirror MaxBatchHashes %d must be in [1, %d]", ErrInvalidConfig, c.MaxBatchHashes, wire.MaxBlocksPerMessage)
	case c.Sample < 0 || c.Sample > kvindex.MaxSample:
		return fmt.Errorf("%w: mirror Sample %d must be in [0, %d]", ErrInvalidConfig, c.Sample, kvindex.MaxSample)
	}
	return nil
}

// Shape is what the mirror must know of the engine before it can rehash:
// the name blocks without a LoRA are salted with, the engine's block size
// and the bound of the engine-hash map.
type Shape struct {
	Model      string
	BlockSize  int
	MaxEntries int
}

// engEntry is one engine block hash the mirror knows.
//
// 16 bytes (24 a slot with its key), so the map at the default bound
// (131,072 slots for a 65,536-block engine) is 3 MB rather than 4: it is
// cache misses that the map costs. gen is the low 32 bits of the order's
// gen, which identify it within the order's ring (never near 2^32 slots).
type engEntry struct {
	sy  uint64 // the Switchyard sequence hash of the block
	ref uint32 // stored and not yet removed copies (vLLM may cache one hash twice)
	gen uint32 // insertion number: its place in the mirror's order
}

// Mirror follows one engine's KV cache from its decoded events
// (enginekv.Handler), recomputes Switchyard sequence hashes from the stored
// blocks' tokens, and publishes the resulting changes to routers as the
// worker's wire.KVEventBatch stream, with its own event ids and heartbeats.
// It answers kvdump requests from its current block set.
//
// Batch and Reset are called by one goroutine (the enginekv subscriber);
// dump requests arrive on nats.go's subscription goroutine and heartbeats
// on Run's. One mutex serialises them all, so a dump's AsOfID is exactly
// the last id published before its snapshot, and ids never interleave.
type Mirror struct {
	cfg      MirrorConfig
	nc       *nats.Conn
	subject  string
	dumpSubj string
	log      *zap.Logger
	m        *mirrorMetrics
	now      func() time.Time

	mu       sync.Mutex
	shape    Shape
	baseSeed uint64
	seeds    map[string]uint64 // LoRA name -> seed, a small cache
	instance uint64
	lastID   uint64
	exact    bool // every block the engine holds is known (see doc.go)
	fresh    bool // no batch since the start or the last reset
	engine   table[engEntry]
	// refs holds every Switchyard hash some engine hash maps to; shared
	// counts the engine hashes beyond the first for the rare hash that
	// several map to. A set of bare keys (8-byte slots, half the cache
	// footprint of a count beside each) with the count on the side.
	refs       table[struct{}]
	shared     map[uint64]uint32
	ord        order // engine hashes in insertion order, for eviction
	pending    []wire.KVEvent
	arena      []uint64 // backing store of pending events' hashes
	stale      []uint64 // scratch: hashes a store's conflicts displaced
	buf        []byte
	configured bool
	// Counts of the batch being applied, added to their counters once
	// per flush rather than once per block.
	nStored, nRemoved int
	// sink keeps touchLocked's loads from being optimised away.
	sink uint64
	// above resolves engine hashes a lower tier's events name without
	// tokens or with a parent only the GPU tier knows (tiers.go); nil for
	// the GPU mirror.
	above *Mirror
}

// NewMirror returns a mirror publishing on nc. It starts nothing; Run
// answers dumps and sends heartbeats.
func NewMirror(cfg MirrorConfig, nc *nats.Conn, log *zap.Logger, reg prometheus.Registerer) (*Mirror, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if nc == nil {
		return nil, fmt.Errorf("%w: mirror needs a NATS connection", ErrInvalidConfig)
	}
	if log == nil {
		log = zap.NewNop()
	}
	subj := wire.NewSubjects(cfg.Cluster)
	m := &Mirror{
		cfg: cfg, nc: nc, subject: subj.KV(cfg.Worker), dumpSubj: subj.KVDump(cfg.Worker),
		log: log.Named("mirror"), m: newMirrorMetrics(reg), now: time.Now,
		seeds: map[string]uint64{}, shared: map[uint64]uint32{}, instance: newInstance(), fresh: true,
	}
	return m, nil
}

// newInstance is a fresh nonzero random engine instance.
func newInstance() uint64 {
	for {
		if v := rand.Uint64(); v != 0 {
			return v
		}
	}
}

// Configure sets the engine's shape. A change after the first call (the
// engine restarted with another block size or model) forgets the mirror:
// blocks hashed under the old shape would never match a request again.
func (m *Mirror) Configure(s Shape) error {
	if s.Model == "" || s.BlockSize <= 0 || s.MaxEntries <= 0 {
		return fmt.Errorf("%w: mirror shape %+v needs a model, a block size and a positive entry bound", ErrInvalidConfig, s)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.configured && s == m.shape {
		return nil
	}
	changed := m.configured && (s.Model != m.shape.Model || s.BlockSize != m.shape.BlockSize)
	m.shape = s
	m.baseSeed = kvindex.ModelSeed(s.Model)
	clear(m.seeds)
	m.configured = true
	if changed {
		m.restartLocked(repairReconfigured)
		m.flushLocked()
	} else {
		m.evictOverflowLocked()
		m.flushLocked()
	}
	return nil
}

// Position is the mirror's current instance and last published event id,
// what a load report carries so routers notice a lost trailing batch.
func (m *Mirror) Position() (instance, lastID uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.instance, m.lastID
}

// Blocks is the number of distinct Switchyard hashes mirrored.
func (m *Mirror) Blocks() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refs.Len()
}

// Batch applies one engine batch and publishes what changed
// (enginekv.Handler).
func (m *Mirror) Batch(b enginekv.Batch) { m.BatchTransient(&b) }

// BatchTransient is Batch for a batch the mirror may not keep
// (enginekv.TransientHandler): it keeps nothing of b, so the subscriber
// decodes every payload into the same memory.
func (m *Mirror) BatchTransient(b *enginekv.Batch) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if b.Unknown > 0 {
		m.m.unknownEvents.Add(float64(b.Unknown))
	}
	if !m.configured {
		// Without the block size nothing can be rehashed; what is lost
		// here makes later stores orphans, so the mirror is inexact.
		for i := range b.Events {
			m.m.skipped[skipUnconfigured].Add(float64(len(b.Events[i].BlockHashes)))
		}
		m.fresh, m.exact = false, false
		return
	}
	if m.fresh {
		m.fresh = false
		// Sequence 0 is the engine's first batch: its cache was empty
		// before it, so from here on every block it holds is known.
		m.exact = b.Seq == 0
		m.setExactGauge()
	}
	m.touchLocked(b)
	for i := range b.Events {
		m.applyLocked(&b.Events[i])
		if len(m.arena) >= m.cfg.MaxBatchHashes {
			m.flushLocked()
		}
	}
	m.flushLocked()
}

// Reset forgets the engine's cache: continuity with its event stream is
// lost (enginekv.Handler). Routers get Cleared under a new instance with
// ids from 1, which they apply without a dump, and the mirror rebuilds from
// live events.
func (m *Mirror) Reset(reason enginekv.ResetReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.m.engineResets.WithLabelValues(reason.String()).Inc()
	m.log.Info("engine event stream reset; mirror cleared under a new instance", zap.Stringer("reason", reason))
	m.restartLocked(repairEngineReset)
	m.fresh = true
	m.flushLocked()
}

// restart starts over under a new instance outside the Handler contract:
// the adapter calls it when its subscriber failed and continuity is lost.
func (m *Mirror) restart(r repairReason) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.restartLocked(r)
	m.fresh = true
	m.flushLocked()
}

// restartLocked drops everything (published or pending) and starts a new
// instance whose first event is Cleared.
func (m *Mirror) restartLocked(r repairReason) {
	m.m.repairs[r].Inc()
	m.engine.clear()
	m.refs.clear()
	clear(m.shared)
	m.ord.reset()
	m.pending, m.arena = m.pending[:0], m.arena[:0]
	m.instance, m.lastID = newInstance(), 0
	m.exact = false
	m.setExactGauge()
	m.pending = append(m.pending, wire.KVEvent{Kind: wire.KVCleared})
	m.setSizeGauges()
}

func (m *Mirror) setExactGauge() {
	if m.exact {
		m.m.exact.Set(1)
	} else {
		m.m.exact.Set(0)
	}
}

func (m *Mirror) setSizeGauges() {
	m.m.mirrored.Set(float64(m.refs.Len()))
	m.m.entries.Set(float64(m.engine.Len()))
}

func (m *Mirror) seedFor(lora string) uint64 {
	if lora == "" {
		return m.baseSeed
	}
	if s, ok := m.seeds[lora]; ok {
		return s
	}
	if len(m.seeds) >= 1024 { // names come from the engine: keep the cache bounded
		clear(m.seeds)
	}
	s := kvindex.ModelSeed(lora)
	m.seeds[lora] = s
	return s
}

// skipReason says why an event's blocks are not mirrored, or skipNone.
func (m *Mirror) skipReason(e *enginekv.Event) skipReason {
	if r := m.tierSkip(e); r != skipNone {
		return r
	}
	if e.GroupIdx != 0 {
		return skipGroup
	}
	if e.Kind != enginekv.BlockStored {
		return skipNone
	}
	switch {
	case e.BlockSize != m.shape.BlockSize:
		return skipBlockSize
	case len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize && !m.resolvable(e):
		return skipMalformed
	case e.LoRAID != 0 && e.LoRAName == "":
		// The seed is the adapter's name; an id alone cannot be hashed
		// the way routers hash the request.
		return skipLoRAUnnamed
	}
	return skipNone
}

// touchLocked brings into cache, before b is applied, the engine-map slot
// of every hash b names and, for removals, the slot of the Switchyard hash
// they release (see table.touch).
func (m *Mirror) touchLocked(b *enginekv.Batch) {
	var x uint64
	for i := range b.Events {
		for _, h := range b.Events[i].BlockHashes {
			x ^= m.engine.touch(h)
		}
	}
	for i := range b.Events {
		if e := &b.Events[i]; e.Kind == enginekv.BlockRemoved {
			for _, h := range e.BlockHashes {
				if sl, ok := m.engine.find(h); ok {
					x ^= m.refs.touch(m.engine.at(sl).sy)
				}
			}
		}
	}
	m.sink ^= x
}

func (m *Mirror) applyLocked(e *enginekv.Event) {
	switch e.Kind {
	case enginekv.BlockStored:
		m.storeLocked(e)
	case enginekv.BlockRemoved:
		if r := m.skipReason(e); r != skipNone {
			m.m.skippedRemovals[r].Add(float64(len(e.BlockHashes)))
			return
		}
		m.removeLocked(e.BlockHashes)
	case enginekv.AllBlocksCleared:
		if r := m.skipReason(e); r != skipNone {
			m.m.skippedRemovals[r].Inc()
			return
		}
		m.engine.clear()
		m.refs.clear()
		clear(m.shared)
		m.ord.reset()
		m.pending = append(m.pending, wire.KVEvent{Kind: wire.KVCleared})
		m.m.engineCleared.Inc()
		// The engine's cache is empty now: the mirror knows all of it.
		m.exact = true
		m.setExactGauge()
	default:
		m.m.unknownEvents.Inc()
	}
}

func (m *Mirror) storeLocked(e *enginekv.Event) {
	n := len(e.BlockHashes)
	if n == 0 {
		return
	}
	if r := m.skipReason(e); r != skipNone {
		m.m.skipped[r].Add(float64(n))
		return
	}
	var parent uint64
	// hasParent: the chain continues a known block; published: routers
	// hold that block on this stream too. A lower tier's chain may
	// continue a block only the GPU tier holds: routers would read that
	// parent as unknown on this stream, so its store goes out as a chain
	// start (the hashes are sequence hashes either way).
	hasParent, published := false, false
	if e.HasParent {
		pe, ok := m.engine.get(e.ParentHash)
		switch {
		case ok:
			parent, hasParent, published = pe.sy, true, true
		case m.above != nil:
			if parent, ok = m.above.resolve(e.ParentHash); ok {
				hasParent = true
				break
			}
			if e.ParentHash != 0 {
				m.unknownParentLocked(n)
				return
			}
			m.m.zeroParents.Add(float64(n))
		case e.ParentHash == 0:
			// Some vLLM-compatible publishers mark a chain's first block
			// with parent 0 rather than None, and other consumers read it
			// as no parent: a chain start, unless the engine really
			// stored a block hashed 0 (found above).
			m.m.zeroParents.Add(float64(n))
		default:
			m.unknownParentLocked(n)
			return
		}
	}
	start := len(m.arena)
	if len(e.TokenIDs) == 0 {
		// A lower tier's copy of blocks the GPU tier stored (resolvable:
		// skipReason let nothing else through).
		if !m.resolveLocked(e.BlockHashes) {
			m.arena = m.arena[:start]
			return
		}
	} else {
		seed := m.seedFor(e.LoRAName)
		bs := e.BlockSize
		prev := parent
		for i := range e.BlockHashes {
			s := kvindex.BlockHash(e.TokenIDs[i*bs:(i+1)*bs], seed)
			if hasParent || i > 0 {
				s = kvindex.ChainHash(prev, s, seed)
			}
			prev = s
			m.arena = append(m.arena, s)
		}
	}
	end := len(m.arena)
	// All of the event's hashes first, then their reference slots
	// touched together (touchLocked's reason), then the inserts.
	var x uint64
	for _, s := range m.arena[start:end] {
		x ^= m.refs.touch(s)
	}
	m.sink ^= x
	m.stale = m.stale[:0]
	for i, h := range e.BlockHashes {
		if old, ok := m.insertLocked(h, m.arena[start+i]); ok {
			m.stale = append(m.stale, old)
		}
	}
	if !published {
		parent = 0
	}
	m.pending = append(m.pending, wire.KVEvent{Kind: wire.KVStored, Parent: parent, HasParent: published,
		Hashes: m.arena[start:end:end]})
	m.nStored += n
	if len(m.stale) > 0 {
		start = len(m.arena)
		m.arena = append(m.arena, m.stale...)
		m.appendRemovedLocked(start)
	}
	m.evictOverflowLocked()
}

// unknownParentLocked handles a store whose parent the mirror does not
// know. When the mirror is exact that cannot happen to a faithful stream:
// the mirror's view is wrong somewhere (a lost event nobody noticed), so it
// repairs by starting over under a new instance, which routers apply as
// Cleared. Otherwise (after a reset, a mid-stream join or an eviction) the
// parent is one the mirror never learnt: the chain cannot be rehashed and is
// skipped, leaving routers a miss rather than a wrong hit.
func (m *Mirror) unknownParentLocked(n int) {
	m.m.skipped[skipUnknownParent].Add(float64(n))
	if !m.exact {
		return
	}
	m.log.Warn("stored block's parent unknown while the mirror was exact; clearing under a new instance")
	m.restartLocked(repairUnknownParent)
}

// insertLocked maps engine hash h to Switchyard hash s. It reports the
// Switchyard hash h mapped to before when that was another one (and held no
// other reference), which the caller must remove on routers.
func (m *Mirror) insertLocked(h, s uint64) (stale uint64, hasStale bool) {
	sl, existed := m.engine.upsert(h)
	ent := m.engine.at(sl) // valid below: only refs changes until the end
	if existed {
		if ent.sy != s {
			// Same engine hash, other tokens or salt: an engine hash
			// collision, or an engine that salts with what events do not
			// carry. The newest store wins: h now means s, and the old
			// hash loses h's reference, so no entry outlives its removal.
			m.m.conflicts.Inc()
			hasStale = m.releaseLocked(ent.sy)
			stale = ent.sy
			ent.sy = s
			m.addRefLocked(s)
		}
		ent.ref++
		return stale, hasStale
	}
	// Making room in the order looks up at most one other entry and moves
	// no slot, so ent stays valid.
	m.orderRoomLocked()
	*ent = engEntry{sy: s, ref: 1, gen: uint32(m.ord.push(h))}
	m.addRefLocked(s)
	return 0, false
}

// orderRoomLocked makes room in the order for one more entry: it drops the
// gone entries at its head, grows it while it is at most twice the live
// entries plus 1024, and otherwise renews the oldest live entry (see order).
func (m *Mirror) orderRoomLocked() {
	if !m.ord.full() {
		return
	}
	if m.ord.skipDead(); !m.ord.full() {
		return
	}
	if len(m.ord.ring) < 2*m.engine.Len()+1024 {
		m.ord.grow()
		return
	}
	h, g, _ := m.ord.oldest()
	m.ord.drop(g)
	m.ord.skipDead()
	if sl, ok := m.engine.find(h); ok && m.engine.at(sl).gen == uint32(g) {
		m.engine.at(sl).gen = uint32(m.ord.push(h))
	}
}

func (m *Mirror) addRefLocked(s uint64) {
	if _, existed := m.refs.upsert(s); existed {
		m.shared[s]++
	}
}

func (m *Mirror) removeLocked(hashes []uint64) {
	start := len(m.arena)
	for _, h := range hashes {
		sl, ok := m.engine.find(h)
		if !ok {
			// Stored before the mirror's start, skipped, or evicted.
			m.m.unknownRemoved.Inc()
			continue
		}
		ent := m.engine.at(sl)
		if ent.ref > 1 {
			ent.ref--
			continue
		}
		sy := ent.sy
		m.ord.drop(uint64(ent.gen))
		m.engine.deleteAt(sl)
		if m.releaseLocked(sy) {
			m.arena = append(m.arena, sy)
		}
	}
	m.appendRemovedLocked(start)
}

// releaseLocked drops one reference to s and reports whether it was the
// last, so that s must be removed on routers.
func (m *Mirror) releaseLocked(s uint64) bool {
	if len(m.shared) > 0 {
		if n, ok := m.shared[s]; ok {
			if n <= 1 {
				delete(m.shared, s)
			} else {
				m.shared[s] = n - 1
			}
			return false
		}
	}
	m.refs.delete(s)
	m.nRemoved++
	return true
}

func (m *Mirror) appendRemovedLocked(start int) {
	if end := len(m.arena); end > start {
		m.pending = append(m.pending, wire.KVEvent{Kind: wire.KVRemoved, Hashes: m.arena[start:end:end]})
	}
}

// evictOverflowLocked keeps the engine-hash map within MaxEntries by
// forgetting its oldest entries. A forgotten block is removed on routers
// too (a miss there, never a stale hit), and its children can no longer be
// rehashed, so the mirror stops being exact.
func (m *Mirror) evictOverflowLocked() {
	if m.engine.Len() <= m.shape.MaxEntries {
		return
	}
	start := len(m.arena)
	for m.engine.Len() > m.shape.MaxEntries {
		h, g, ok := m.ord.oldest()
		if !ok {
			break
		}
		m.ord.drop(g)
		sl, ok := m.engine.find(h)
		if !ok || m.engine.at(sl).gen != uint32(g) {
			continue // cannot happen: every entry that leaves drops its gen
		}
		sy := m.engine.at(sl).sy
		m.engine.deleteAt(sl)
		m.m.evictions.Inc()
		if m.releaseLocked(sy) {
			m.arena = append(m.arena, sy)
		}
	}
	if m.exact {
		m.exact = false
		m.setExactGauge()
	}
	m.appendRemovedLocked(start)
}

// flushLocked publishes the pending events as one batch, and brings the
// counters and gauges up to date.
func (m *Mirror) flushLocked() {
	if m.nStored > 0 {
		m.m.stored.Add(float64(m.nStored))
	}
	if m.nRemoved > 0 {
		m.m.removed.Add(float64(m.nRemoved))
	}
	m.nStored, m.nRemoved = 0, 0
	m.setSizeGauges()
	if len(m.pending) == 0 {
		return
	}
	b := wire.KVEventBatch{Worker: m.cfg.Worker, Instance: m.instance, FirstID: m.lastID + 1,
		TimeUnixNano: m.now().UnixNano(), Events: m.pending}
	if m.cfg.Sample > 1 {
		b.Sample = m.cfg.Sample
		sampleEvents(b.Events, m.cfg.Sample)
	}
	m.buf = wire.AppendKVEventBatch(m.buf[:0], &b)
	// The ids are spent even if the publish fails: routers then see a gap
	// and repair from a dump, which is answered from this very state.
	m.lastID += uint64(len(m.pending))
	m.pending, m.arena = m.pending[:0], m.arena[:0]
	if err := m.nc.Publish(m.subject, m.buf); err != nil {
		m.m.batches[resultError].Inc()
		m.log.Debug("publish kv batch", zap.Error(err))
		return
	}
	m.m.batches[resultOK].Inc()
}

// sampleEvents keeps in each event's hashes only those kvindex.Sampled
// keeps at rate n, in place.
func sampleEvents(events []wire.KVEvent, n int) {
	for i := range events {
		events[i].Hashes = kvindex.KeepSampled(events[i].Hashes, n)
	}
}

// heartbeatLocked publishes an empty batch at the next id.
func (m *Mirror) heartbeatLocked() {
	b := wire.KVEventBatch{Worker: m.cfg.Worker, Instance: m.instance, FirstID: m.lastID + 1,
		TimeUnixNano: m.now().UnixNano()}
	m.buf = wire.AppendKVEventBatch(m.buf[:0], &b)
	if err := m.nc.Publish(m.subject, m.buf); err != nil {
		m.m.heartbeats[resultError].Inc()
		return
	}
	m.m.heartbeats[resultOK].Inc()
}

// Run answers dump requests and sends heartbeats until ctx ends. It returns
// nil then, or an error if it cannot subscribe.
func (m *Mirror) Run(ctx context.Context) error {
	sub, err := m.nc.Subscribe(m.dumpSubj, m.answerDump)
	if err != nil {
		return fmt.Errorf("adapter: subscribe %s: %w", m.dumpSubj, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	tick := time.NewTicker(m.cfg.HeartbeatInterval)
	defer tick.Stop()
	m.mu.Lock()
	m.heartbeatLocked() // routers learn the instance at once
	m.mu.Unlock()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			m.mu.Lock()
			m.heartbeatLocked()
			m.mu.Unlock()
		}
	}
}

// snapshot is the mirror's block set as of its last published id.
func (m *Mirror) snapshot() (instance, asOf uint64, hashes []uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	hashes = make([]uint64, 0, m.refs.Len())
	m.refs.each(func(h uint64, _ struct{}) { hashes = append(hashes, h) })
	return m.instance, m.lastID, hashes
}

// answerDump replies with the mirror's block set in chunks on the
// request's reply subject, like the simulated worker does.
func (m *Mirror) answerDump(msg *nats.Msg) {
	req, err := wire.DecodeKVDumpRequest(msg.Data)
	if err == nil && msg.Reply == "" {
		err = fmt.Errorf("%w: dump request without a reply subject", wire.ErrMalformed)
	}
	if err != nil {
		m.m.dumps[dumpMalformed].Inc()
		m.log.Warn("malformed kv dump request", zap.Error(err))
		return
	}
	per := m.cfg.DumpChunkBlocks
	if req.MaxBlocksPerChunk > 0 && req.MaxBlocksPerChunk < per {
		per = req.MaxBlocksPerChunk
	}
	instance, asOf, hs := m.snapshot()
	hs = kvindex.KeepSampled(hs, m.cfg.Sample) // hs is the snapshot's own copy
	var buf []byte
	for seq, off := uint32(0), 0; ; seq++ {
		end := min(off+per, len(hs))
		c := wire.KVDumpChunk{Worker: m.cfg.Worker, Instance: instance, AsOfID: asOf, Seq: seq,
			Final: end == len(hs), Hashes: hs[off:end]}
		buf = wire.AppendKVDumpChunk(buf[:0], &c)
		if err := m.nc.Publish(msg.Reply, buf); err != nil {
			m.m.dumps[dumpError].Inc()
			m.log.Warn("publish kv dump chunk", zap.Error(err))
			return
		}
		if c.Final {
			break
		}
		off = end
	}
	m.m.dumps[dumpOK].Inc()
}
