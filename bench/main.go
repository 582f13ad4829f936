package bench

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Trace kinds accepted by --trace.
const (
	TraceMooncake  = "mooncake"
	TraceAzure     = "azure"
	TraceSynthetic = "synthetic"
)

// Output file names written under --out.
const (
	FileResults     = "results.jsonl"
	FileSummaryMD   = "summary.md"
	FileSummaryJSON = "summary.json"
	FileTTFTCDF     = "ttft_cdf.png"
	FileThroughput  = "throughput.png"
	FileWorkerLoad  = "worker_load.png"
)

// Options are `switchyard bench`'s parsed flags.
type Options struct {
	// Trace is mooncake, azure or synthetic; File the trace file (not used
	// by synthetic).
	Trace string
	File  string
	// Out is the directory for results and reports ("": summary on stdout
	// only).
	Out string
	// Label names the run in reports (default: the trace kind).
	Label string
	// Progress is auto (only when stderr is a terminal), on or off.
	Progress string
	// SkipBadLines skips malformed trace lines instead of failing.
	SkipBadLines bool
	// Sim selects the simulator mode (see SimMode).
	Sim bool
	// Scale writes the scale report (bench/scale*.go) instead of a run.
	Scale bool
	// Compare lists earlier --out directories whose results.jsonl are
	// combined into one report (no requests are sent); each run keeps the
	// label in its summary.json, else its directory's name.
	Compare []string
	// LogLevel is the zap level of diagnostics on stderr.
	LogLevel string
	// MaxModelLen > 0 drops trace requests whose prompt plus output exceed
	// it (the engines' context limit), instead of sending them to be
	// rejected.
	MaxModelLen int

	MooncakeBlockSize int
	// ArrivalSpread spreads requests sharing one trace timestamp evenly over
	// this window (see SpreadArrivals); 0 replays the timestamps as they are.
	ArrivalSpread time.Duration
	Azure         AzureOptions
	Synthetic     SyntheticConfig
	Runner        RunnerConfig
}

// DefaultOptions holds every default of `switchyard bench`.
func DefaultOptions() Options {
	return Options{
		Trace:             TraceSynthetic,
		Progress:          "auto",
		LogLevel:          "warn",
		MooncakeBlockSize: MooncakeBlockSize,
		Azure:             DefaultAzureOptions(),
		Synthetic:         DefaultSyntheticConfig(),
		Runner:            DefaultRunnerConfig(),
	}
}

// RegisterFlags registers every live-mode flag on fs.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.Trace, "trace", o.Trace, "trace kind: mooncake, azure or synthetic")
	fs.StringVar(&o.File, "file", o.File, "trace file (mooncake JSONL or azure CSV)")
	fs.StringVar(&o.Out, "out", o.Out, "directory for results.jsonl, summary.md, summary.json and PNG plots")
	fs.StringVar(&o.Label, "label", o.Label, "run label in reports (default: the trace kind)")
	fs.StringVar(&o.Progress, "progress", o.Progress, "progress line on stderr: auto (when a terminal), on, off")
	fs.BoolVar(&o.SkipBadLines, "skip-bad-lines", o.SkipBadLines, "skip malformed trace lines instead of failing")
	fs.BoolVar(&o.Sim, "sim", o.Sim, "run the deterministic in-process simulator instead of a live endpoint")
	fs.BoolVar(&o.Scale, "scale", o.Scale, "measure the index, event ingest and routing quality at fleet scale and write the scale report (--trace mooncake)")
	fs.Func("compare", "comma-separated earlier --out directories: report them side by side instead of running", func(v string) error {
		o.Compare = nil
		for _, d := range strings.Split(v, ",") {
			if d = strings.TrimSpace(d); d != "" {
				o.Compare = append(o.Compare, d)
			}
		}
		return nil
	})
	fs.StringVar(&o.LogLevel, "log-level", o.LogLevel, "diagnostics level: debug, info, warn, error")
	fs.IntVar(&o.MaxModelLen, "max-model-len", o.MaxModelLen, "drop trace requests longer than this many prompt+output tokens (0: keep all)")
	fs.IntVar(&o.MooncakeBlockSize, "mooncake-block-size", o.MooncakeBlockSize, "tokens per Mooncake hash id")
	fs.DurationVar(&o.ArrivalSpread, "arrival-spread", o.ArrivalSpread, "spread requests that share a trace timestamp evenly over this window, in trace time (0: replay timestamps as they are)")
	fs.IntVar(&o.Azure.PrefixGroups, "azure-prefix-groups", o.Azure.PrefixGroups, "azure: number of synthetic shared prefixes (0: none)")
	fs.IntVar(&o.Azure.PrefixTokens, "azure-prefix-tokens", o.Azure.PrefixTokens, "azure: shared prefix length in tokens")
	fs.Uint64Var(&o.Azure.Seed, "azure-seed", o.Azure.Seed, "azure: seed of synthesized tokens and prefix groups")
	o.Synthetic.RegisterFlags(fs, "synthetic-")
	o.Runner.RegisterFlags(fs, "")
}

