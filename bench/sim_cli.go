package bench

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	"gonum.org/v1/plot/plotter"

	"github.com/switchyard/switchyard/scheduler"
)

// Files the simulator writes under --out besides the live mode's.
const (
	FileSimReport      = "sim_report.json"
	FileHitRateReplica = "hit_rate_vs_replicas.png"
)

func init() { simMode = &simCLI{} }

// simCLI is the `switchyard bench --sim` front end installed into Main.
// Main calls RegisterFlags and then Run on one goroutine; the flag values of
// the call in progress live in cur (guarded by mu, so concurrent Main calls
// with --sim are safe but must not interleave their flag sets).
type simCLI struct {
	mu  sync.Mutex
	cur *simFlags
}

// simFlags are the simulator's flags. List flags run every combination.
type simFlags struct {
	base          SimConfig
	replicas      []int
	policies      []SimPolicy
	admissions    []SimAdmission
	gossip        []bool
	sessions      []bool
	ignoreDue     []bool
	dueMargins    []time.Duration
	classPolicies []scheduler.Policy
	fleets        []SimFleet
	deciders      []bool
	writeResults  bool
}

func newSimFlags() *simFlags {
	return &simFlags{
		base:          DefaultSimConfig(),
		replicas:      []int{1},
		policies:      []SimPolicy{SimKVAware},
		admissions:    []SimAdmission{SimCluster},
		gossip:        []bool{true},
		sessions:      []bool{false},
		ignoreDue:     []bool{false},
		dueMargins:    []time.Duration{0},
		classPolicies: []scheduler.Policy{scheduler.PolicyFCFS},
		fleets:        []SimFleet{{}},
		deciders:      []bool{true},
	}
}

// listFlag parses a comma-separated list with parse.
func listFlag[T any](fs *flag.FlagSet, name, usage string, dst *[]T, parse func(string) (T, error)) {
	fs.Func(name, usage, func(s string) error {
		var out []T
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			v, err := parse(item)
			if err != nil {
				return err
			}
			out = append(out, v)
		}
		if len(out) == 0 {
			return fmt.Errorf("empty list")
		}
		*dst = out
		return nil
	})
}

func parseOnOff(s string) (bool, error) {
	switch s {
	case "on", "true", "yes":
		return true, nil
	case "off", "false", "no":
		return false, nil
	}
	return false, fmt.Errorf("want on or off, got %q", s)
}

func parseDeadlines(s string) (bool, error) {
	switch s {
	case "aware", "edf":
		return false, nil
	case "ignore", "fcfs":
		return true, nil
	}
	return false, fmt.Errorf("want aware or ignore, got %q", s)
}

