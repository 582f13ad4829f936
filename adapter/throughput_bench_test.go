package adapter

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/switchyard/switchyard/enginekv"
	"github.com/switchyard/switchyard/internal/testenv"
)

// The engine BenchmarkAdapterThroughput simulates: a vLLM-like engine of
// 65,536 GPU blocks of 16 tokens (the adapter's default map bound is then
// 4 × 65,536 = 262,144 entries), serving requests of a 1,024-token prompt
// and 256 generated tokens with a 128k vocabulary.
const (
	tpEngineBlocks  = 65536
	tpBlockSize     = 16
	tpPromptBlocks  = 64 // one prefill event: a 1,024-token prompt
	tpDecodeBlocks  = 16 // 256 generated tokens: a block every 16 steps
	tpRequestBlocks = tpPromptBlocks + tpDecodeBlocks
	tpVocab         = 128256
	// tpCycle is the number of requests after which the stream repeats
	// itself: more than twice the engine's capacity, so every block of a
	// request has been removed before the same request (same engine hashes,
	// same tokens) is stored again.
	tpCycle = 2*tpEngineBlocks/tpRequestBlocks + 2*tpDecodeBlocks
)

// tpStream is a simulated engine's event stream as raw msgpack payloads,
// one per engine step (a vLLM scheduler step publishes one batch).
type tpStream struct {
	warm [][]byte // fill the engine (and the mirror) to steady state
	loop [][]byte // the steady state, repeatable forever
	// storedPerStep is the number of blocks each loop payload stores (and
	// removes).
	storedPerStep int
}

// engineStream builds the payloads of an engine that starts one request
// per step, the way vLLM reports it (vllm/v1/core/block_pool.py,
// kv_cache_manager.py): every scheduler step caches each running request's
// newly full blocks in ONE BlockStored event chained to the request's
// previous block, so a step carries one prefill event of 64 blocks and 16
// decode events of one block each (16 running requests completing a block),
// and every evicted block is its own BlockRemoved event of one hash. The
// engine evicts its oldest blocks to stay at tpEngineBlocks. singleBlock
// splits every BlockStored into one event per block, chained: the worst
// case for per-event costs, the same blocks.
func engineStream(enc enginekv.Encoding, singleBlock bool) tpStream {
	rng := rand.New(rand.NewPCG(1, 2))
	tokens := make([][]uint32, tpCycle) // per request of the cycle
	for r := range tokens {
		tokens[r] = make([]uint32, tpRequestBlocks*tpBlockSize)
		for i := range tokens[r] {
			tokens[r][i] = uint32(rng.IntN(tpVocab))
		}
	}
	hash := func(r, j int) uint64 { // engine hash of request r's block j
		x := uint64(r%tpCycle*tpRequestBlocks+j+1) * 0x9E3779B97F4A7C15
		x ^= x >> 31
		return x*0xBF58476D1CE4E5B9 | 1
	}
	type blockRef struct{ r, j int }
	var live []blockRef // the engine's blocks, oldest first
	stored := func(r, from, to int) enginekv.Event {
		rc := r % tpCycle
		e := enginekv.Event{Kind: enginekv.BlockStored, BlockSize: tpBlockSize, Medium: "GPU",
			TokenIDs: tokens[rc][from*tpBlockSize : to*tpBlockSize]}
		for j := from; j < to; j++ {
			e.BlockHashes = append(e.BlockHashes, hash(r, j))
		}
		if from > 0 {
			e.ParentHash, e.HasParent = hash(r, from-1), true
		}
		return e
	}
	var s tpStream
	steps := 2 * tpCycle
	for step := 0; step < steps; step++ {
		var stores []enginekv.Event
		add := func(r, from, to int) {
			if !singleBlock {
				stores = append(stores, stored(r, from, to))
			} else {
				for j := from; j < to; j++ {
					stores = append(stores, stored(r, j, j+1))
				}
			}
			for j := from; j < to; j++ {
				live = append(live, blockRef{r, j})
			}
		}
		n := len(live)
		add(step, 0, tpPromptBlocks)
		for j := 0; j < tpDecodeBlocks; j++ {
			if r := step - 1 - j; r >= 0 {
				add(r, tpPromptBlocks+j, tpPromptBlocks+j+1)
			}
		}
		added := len(live) - n
		// vLLM evicts while allocating, before it caches the step's blocks.
		var evs []enginekv.Event
		for ; len(live) > tpEngineBlocks; live = live[1:] {
			evs = append(evs, enginekv.Event{Kind: enginekv.BlockRemoved, Medium: "GPU",
				BlockHashes: []uint64{hash(live[0].r, live[0].j)}})
		}
		evs = append(evs, stores...)
		p := enginekv.EncodeBatch(enginekv.Batch{TS: 1.7e9 + float64(step)/100, DPRank: 0, Events: evs}, enc)
		if step < tpCycle {
			s.warm = append(s.warm, p)
		} else {
			s.loop = append(s.loop, p)
			s.storedPerStep = added
		}
	}
	return s
}

