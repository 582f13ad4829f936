package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestScaleIndexHoldsEveryWorkersBlocksAndFindsTheConversationsItWasBuiltWith(t *testing.T) {
	cfg := DefaultIndexScaleConfig()
	cfg.Workers, cfg.BlocksPerWorker, cfg.Queries, cfg.Rounds, cfg.ChurnBatches = 32, 800, 200, 1, 50
	r, err := MeasureIndexScale(cfg)
	require.NoError(t, err)
	// Every worker's stored blocks are distinct per worker (system prompts
	// and documents held twice by one worker are stored once), so the
	// index holds at most workers × blocks entries and at least the
	// conversations'.
	assert.LessOrEqual(t, r.Entries, cfg.Workers*cfg.BlocksPerWorker)
	assert.GreaterOrEqual(t, r.Entries, cfg.Workers*scaleConvs(cfg.BlocksPerWorker)*scaleConvBlocks)
	assert.Positive(t, r.MatchesPerQuery, "continued conversations and known system prompts match")
	assert.Positive(t, r.BytesPerBlock)
	assert.Positive(t, r.LookupP99us)
}

func TestScaleIndexRejectsAFleetTooSmallForItsShape(t *testing.T) {
	cfg := DefaultIndexScaleConfig()
	cfg.BlocksPerWorker = 10
	_, err := MeasureIndexScale(cfg)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

func TestScaleIngestMeasuresTheEventsTheSimulatedEnginesPublish(t *testing.T) {
	f, err := os.Open("testdata/mooncake_small.jsonl")
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	src, err := NewMooncakeReader(f, MooncakeOptions{})
	require.NoError(t, err)
	reqs, err := ReadAll(src, 0)
	require.NoError(t, err)
	cfg := DefaultIngestScaleConfig()
	cfg.Sim.Workers = 2
	cfg.Fleets = []int{10, 100}
	r, err := MeasureIngestScale(testenv.Context(t), cfg, reqs, []IndexScaleResult{{Workers: 100, ApplyNsPerBlock: 1e6}})
	require.NoError(t, err)
	assert.Positive(t, r.StoredBlocksPerS)
	assert.Positive(t, r.BatchesPerS)
	require.Len(t, r.Curve, 2)
	assert.Equal(t, 1e6, r.Curve[1].ApplyNsPerBlock, "a fleet at least as large as a measured index pays its apply cost")
	assert.Greater(t, r.Curve[1].Cores, 10*r.Curve[0].Cores*0.99)
	assert.Positive(t, r.OneCoreAt)
}

func TestScaleReportMergesEarlierRunsAndStatesTheThroughputGoal(t *testing.T) {
	dir := t.TempDir()
	old := ScaleReport{Quality: []ScaleQuality{{Workers: 64, Replicas: 1, HitRate: 0.30}, {Workers: 64, Replicas: 8, HitRate: 0.295}}}
	raw, err := json.Marshal(old)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, FileScaleJSON), raw, 0o644))
	gotest := filepath.Join(dir, "go.txt")
	require.NoError(t, os.WriteFile(gotest, []byte("goos: linux\nBenchmarkReplicaThroughput-2   \t    3000\t   6236724 ns/op\t 0.1023 proxy-cpu-ms/req\t 24.81 ratio-%\nPASS\n"), 0o644))
	out := t.TempDir()
	var stdout, stderr bytes.Buffer
	err = Main(testenv.Context(t), []string{"--scale", "--scale-sections", "none", "--scale-merge", dir, "--scale-gotest", gotest,
		"--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl", "--out", out}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	md := stdout.String()
	assert.Contains(t, md, "| 64 | 8 |")
	assert.Contains(t, md, "-0.5", "the 8-replica run is half a point below one replica")
	assert.Contains(t, md, "within 1 point of one replica: **met**")
	assert.Contains(t, md, "bare proxy's requests per second per core: **missed** (25%; in-process difference, one run)")
	assert.FileExists(t, filepath.Join(out, FileScaleReport))
	assert.FileExists(t, filepath.Join(out, FileScaleHitRate))
}

// With both throughput benchmarks in the output, the goal is stated
// against the isolated one (each target its own process), before or after
// the in-process one.
func TestScaleReportStatesTheThroughputGoalAgainstTheIsolatedBenchmark(t *testing.T) {
	inProcess := "BenchmarkReplicaThroughput-2   \t    3000\t   6236724 ns/op\t 0.1023 proxy-cpu-ms/req\t 24.81 ratio-%\n"
	isolated := "BenchmarkReplicaThroughputIsolated-2   \t    3000\t   2117986 ns/op\t 0.2773 proxy-cpu-ms/req\t 59.13 ratio-%\n"
	for name, lines := range map[string]string{"isolated last": inProcess + isolated, "isolated first": isolated + inProcess} {
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			gotest := filepath.Join(dir, "go.txt")
			require.NoError(t, os.WriteFile(gotest, []byte("goos: linux\n"+lines+"PASS\n"), 0o644))
			var stdout, stderr bytes.Buffer
			err := Main(testenv.Context(t), []string{"--scale", "--scale-sections", "none", "--scale-gotest", gotest,
				"--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl", "--out", t.TempDir()}, &stdout, &stderr)
			require.NoError(t, err, "stderr: %s", stderr.String())
			assert.Contains(t, stdout.String(), "bare proxy's requests per second per core: **met** (59%; router and proxy each in a process of its own, one run)")
			assert.Contains(t, stdout.String(), "| BenchmarkReplicaThroughput-2 |", "the in-process run is still listed")
		})
	}
}

func TestScaleReportRejectsAnUnknownSection(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{"--scale", "--scale-sections", "lookup", "--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl"}, &stdout, &stderr)
	require.ErrorIs(t, err, ErrInvalidConfig)
}

// FuzzReadGoBench feeds arbitrary text to the reader of `go test -bench`
// output: it must not fail on text (only on I/O) and every line it keeps
// names a benchmark and has a value for each unit it lists.
func FuzzReadGoBench(f *testing.F) {
	f.Add("BenchmarkX-2 \t 100\t 12.5 ns/op\t 3 B/op\n")
	f.Add("goos: linux\nBenchmarkY/a=1-2 10 1e3 x-% NaN y\nPASS\n")
	f.Add("Benchmark 1 2\n")
	f.Fuzz(func(t *testing.T, text string) {
		path := filepath.Join(t.TempDir(), "b.txt")
		require.NoError(t, os.WriteFile(path, []byte(text), 0o644))
		lines, err := readGoBench(path)
		if err != nil {
			// Only a line longer than the scanner's limit fails.
			return
		}
		for _, l := range lines {
			require.True(t, strings.HasPrefix(l.Name, "Benchmark"), "line %q", l.Name)
			for _, u := range l.Units {
				_, ok := l.Metrics[u]
				require.True(t, ok, "unit %q has a value", u)
			}
		}
	})
}