// RegisterFlags implements SimMode.
func (c *simCLI) RegisterFlags(fs *flag.FlagSet) {
	f := newSimFlags()
	c.mu.Lock()
	c.cur = f
	c.mu.Unlock()
	b := &f.base
	listFlag(fs, "sim-replicas", "sim: router replica counts to run, e.g. 1,3,8", &f.replicas, func(s string) (int, error) {
		n, err := strconv.Atoi(s)
		if err == nil && n < 1 {
			err = fmt.Errorf("replicas %d must be positive", n)
		}
		return n, err
	})
	listFlag(fs, "sim-policy", "sim: routing policies to run: kv, round-robin, random, least-loaded", &f.policies, ParseSimPolicy)
	listFlag(fs, "sim-admission", "sim: admission placements to run: cluster (class owners), per-replica (peer routers)", &f.admissions, ParseSimAdmission)
	listFlag(fs, "sim-gossip", "sim: share loads and predictions between replicas: on, off (or both: on,off)", &f.gossip, parseOnOff)
	listFlag(fs, "sim-sessions", "sim: session affinity (a turn prefers its session's previous worker): on, off (or both: on,off)", &f.sessions, parseOnOff)
	fs.Float64Var(&b.SessionMargin, "sim-session-margin", b.SessionMargin, "sim: soft session affinity keeps a session's worker while its cost is within this fraction of the best")
	listFlag(fs, "sim-deadlines", "sim: aware (due times order and expire queued requests) and/or ignore (plain FCFS)", &f.ignoreDue, parseDeadlines)
	listFlag(fs, "sim-due-margin", "sim: due time = deadline minus this margin, e.g. 0,200ms (room for the prefill after admission)", &f.dueMargins, time.ParseDuration)
	listFlag(fs, "sim-class-policy", "sim: class queue policies to run: fcfs, lcfs, wspt", &f.classPolicies, scheduler.ParsePolicy)
	fs.IntVar(&b.Workers, "sim-workers", b.Workers, "sim: simulated workers")
	fs.Uint64Var(&b.Seed, "sim-seed", b.Seed, "sim: seed of every random choice")
	fs.DurationVar(&b.GossipDelay, "sim-gossip-delay", b.GossipDelay, "sim: delay of gossiped loads and predictions")
	fs.DurationVar(&b.GossipRound, "sim-gossip-round", b.GossipRound, "sim: coalesce load changes into one gossip update per round, as the live gossip's interval (0: each change on its own)")
	fs.DurationVar(&b.EventDelay, "sim-event-delay", b.EventDelay, "sim: delay of KV events from engines to every replica's index")
	fs.DurationVar(&b.PredictTTL, "sim-predict-ttl", b.PredictTTL, "sim: lifetime of a routing decision's predicted prefix")
	fs.IntVar(&b.IndexSample, "sim-index-sample", b.IndexSample, "sim: every replica's index keeps about one block hash in this many, as -index.sample (0 or 1: every block)")
	fs.IntVar(&b.MaxRunning, "sim-max-running", b.MaxRunning, "sim: router-side cap of requests per worker (0: the engine's max-num-seqs)")
	fs.IntVar(&b.SplitClasses, "sim-split-classes", b.SplitClasses, "sim: spread requests without a class over this many classes (0: one class)")
	fs.BoolVar(&b.SingleClass, "sim-single-class", b.SingleClass, "sim: admit every request in one class, keeping its priority and deadline")
	fs.IntVar(&b.Class.Limits.Requests, "sim-queue-limit", b.Class.Limits.Requests, "sim: queued requests per worker per class (-1: unlimited)")
	fs.IntVar(&b.Class.Limits.ISLTokens, "sim-queue-limit-tokens", b.Class.Limits.ISLTokens, "sim: queued prompt tokens per worker per class (-1: unlimited)")
	fs.Float64Var(&b.Class.BusyDecodeFraction, "sim-busy-decode-fraction", b.Class.BusyDecodeFraction, "sim: a worker is busy above this projected KV fraction (0: off)")
	fs.IntVar(&b.Class.BusyPrefillTokens, "sim-busy-prefill-tokens", b.Class.BusyPrefillTokens, "sim: a worker is busy above this many projected prefill tokens (0: off)")
	b.Scheduler.RegisterFlags(fs, "sim-")
	fs.IntVar(&b.Engine.BlockSize, "sim-block-size", b.Engine.BlockSize, "sim: engine tokens per KV block")
	fs.IntVar(&b.Engine.NumBlocks, "sim-kv-blocks", b.Engine.NumBlocks, "sim: engine KV pool in blocks")
	fs.IntVar(&b.Engine.MaxNumBatchedTokens, "sim-max-batched-tokens", b.Engine.MaxNumBatchedTokens, "sim: engine token budget per step")
	fs.IntVar(&b.Engine.MaxNumSeqs, "sim-max-num-seqs", b.Engine.MaxNumSeqs, "sim: engine maximum running sequences")
	fs.IntVar(&b.Engine.MaxModelLen, "sim-max-model-len", b.Engine.MaxModelLen, "sim: engine maximum prompt plus output tokens")
	fs.Float64Var(&b.Engine.Speedup, "sim-engine-speedup", b.Engine.Speedup, "sim: divide every engine step time by this factor")
	fs.IntVar(&b.Engine.HostBlocks, "sim-host-blocks", b.Engine.HostBlocks, "sim: engine host-memory KV tier in blocks (0: none): GPU-evicted blocks go there and load back at -sim-host-load-ms-per-token")
	fs.Float64Var(&b.Engine.HostLoadMsPerToken, "sim-host-load-ms-per-token", b.Engine.HostLoadMsPerToken, "sim: ms a token's KV takes to load back from the host tier")
	fs.IntVar(&b.Engine.DiskBlocks, "sim-disk-blocks", b.Engine.DiskBlocks, "sim: engine disk KV tier in blocks below the host tier (0: none; needs -sim-host-blocks): blocks the host tier evicts go there and load back at -sim-disk-load-ms-per-token")
	fs.Float64Var(&b.Engine.DiskLoadMsPerToken, "sim-disk-load-ms-per-token", b.Engine.DiskLoadMsPerToken, "sim: ms a token's KV takes to load back from the disk tier")
	listFlag(fs, "sim-engine-speedups", "sim: per-worker engine speedups, assigned round-robin (e.g. 0.5,1: half the workers twice as slow)", &b.EngineSpeedups, func(s string) (float64, error) {
		return strconv.ParseFloat(s, 64)
	})
	listFlag(fs, "sim-fleet", "sim: fleet shapes to run: aggregated, <x>p<y>d (x prefill and y decode workers, e.g. 2p6d; sets -sim-workers to x+y)", &f.fleets, ParseSimFleet)
	listFlag(fs, "sim-decider", "sim: in an xPyD fleet, run short uncached prefills aggregated on the decode worker: on, off (or both: on,off)", &f.deciders, parseOnOff)
	fs.IntVar(&b.Scheduler.Disagg.MinTokens, "sim-disagg-min-tokens", b.Scheduler.Disagg.MinTokens, "sim: the decider's threshold in uncached prefill tokens (0: from the timing model)")
	fs.DurationVar(&b.SLO.TTFT, "sim-slo-ttft", b.SLO.TTFT, "sim: goodput SLO on time to first token")
	fs.DurationVar(&b.SLO.ITL, "sim-slo-itl", b.SLO.ITL, "sim: goodput SLO on a request's mean inter-token latency")
	fs.Float64Var(&b.Engine.TransferGbps, "sim-transfer-gbps", b.Engine.TransferGbps, "sim: prefill-to-decode KV link bandwidth in Gb/s")
	fs.Float64Var(&b.Engine.TransferSetupMs, "sim-transfer-setup-ms", b.Engine.TransferSetupMs, "sim: fixed cost of one KV transfer in ms")
	fs.IntVar(&b.Engine.ModelLayers, "sim-model-layers", b.Engine.ModelLayers, "sim: model layers (KV bytes per token = layers x kv heads x head dim x 2 x dtype bytes)")
	fs.IntVar(&b.Engine.KVHeads, "sim-kv-heads", b.Engine.KVHeads, "sim: KV heads per layer")
	fs.IntVar(&b.Engine.HeadDim, "sim-head-dim", b.Engine.HeadDim, "sim: attention head dimension")
	fs.IntVar(&b.Engine.KVDTypeBytes, "sim-kv-dtype-bytes", b.Engine.KVDTypeBytes, "sim: bytes per KV element (2: bf16, 1: fp8)")
	fs.BoolVar(&f.writeResults, "sim-results", f.writeResults, "sim: also write every request's results (results.jsonl, or results-<run>.jsonl per run)")
}