// BenchmarkAdapterThroughput measures the adapter's whole event path per
// CPU-second: raw msgpack payloads as they come off the engine's ZMQ socket
// (written by enginekv's encoder in each engine's format) are decoded,
// applied to the mirror (rehash, engine-hash map, removals), encoded as wire
// batches and published to a NATS server on loopback, at the default map
// bound for a 65,536-block engine. Sub-benchmarks: vLLM's map events
// (unsigned hashes), vLLM's tagged-array events, SGLang's (tagged arrays,
// signed int64 hashes); "steps" is vLLM's real shape (a 64-block prefill
// event and single-block decode events per step), "single" the worst case
// of one block per event. blocks/cpu-s counts stored blocks; each loop also
// removes as many, one event each. Run it with -cpu 1.
//
// The NATS server runs in another process ("nats=proc", as in production:
// blocks/cpu-s is the adapter's process alone, and srv-ns/block the server's
// CPU time beside it) or in this one ("nats=inproc": blocks/cpu-s includes
// the server routing every batch). Either way the server must have received
// every published batch.
func BenchmarkAdapterThroughput(b *testing.B) {
	engines := []struct {
		name string
		enc  enginekv.Encoding
	}{
		{"vllm-map", enginekv.Encoding{Layout: enginekv.LayoutMap, Hashes: enginekv.HashUint}},
		{"vllm-array", enginekv.Encoding{Layout: enginekv.LayoutArray, Hashes: enginekv.HashUint}},
		{"sglang", enginekv.Encoding{Layout: enginekv.LayoutArray, Hashes: enginekv.HashInt64}},
	}
	for _, e := range engines {
		for _, single := range []bool{false, true} {
			name := e.name + "/steps"
			if single {
				name = e.name + "/single"
			}
			b.Run(name, func(b *testing.B) {
				s := engineStream(e.enc, single)
				b.Run("nats=proc", func(b *testing.B) { benchThroughput(b, s, newProcNATS(b)) })
				b.Run("nats=inproc", func(b *testing.B) { benchThroughput(b, s, newInprocNATS(b)) })
			})
		}
	}
}

// benchNATS is the NATS server a throughput benchmark publishes to.
type benchNATS struct {
	nc *nats.Conn
	// stats reports the messages the server has received and the CPU
	// time it took that the benchmark's process did not (zero in process).
	stats func() (inMsgs int64, cpu time.Duration)
}

func newProcNATS(b *testing.B) benchNATS {
	p := testenv.StartNATSProcess(b)
	return benchNATS{nc: p.Conn(b), stats: func() (int64, time.Duration) {
		st := p.Stats(b)
		return st.InMsgs, st.CPU
	}}
}

func newInprocNATS(b *testing.B) benchNATS {
	n := testenv.StartNATS(b)
	return benchNATS{nc: n.Conn(b), stats: func() (int64, time.Duration) {
		v, err := n.Server.Varz(nil)
		if err != nil {
			b.Fatal(err)
		}
		return v.InMsgs, 0
	}}
}

func benchThroughput(b *testing.B, s tpStream, srv benchNATS) {
	m := newBenchMirrorOn(b, srv.nc, tpBlockSize, max4(tpEngineBlocks))
	seq, deliver := uint64(0), payloadFeeder(m)
	feed := func(p []byte) {
		if err := deliver(seq, p); err != nil {
			b.Fatal(err)
		}
		seq++
	}
	for _, p := range s.warm {
		feed(p)
	}
	for _, p := range s.loop { // one cycle more: the maps at their steady size
		feed(p)
	}
	if got := m.Blocks(); got != tpEngineBlocks {
		b.Fatalf("mirror holds %d blocks after the warm-up, want the engine's %d", got, tpEngineBlocks)
	}
	var bytes int
	for _, p := range s.loop {
		bytes += len(p)
	}
	if err := srv.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	_, srvCPU0 := srv.stats()
	b.ReportAllocs()
	b.ResetTimer()
	start, cpu0 := time.Now(), testenv.ProcessCPU()
	for i := 0; b.Loop(); i++ {
		feed(s.loop[i%len(s.loop)])
	}
	el, cpu := time.Since(start), testenv.ProcessCPU()-cpu0
	b.StopTimer()
	// The server must have received every batch: a publish the client
	// dropped or still buffers would make the figure a lie. The flush
	// waits for the server's answer, so its counts hold everything sent;
	// its CPU time then includes routing the last batches.
	if err := srv.nc.Flush(); err != nil {
		b.Fatal(err)
	}
	inMsgs, srvCPU := srv.stats()
	srvCPU -= srvCPU0
	if e := testutil.ToFloat64(m.m.batches[resultError]); e != 0 {
		b.Fatalf("%v batches failed to publish", e)
	}
	if sent := int64(testutil.ToFloat64(m.m.batches[resultOK])); inMsgs != sent {
		b.Fatalf("the NATS server received %d messages, the mirror published %d", inMsgs, sent)
	}
	// The stream must have been followed exactly: nothing skipped, no
	// repair, every removal known, no eviction by the bound.
	check := map[string]prometheus.Collector{"conflicts": m.m.conflicts,
		"unknown removals": m.m.unknownRemoved, "evictions": m.m.evictions}
	for r := skipBlockSize; r < numSkipReasons; r++ {
		check["skipped "+r.String()] = m.m.skipped[r]
	}
	for r := repairEngineReset; r < numRepairReasons; r++ {
		check["repairs "+r.String()] = m.m.repairs[r]
	}
	for what, c := range check {
		if v := testutil.ToFloat64(c); v != 0 {
			b.Fatalf("%s: %v, want 0: the benchmark stream is not what it claims", what, v)
		}
	}
	if got := m.Blocks(); got != tpEngineBlocks {
		b.Fatalf("mirror holds %d blocks, want the engine's %d", got, tpEngineBlocks)
	}
	blocks := float64(b.N) * float64(s.storedPerStep)
	b.ReportMetric(blocks/el.Seconds(), "blocks/s")
	b.ReportMetric(float64(el.Nanoseconds())/blocks, "ns/block")
	b.ReportMetric(float64(bytes)/float64(len(s.loop))/float64(s.storedPerStep), "B/block")
	if cpu > 0 {
		b.ReportMetric(blocks/cpu.Seconds(), "blocks/cpu-s")
	}
	if srvCPU > 0 {
		b.ReportMetric(float64(srvCPU.Nanoseconds())/blocks, "srv-ns/block")
	}
}
