package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
)

// Files `switchyard bench --scale` writes under --out.
const (
	FileScaleReport    = "scale_report.md"
	FileScaleJSON      = "scale_report.json"
	FileScaleIndexMem  = "scale_index_bytes.png"
	FileScaleIndexTail = "scale_index_lookup.png"
	FileScaleIngest    = "scale_ingest.png"
	FileScaleHitRate   = "scale_hit_rate.png"
)

// The goals the scale report states each measurement against
// (docs/benchmarks.md, "Scale").
const (
	goalLookupP99us     = 10
	goalBytesPerBlock   = 64
	goalApplyNsPerBlock = 1000
	goalGoalWorkers     = 10_000
	goalHitRatePoints   = 1
	goalThroughputRatio = 50
)

func init() { scaleMode = &scaleCLI{} }

// scaleCLI is `switchyard bench --scale`: the index at fleet sizes, one
// replica's event ingest as the fleet grows, routing quality in the
// simulator at 64 to 256 workers and 8 to 32 replicas, and the results of
// the Go benchmarks that need real sockets (a replica against a bare proxy,
// gossip), read from `go test -bench` output. Main calls RegisterFlags and
// then Run on one goroutine; cur holds the flags of the call in progress.
type scaleCLI struct {
	mu  sync.Mutex
	cur *scaleFlags
}

type scaleFlags struct {
	workers     []int
	blocks      int
	queries     int
	requests    int
	simWorkers  []int
	simReplicas []int
	simRequests int
	simCopies   int
	simSample   []int
	simKVBlocks int
	cpuProfile  string
	simRound    time.Duration
	simSplit    int
	sample      int
	sections    []string
	gotest      []string
	merge       []string
}

func newScaleFlags() *scaleFlags {
	return &scaleFlags{
		workers:     []int{1_000, 10_000},
		blocks:      DefaultIndexScaleConfig().BlocksPerWorker,
		queries:     DefaultIndexScaleConfig().Queries,
		requests:    3_000,
		simWorkers:  []int{64, 256},
		simReplicas: []int{1, 8, 32},
		simRequests: 3_000,
		simSample:   []int{1},
		simSplit:    8,
		sample:      1,
		sections:    []string{"index", "ingest", "sim"},
	}
}

func (c *scaleCLI) RegisterFlags(fs *flag.FlagSet) {
	f := newScaleFlags()
	c.mu.Lock()
	c.cur = f
	c.mu.Unlock()
	atoi := strconv.Atoi
	listFlag(fs, "scale-workers", "scale: index fleet sizes (workers), e.g. 1000,10000,50000", &f.workers, atoi)
	fs.IntVar(&f.blocks, "scale-blocks", f.blocks, "scale: indexed blocks per worker")
	fs.IntVar(&f.queries, "scale-queries", f.queries, "scale: distinct 256-block lookups per index (each run 5 times)")
	fs.IntVar(&f.requests, "scale-ingest-requests", f.requests, "scale: trace requests whose KV events give the ingest rates")
	fs.IntVar(&f.sample, "scale-sample", f.sample, "scale: index sampling rate of the index and ingest sections, as -index.sample (1: every block)")
	listFlag(fs, "scale-sim-workers", "scale: simulated fleet sizes for routing quality (the trace is time-compressed 6x per 8 workers)", &f.simWorkers, atoi)
	listFlag(fs, "scale-sim-replicas", "scale: replica counts for routing quality", &f.simReplicas, atoi)
	fs.IntVar(&f.simRequests, "scale-sim-requests", f.simRequests, "scale: trace requests per routing-quality run (with --scale-sim-copies: the first of the merged copies)")
	fs.IntVar(&f.simCopies, "scale-sim-copies", f.simCopies, "scale: replay this many copies of the Mooncake trace as independent user populations (disjoint block ids, rotated in time), each compressed so the copies together carry §1's load per engine (0: the one trace, compressed 6x per 8 workers)")
	fs.DurationVar(&f.simRound, "scale-sim-gossip-round", f.simRound, "scale: coalesce load changes into one gossip update per round, as -sim-gossip-round (0: each change on its own)")
	fs.IntVar(&f.simSplit, "scale-sim-split-classes", f.simSplit, "scale: spread the trace's requests over this many classes, so that several replicas own classes (1: one owner admits every request)")
	fs.StringVar(&f.cpuProfile, "scale-cpuprofile", f.cpuProfile, "scale: write a CPU profile of the run to this file")
	listFlag(fs, "scale-sim-sample", "scale: index sampling rates of the simulated replicas, as -index.sample (1: every block)", &f.simSample, atoi)
	fs.IntVar(&f.simKVBlocks, "scale-sim-kv-blocks", f.simKVBlocks, "scale: every simulated engine's KV pool in blocks (0: the simulator's default, 54,400 of 16 tokens)")
	listFlag(fs, "scale-sections", "scale: sections to run: index, ingest, sim, or none (only --scale-gotest)", &f.sections, func(s string) (string, error) {
		switch s {
		case "index", "ingest", "sim", "none":
			return s, nil
		}
		return "", fmt.Errorf("section %q: want index, ingest, sim or none", s)
	})
	listFlag(fs, "scale-merge", "scale: earlier --scale --out directories whose scale_report.json joins this report (run sections apart, report once)", &f.merge, func(s string) (string, error) { return s, nil })
	listFlag(fs, "scale-gotest", "scale: files of `go test -bench` output to add to the report (BenchmarkReplicaThroughput, gossip)", &f.gotest, func(s string) (string, error) { return s, nil })
}

