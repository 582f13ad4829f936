package adapter

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
)

const (
	benchChains       = 4  // stored events per batch, one chain each
	benchChainBlocks  = 32 // blocks per chain
	benchBatchBlocks  = benchChains * benchChainBlocks
	benchDistinctRuns = 64 // batches prepared; each loop shifts their hashes and first tokens
)

// benchBatches are engine batches of BlockStored events, as a busy vLLM
// publishes them (a prefill's worth of blocks per event).
func benchBatches() []enginekv.Batch {
	out := make([]enginekv.Batch, benchDistinctRuns)
	for i := range out {
		for c := 0; c < benchChains; c++ {
			p := newPrompt(uint32(i*benchChains+c), benchChainBlocks, testBS)
			out[i].Events = append(out[i].Events, p.stored(0, benchChainBlocks))
		}
		out[i].Seq = uint64(i)
	}
	return out
}

// benchShift is added to every engine hash on each reuse of a prepared
// batch. It must not be a multiple of newPrompt's hash step (the golden
// ratio constant): shifted hashes would then land on other prompts' hashes
// and the benchmark would measure re-stores instead of new blocks.
const benchShift = 0xD1B54A32D192ED03

// shift makes a prepared batch new: other engine hashes and other tokens at
// each chain's start (so other Switchyard hashes all along the chain).
func shift(b *enginekv.Batch, delta uint64) {
	for i := range b.Events {
		e := &b.Events[i]
		for j := range e.BlockHashes {
			e.BlockHashes[j] += delta
		}
		e.TokenIDs[0] += uint32(delta)
	}
}

// BenchmarkMirror measures the adapter's hot path: apply an engine batch to
// the mirror, rehash its blocks, encode the wire batch and publish it to a
// real NATS server on loopback. Every block is new and the map is full, so
// each store also evicts one (the same map work as a healthy engine's
// store plus its later BlockRemoved). entries is the map bound: 4096 stays
// in the CPU caches, 262144 is the default for a 65536-block engine. Run it
// with -cpu 1 for blocks/s per core; BenchmarkRehashOnly is the baseline of
// the same run (the hashing alone).
func BenchmarkMirror(b *testing.B) {
	for _, entries := range []int{4096, 4 * 65536} {
		b.Run(fmt.Sprintf("entries=%d", entries), func(b *testing.B) { benchMirror(b, entries) })
	}
}

func benchMirror(b *testing.B, entries int) {
	m := newBenchMirror(b, testBS, entries)
	batches := benchBatches()
	// Fill the map first, so the timed loop is the steady state.
	for i := 0; i*benchBatchBlocks < entries; i++ {
		bt := &batches[i%benchDistinctRuns]
		shift(bt, benchShift)
		m.Batch(*bt)
	}
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), testenv.ProcessCPU()
	for i := 0; b.Loop(); i++ {
		bt := &batches[i%benchDistinctRuns]
		shift(bt, benchShift)
		m.Batch(*bt)
	}
	el, cpu := time.Since(start), testenv.ProcessCPU()-cpu0
	b.StopTimer()
	if c := testutil.ToFloat64(m.m.conflicts); c != 0 {
		b.Fatalf("%v engine hash conflicts: the benchmark re-stored hashes instead of storing new ones", c)
	}
	blocks := float64(b.N) * benchBatchBlocks
	b.ReportMetric(blocks/el.Seconds(), "blocks/s")
	b.ReportMetric(float64(el.Nanoseconds())/blocks, "ns/block")
	// Per CPU-second of the whole process, the in-process NATS server's
	// share of delivering the batches included: "per core" without the
	// time other processes of a shared machine took.
	if cpu > 0 {
		b.ReportMetric(blocks/cpu.Seconds(), "blocks/cpu-s")
	}
}

// BenchmarkRehashOnly is BenchmarkMirror's baseline: the same blocks
// through kvindex.SequenceHashes and nothing else.
func BenchmarkRehashOnly(b *testing.B) {
	batches := benchBatches()
	seed := kvindex.ModelSeed(testModel)
	var dst []uint64
	b.ResetTimer()
	start := time.Now()
	for i := 0; b.Loop(); i++ {
		bt := &batches[i%benchDistinctRuns]
		shift(bt, benchShift)
		for j := range bt.Events {
			dst = kvindex.AppendSequenceHashes(dst[:0], bt.Events[j].TokenIDs, testBS, seed)
		}
	}
	el := time.Since(start)
	blocks := float64(b.N) * benchBatchBlocks
	b.ReportMetric(blocks/el.Seconds(), "blocks/s")
	b.ReportMetric(float64(el.Nanoseconds())/blocks, "ns/block")
}

