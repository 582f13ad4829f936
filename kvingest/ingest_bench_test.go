package kvingest

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/wire"
)

// The shape of one engine's KV event batch at the load of
// docs/benchmarks.md §1 (Mooncake, 6× compressed, 8 engines): 17.6
// batches, 61.5 events, 1,351 stored and 1,061 removed blocks a second, so
// about 77 stored and 60 removed blocks in 3.5 events a batch.
const (
	ingestStoredPerBatch  = 77
	ingestRemovedPerBatch = 60
	ingestBatchesPerSec   = 17.6
)

// ingestFeed is a fleet's pre-encoded batches, worker by worker in turn,
// each worker's event ids contiguous from 1 (so the index never resets a
// worker and never asks for a dump).
type ingestFeed struct {
	subjects []string
	payloads [][]byte
	lastID   []uint64 // batch i's last event id
	blocks   int      // stored + removed blocks over all batches
}

// newIngestFeed builds rounds batches for each of workers engines: a
// stored chain of 64 blocks and one of 13 chained to it, and the removal of
// 60 of the blocks stored two batches earlier.
// With pubSample > 1 the batches are what an adapter with -kv-sample
// pubSample publishes: only the sampled hashes.
func newIngestFeed(cluster string, workers, rounds, pubSample int) *ingestFeed {
	subj := wire.NewSubjects(cluster)
	f := &ingestFeed{}
	last := make([]uint64, workers)
	history := make([][][]uint64, workers) // the chains each worker stored, per round
	var buf []byte
	now := time.Now().UnixNano()
	for r := range rounds {
		for w := range workers {
			name := fmt.Sprintf("engine-%05d", w)
			hs := chain(uint64(w)<<20|uint64(r), ingestStoredPerBatch)
			history[w] = append(history[w], hs)
			var parent *uint64
			if r > 0 {
				prev := history[w][r-1]
				parent = ptr(prev[len(prev)-1])
			}
			events := []wire.KVEvent{stored(parent, hs[:64]...), stored(ptr(hs[63]), hs[64:]...)}
			if r >= 2 {
				events = append(events, removed(history[w][r-2][ingestStoredPerBatch-ingestRemovedPerBatch:]...))
				f.blocks += ingestRemovedPerBatch
			}
			f.blocks += ingestStoredPerBatch
			b := batch(name, 7, last[w]+1, events...)
			b.TimeUnixNano = now
			if pubSample > 1 {
				b.Sample = pubSample
				for i := range b.Events {
					b.Events[i].Hashes = kvindex.KeepSampled(slices.Clone(b.Events[i].Hashes), pubSample)
				}
			}
			last[w] = b.LastID()
			buf = wire.AppendKVEventBatch(buf[:0], b)
			f.subjects = append(f.subjects, subj.KV(name))
			f.payloads = append(f.payloads, append([]byte(nil), buf...))
			f.lastID = append(f.lastID, b.LastID())
		}
	}
	return f
}

// BenchmarkSubscriberIngest is the CPU one replica spends per KV event
// batch on the whole ingest path: the NATS client's receive (socket reads,
// protocol parse, the message and its hand-off to an apply shard), the wire
// decode and the index apply. The NATS server is another process
// (testenv.StartNATSProcess); the publisher shares the benchmark's process,
// so each round also publishes the same number of batches to a subject
// nobody subscribes to, and the ingest's cost is the difference of the two
// passes' process CPU (three interleaved rounds, the median reported).
// Publishing is paced in chunks well under the subscription's pending
// limit, so nothing is dropped, and the benchmark fails if any batch went
// unapplied or any worker was reset.
//
// Reported: ingest CPU per batch and per block, and the cores one replica
// spends at 10,000 engines at §1's batch rate (17.6 a second per engine)
// at this index's size: -ingest.workers engines of about 150 blocks each
// (the apply cost of an index of 2,000 blocks an engine is the index
// section's, docs/benchmarks.md §10).
func BenchmarkSubscriberIngest(b *testing.B) {
	for _, c := range []struct{ index, adapter int }{{1, 1}, {32, 1}, {32, 32}} {
		name := fmt.Sprintf("index-sample=%d/kv-sample=%d", c.index, c.adapter)
		b.Run(name, func(b *testing.B) { benchIngest(b, c.index, c.adapter, false) })
	}
	// The floor: the same messages received by a bare synchronous
	// subscription that decodes and applies nothing.
	b.Run("receive-only", func(b *testing.B) { benchIngest(b, 1, 1, true) })
}

// ingestWorkers is the fleet BenchmarkSubscriberIngest publishes for.
var ingestWorkers = flag.Int("ingest.workers", 1000, "BenchmarkSubscriberIngest: engines publishing (the index holds about 150 blocks of each)")

