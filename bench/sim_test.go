package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// simTestConfig is a small cluster for fast tests.
func simTestConfig() SimConfig {
	c := DefaultSimConfig()
	c.Workers = 2
	c.Engine.NumBlocks = 4096
	return c
}

func runSim(t *testing.T, cfg SimConfig, reqs []TraceRequest) *SimReport {
	t.Helper()
	rep, err := RunSim(testenv.Context(t), cfg, reqs, nil)
	require.NoError(t, err)
	require.Len(t, rep.Results, len(reqs))
	return rep
}

func reportJSON(t *testing.T, rep *SimReport) []byte {
	t.Helper()
	var b bytes.Buffer
	require.NoError(t, WriteSimReports(&b, rep))
	for _, r := range rep.Results {
		line, err := r.MarshalJSON()
		require.NoError(t, err)
		b.Write(line)
		b.WriteByte('\n')
	}
	return b.Bytes()
}

func TestSimSameSeedGivesAByteIdenticalReport(t *testing.T) {
	syn := DefaultSyntheticConfig()
	syn.Requests, syn.Rate, syn.Turns, syn.PrefixTokens, syn.InputTokens = 300, 40, 3, 512, 128
	syn.Classes = []ClassMix{{Name: "chat", Weight: 2, Priority: 1, Deadline: 2 * time.Second}, {Name: "batch", Weight: 1}}
	reqs, err := GenerateSynthetic(syn)
	require.NoError(t, err)

	cfg := simTestConfig()
	cfg.Workers, cfg.Replicas, cfg.Admission, cfg.MaxRunning = 4, 3, SimCluster, 4
	first := reportJSON(t, runSim(t, cfg, reqs))
	second := reportJSON(t, runSim(t, cfg, reqs))
	require.Equal(t, string(first), string(second), "same seed and trace must give the same bytes")

	cfg.Seed = 2
	other := reportJSON(t, runSim(t, cfg, reqs))
	assert.NotEqual(t, string(first), string(other), "a different seed breaks selector ties differently")
}

// twoGroupTrace: prefixes A and B (1024 tokens = 64 blocks) with a unique
// 16-token suffix, in the order A A B B A A B B, ten seconds apart so each
// request ends before the next arrives.
func twoGroupTrace() []TraceRequest {
	var reqs []TraceRequest
	for i, g := range []uint64{0, 0, 1, 1, 0, 0, 1, 1} {
		reqs = append(reqs, TraceRequest{
			Index: i, Arrival: time.Duration(i) * 10 * time.Second, InputLength: 1040, OutputLength: 4,
			Segments: []Segment{{Seed: 100 + g, Len: 1024}, {Seed: 1000 + uint64(i), Len: 16}},
		})
	}
	return reqs
}

func TestSimKVAwareRoutingCachesMoreThanRoundRobinOnATinyTrace(t *testing.T) {
	reqs := twoGroupTrace()
	cfg := simTestConfig()

	cfg.Policy = SimRoundRobin
	rr := runSim(t, cfg, reqs)
	cfg.Policy = SimKVAware
	kv := runSim(t, cfg, reqs)

	// Round-robin sends each prefix's first two requests to both workers:
	// each worker computes each prefix once (4 misses, 4 hits). KV-aware
	// sends every repeat to the worker that holds it (2 misses, 6 hits).
	assert.EqualValues(t, 4*1024, rr.Summary.CachedTokens, "round-robin cached tokens")
	assert.EqualValues(t, 6*1024, kv.Summary.CachedTokens, "kv-aware cached tokens")
	assert.Greater(t, kv.Summary.HitRate, rr.Summary.HitRate)
	assert.Equal(t, 8, kv.Summary.OK)
	assert.Equal(t, 8, rr.Summary.OK)
}

// burst is n requests arriving together, each long enough to still be
// running when the last one is admitted.
func burst(n int) []TraceRequest {
	reqs := make([]TraceRequest, n)
	for i := range reqs {
		reqs[i] = TraceRequest{Index: i, InputLength: 256, OutputLength: 64,
			Segments: []Segment{{Seed: 5000 + uint64(i), Len: 256}}}
	}
	return reqs
}