// simRun is one configuration of a sweep with its report.
type simRun struct {
	cfg    SimConfig
	key    string // the configuration without its policy (for ratios)
	report *SimReport
}

// Run implements SimMode: it runs every combination of the list flags on the
// trace, one after the other, and writes the reports.
func (c *simCLI) Run(ctx context.Context, env SimEnv) error {
	c.mu.Lock()
	f := c.cur
	c.mu.Unlock()
	if f == nil {
		f = newSimFlags()
	}
	log := env.Log
	if log == nil {
		log = zap.NewNop()
	}
	reqs, err := ReadAll(env.Trace, env.Options.Runner.MaxRequests)
	if err != nil {
		return fmt.Errorf("sim: read trace: %w", err)
	}
	if len(reqs) == 0 {
		return fmt.Errorf("%w: sim: the trace has no requests", ErrInvalidConfig)
	}
	runs, err := f.expand(env.Options)
	if err != nil {
		return err
	}
	for i := range runs {
		if err := runs[i].cfg.Validate(); err != nil {
			return err
		}
	}
	bounds := map[[3]int]CacheBound{}
	for i := range runs {
		start := time.Now()
		rep, err := RunSim(ctx, runs[i].cfg, reqs, log)
		if err != nil {
			return fmt.Errorf("sim run %q: %w", runs[i].cfg.Label, err)
		}
		ec := runs[i].cfg.Engine
		k := [3]int{ec.BlockSize, ec.NumBlocks, runs[i].cfg.Workers}
		if _, ok := bounds[k]; !ok {
			bounds[k] = ComputeCacheBound(reqs, runs[i].cfg.Vocab, ec.BlockSize, ec.NumBlocks, runs[i].cfg.Workers)
		}
		rep.Bound = bounds[k]
		runs[i].report = rep
		wall := time.Since(start).Seconds()
		_, _ = fmt.Fprintf(env.Stderr, "sim %-40s %6d requests  %8.1f simulated s in %6.1f wall s (%.0f× real time)\n",
			rep.Label, len(rep.Results), rep.SimulatedS, wall, rep.SimulatedS/max(wall, 1e-9))
	}
	return writeSimOutputs(env, runs, f.writeResults, log)
}

