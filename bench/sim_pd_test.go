package bench

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// pdTrace: n requests a second apart, each a prompt of a shared prefix of
// prefix tokens (group i%2) plus 16 tokens of its own.
func pdTrace(n, prefix, output int) []TraceRequest {
	var reqs []TraceRequest
	for i := range n {
		reqs = append(reqs, TraceRequest{
			Index: i, Arrival: time.Duration(i) * time.Second, InputLength: prefix + 16, OutputLength: output,
			Segments: []Segment{{Seed: 100 + uint64(i%2), Len: prefix}, {Seed: 1000 + uint64(i), Len: 16}},
		})
	}
	return reqs
}

func pdConfig(p, d int, decider bool) SimConfig {
	cfg := simTestConfig()
	cfg.Workers = p + d
	cfg.Fleet, cfg.Decider = SimFleet{Prefill: p, Decode: d}, decider
	return cfg
}

func TestSimPDRunsALongRequestAsPrefillThenTransferThenDecode(t *testing.T) {
	reqs := pdTrace(6, 2048, 8)
	rep := runSim(t, pdConfig(1, 1, false), reqs)
	assert.Equal(t, 6, rep.Summary.OK)
	require.NotNil(t, rep.PD)
	assert.Equal(t, "1P1D", rep.PD.Fleet)
	assert.Equal(t, 6, rep.PD.Pairs)
	assert.Zero(t, rep.PD.Bypassed)
	assert.EqualValues(t, 6, rep.PD.Transfers)
	pre, dec := rep.Workers[0], rep.Workers[1]
	assert.EqualValues(t, 6*(2048+16), pre.PromptTokens, "every prompt is prefilled on the prefill worker")
	assert.EqualValues(t, 4*2048, pre.CachedTokens, "the prefill worker keeps the two prefixes")
	// The decode worker pulls what it does not hold: the first request of
	// each prefix group pulls all but the last token, later ones only
	// their own 16 tokens (the prefix they pulled before is cached there).
	assert.EqualValues(t, 2*(2048+15)+4*15, rep.PD.TransferredTokens)
	assert.EqualValues(t, 4*2048, dec.CachedTokens)
	for _, r := range rep.Results {
		assert.Equal(t, "worker-1", r.Worker, "the answer streams from the decode worker")
		assert.Len(t, r.ITL, 7)
	}
	assert.EqualValues(t, 4*2048, rep.Summary.CachedTokens, "a pair's hit is its prefill worker's")
	assert.Positive(t, rep.PD.PrefillBusyS)
	assert.Positive(t, rep.PD.DecodeBusyS)

	// With the decider, the repeats' uncached prefill (16 tokens on the
	// prefill worker) is below the threshold: they run aggregated on the
	// decode worker, which holds their prefix from its earlier pulls.
	on := runSim(t, pdConfig(1, 1, true), reqs)
	assert.Equal(t, 2, on.PD.Pairs)
	assert.Equal(t, 4, on.PD.Bypassed)
	assert.EqualValues(t, 4*2048, on.Workers[1].CachedTokens)
	assert.Equal(t, 6, on.Summary.OK)
}

func TestSimPDDeciderRunsShortPrefillsAggregatedOnTheDecodeWorker(t *testing.T) {
	reqs := pdTrace(4, 32, 4) // 48-token prompts: below the derived threshold
	on := runSim(t, pdConfig(1, 1, true), reqs)
	require.NotNil(t, on.PD)
	require.Greater(t, on.PD.Threshold, 48)
	assert.Equal(t, 4, on.PD.Bypassed)
	assert.Zero(t, on.PD.Pairs)
	assert.Zero(t, on.PD.Transfers)
	assert.Zero(t, on.Workers[0].PromptTokens, "the prefill worker does nothing")
	assert.Equal(t, 4, on.Summary.OK)

	off := runSim(t, pdConfig(1, 1, false), reqs)
	assert.Equal(t, 4, off.PD.Pairs, "without the decider every request is a pair")
	assert.Zero(t, off.PD.Bypassed)
	assert.Equal(t, 4, off.Summary.OK)
	assert.Greater(t, off.Summary.TTFT.Mean, on.Summary.TTFT.Mean, "a pair's extra hop costs a short prompt")
}

func TestSimPDRejectsAFleetThatIsNotTheWorkerCount(t *testing.T) {
	for _, f := range []SimFleet{{Prefill: 1, Decode: 2}, {Prefill: 0, Decode: 2}, {Prefill: -1, Decode: 3}} {
		cfg := simTestConfig()
		cfg.Fleet = f
		assert.ErrorIs(t, cfg.Validate(), ErrInvalidConfig, f.String())
	}
	cfg := simTestConfig()
	cfg.SLO.ITL = 0
	assert.ErrorIs(t, cfg.Validate(), ErrInvalidConfig)
}