// ScaleReport is what `switchyard bench --scale` measured.
type ScaleReport struct {
	Index   []IndexScaleResult `json:"index,omitempty"`
	Ingest  *IngestScaleResult `json:"ingest,omitempty"`
	Quality []ScaleQuality     `json:"quality,omitempty"`
	GoTest  []GoBenchLine      `json:"go_benchmarks,omitempty"`
}

// ScaleQuality is one simulated run of the routing-quality section.
type ScaleQuality struct {
	Workers   int     `json:"workers"`
	Replicas  int     `json:"replicas"`
	TimeScale float64 `json:"time_scale"`
	Requests  int     `json:"requests"`
	// Copies is FleetTrace's copies (0: the one trace), Sample the
	// replicas' index sampling rate, KVBlocks every engine's pool.
	Copies   int     `json:"copies,omitempty"`
	Sample   int     `json:"sample,omitempty"`
	KVBlocks int     `json:"kv_blocks,omitempty"`
	HitRate  float64 `json:"hit_rate"`
	// BoundAll is the hit rate of one LRU of every worker's pool together,
	// BoundOne of one worker's pool (CacheBound).
	BoundAll float64 `json:"bound_all_pools"`
	BoundOne float64 `json:"bound_one_worker"`
	TTFTp50  float64 `json:"ttft_p50_ms"`
	TTFTp99  float64 `json:"ttft_p99_ms"`
	WallS    float64 `json:"wall_s"`
	// SimulatedS is the run's virtual time, Evicted the blocks the
	// engines evicted in it (0: no pool filled, its size did not matter).
	SimulatedS float64 `json:"simulated_s,omitempty"`
	Evicted    uint64  `json:"evicted_blocks,omitempty"`
	// Ingest is one replica's KV event apply CPU in the run.
	Ingest *SimIngestReport `json:"ingest,omitempty"`
	// Quality is the run's routing quality (reachable, achieved and
	// realised prompt tokens: where a loss against one replica went).
	Quality *SimQuality `json:"routing_quality,omitempty"`
}

// GoBenchLine is one result line of `go test -bench` output.
type GoBenchLine struct {
	Name    string             `json:"name"`
	Metrics map[string]float64 `json:"metrics"`
	Units   []string           `json:"units"`
}