// Validate names the first bad option.
func (o Options) Validate() error {
	switch o.Trace {
	case TraceMooncake, TraceAzure:
		if o.File == "" {
			return fmt.Errorf("%w: --file is required for --trace %s", ErrInvalidConfig, o.Trace)
		}
	case TraceSynthetic:
		if err := o.Synthetic.Validate(); err != nil {
			return err
		}
	default:
		return fmt.Errorf("%w: --trace %q: want mooncake, azure or synthetic", ErrInvalidConfig, o.Trace)
	}
	if o.ArrivalSpread < 0 {
		return fmt.Errorf("%w: --arrival-spread %v must not be negative", ErrInvalidConfig, o.ArrivalSpread)
	}
	if o.MaxModelLen < 0 {
		return fmt.Errorf("%w: --max-model-len %d must not be negative", ErrInvalidConfig, o.MaxModelLen)
	}
	switch o.Progress {
	case "auto", "on", "off":
	default:
		return fmt.Errorf("%w: --progress %q: want auto, on or off", ErrInvalidConfig, o.Progress)
	}
	if _, err := zapcore.ParseLevel(o.LogLevel); err != nil {
		return fmt.Errorf("%w: --log-level %q", ErrInvalidConfig, o.LogLevel)
	}
	return nil
}

// badLines maps SkipBadLines to a policy.
func (o Options) badLines() BadLinePolicy {
	if o.SkipBadLines {
		return BadLineSkip
	}
	return BadLineFail
}

// TraceSource is an opened trace, after the --max-model-len filter.
type TraceSource struct {
	Source
	reader Source // the file reader or generator under the filter
	filter *LengthFilter
	closer io.Closer
}

// Skipped reports skipped bad lines of file traces (nil, 0 otherwise).
func (t *TraceSource) Skipped() ([]*LineError, int) {
	if s, ok := t.reader.(interface{ Skipped() ([]*LineError, int) }); ok {
		return s.Skipped()
	}
	return nil, 0
}

// TooLong is the number of requests dropped by --max-model-len so far.
func (t *TraceSource) TooLong() int { return t.filter.Dropped }

func newTraceSource(src Source, maxModelLen int, spread time.Duration, closer io.Closer) *TraceSource {
	f := &LengthFilter{Src: &SpreadArrivals{Src: src, Window: spread}, MaxTotal: maxModelLen}
	return &TraceSource{Source: f, reader: src, filter: f, closer: closer}
}

// Close closes the trace file, if any.
func (t *TraceSource) Close() error {
	if t.closer == nil {
		return nil
	}
	return t.closer.Close()
}