// expand builds the cartesian product of the list flags.
func (f *simFlags) expand(o Options) ([]simRun, error) {
	base := f.base
	base.TimeScale = o.Runner.Speedup
	base.ArrivalSpread = o.ArrivalSpread
	base.Vocab = o.Runner.Vocab
	var runs []simRun
	for _, cp := range f.classPolicies {
		for _, ign := range f.ignoreDue {
			for _, margin := range f.dueMargins {
				for _, adm := range f.admissions {
					for _, g := range f.gossip {
						for _, n := range f.replicas {
							for _, p := range f.policies {
								for _, sa := range f.sessions {
									for _, fl := range f.fleets {
										for _, dec := range f.deciders {
											if !fl.Disaggregated() && dec != f.deciders[0] {
												continue // the decider needs roles: one aggregated run
											}
											cfg := base
											cfg.Fleet, cfg.Decider = fl, dec
											if fl.Disaggregated() {
												cfg.Workers = fl.Prefill + fl.Decode
											}
											cfg.Sessions = sa
											cfg.Class.Policy, cfg.IgnoreDeadlines, cfg.Admission, cfg.Gossip, cfg.Replicas, cfg.Policy = cp, ign, adm, g, n, p
											cfg.DueMargin = margin
											var parts, keyParts []string
											add := func(vary bool, s string, inKey bool) {
												if vary {
													parts = append(parts, s)
													if inKey {
														keyParts = append(keyParts, s)
													}
												}
											}
											add(len(f.policies) > 1, p.String(), false)
											add(len(f.sessions) > 1, map[bool]string{true: "sessions", false: "no sessions"}[sa], true)
											add(len(f.fleets) > 1, fl.String(), true)
											add(len(f.deciders) > 1 && fl.Disaggregated(), map[bool]string{true: "decider", false: "no decider"}[dec], true)
											add(len(f.replicas) > 1, fmt.Sprintf("%d replicas", n), true)
											add(len(f.admissions) > 1, adm.String(), true)
											add(len(f.gossip) > 1, map[bool]string{true: "gossip", false: "no gossip"}[g], true)
											add(len(f.ignoreDue) > 1, map[bool]string{false: "deadline-aware", true: "deadline-blind"}[ign], true)
											add(len(f.dueMargins) > 1, "due margin "+margin.String(), true)
											add(len(f.classPolicies) > 1, cp.String(), true)
											cfg.Label = o.Label
											if len(parts) > 0 {
												cfg.Label = strings.Join(parts, ", ")
											}
											runs = append(runs, simRun{cfg: cfg, key: strings.Join(keyParts, ", ")})
										}
									}
								}
							}
						}
					}
				}
			}
		}
	}
	return runs, nil
}