func (c *scaleCLI) Run(ctx context.Context, env SimEnv) error {
	c.mu.Lock()
	f := c.cur
	c.mu.Unlock()
	if f == nil {
		f = newScaleFlags()
	}
	has := func(s string) bool {
		for _, x := range f.sections {
			if x == s {
				return true
			}
		}
		return false
	}
	if f.cpuProfile != "" {
		fh, err := os.Create(f.cpuProfile)
		if err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		defer func() { _ = fh.Close() }()
		if err := pprof.StartCPUProfile(fh); err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	var rep ScaleReport
	progress := func(format string, args ...any) { _, _ = fmt.Fprintf(env.Stderr, "scale: "+format+"\n", args...) }
	if has("index") {
		for _, w := range f.workers {
			cfg := DefaultIndexScaleConfig()
			cfg.Workers, cfg.BlocksPerWorker, cfg.Queries = w, f.blocks, f.queries
			cfg.Sample = f.sample
			start := time.Now()
			r, err := MeasureIndexScale(cfg)
			if err != nil {
				return err
			}
			progress("index %d workers, sample %d: %.1f B/block (%.1f per raw block), lookup p50 %.1f p99 %.1f (query-min %.1f) µs, apply %.0f ns/block, %.1f matches/query, in %.0f s",
				w, r.Sample, r.BytesPerBlock, r.BytesPerRawBlock, r.LookupP50us, r.LookupP99us, r.QueryMinP99us, r.ApplyNsPerBlock, r.MatchesPerQuery, time.Since(start).Seconds())
			rep.Index = append(rep.Index, r)
			if err := ctx.Err(); err != nil {
				return err
			}
		}
	}
	var reqs []TraceRequest
	if has("ingest") || has("sim") {
		var err error
		n := max(f.requests, f.simRequests)
		if has("sim") && f.simCopies > 0 {
			n = 0 // every copy is the whole trace
		}
		if reqs, err = ReadAll(env.Trace, n); err != nil {
			return fmt.Errorf("scale: read trace: %w", err)
		}
	}
	if has("ingest") {
		cfg := DefaultIngestScaleConfig()
		cfg.Sim.MaxRequests = f.requests
		cfg.Sample = f.sample
		start := time.Now()
		r, err := MeasureIngestScale(ctx, cfg, reqs, rep.Index)
		if err != nil {
			return err
		}
		cores10k := 0.0
		for _, p := range r.Curve {
			if p.Engines == 10_000 {
				cores10k = p.Cores
			}
		}
		progress("ingest, sample %d: %.0f stored + %.0f removed blocks/s per engine, decode %.0f + apply %.0f ns/block, %.2f cores at 10,000 engines, one core at %d engines, in %.0f s",
			r.Sample, r.StoredBlocksPerS, r.RemovedBlocksPerS, r.DecodeNsPerBlock, r.ApplyNsPerBlock, cores10k, r.OneCoreAt, time.Since(start).Seconds())
		rep.Ingest = &r
	}
	if has("sim") {
		for _, w := range f.simWorkers {
			run := scaleSimRun{workers: w, requests: f.simRequests, copies: f.simCopies, kvBlocks: f.simKVBlocks, round: f.simRound, split: f.simSplit}
			if err := run.prepare(reqs); err != nil {
				return err
			}
			for _, sample := range f.simSample {
				for _, n := range f.simReplicas {
					q, err := run.quality(ctx, n, sample)
					if err != nil {
						return err
					}
					in := ""
					if q.Ingest != nil {
						in = fmt.Sprintf(", ingest %.3f cores per replica (%.0f blocks/s, %.0f ns/block)", q.Ingest.Cores, q.Ingest.BlocksPerS, q.Ingest.ApplyNsBlock)
					}
					progress("sim %d workers × %d replicas, sample %d, %d requests over %.1f simulated s: hit rate %.1f%% (all pools %.1f%%, one worker %.1f%%)%s, %d blocks evicted, %.0f wall s",
						w, n, max(1, sample), q.Requests, q.SimulatedS, 100*q.HitRate, 100*q.BoundAll, 100*q.BoundOne, in, q.Evicted, q.WallS)
					rep.Quality = append(rep.Quality, q)
				}
			}
		}
	}
	for _, dir := range f.merge {
		if err := mergeScaleReport(&rep, filepath.Join(dir, FileScaleJSON)); err != nil {
			return err
		}
	}
	for _, path := range f.gotest {
		lines, err := readGoBench(path)
		if err != nil {
			return err
		}
		rep.GoTest = append(rep.GoTest, lines...)
	}
	return writeScaleOutputs(env, &rep)
}

// scaleSimRun is the routing-quality section at one fleet size: the
// workload (the one trace compressed 6× per 8 workers, or FleetTrace's
// copies at the same load per engine) and its cache bound, shared by the
// runs at each replica count and sampling rate.
type scaleSimRun struct {
	workers, requests, copies, kvBlocks int
	round                               time.Duration
	split                               int
	reqs                                []TraceRequest
	timeScale                           float64 // of the simulation (1 for FleetTrace's pre-scaled arrivals)
	traceScale                          float64 // of each copy of the trace
	bound                               CacheBound
}

func (r *scaleSimRun) prepare(reqs []TraceRequest) error {
	r.traceScale = 6 * float64(r.workers) / 8
	r.timeScale = r.traceScale
	r.reqs = reqs
	if r.copies > 0 {
		r.traceScale = FleetTimeScale(r.workers, r.copies)
		fleet, err := FleetTrace(reqs, r.copies, r.traceScale)
		if err != nil {
			return fmt.Errorf("scale sim: %w", err)
		}
		r.reqs, r.timeScale = fleet, 1
	}
	r.reqs = r.reqs[:min(len(r.reqs), r.requests)]
	cfg := r.config(1, 1)
	r.bound = ComputeCacheBound(r.reqs, cfg.Vocab, cfg.Engine.BlockSize, cfg.Engine.NumBlocks, r.workers)
	return nil
}

func (r *scaleSimRun) config(replicas, sample int) SimConfig {
	cfg := DefaultSimConfig()
	cfg.Label = fmt.Sprintf("scale-%dw-%dr", r.workers, replicas)
	cfg.Workers, cfg.Replicas = r.workers, replicas
	cfg.TimeScale = r.timeScale
	cfg.SplitClasses = r.split
	cfg.IndexSample = sample
	cfg.GossipRound = r.round
	if r.kvBlocks > 0 {
		cfg.Engine.NumBlocks = r.kvBlocks
	}
	return cfg
}

// quality simulates the run's workers behind replicas routers, classes
// split 8 ways so that several replicas own classes, and accounts one
// replica's ingest CPU (on this goroutine's OS thread, locked for it).
func (r *scaleSimRun) quality(ctx context.Context, replicas, sample int) (ScaleQuality, error) {
	cfg := r.config(replicas, sample)
	cfg.MeasureIngest = true
	start := time.Now()
	runtime.LockOSThread()
	rep, err := RunSim(ctx, cfg, r.reqs, nil)
	runtime.UnlockOSThread()
	if err != nil {
		return ScaleQuality{}, fmt.Errorf("scale sim %s: %w", cfg.Label, err)
	}
	q := ScaleQuality{
		Workers: r.workers, Replicas: replicas, TimeScale: r.traceScale, Requests: len(rep.Results),
		Copies: r.copies, Sample: max(1, sample), KVBlocks: cfg.Engine.NumBlocks,
		HitRate: rep.Summary.HitRate, BoundAll: r.bound.AllPools, BoundOne: r.bound.OneWorker,
		TTFTp50: rep.Summary.TTFT.P50, TTFTp99: rep.Summary.TTFT.P99,
		WallS: time.Since(start).Seconds(), SimulatedS: rep.SimulatedS, Ingest: rep.Ingest,
	}
	qual := rep.Quality
	q.Quality = &qual
	for _, w := range rep.Workers {
		q.Evicted += w.Evicted
	}
	return q, nil
}

// mergeScaleReport adds the measurements of an earlier report to rep.
func mergeScaleReport(rep *ScaleReport, path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("scale: merge: %w", err)
	}
	var old ScaleReport
	if err := json.Unmarshal(raw, &old); err != nil {
		return fmt.Errorf("%w: scale: merge %s: %w", ErrInvalidConfig, path, err)
	}
	rep.Index = append(rep.Index, old.Index...)
	if rep.Ingest == nil {
		rep.Ingest = old.Ingest
	}
	rep.Quality = append(rep.Quality, old.Quality...)
	rep.GoTest = append(rep.GoTest, old.GoTest...)
	return nil
}