func TestSimClassLimitsHoldClusterWideOnlyWhenOneOwnerAdmitsTheClass(t *testing.T) {
	cfg := simTestConfig()
	cfg.Replicas, cfg.Workers, cfg.MaxRunning, cfg.Gossip = 3, 1, 1, false
	cfg.Class.Limits.Requests = 2 // per worker: two queued requests for the whole class
	reqs := burst(12)

	cfg.Admission = SimCluster
	cl := runSim(t, cfg, reqs)
	assert.LessOrEqual(t, cl.PeakQueued, 2, "cluster mode: the owner's queue is the class's only queue")
	assert.Equal(t, 1, cl.Workers[0].PeakActive, "cluster mode: the worker's running cap holds")
	require.Len(t, cl.Classes, 1)
	assert.EqualValues(t, 12, cl.Classes[0].Received)
	assert.EqualValues(t, 3, cl.Classes[0].Admitted)
	assert.EqualValues(t, 9, cl.Classes[0].Rejected[scheduler.ReasonQueueFull.String()])

	cfg.Admission = SimPerReplica
	pr := runSim(t, cfg, reqs)
	assert.Greater(t, pr.PeakQueued, 2, "per-replica queues: each replica applies the limit to its own share")
	assert.Equal(t, 6, pr.PeakQueued)
	assert.Equal(t, 3, pr.Workers[0].PeakActive, "per-replica queues: each replica fills the worker")
	require.Len(t, pr.Classes, 1)
	assert.EqualValues(t, 9, pr.Classes[0].Admitted)
}

func TestSimDeadlineAwareAdmissionMeetsMoreDeadlinesUnderOverload(t *testing.T) {
	syn := DefaultSyntheticConfig()
	syn.Requests, syn.Rate, syn.PrefixGroups, syn.InputTokens, syn.OutputTokens = 400, 60, 0, 512, 64
	syn.Classes = []ClassMix{{Name: "tight", Weight: 1, Deadline: 1500 * time.Millisecond}, {Name: "loose", Weight: 1, Deadline: 20 * time.Second}}
	reqs, err := GenerateSynthetic(syn)
	require.NoError(t, err)
	cfg := simTestConfig()
	cfg.Workers, cfg.MaxRunning, cfg.SingleClass = 1, 4, true

	cfg.IgnoreDeadlines = true
	blind := runSim(t, cfg, reqs)
	cfg.IgnoreDeadlines = false
	aware := runSim(t, cfg, reqs)

	require.Positive(t, blind.Summary.DeadlineMisses, "the workload must overload the worker")
	assert.Less(t, aware.Summary.DeadlineMisses, blind.Summary.DeadlineMisses)
	assert.Greater(t, aware.GoodRequests, blind.GoodRequests)
}

func TestSimRejectsABadConfigNamingTheField(t *testing.T) {
	cfg := DefaultSimConfig()
	cfg.Replicas = 0
	_, err := RunSim(context.Background(), cfg, twoGroupTrace(), nil)
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "replicas")

	cfg = DefaultSimConfig()
	cfg.TimeScale = 0
	_, err = RunSim(context.Background(), cfg, twoGroupTrace(), nil)
	assert.ErrorContains(t, err, "time_scale")
}

func TestSimStopsWhenItsContextIsCancelled(t *testing.T) {
	reqs, err := GenerateSynthetic(DefaultSyntheticConfig())
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = RunSim(ctx, simTestConfig(), reqs, nil)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestSimModeRunsThroughBenchMainAndWritesItsReports(t *testing.T) {
	require.NotNil(t, simMode, "bench/sim_cli.go installs the simulator")
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{
		"--sim", "--trace", "synthetic", "--synthetic-requests", "60", "--synthetic-rate", "20",
		"--sim-workers", "2", "--sim-policy", "kv,rr", "--sim-replicas", "1,2", "--sim-results",
		"--out", out,
	}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	assert.Contains(t, stdout.String(), "| kv-aware, 1 replicas |")
	assert.Contains(t, stdout.String(), "| round-robin, 2 replicas |")
	for _, f := range []string{FileSummaryMD, FileSummaryJSON, FileSimReport, FileTTFTCDF, FileThroughput,
		FileWorkerLoad, FileHitRateReplica, "results-kv-aware-1-replicas.jsonl"} {
		st, err := os.Stat(filepath.Join(out, f))
		if assert.NoError(t, err, f) {
			assert.Positive(t, st.Size(), f)
		}
	}
	f, err := os.Open(filepath.Join(out, "results-kv-aware-1-replicas.jsonl"))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	res, err := ReadResults(f, "results")
	require.NoError(t, err)
	assert.Len(t, res, 60)
}

func TestSimModeRejectsABadListFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{"--sim", "--sim-policy", "fastest"}, &stdout, &stderr)
	assert.ErrorIs(t, err, ErrInvalidConfig)
	assert.Contains(t, stderr.String(), "fastest")
}