// writeSimOutputs prints the comparison on stdout and, with --out, writes
// summary.md, summary.json, sim_report.json and the plots.
func writeSimOutputs(env SimEnv, runs []simRun, writeResults bool, log *zap.Logger) error {
	var md strings.Builder
	writeSimMarkdown(&md, runs)
	sums := make([]Summary, len(runs))
	rr := make([]RunResults, len(runs))
	reports := make([]*SimReport, len(runs))
	for i, r := range runs {
		sums[i], reports[i] = r.report.Summary, r.report
		rr[i] = RunResults{Label: r.report.Label, Results: r.report.Results}
	}
	md.WriteString("\n")
	if err := WriteMarkdown(&md, sums...); err != nil {
		return err
	}
	if _, err := io.WriteString(env.Stdout, md.String()); err != nil {
		return fmt.Errorf("write summary: %w", err)
	}
	out := env.Options.Out
	if out == "" {
		return nil
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return fmt.Errorf("create --out: %w", err)
	}
	if err := writeFile(filepath.Join(out, FileSummaryMD), func(w io.Writer) error {
		_, err := io.WriteString(w, md.String())
		return err
	}); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(out, FileSummaryJSON), func(w io.Writer) error { return WriteJSON(w, sums...) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(out, FileSimReport), func(w io.Writer) error { return WriteSimReports(w, reports...) }); err != nil {
		return err
	}
	if writeResults {
		for _, r := range runs {
			name := FileResults
			if len(runs) > 1 {
				name = "results-" + slug(r.report.Label) + ".jsonl"
			}
			if err := writeFile(filepath.Join(out, name), func(w io.Writer) error {
				rw := NewResultWriter(w)
				for _, res := range r.report.Results {
					_ = rw.Write(res) // the first error sticks
				}
				return rw.Flush()
			}); err != nil {
				return err
			}
		}
	}
	plots := []struct {
		name string
		draw func(string) error
	}{
		{FileTTFTCDF, func(p string) error { return PlotTTFTCDF(p, rr) }},
		{FileThroughput, func(p string) error { return PlotThroughput(p, rr, 0) }},
		{FileWorkerLoad, func(p string) error { return plotSimWorkerLoad(p, reports) }},
	}
	if pts := hitRatePoints(runs); pts != nil {
		plots = append(plots, struct {
			name string
			draw func(string) error
		}{FileHitRateReplica, func(p string) error { return PlotHitRateVsReplicas(p, pts) }})
	}
	for _, p := range plots {
		err := p.draw(filepath.Join(out, p.name))
		if err != nil {
			log.Warn("plot skipped", zap.String("plot", p.name), zap.Error(err))
		}
	}
	return nil
}

// WriteSimReports writes reports as an indented JSON array (sim_report.json).
func WriteSimReports(w io.Writer, reports ...*SimReport) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(reports); err != nil {
		return fmt.Errorf("write sim report: %w", err)
	}
	return nil
}

// writeSimMarkdown writes the sweep's comparison table: the headline
// numbers, with mean and p99 TTFT as ratios against round-robin under the
// same other settings when the sweep has it.
func writeSimMarkdown(b *strings.Builder, runs []simRun) {
	base := map[string]*SimReport{}
	for _, r := range runs {
		if r.cfg.Policy == SimRoundRobin {
			base[r.key] = r.report
		}
	}
	b.WriteString("| run | replicas | workers | TTFT mean (ms) | TTFT p99 (ms) | RR/this mean TTFT | RR/this p99 TTFT | req/s | out tok/s | hit rate | bound: all pools / one worker | hit / bound | deadline misses | goodput (req/s) | rejected | peak queued |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		s := r.report.Summary
		ratio := func(get func(Summary) float64) string {
			rr := base[r.key]
			if rr == nil || get(s) <= 0 {
				return "–"
			}
			return fmt.Sprintf("%.2f×", get(rr.Summary)/get(s))
		}
		ofBound := "–"
		if bd := r.report.Bound; bd.AllPools > 0 {
			ofBound = fmt.Sprintf("%.0f%%", 100*s.HitRate/bd.AllPools)
		}
		fmt.Fprintf(b, "| %s | %d | %d | %.1f | %.1f | %s | %s | %.2f | %.1f | %.1f%% | %.1f%% / %.1f%% | %s | %d/%d | %.2f | %d | %d |\n",
			mdEscape(r.report.Label), r.cfg.Replicas, r.cfg.Workers, s.TTFT.Mean, s.TTFT.P99,
			ratio(func(x Summary) float64 { return x.TTFT.Mean }), ratio(func(x Summary) float64 { return x.TTFT.P99 }),
			s.RequestRate, s.OutputTokenRate, 100*s.HitRate, 100*r.report.Bound.AllPools, 100*r.report.Bound.OneWorker, ofBound,
			s.DeadlineMisses, s.DeadlineRequests,
			r.report.GoodputRPS, s.Failed, r.report.PeakQueued)
	}
	writeSimQualityMarkdown(b, runs)
	writeSimSessionsMarkdown(b, runs)
	writeSimPDMarkdown(b, runs)
}

