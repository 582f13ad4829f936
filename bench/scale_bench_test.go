package bench

import (
	"flag"
	"fmt"
	"testing"
)

var scaleLarge = flag.Bool("scale-large", false, "also run the 50,000-worker index (about 7 GB)")

// BenchmarkScaleIndex builds a fleet index (IndexScaleConfig: 2,000 blocks
// per worker) and reports its heap per block and per worker, lookup
// latencies and steady-state apply cost. Each size builds one index, so run
// it with -benchtime 1x; 50,000 workers needs about 7 GB and runs only with
// -scale-large.
func BenchmarkScaleIndex(b *testing.B) {
	sizes := []int{1_000, 10_000}
	if *scaleLarge {
		sizes = append(sizes, 50_000)
	}
	for _, workers := range sizes {
		for _, sample := range []int{1, 4, 16} {
			benchScaleIndex(b, workers, sample)
		}
	}
}

// benchScaleIndex is one size and sampling rate of BenchmarkScaleIndex.
// B/block and build-ns/block divide by the indexed (sampled) entries;
// B/raw-block and build-ns/raw-block by the blocks the workers stored, so
// they compare across rates, as apply-ns/block (raw block events) does.
func benchScaleIndex(b *testing.B, workers, sample int) {
	b.Run(fmt.Sprintf("workers=%d/sample=%d", workers, sample), func(b *testing.B) {
		cfg := DefaultIndexScaleConfig()
		cfg.Workers = workers
		cfg.Sample = sample
		var r IndexScaleResult
		for range b.N {
			var err error
			if r, err = MeasureIndexScale(cfg); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(r.BytesPerBlock, "B/block")
		b.ReportMetric(r.BytesPerWorker/1e3, "kB/worker")
		b.ReportMetric(r.LookupP50us, "p50-µs")
		b.ReportMetric(r.LookupP99us, "p99-µs")
		b.ReportMetric(r.QueryMinP99us, "query-min-p99-µs")
		b.ReportMetric(r.ApplyNsPerBlock, "apply-ns/block")
		b.ReportMetric(r.BuildNsPerBlock, "build-ns/block")
		b.ReportMetric(r.BytesPerRawBlock, "B/raw-block")
		b.ReportMetric(r.BuildNsPerRawBlock, "build-ns/raw-block")
		b.ReportMetric(r.MatchesPerQuery, "matches/query")
	})
}