// TestSelectorTreatsLoadBookedElsewhereLikeLoadBookedHere pins down what
// used to cost hit rate at 8 replicas with gossip on: the same in-flight
// request must steer the selector the same way whichever replica booked it.
// Gossip carries only the aggregate DecodeBlocks of another replica's
// bookings, so the selector counts the prompt blocks the worker already
// holds (its cache overlap) as held, not as new.
func TestSelectorTreatsLoadBookedElsewhereLikeLoadBookedHere(t *testing.T) {
	workers := []scheduler.Worker{{ID: "x", BlockSize: 16, KVBlocks: 10000}, {ID: "y", BlockSize: 16, KVBlocks: 10000}}
	hashes := make([]uint64, 64)
	for i := range hashes {
		hashes[i] = uint64(i + 1)
	}
	cls := []scheduler.ClassConfig{{Name: "c", Quantum: 1024, Policy: scheduler.PolicyFCFS,
		Limits: scheduler.Limits{Requests: scheduler.Unlimited, ISLTokens: scheduler.Unlimited, CachedTokens: scheduler.Unlimited}}}
	newCore := func(view scheduler.LoadView) *scheduler.Core {
		c := scheduler.NewCore(scheduler.DefaultConfig(), clock.NewFake(simEpoch), view, nil)
		c.SetWorkers(workers)
		c.SetClasses(cls)
		return c
	}
	admit := func(c *scheduler.Core, r *scheduler.Request) scheduler.Grant {
		var got scheduler.Grant
		c.Enqueue(r, func(g scheduler.Grant, err error) bool {
			require.NoError(t, err)
			got = g
			return true
		})
		require.NotEmpty(t, got.Worker)
		return got
	}
	first := &scheduler.Request{ID: "a", Class: "c", PromptTokens: 1024, BlockHashes: hashes, ExpectedOutputTokens: 16, Pinned: "x"}
	second := &scheduler.Request{ID: "b", Class: "c", PromptTokens: 1024, BlockHashes: hashes, ExpectedOutputTokens: 16,
		Overlaps: []scheduler.Overlap{{Worker: "x", Blocks: 64}}}

	local := newCore(nil)
	g := admit(local, first)
	local.FirstToken(g.Booking)
	require.Equal(t, "x", admit(local, second).Worker, "booked here: the cached, already running prefix wins")

	remote := newCore(fixedLoad{"x": local.Load("x")})
	second.ID = "b2"
	assert.Equal(t, "x", admit(remote, second).Worker, "booked elsewhere: the same load must lead to the same choice")
}

// fixedLoad is a LoadView with constant answers.
type fixedLoad map[string]scheduler.WorkerLoad

func (f fixedLoad) RemoteLoad(w string) scheduler.WorkerLoad { return f[w] }

func TestSimReplaysAMooncakeFileAndReportsTheCacheHitsItsHashIDsImply(t *testing.T) {
	var stdout, stderr bytes.Buffer
	out := t.TempDir()
	err := Main(testenv.Context(t), []string{"--sim", "--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl",
		"--sim-workers", "1", "--out", out}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	f, err := os.Open(filepath.Join(out, FileSimReport))
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	var reps []SimReport
	require.NoError(t, json.NewDecoder(f).Decode(&reps))
	require.Len(t, reps, 1)
	s := reps[0].Summary
	assert.Equal(t, s.Requests, s.OK, "every request of the small trace succeeds")
	// Every request starts with hash id 0: after the first one, the next
	// requests on the single worker find at least that 512-token block.
	assert.GreaterOrEqual(t, s.CachedTokens, int64(512))
}