// readGoBench reads the result lines of `go test -bench` output: a name,
// an iteration count, then value-unit pairs.
func readGoBench(path string) ([]GoBenchLine, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("scale: %w", err)
	}
	defer func() { _ = fh.Close() }()
	var out []GoBenchLine
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 4 || !strings.HasPrefix(fields[0], "Benchmark") {
			continue
		}
		if _, err := strconv.Atoi(fields[1]); err != nil {
			continue
		}
		l := GoBenchLine{Name: fields[0], Metrics: map[string]float64{}}
		for i := 2; i+1 < len(fields); i += 2 {
			v, err := strconv.ParseFloat(fields[i], 64)
			if err != nil {
				break
			}
			l.Metrics[fields[i+1]] = v
			l.Units = append(l.Units, fields[i+1])
		}
		out = append(out, l)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("scale: read %s: %w", path, err)
	}
	return out, nil
}

func writeScaleOutputs(env SimEnv, rep *ScaleReport) error {
	var md strings.Builder
	writeScaleMarkdown(&md, rep)
	if _, err := io.WriteString(env.Stdout, md.String()); err != nil {
		return fmt.Errorf("scale: write report: %w", err)
	}
	dir := env.Options.Out
	if dir == "" {
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileScaleReport), []byte(md.String()), 0o644); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	js, err := json.MarshalIndent(rep, "", "  ")
	if err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, FileScaleJSON), append(js, '\n'), 0o644); err != nil {
		return fmt.Errorf("scale: %w", err)
	}
	return plotScale(dir, rep)
}

