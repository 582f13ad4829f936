package bench

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// ErrNoPlotData is returned when a plot would be empty.
var ErrNoPlotData = errors.New("bench: nothing to plot")

// RunResults is one run's results under a label (a policy, a replica count).
type RunResults struct {
	Label   string
	Results []Result
}

// HitRatePoint is one measurement for PlotHitRateVsReplicas.
type HitRatePoint struct {
	Series   string
	Replicas int
	HitRate  float64
}

// Plot size: wide enough for a legend beside a few series.
const (
	plotWidth  = 8 * vg.Inch
	plotHeight = 5 * vg.Inch
)

// PlotTTFTCDF writes the TTFT distribution (successful requests) of each run
// as a CDF line to a PNG at path.
func PlotTTFTCDF(path string, runs []RunResults) error {
	p := newPlot("TTFT CDF", "TTFT (ms)", "fraction of requests")
	drawn := false
	for i, run := range runs {
		var v []float64
		for _, r := range run.Results {
			if r.Outcome == OutcomeOK && r.Chunks > 0 {
				v = append(v, ms(r.TTFT))
			}
		}
		if len(v) == 0 {
			continue
		}
		slices.Sort(v)
		// An empirical CDF is a step function: it jumps at each sample.
		pts := make(plotter.XYs, 0, 2*len(v))
		for j, x := range v {
			pts = append(pts,
				plotter.XY{X: x, Y: float64(j) / float64(len(v))},
				plotter.XY{X: x, Y: float64(j+1) / float64(len(v))})
		}
		if err := addLine(p, run.Label, i, pts); err != nil {
			return err
		}
		drawn = true
	}
	if !drawn {
		return fmt.Errorf("ttft cdf: %w", ErrNoPlotData)
	}
	p.Y.Min, p.Y.Max = 0, 1
	p.Legend.Top, p.Legend.Left = false, false // bottom right: CDFs leave it empty
	return savePNG(p, path)
}

// PlotThroughput writes output tokens per second over the run's time to a
// PNG, one line per run. Tokens are placed at the times their chunks
// arrived (spread evenly over a request's chunks). A zero bucket picks
// max(1 s, span/100).
func PlotThroughput(path string, runs []RunResults, bucket time.Duration) error {
	p := newPlot("Output throughput", "time since start (s)", "output tokens/s")
	type ev struct {
		at     time.Duration
		tokens float64
	}
	all := make([][]ev, len(runs))
	var span time.Duration
	for i, run := range runs {
		for _, r := range run.Results {
			if r.Outcome != OutcomeOK || r.CompletionTokens == 0 {
				continue
			}
			if r.Chunks == 0 {
				all[i] = append(all[i], ev{r.Sent + r.E2E, float64(r.CompletionTokens)})
				continue
			}
			per := float64(r.CompletionTokens) / float64(r.Chunks)
			at := r.Sent + r.TTFT
			all[i] = append(all[i], ev{at, per})
			for _, d := range r.ITL {
				at += d
				all[i] = append(all[i], ev{at, per})
			}
		}
		for _, e := range all[i] {
			span = max(span, e.at)
		}
	}
	if bucket <= 0 {
		bucket = max(time.Second, span/100)
	}
	drawn := false
	for i, evs := range all {
		if len(evs) == 0 {
			continue
		}
		n := int(span/bucket) + 1
		sums := make([]float64, n)
		for _, e := range evs {
			sums[int(e.at/bucket)] += e.tokens
		}
		pts := make(plotter.XYs, n)
		for j, s := range sums {
			pts[j] = plotter.XY{X: (time.Duration(j) * bucket).Seconds(), Y: s / bucket.Seconds()}
		}
		if err := addLine(p, runs[i].Label, i, pts); err != nil {
			return err
		}
		drawn = true
	}
	if !drawn {
		return fmt.Errorf("throughput: %w", ErrNoPlotData)
	}
	p.Y.Min = 0
	return savePNG(p, path)
}