func TestSimPDSameSeedGivesAByteIdenticalReport(t *testing.T) {
	reqs := pdTrace(8, 1024, 6)
	a := reportJSON(t, runSim(t, pdConfig(1, 2, true), reqs))
	b := reportJSON(t, runSim(t, pdConfig(1, 2, true), reqs))
	assert.True(t, bytes.Equal(a, b))
}

func TestParseSimFleet(t *testing.T) {
	for in, want := range map[string]SimFleet{"aggregated": {}, "agg": {}, "2p6d": {2, 6}, " 4P4D ": {4, 4}} {
		got, err := ParseSimFleet(in)
		require.NoError(t, err, in)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"", "2p", "p6d", "0p8d", "2p0d", "2x6d", "-1p9d", "2p6dd"} {
		_, err := ParseSimFleet(in)
		assert.ErrorIs(t, err, ErrInvalidConfig, in)
	}
}

func FuzzParseSimFleet(f *testing.F) {
	for _, s := range []string{"aggregated", "2p6d", "4p4d", "p", "9999p9999d", "1p1d1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		fl, err := ParseSimFleet(s)
		if err != nil {
			return
		}
		if fl.Disaggregated() {
			assert.Positive(t, fl.Prefill)
			assert.Positive(t, fl.Decode)
			back, err := ParseSimFleet(fl.String())
			assert.NoError(t, err)
			assert.Equal(t, fl, back)
		}
	})
}

func TestSimSLOCountsTTFTAndMeanITL(t *testing.T) {
	o := SimSLO{TTFT: time.Second, ITL: 50 * time.Millisecond}
	ok := Result{Outcome: OutcomeOK, TTFT: time.Second, ITL: []time.Duration{10 * time.Millisecond, 90 * time.Millisecond}}
	assert.True(t, o.Met(&ok), "the mean ITL is 50 ms: one slow gap does not fail it")
	slow := ok
	slow.ITL = []time.Duration{60 * time.Millisecond}
	assert.False(t, o.Met(&slow))
	late := ok
	late.TTFT = time.Second + 1
	assert.False(t, o.Met(&late))
	failed := ok
	failed.Outcome = OutcomeStreamError
	assert.False(t, o.Met(&failed))
	assert.True(t, o.Met(&Result{Outcome: OutcomeOK, TTFT: time.Millisecond}), "one token meets any ITL")
}

func TestSimModeSweepsFleetsAndDecidersAndPrintsTheDisaggregationTable(t *testing.T) {
	var stdout, stderr bytes.Buffer
	err := Main(testenv.Context(t), []string{
		"--sim", "--trace", "synthetic", "--synthetic-requests", "40", "--synthetic-rate", "20",
		"--sim-fleet", "aggregated,1p1d", "--sim-decider", "on,off", "--sim-slo-ttft", "1s",
	}, &stdout, &stderr)
	require.NoError(t, err, "stderr: %s", stderr.String())
	out := stdout.String()
	assert.Contains(t, out, "Disaggregation (goodput: requests with TTFT <= 1s and mean ITL <= 50ms per second)")
	assert.Contains(t, out, "| aggregated | aggregated | – |")
	assert.Contains(t, out, "| 1P1D, decider | 1P1D | on |")
	assert.Contains(t, out, "| 1P1D, no decider | 1P1D | off |")
	assert.NotContains(t, out, "aggregated, decider", "an aggregated fleet runs once")
}

// BenchmarkSimPD simulates 200 requests of 4k-token prompts on 2P2D and on
// four aggregated workers: the pair path's cost (two legs, the transfer)
// against the aggregated baseline, in simulated requests per wall second.
func BenchmarkSimPD(b *testing.B) {
	reqs := pdTrace(200, 4096, 32)
	for i := range reqs {
		reqs[i].Arrival = time.Duration(i) * 50 * time.Millisecond
	}
	for _, fleet := range []SimFleet{{}, {Prefill: 2, Decode: 2}} {
		b.Run(fleet.String(), func(b *testing.B) {
			cfg := pdConfig(fleet.Prefill, fleet.Decode, false)
			cfg.Workers = 4
			b.ReportAllocs()
			start := time.Now()
			for b.Loop() {
				if _, err := RunSim(context.Background(), cfg, reqs, nil); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(reqs)*b.N)/time.Since(start).Seconds(), "requests/s")
		})
	}
}
