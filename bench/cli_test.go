package bench

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

func TestMainReplaysASyntheticTraceAndWritesEveryReport(t *testing.T) {
	a, b := newUpstream(t), newUpstream(t)
	a.CachedTokens, b.CachedTokens = 64, 64
	b.Worker = "worker-b"
	out := filepath.Join(t.TempDir(), "run")
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{
		"--trace", "synthetic", "--synthetic-requests", "12", "--synthetic-rate", "1000",
		"--synthetic-prefix-tokens", "64", "--synthetic-input-tokens", "16", "--synthetic-output-tokens", "4",
		"--synthetic-classes", "chat:1:1:30s,batch:1",
		"--target", a.URL + "," + b.URL, "--speedup", "100", "--out", out, "--label", "demo",
	}, &stdout, &stderr)
	require.NoError(t, err, stderr.String())
	assert.Equal(t, 12, a.count()+b.count())
	assert.Contains(t, stdout.String(), "| demo | 12 | 12 |")
	assert.Empty(t, stderr.String(), "no progress line when stderr is not a terminal")

	f, err := os.Open(filepath.Join(out, FileResults))
	require.NoError(t, err)
	defer f.Close()
	results, err := ReadResults(f, FileResults)
	require.NoError(t, err)
	require.Len(t, results, 12)
	for _, r := range results {
		assert.Equal(t, OutcomeOK, r.Outcome)
	}

	raw, err := os.ReadFile(filepath.Join(out, FileSummaryJSON))
	require.NoError(t, err)
	var sums []Summary
	require.NoError(t, json.Unmarshal(raw, &sums))
	require.Len(t, sums, 1)
	assert.Equal(t, "demo", sums[0].Label)
	assert.Equal(t, 12, sums[0].OK)
	assert.Positive(t, sums[0].HitRate)
	assert.Len(t, sums[0].Classes, 2)

	md, err := os.ReadFile(filepath.Join(out, FileSummaryMD))
	require.NoError(t, err)
	assert.Equal(t, stdout.String(), string(md))
	for _, name := range []string{FileTTFTCDF, FileThroughput, FileWorkerLoad} {
		requirePNG(t, filepath.Join(out, name))
	}
}

func TestMainReplaysAMooncakeFileWithAProgressLineWhenAsked(t *testing.T) {
	up := newUpstream(t)
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{
		"--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl", "--target", up.URL,
		"--speedup", "1000", "--max-requests", "3", "--progress", "on",
	}, &stdout, &stderr)
	require.NoError(t, err)
	assert.Equal(t, 3, up.count())
	assert.Contains(t, stdout.String(), "| mooncake | 3 | 3 |")
	assert.Contains(t, stderr.String(), "sent=3 done=3 errors=0")
	seen := up.requests()
	lengths := map[int]bool{}
	for _, s := range seen {
		lengths[len(s.Body.Prompt)] = true
	}
	assert.Equal(t, map[int]bool{1100: true, 1024: true, 600: true}, lengths)
}

func TestMainFailsOnATraceErrorButKeepsWhatItMeasured(t *testing.T) {
	up := newUpstream(t)
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{
		"--trace", "mooncake", "--file", "testdata/mooncake_bad.jsonl", "--target", up.URL, "--speedup", "1000",
	}, &stdout, &stderr)
	var le *LineError
	require.ErrorAs(t, err, &le)
	assert.Equal(t, 2, le.Line)
	assert.Contains(t, stdout.String(), "| mooncake | 1 | 1 |", "the summary covers the request sent before the bad line")

	stdout.Reset()
	err = Main(testenv.Context(t), []string{
		"--trace", "mooncake", "--file", "testdata/mooncake_bad.jsonl", "--target", up.URL, "--speedup", "1000", "--skip-bad-lines",
	}, &stdout, &stderr)
	require.NoError(t, err)
	assert.Contains(t, stdout.String(), "| mooncake | 3 | 3 |")
	assert.Contains(t, stderr.String(), "skipped 4 bad trace lines; first: mooncake_bad.jsonl:2:")
}