// OpenTrace opens the trace the options describe.
func (o Options) OpenTrace() (*TraceSource, error) {
	if o.Trace == TraceSynthetic {
		reqs, err := GenerateSynthetic(o.Synthetic)
		if err != nil {
			return nil, err
		}
		return newTraceSource(NewSliceSource(reqs), o.MaxModelLen, o.ArrivalSpread, nil), nil
	}
	f, err := os.Open(o.File)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	var src Source
	switch o.Trace {
	case TraceMooncake:
		src, err = NewMooncakeReader(f, MooncakeOptions{Name: filepath.Base(o.File), BlockSize: o.MooncakeBlockSize, OnBadLine: o.badLines()})
	case TraceAzure:
		az := o.Azure
		az.Name, az.OnBadLine = filepath.Base(o.File), o.badLines()
		src, err = NewAzureReader(f, az)
	default:
		err = fmt.Errorf("%w: --trace %q", ErrInvalidConfig, o.Trace)
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return newTraceSource(src, o.MaxModelLen, o.ArrivalSpread, f), nil
}

// SimMode is the hook for `switchyard bench --sim`: the deterministic
// simulator lives in bench/sim*.go and installs itself by setting simMode
// from an init function in that file. Until then --sim fails with
// ErrSimUnavailable.
type SimMode interface {
	// RegisterFlags adds the simulator's own flags (they are registered
	// whether or not --sim is given).
	RegisterFlags(fs *flag.FlagSet)
	// Run simulates the opened trace under env.Options and writes its
	// reports like the live mode does.
	Run(ctx context.Context, env SimEnv) error
}

// SimEnv is what Main hands the simulator.
type SimEnv struct {
	Options Options
	Trace   *TraceSource
	Stdout  io.Writer
	Stderr  io.Writer
	Log     *zap.Logger
}

// simMode is nil until bench/sim*.go installs the simulator. It is written
// only by package initialisation and read-only afterwards.
var simMode SimMode

// scaleMode is `switchyard bench --scale`, installed like simMode by
// bench/scale_cli.go; it has the same shape.
var scaleMode SimMode

// Main is `switchyard bench`: it parses args, replays the trace against the
// targets (or runs the simulator with --sim), writes results and reports
// under --out, and prints the Markdown summary on stdout. A cancelled ctx
// stops the replay; the requests already sent are still reported.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := DefaultOptions()
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	opts.RegisterFlags(fs)
	sim := simMode
	if sim != nil {
		sim.RegisterFlags(fs)
	}
	scale := scaleMode
	if scale != nil {
		scale.RegisterFlags(fs)
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil // -h printed the usage; asking for help is not a failure
		}
		return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", ErrInvalidConfig, fs.Args())
	}
	if (opts.Sim && sim == nil) || (opts.Scale && scale == nil) {
		return ErrSimUnavailable
	}
	if err := opts.Validate(); err != nil {
		return err
	}
	if opts.Label == "" {
		opts.Label = opts.Trace
	}
	log := newLogger(stderr, opts.LogLevel)
	defer func() { _ = log.Sync() }()
	if len(opts.Compare) > 0 {
		return compareRuns(opts, stdout, log)
	}

	trace, err := opts.OpenTrace()
	if err != nil {
		return err
	}
	defer func() { _ = trace.Close() }()

	if opts.Scale {
		return scale.Run(ctx, SimEnv{Options: opts, Trace: trace, Stdout: stdout, Stderr: stderr, Log: log})
	}
	if opts.Sim {
		return sim.Run(ctx, SimEnv{Options: opts, Trace: trace, Stdout: stdout, Stderr: stderr, Log: log})
	}
	return runLive(ctx, opts, trace, stdout, stderr, log)
}

func runLive(ctx context.Context, opts Options, trace *TraceSource, stdout, stderr io.Writer, log *zap.Logger) error {
	deps := RunnerDeps{Log: log}
	switch opts.Progress {
	case "on":
		deps.Progress, deps.ProgressTTY = stderr, isTerminal(stderr)
	case "auto":
		if isTerminal(stderr) {
			deps.Progress, deps.ProgressTTY = stderr, true
		}
	}
	runner, err := NewRunner(opts.Runner, deps)
	if err != nil {
		return err
	}

	var rw *ResultWriter
	if opts.Out != "" {
		if err := os.MkdirAll(opts.Out, 0o755); err != nil {
			return fmt.Errorf("create --out: %w", err)
		}
		f, err := os.Create(filepath.Join(opts.Out, FileResults))
		if err != nil {
			return fmt.Errorf("create results: %w", err)
		}
		defer func() { _ = f.Close() }()
		rw = NewResultWriter(f)
	}
	var results []Result
	_, runErr := runner.Run(ctx, trace, func(r Result) {
		results = append(results, r)
		if rw != nil {
			_ = rw.Write(r) // the first error sticks and is reported by Flush
		}
	})
	if kept, n := trace.Skipped(); n > 0 {
		fmt.Fprintf(stderr, "skipped %d bad trace lines; first: %v\n", n, kept[0])
	}
	if n := trace.TooLong(); n > 0 {
		fmt.Fprintf(stderr, "dropped %d trace requests longer than --max-model-len %d\n", n, opts.MaxModelLen)
	}
	sum := Summarize(opts.Label, results)
	if err := WriteMarkdown(stdout, sum); err != nil {
		return err
	}
	if opts.Out != "" {
		if err := rw.Flush(); err != nil {
			return err
		}
		if err := WriteReports(opts.Out, []Summary{sum}, []RunResults{{Label: opts.Label, Results: results}}, log); err != nil {
			return err
		}
	}
	if runErr != nil {
		return fmt.Errorf("replay stopped after %d requests: %w", len(results), runErr)
	}
	return nil
}