// PlotWorkerLoad writes a bar chart of requests per worker to a PNG (see
// workerLoad for what is counted).
func PlotWorkerLoad(path string, results []Result) error {
	counts, title := workerLoad(results)
	if len(counts) == 0 {
		return fmt.Errorf("worker load: %w", ErrNoPlotData)
	}
	names := make([]string, 0, len(counts))
	for n := range counts {
		names = append(names, n)
	}
	slices.Sort(names)
	vals := make(plotter.Values, len(names))
	for i, n := range names {
		vals[i] = float64(counts[n])
	}
	p := newPlot(title, "", "requests")
	// About 60% of each bar's share of the drawing width, within [2, 60] pt.
	width := vg.Length(math.Max(2, math.Min(60, 0.6*float64(plotWidth-vg.Inch)/float64(len(names)))))
	bars, err := plotter.NewBarChart(vals, width)
	if err != nil {
		return fmt.Errorf("worker load: %w", err)
	}
	bars.Color = plotutil.Color(0)
	bars.LineStyle.Width = 0
	p.Add(bars)
	p.NominalX(names...)
	p.X.Min, p.X.Max = -0.5, float64(len(names))-0.5 // half a slot of margin on each side
	p.Y.Min = 0
	return savePNG(p, path)
}

// PlotHitRateVsReplicas writes prefix hit rate against router replica
// count, one line per series (routing policy), to a PNG.
func PlotHitRateVsReplicas(path string, points []HitRatePoint) error {
	if len(points) == 0 {
		return fmt.Errorf("hit rate vs replicas: %w", ErrNoPlotData)
	}
	bySeries := map[string]plotter.XYs{}
	var order []string
	for _, pt := range points {
		if _, ok := bySeries[pt.Series]; !ok {
			order = append(order, pt.Series)
		}
		bySeries[pt.Series] = append(bySeries[pt.Series], plotter.XY{X: float64(pt.Replicas), Y: pt.HitRate})
	}
	p := newPlot("Prefix hit rate vs router replicas", "router replicas", "hit rate (cached/prompt tokens)")
	for i, s := range order {
		pts := bySeries[s]
		slices.SortFunc(pts, func(a, b plotter.XY) int { return cmp.Compare(a.X, b.X) })
		if err := addLine(p, s, i, pts); err != nil {
			return err
		}
	}
	p.Y.Min, p.Y.Max = 0, 1
	return savePNG(p, path)
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Add(plotter.NewGrid())
	return p
}

func addLine(p *plot.Plot, label string, i int, pts plotter.XYs) error {
	for _, pt := range pts {
		if math.IsNaN(pt.X) || math.IsInf(pt.X, 0) || math.IsNaN(pt.Y) || math.IsInf(pt.Y, 0) {
			return fmt.Errorf("plot %q: non-finite point (%v, %v)", label, pt.X, pt.Y)
		}
	}
	l, err := plotter.NewLine(pts)
	if err != nil {
		return fmt.Errorf("plot %q: %w", label, err)
	}
	l.Color = plotutil.Color(i)
	l.Width = vg.Points(1.5)
	l.Dashes = plotutil.Dashes(i / len(plotutil.DefaultColors))
	p.Add(l)
	if label != "" {
		p.Legend.Add(label, l)
	}
	return nil
}

// savePNG renders p. gonum/plot panics on some degenerate inputs; a
// benchmark report must not crash over a chart, so a panic becomes an error.
func savePNG(p *plot.Plot, path string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("render %s: %v", path, r)
		}
	}()
	wt, err := p.WriterTo(plotWidth, plotHeight, "png")
	if err != nil {
		return fmt.Errorf("render %s: %w", path, err)
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create plot: %w", err)
	}
	if _, err := wt.WriteTo(f); err != nil {
		_ = f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}

// workerLoad counts requests per worker, named by the response's worker
// header. Requests without one (rejected before routing, or failed) are left
// out and counted in the title. When no request names a worker (the targets
// are workers themselves), it counts per target instead.
func workerLoad(results []Result) (map[string]int, string) {
	counts := map[string]int{}
	unnamed := 0
	for _, r := range results {
		if r.Worker != "" {
			counts[r.Worker]++
		} else {
			unnamed++
		}
	}
	switch {
	case len(counts) > 0 && unnamed > 0:
		return counts, fmt.Sprintf("Requests per worker (%d more without a worker)", unnamed)
	case len(counts) > 0:
		return counts, "Requests per worker"
	}
	for _, r := range results {
		name := strings.TrimPrefix(strings.TrimPrefix(r.Target, "http://"), "https://")
		if name == "" {
			name = "(unknown)"
		}
		counts[name]++
	}
	return counts, "Requests per target"
}