func TestMainRejectsBadFlagsWithClearErrors(t *testing.T) {
	run := func(args ...string) error {
		var stdout, stderr bytes.Buffer
		return Main(testenv.Context(t), args, &stdout, &stderr)
	}
	assert.ErrorContains(t, run("--trace", "sharegpt"), `--trace "sharegpt"`)
	assert.ErrorContains(t, run("--trace", "mooncake"), "--file is required")
	assert.ErrorContains(t, run("--speedup", "0"), "speedup")
	assert.ErrorContains(t, run("--progress", "sometimes"), "--progress")
	assert.ErrorContains(t, run("extra"), "unexpected arguments")
	assert.ErrorContains(t, run("--no-such-flag"), "no-such-flag")
	assert.ErrorIs(t, run("--no-such-flag"), ErrInvalidConfig)
	var help bytes.Buffer
	assert.NoError(t, Main(testenv.Context(t), []string{"-h"}, &help, &help), "help is not an error")
	assert.Contains(t, help.String(), "-synthetic-classes")
	assert.Contains(t, help.String(), "-sim")
	assert.ErrorContains(t, run("--trace", "azure", "--file", "testdata/missing.csv"), "open trace")
}

func TestSimModeFailsClearlyUntilTheSimulatorIsBuiltIn(t *testing.T) {
	if simMode != nil {
		t.Skip("a simulator is installed; --sim is covered by the simulator's own tests")
	}
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{"--sim"}, &stdout, &stderr)
	assert.ErrorIs(t, err, ErrSimUnavailable)
}

func TestMainComparesEarlierRunsSideBySide(t *testing.T) {
	up := newUpstream(t)
	root := t.TempDir()
	for _, dir := range []string{"run-a", "run-b"} {
		var stdout, stderr bytes.Buffer
		require.NoError(t, Main(testenv.Context(t), []string{
			"--synthetic-requests", "5", "--synthetic-rate", "1000", "--synthetic-prefix-tokens", "32",
			"--synthetic-input-tokens", "8", "--synthetic-output-tokens", "2",
			"--target", up.URL, "--speedup", "100", "--out", filepath.Join(root, dir), "--label", "label-of-" + dir,
		}, &stdout, &stderr))
	}
	require.NoError(t, os.Remove(filepath.Join(root, "run-b", FileSummaryJSON)))

	var stdout, stderr bytes.Buffer
	cmp := filepath.Join(root, "cmp")
	require.NoError(t, Main(testenv.Context(t), []string{
		"--compare", filepath.Join(root, "run-a") + "," + filepath.Join(root, "run-b"), "--out", cmp,
	}, &stdout, &stderr))
	assert.Equal(t, 10, up.count(), "comparing sends nothing")
	assert.Contains(t, stdout.String(), "| label-of-run-a | 5 | 5 |", "the label recorded in summary.json")
	assert.Contains(t, stdout.String(), "| run-b | 5 | 5 |", "the directory name when summary.json is gone")
	requirePNG(t, filepath.Join(cmp, FileTTFTCDF))

	err := Main(testenv.Context(t), []string{"--compare", filepath.Join(root, "nope")}, &stdout, &stderr)
	assert.ErrorContains(t, err, "compare")
}

func TestMainDropsRequestsLongerThanMaxModelLen(t *testing.T) {
	up := newUpstream(t)
	var stdout, stderr bytes.Buffer
	require.NoError(t, Main(testenv.Context(t), []string{
		"--trace", "mooncake", "--file", "testdata/mooncake_small.jsonl", "--target", up.URL,
		"--speedup", "1000", "--max-model-len", "1030",
	}, &stdout, &stderr))
	// 1100+10 and 1024+20 exceed 1030; 600+5, 1+1 and 513+7 fit.
	assert.Equal(t, 3, up.count())
	assert.Contains(t, stderr.String(), "dropped 2 trace requests longer than --max-model-len 1030")
}