func status(ok bool) string {
	if ok {
		return "**met**"
	}
	return "**missed**"
}

func writeScaleMarkdown(b *strings.Builder, rep *ScaleReport) {
	b.WriteString("# Scale report\n\n")
	if len(rep.Index) > 0 {
		b.WriteString("## Index (one replica's KV index)\n\n")
		b.WriteString("| workers | blocks/worker | entries (M) | B/block | MB/worker | lookup p50 µs | lookup p99 µs | query-min p99 µs | apply ns/block | build ns/block |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		for _, r := range rep.Index {
			fmt.Fprintf(b, "| %d | %d | %.1f | %.1f | %.3f | %.1f | %.1f | %.1f | %.0f | %.0f |\n",
				r.Workers, r.BlocksPerWorker, float64(r.Entries)/1e6, r.BytesPerBlock, r.BytesPerWorker/1e6,
				r.LookupP50us, r.LookupP99us, r.QueryMinP99us, r.ApplyNsPerBlock, r.BuildNsPerBlock)
		}
		b.WriteString("\n(MB/worker is the whole index's heap divided by the workers. query-min p99 is the p99 over queries of each query's fastest of 5 runs: the index's own tail without the machine's preemptions. Apply is thread CPU time of steady-state batches, 16 blocks removed and stored again.)\n\n")
		for _, r := range rep.Index {
			if r.Workers != goalGoalWorkers {
				continue
			}
			fmt.Fprintf(b, "Goals at %d workers × %d blocks: lookup p99 ≤ %d µs: %s (single lookups %.1f µs, query-min %.1f µs); ≤ %d B/block: %s (%.1f); apply ≤ 1 µs/block: %s (%.0f ns).\n\n",
				r.Workers, r.BlocksPerWorker, goalLookupP99us, status(r.LookupP99us <= goalLookupP99us), r.LookupP99us, r.QueryMinP99us,
				goalBytesPerBlock, status(r.BytesPerBlock <= goalBytesPerBlock), r.BytesPerBlock,
				status(r.ApplyNsPerBlock <= goalApplyNsPerBlock), r.ApplyNsPerBlock)
		}
	}
	if in := rep.Ingest; in != nil {
		b.WriteString("## Event ingest per replica\n\n")
		fmt.Fprintf(b, "Per engine at §1's load (Mooncake, 6×, %d engines, %.0f simulated s): %.1f batches/s, %.1f events/s, %.0f stored and %.0f removed blocks/s, %.1f kB/s on the wire. Replayed on one thread: decode %.1f ns/block (%.0f ns/batch), apply %.1f ns/block into a fresh index; %.5f cores per engine.\n\n",
			in.Engines, in.SimulatedS, in.BatchesPerS, in.EventsPerS, in.StoredBlocksPerS, in.RemovedBlocksPerS, in.WireBytesPerS/1e3,
			in.DecodeNsPerBlock, in.DecodeNsPerBatch, in.ApplyNsPerBlock, in.CoresPerEngine)
		b.WriteString("| engines | apply ns/block used | replica cores on ingest |\n|---:|---:|---:|\n")
		for _, p := range in.Curve {
			fmt.Fprintf(b, "| %d | %.0f | %.2f |\n", p.Engines, p.ApplyNsPerBlock, p.Cores)
		}
		fmt.Fprintf(b, "\nIngest takes one core at about **%d engines** (apply cost of the largest index measured). Goal, below one core at %d: %s.\n\n",
			in.OneCoreAt, goalGoalWorkers, status(in.OneCoreAt > goalGoalWorkers))
	}
	if len(rep.Quality) > 0 {
		b.WriteString("## Routing quality at scale (simulator)\n\n")
		b.WriteString("| workers | replicas | time scale | requests | hit rate | vs 1 replica (points) | all-pools LRU bound | one-worker LRU | TTFT p50 ms | TTFT p99 ms | wall s |\n")
		b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
		// One replica's run of the same workload and sampling rate is
		// each row's baseline.
		type runKey struct{ workers, copies, requests, sample int }
		key := func(q ScaleQuality) runKey { return runKey{q.Workers, q.Copies, q.Requests, max(1, q.Sample)} }
		one := map[runKey]float64{}
		for _, q := range rep.Quality {
			if q.Replicas == 1 {
				one[key(q)] = q.HitRate
			}
		}
		for _, q := range rep.Quality {
			d := "—"
			if base, ok := one[key(q)]; ok {
				d = fmt.Sprintf("%+.1f", 100*(q.HitRate-base))
			}
			fmt.Fprintf(b, "| %d | %d | %.0f× | %d | %.1f%% | %s | %.1f%% | %.1f%% | %.0f | %.0f | %.0f |\n",
				q.Workers, q.Replicas, q.TimeScale, q.Requests, 100*q.HitRate, d, 100*q.BoundAll, 100*q.BoundOne, q.TTFTp50, q.TTFTp99, q.WallS)
		}
		worst := 0.0
		for _, q := range rep.Quality {
			if base, ok := one[key(q)]; ok {
				worst = max(worst, 100*(base-q.HitRate))
			}
		}
		fmt.Fprintf(b, "\nGoal, hit rate within %d point of one replica: %s (largest loss %.1f points).\n\n", goalHitRatePoints, status(worst <= goalHitRatePoints), worst)
		var fleet []ScaleQuality
		for _, q := range rep.Quality {
			if q.Copies > 0 || q.Ingest != nil {
				fleet = append(fleet, q)
			}
		}
		if len(fleet) > 0 {
			b.WriteString("Workload and ingest of each run (copies: FleetTrace's copies of the trace, 0 the one trace; ingest: one replica's KV batch apply CPU per simulated second, decode not included):\n\n")
			b.WriteString("| workers | replicas | copies | sample | KV blocks | requests | req/worker | simulated s | evicted blocks | blocks/s per replica | apply ns/block | ingest cores per replica |\n")
			b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
			for _, q := range fleet {
				in := SimIngestReport{}
				if q.Ingest != nil {
					in = *q.Ingest
				}
				fmt.Fprintf(b, "| %d | %d | %d | %d | %d | %d | %.1f | %.2f | %d | %.0f | %.0f | %.3f |\n",
					q.Workers, q.Replicas, q.Copies, max(1, q.Sample), q.KVBlocks, q.Requests, float64(q.Requests)/float64(q.Workers),
					q.SimulatedS, q.Evicted, in.BlocksPerS, in.ApplyNsBlock, in.Cores)
			}
			b.WriteString("\n")
		}
	}
	if len(rep.GoTest) > 0 {
		b.WriteString("## Go benchmarks\n\n| benchmark | metrics |\n|---|---|\n")
		// The goal is stated against the isolated benchmark (router and
		// proxy each in a process of its own) when the output holds it:
		// its CPU per request is each process's own, not a difference of
		// two passes of a shared process. Several runs: their median.
		var isolated, inProcess []float64
		for _, l := range rep.GoTest {
			var ms []string
			for _, u := range l.Units {
				ms = append(ms, fmt.Sprintf("%.4g %s", l.Metrics[u], u))
			}
			fmt.Fprintf(b, "| %s | %s |\n", l.Name, strings.Join(ms, ", "))
			if r, ok := l.Metrics["ratio-%"]; ok {
				switch {
				case strings.HasPrefix(l.Name, "BenchmarkReplicaThroughputIsolated"):
					isolated = append(isolated, r)
				case strings.HasPrefix(l.Name, "BenchmarkReplicaThroughput"):
					inProcess = append(inProcess, r)
				}
			}
		}
		goal := ""
		if runs, how := isolated, "router and proxy each in a process of its own"; len(runs) > 0 || len(inProcess) > 0 {
			if len(runs) == 0 {
				runs, how = inProcess, "in-process difference"
			}
			r, of := median(runs), "one run"
			if len(runs) > 1 {
				of = fmt.Sprintf("median of %d runs", len(runs))
			}
			goal = fmt.Sprintf("Goal, a replica at ≥ %d%% of a bare proxy's requests per second per core: %s (%.0f%%; %s, %s).\n\n",
				goalThroughputRatio, status(r >= goalThroughputRatio), r, how, of)
		}
		b.WriteString("\n" + goal)
	}
}