// compareRuns reports earlier runs side by side.
func compareRuns(opts Options, stdout io.Writer, log *zap.Logger) error {
	var sums []Summary
	var runs []RunResults
	for _, dir := range opts.Compare {
		f, err := os.Open(filepath.Join(dir, FileResults))
		if err != nil {
			return fmt.Errorf("compare: %w", err)
		}
		res, err := ReadResults(f, filepath.Join(dir, FileResults))
		_ = f.Close()
		if err != nil {
			return fmt.Errorf("compare: %w", err)
		}
		label := runLabel(dir)
		sums = append(sums, Summarize(label, res))
		runs = append(runs, RunResults{Label: label, Results: res})
	}
	if err := WriteMarkdown(stdout, sums...); err != nil {
		return err
	}
	if opts.Out == "" {
		return nil
	}
	if err := os.MkdirAll(opts.Out, 0o755); err != nil {
		return fmt.Errorf("create --out: %w", err)
	}
	return WriteReports(opts.Out, sums, runs, log)
}

// runLabel is the label recorded in dir's summary.json, or the directory's
// name when there is none.
func runLabel(dir string) string {
	var sums []Summary
	if raw, err := os.ReadFile(filepath.Join(dir, FileSummaryJSON)); err == nil &&
		json.Unmarshal(raw, &sums) == nil && len(sums) == 1 && sums[0].Label != "" {
		return sums[0].Label
	}
	return filepath.Base(filepath.Clean(dir))
}

// WriteReports writes summary.md and summary.json (one entry per summary)
// and the TTFT CDF, throughput and per-worker load plots (all runs) into
// dir, which must exist. A plot with no data (no successful request) is
// skipped with a warning. The simulator mode reuses it.
func WriteReports(dir string, sums []Summary, runs []RunResults, log *zap.Logger) error {
	if log == nil {
		log = zap.NewNop()
	}
	if err := writeFile(filepath.Join(dir, FileSummaryMD), func(w io.Writer) error { return WriteMarkdown(w, sums...) }); err != nil {
		return err
	}
	if err := writeFile(filepath.Join(dir, FileSummaryJSON), func(w io.Writer) error { return WriteJSON(w, sums...) }); err != nil {
		return err
	}
	var all []Result
	for _, r := range runs {
		all = append(all, r.Results...)
	}
	for _, p := range []struct {
		name string
		draw func(string) error
	}{
		{FileTTFTCDF, func(path string) error { return PlotTTFTCDF(path, runs) }},
		{FileThroughput, func(path string) error { return PlotThroughput(path, runs, 0) }},
		{FileWorkerLoad, func(path string) error { return PlotWorkerLoad(path, all) }},
	} {
		err := p.draw(filepath.Join(dir, p.name))
		if errors.Is(err, ErrNoPlotData) {
			log.Warn("plot skipped", zap.String("plot", p.name), zap.Error(err))
			continue
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", filepath.Base(path), err)
	}
	if err := write(f); err != nil {
		_ = f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return nil
}

func newLogger(w io.Writer, level string) *zap.Logger {
	lvl, err := zapcore.ParseLevel(level)
	if err != nil {
		lvl = zapcore.WarnLevel // Validate already rejected bad levels
	}
	enc := zap.NewDevelopmentEncoderConfig()
	core := zapcore.NewCore(zapcore.NewConsoleEncoder(enc), zapcore.AddSync(w), lvl)
	return zap.New(core).Named("bench")
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
