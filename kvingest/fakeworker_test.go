package kvingest

import (
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// fakeWorker is a tiny engine stand-in for integration tests: it keeps the
// true block set, publishes the events that change it on NATS exactly as an
// engine does (ids from 1 per instance, parents on stored chains) and
// answers dumps in chunks. Publishing happens under mu so that a dump's
// AsOfID always matches the events published before it.
type fakeWorker struct {
	t          testing.TB
	nc         *nats.Conn
	subj       wire.Subjects
	name       string
	chunkSize  int
	rng        *rand.Rand
	prompts    [][]uint64
	dumpSub    *nats.Subscription
	mu         sync.Mutex
	instance   uint64
	nextID     uint64
	held       map[uint64]bool
	dumpsTaken int
}

func newFakeWorker(t testing.TB, nc *nats.Conn, cluster, name string, seed uint64) *fakeWorker {
	w := &fakeWorker{
		t: t, nc: nc, subj: wire.NewSubjects(cluster), name: name, chunkSize: 7,
		rng: rand.New(rand.NewPCG(seed, 99)), instance: seed<<32 | 1, nextID: 1, held: map[uint64]bool{},
	}
	// Prompts share system-prompt prefixes, as real traffic does.
	systems := [][]uint64{chain(seed*1000+1, 6), chain(seed*1000+2, 3)}
	for i := 0; i < 30; i++ {
		p := chain(seed*1000+10+uint64(i), 4+w.rng.IntN(8))
		if i%3 != 2 {
			sys := systems[i%2]
			p = append(slices.Clone(sys), p...)
		}
		w.prompts = append(w.prompts, p)
	}
	return w
}

// serveDumps answers dump requests until the test ends.
func (w *fakeWorker) serveDumps() {
	sub, err := w.nc.Subscribe(w.subj.KVDump(w.name), w.answerDump)
	require.NoError(w.t, err)
	require.NoError(w.t, w.nc.Flush())
	w.dumpSub = sub
	w.t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func (w *fakeWorker) answerDump(m *nats.Msg) {
	req, err := wire.DecodeKVDumpRequest(m.Data)
	if err != nil {
		w.t.Errorf("fake worker got a bad dump request: %v", err)
		return
	}
	size := w.chunkSize
	if req.MaxBlocksPerChunk > 0 {
		size = req.MaxBlocksPerChunk
	}
	w.mu.Lock()
	hashes := make([]uint64, 0, len(w.held))
	for h := range w.held {
		hashes = append(hashes, h)
	}
	instance, asOf := w.instance, w.nextID-1
	w.dumpsTaken++
	w.mu.Unlock()
	for seq := uint32(0); ; seq++ {
		n := min(size, len(hashes))
		c := &wire.KVDumpChunk{Worker: w.name, Instance: instance, AsOfID: asOf, Seq: seq,
			Final: n == len(hashes), Hashes: hashes[:n]}
		hashes = hashes[n:]
		if err := w.nc.Publish(m.Reply, wire.AppendKVDumpChunk(nil, c)); err != nil {
			return // the connection is closing with the test
		}
		if c.Final {
			return
		}
	}
}

// step changes the cache a little and publishes the events as one batch.
func (w *fakeWorker) step() {
	w.mu.Lock()
	defer w.mu.Unlock()
	var events []wire.KVEvent
	for n := 1 + w.rng.IntN(3); n > 0; n-- {
		p := w.prompts[w.rng.IntN(len(w.prompts))]
		k := 0 // held prefix length
		for k < len(p) && w.held[p[k]] {
			k++
		}
		switch r := w.rng.IntN(40); {
		case r == 0:
			clear(w.held)
			events = append(events, wire.KVEvent{Kind: wire.KVCleared})
		case r < 14 && k > 0:
			// Evict a tail of the held prefix, leaves first.
			j := w.rng.IntN(k)
			for _, h := range p[j:k] {
				delete(w.held, h)
			}
			events = append(events, removed(slices.Clone(p[j:k])...))
		case k < len(p):
			end := k + 1 + w.rng.IntN(len(p)-k)
			var parent *uint64
			if k > 0 {
				parent = ptr(p[k-1])
			}
			for _, h := range p[k:end] {
				w.held[h] = true
			}
			events = append(events, stored(parent, slices.Clone(p[k:end])...))
		}
	}
	w.publishLocked(events)
}

func (w *fakeWorker) publishLocked(events []wire.KVEvent) {
	b := &wire.KVEventBatch{Worker: w.name, Instance: w.instance, FirstID: w.nextID,
		TimeUnixNano: time.Now().UnixNano(), Events: events}
	w.nextID += uint64(len(events))
	require.NoError(w.t, w.nc.Publish(w.subj.KV(w.name), wire.AppendKVEventBatch(nil, b)))
}

// heartbeat publishes an empty batch so consumers notice lost trailing ones.
func (w *fakeWorker) heartbeat() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.publishLocked(nil)
}

// restart simulates an engine restart: new instance, ids from 1, empty cache.
func (w *fakeWorker) restart() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.instance++
	w.nextID = 1
	clear(w.held)
}

// truth returns the worker's blocks, sorted, and its digest.
func (w *fakeWorker) truth() ([]uint64, uint64, uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	hs := make([]uint64, 0, len(w.held))
	for h := range w.held {
		hs = append(hs, h)
	}
	return sortedHashes(hs), w.instance, w.nextID - 1
}

// matches reports whether ix holds exactly the worker's true block set as of
// its last published event.
func (w *fakeWorker) matches(ix *kvindex.Index) bool {
	want, instance, last := w.truth()
	d, ok := ix.Digest(w.name)
	if !ok || !d.Synced || d.Instance != instance || d.LastID != last || d.Blocks != len(want) {
		return false
	}
	return slices.Equal(want, sortedHashes(ix.WorkerHashes(w.name, nil)))
}