// writeSimQualityMarkdown writes the routing-quality table: the three
// figures of switchyard_router_decision_* per run, and why each fell short.
func writeSimQualityMarkdown(b *strings.Builder, runs []simRun) {
	b.WriteString("\nRouting quality (cached prompt tokens; the figures of a live router's switchyard_router_decision_* counters):\n\n")
	b.WriteString("| run | decisions | on the deepest prefix | reachable | achieved | achieved / reachable | realised | realised / achieved | missed, by reason | lost, by reason |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|---|\n")
	reasons := func(m map[string]uint64) string {
		var parts []string
		for _, k := range sortedKeys(m) {
			parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
		}
		if len(parts) == 0 {
			return "–"
		}
		return strings.Join(parts, ", ")
	}
	for _, r := range runs {
		q := r.report.Quality
		fmt.Fprintf(b, "| %s | %d | %d | %d | %d | %.1f%% | %d | %.1f%% | %s | %s |\n",
			mdEscape(r.report.Label), q.Decisions, q.KVOptimal, q.ReachableTokens, q.AchievedTokens, 100*q.AchievedRate,
			q.RealisedTokens, 100*q.RealisedRate, reasons(q.MissedTokens), reasons(q.LostTokens))
	}
}

// hitRatePoints is the hit rate per replica count, one series per
// configuration apart from the replica count; nil unless the sweep varies
// replicas.
func hitRatePoints(runs []simRun) []HitRatePoint {
	counts := map[int]bool{}
	for _, r := range runs {
		counts[r.cfg.Replicas] = true
	}
	if len(counts) < 2 {
		return nil
	}
	var pts []HitRatePoint
	for _, r := range runs {
		series := strings.TrimPrefix(strings.ReplaceAll(r.report.Label, fmt.Sprintf("%d replicas", r.cfg.Replicas), ""), ", ")
		series = strings.ReplaceAll(strings.TrimSuffix(series, ", "), ", , ", ", ")
		if series == "" {
			series = r.cfg.Policy.String()
		}
		pts = append(pts, HitRatePoint{Series: series, Replicas: r.cfg.Replicas, HitRate: r.report.Summary.HitRate})
	}
	// The bound does not depend on replicas: one flat line per pool size
	// shows how far each policy stays below what the caches can hold.
	seen := map[[2]int]bool{}
	for _, r := range runs {
		bd := r.report.Bound
		if bd.AllPools <= 0 {
			continue
		}
		k := [2]int{r.cfg.Replicas, bd.BlocksPerWorker * bd.Workers * bd.BlockSize}
		if seen[k] {
			continue
		}
		seen[k] = true
		pts = append(pts, HitRatePoint{Series: fmt.Sprintf("bound: one LRU of all %d pools", bd.Workers), Replicas: r.cfg.Replicas, HitRate: bd.AllPools})
	}
	return pts
}

// plotSimWorkerLoad draws the uncached prompt tokens (prefill work) each
// worker did, one line per run: a flat line is a balanced cluster, and the
// level shows how much prefill the cache saved.
func plotSimWorkerLoad(path string, reports []*SimReport) error {
	p := newPlot("Per-worker prefill load", "worker", "uncached prompt tokens (millions)")
	drawn := false
	for i, rep := range reports {
		pts := make(plotter.XYs, len(rep.Workers))
		for j, w := range rep.Workers {
			pts[j] = plotter.XY{X: float64(j), Y: float64(w.PromptTokens-w.CachedTokens) / 1e6}
		}
		if len(pts) == 0 {
			continue
		}
		if err := addLine(p, rep.Label, i, pts); err != nil {
			return err
		}
		drawn = true
	}
	if !drawn {
		return fmt.Errorf("worker load: %w", ErrNoPlotData)
	}
	p.Y.Min = 0
	return savePNG(p, path)
}

// slug makes a label usable in a file name.
func slug(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		case b.Len() > 0 && !strings.HasSuffix(b.String(), "-"):
			b.WriteByte('-')
		}
	}
	return strings.TrimSuffix(b.String(), "-")
}