func benchIngest(b *testing.B, sample, pubSample int, receiveOnly bool) {
	workers := *ingestWorkers
	const (
		cluster = "ingestbench"
		rounds  = 3
		chunk   = 4096 // batches published before waiting for the index: well under PendingMsgs
	)
	// Two warm-up batches per worker, then each round's share.
	per := max(workers, b.N/rounds/workers*workers)
	feed := newIngestFeed(cluster, workers, 2+rounds*per/workers, pubSample)

	srv := testenv.StartNATSProcess(b)
	icfg := kvindex.DefaultConfig()
	icfg.Sample = sample
	icfg.MaxWorkers = max(icfg.MaxWorkers, workers+1) // every engine of the feed
	reg := prometheus.NewRegistry()
	ix, err := kvindex.New(icfg, nil, zap.NewNop(), reg)
	require.NoError(b, err)
	cfg := DefaultConfig()
	cfg.Cluster = cluster
	sub, err := NewSubscriber(cfg, srv.Conn(b), ix, zap.NewNop(), reg)
	require.NoError(b, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	var received atomic.Int64
	if receiveOnly {
		raw, err := srv.Conn(b).SubscribeSync(wire.NewSubjects(cluster).KVAll())
		require.NoError(b, err)
		require.NoError(b, raw.SetPendingLimits(cfg.PendingMsgs, -1))
		go func() {
			for {
				if _, err := raw.NextMsgWithContext(ctx); err != nil {
					done <- nil
					return
				}
				received.Add(1)
			}
		}()
	} else {
		go func() { done <- sub.Run(ctx) }()
	}
	defer func() {
		cancel()
		require.NoError(b, <-done)
	}()
	pub := srv.Conn(b)

	// waitApplied waits until every batch before upTo is applied: each
	// worker's last batch before upTo is among the last workers of them.
	waitApplied := func(upTo int) {
		deadline := time.Now().Add(30 * time.Second)
		if receiveOnly {
			for received.Load() < int64(upTo) {
				if time.Now().After(deadline) {
					b.Fatalf("%d of %d batches received within 30s", received.Load(), upTo)
				}
				time.Sleep(100 * time.Microsecond)
			}
			return
		}
		for i := max(0, upTo-workers); i < upTo; i++ {
			name := wire.WorkerFromSubject(feed.subjects[i])
			for {
				d, _ := ix.Digest(name)
				if d.LastID >= feed.lastID[i] {
					break
				}
				if time.Now().After(deadline) {
					b.Fatalf("batch %d of %s (id %d) not applied within 30s: the index is at %d", i, name, feed.lastID[i], d.LastID)
				}
				time.Sleep(100 * time.Microsecond)
			}
		}
	}
	// publish sends batches [from, to) and returns the process CPU it took;
	// to a subject nobody reads when sink, else to the workers' subjects,
	// waiting for the index to apply each chunk.
	publish := func(from, to int, sink bool) time.Duration {
		c0 := testenv.ProcessCPU()
		for start := from; start < to; start += chunk {
			end := min(to, start+chunk)
			for i := start; i < end; i++ {
				s := feed.subjects[i]
				if sink {
					s = "sink." + s
				}
				if err := pub.Publish(s, feed.payloads[i]); err != nil {
					b.Fatal(err)
				}
			}
			require.NoError(b, pub.Flush())
			if !sink {
				waitApplied(end)
			}
		}
		runtime.GC() // each pass pays for collecting its own garbage
		return testenv.ProcessCPU() - c0
	}
	publish(0, 2*workers, false) // every worker known, the removals' history in place
	var costs [rounds]float64
	b.ResetTimer()
	for r := range rounds {
		from := 2*workers + r*per
		sinkCPU := publish(from, from+per, true)
		ingestCPU := publish(from, from+per, false)
		costs[r] = float64(ingestCPU-sinkCPU) / float64(per)
	}
	b.StopTimer()
	for w := range workers {
		c := ix.EventCounts(fmt.Sprintf("engine-%05d", w))
		require.Zero(b, c.Resets, "engine-%05d was reset: the benchmark would measure dumps", w)
	}
	slices.Sort(costs[:])
	perBatch := costs[rounds/2]
	blocksPerBatch := float64(feed.blocks) / float64(len(feed.payloads))
	b.ReportMetric(perBatch/1e3, "cpu-us/batch")
	b.ReportMetric(perBatch/blocksPerBatch, "cpu-ns/block")
	b.ReportMetric(perBatch*ingestBatchesPerSec*10_000/1e9, "cores@10k-engines")
}