func plotScale(dir string, rep *ScaleReport) error {
	logX := func(p *plot.Plot) {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	// Costs that grow with the fleet span decades: log scales on both axes.
	logY := func(p *plot.Plot) {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
	}
	if len(rep.Index) > 0 {
		var mem, p50, p99, qmin plotter.XYs
		for _, r := range rep.Index {
			x := float64(r.Workers)
			mem = append(mem, plotter.XY{X: x, Y: r.BytesPerBlock})
			p50 = append(p50, plotter.XY{X: x, Y: r.LookupP50us})
			p99 = append(p99, plotter.XY{X: x, Y: r.LookupP99us})
			qmin = append(qmin, plotter.XY{X: x, Y: r.QueryMinP99us})
		}
		p := newPlot("Index heap per indexed block", "workers", "bytes per block")
		logX(p)
		if err := addLine(p, "B/block", 0, mem); err != nil {
			return err
		}
		if err := addLine(p, "goal", 1, plotter.XYs{{X: mem[0].X, Y: goalBytesPerBlock}, {X: mem[len(mem)-1].X, Y: goalBytesPerBlock}}); err != nil {
			return err
		}
		if err := savePNG(p, filepath.Join(dir, FileScaleIndexMem)); err != nil {
			return err
		}
		p = newPlot("Lookup latency of a 256-block prompt", "workers", "µs")
		logX(p)
		logY(p)
		for i, s := range []struct {
			name string
			pts  plotter.XYs
		}{{"p50", p50}, {"p99", p99}, {"query-min p99", qmin}} {
			if err := addLine(p, s.name, i, s.pts); err != nil {
				return err
			}
		}
		if err := savePNG(p, filepath.Join(dir, FileScaleIndexTail)); err != nil {
			return err
		}
	}
	if in := rep.Ingest; in != nil && len(in.Curve) > 0 {
		var pts plotter.XYs
		for _, c := range in.Curve {
			pts = append(pts, plotter.XY{X: float64(c.Engines), Y: c.Cores})
		}
		p := newPlot("One replica's KV event ingest (Mooncake 6× load per engine)", "engines", "cores")
		logX(p)
		logY(p)
		if err := addLine(p, "decode + apply", 0, pts); err != nil {
			return err
		}
		if err := addLine(p, "one core", 1, plotter.XYs{{X: pts[0].X, Y: 1}, {X: pts[len(pts)-1].X, Y: 1}}); err != nil {
			return err
		}
		if err := savePNG(p, filepath.Join(dir, FileScaleIngest)); err != nil {
			return err
		}
	}
	if len(rep.Quality) > 0 {
		p := newPlot("Hit rate against replicas (simulator)", "replicas", "hit rate %")
		series := map[int]plotter.XYs{}
		var order []int
		for _, q := range rep.Quality {
			if _, ok := series[q.Workers]; !ok {
				order = append(order, q.Workers)
			}
			series[q.Workers] = append(series[q.Workers], plotter.XY{X: float64(q.Replicas), Y: 100 * q.HitRate})
		}
		for i, w := range order {
			if err := addLine(p, fmt.Sprintf("%d workers", w), i, series[w]); err != nil {
				return err
			}
		}
		if err := savePNG(p, filepath.Join(dir, FileScaleHitRate)); err != nil {
			return err
		}
	}
	return nil
}

// median is the middle of vs (the mean of the two middle values when
// there is an even number); vs is not changed. vs must not be empty.
func median(vs []float64) float64 {
	s := slices.Clone(vs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