// BenchmarkEventToRouterIndex measures the delay from an engine batch
// reaching the mirror (Handler.Batch) to a router's index, fed by a real
// kvingest.Subscriber over loopback NATS, holding its last block. Each
// iteration stores one 8-block prompt and spins until the router has it.
// Once enginekv merges, the same measurement through ZMQ adds the
// subscriber's decode.
func BenchmarkEventToRouterIndex(b *testing.B) {
	n := testenv.StartNATS(b)
	router := startRouterIndexTB(b, n, "bench", 1<<20)
	// Heartbeats and dumps run as in production (a heartbeat every 20 ms).
	m := startMirror(b, n, "bench", Shape{Model: testModel, BlockSize: testBS, MaxEntries: 1 << 20}, prometheus.NewRegistry())
	f := &feeder{h: m}
	// Warm up: the router's first contact and subscription.
	warm := newPrompt(0, 1, testBS)
	f.batch(warm.stored(0, 1))
	deadline := time.Now().Add(10 * time.Second)
	for !router.ix.Held("bench", warm.want(testModel, 1)[0]) {
		if time.Now().After(deadline) {
			b.Fatal("router never indexed the warm-up block")
		}
		time.Sleep(time.Millisecond)
	}
	var lat []time.Duration
	b.ResetTimer()
	for i := 1; b.Loop(); i++ {
		b.StopTimer()
		p := newPrompt(uint32(i), 8, testBS)
		last := p.want(testModel, 8)[7]
		ev := p.stored(0, 8)
		b.StartTimer()
		t0 := time.Now()
		f.batch(ev)
		pollUntil(b, t0, func() bool { return router.ix.Held("bench", last) }, "block %d never reached the router", i)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatencies(b, lat)
}

// BenchmarkNATSDeliveryBaseline is BenchmarkEventToRouterIndex's baseline
// in the same run: one small message through the same loopback NATS to a
// subscriber, observed with the same polling. The difference is the
// adapter's and the router's own work.
func BenchmarkNATSDeliveryBaseline(b *testing.B) {
	n := testenv.StartNATS(b)
	pub, subc := n.Conn(b), n.Conn(b)
	var got atomic.Uint64
	sub, err := subc.Subscribe("baseline", func(m *nats.Msg) { got.Store(binary.LittleEndian.Uint64(m.Data)) })
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := subc.Flush(); err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	var buf [8]byte
	for i := uint64(1); b.Loop(); i++ {
		t0 := time.Now()
		binary.LittleEndian.PutUint64(buf[:], i)
		if err := pub.Publish("baseline", buf[:]); err != nil {
			b.Fatal(err)
		}
		pollUntil(b, t0, func() bool { return got.Load() == i }, "message %d never arrived", i)
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportLatencies(b, lat)
}

// pollUntil polls done every 20 µs, the same way for a benchmark and its
// baseline, and fails the benchmark 5 s after t0.
func pollUntil(b *testing.B, t0 time.Time, done func() bool, format string, args ...any) {
	for !done() {
		if time.Since(t0) > 5*time.Second {
			b.Fatalf(format, args...)
		}
		time.Sleep(20 * time.Microsecond)
	}
}

// reportLatencies reports the median, 99th percentile and largest of lat.
func reportLatencies(b *testing.B, lat []time.Duration) {
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50_us")
	b.ReportMetric(q(0.99), "p99_us")
	b.ReportMetric(q(1), "max_us")
}

// newBenchMirror returns a mirror of worker "bench" publishing to a real
// NATS server on loopback, configured for blockSize and entries.
func newBenchMirror(b *testing.B, blockSize, entries int) *Mirror {
	b.Helper()
	return newBenchMirrorOn(b, testenv.StartNATS(b).Conn(b), blockSize, entries)
}

// newBenchMirrorOn is newBenchMirror publishing on nc.
func newBenchMirrorOn(b *testing.B, nc *nats.Conn, blockSize, entries int) *Mirror {
	b.Helper()
	cfg := DefaultMirrorConfig()
	cfg.Worker, cfg.Cluster = "bench", testCluster
	m, err := NewMirror(cfg, nc, nil, prometheus.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	if err := m.Configure(Shape{Model: testModel, BlockSize: blockSize, MaxEntries: entries}); err != nil {
		b.Fatal(err)
	}
	return m
}
