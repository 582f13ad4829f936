package bench

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Stats summarises a sample of durations, in milliseconds.
type Stats struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean"`
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	Max   float64 `json:"max"`
}

// Percentile returns the p-th percentile (0 ≤ p ≤ 100) of sorted values by
// linear interpolation between closest ranks (rank p/100·(n−1), the method
// NumPy uses by default). An empty sample gives 0.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	p = min(max(p, 0), 100)
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	hi := min(lo+1, n-1)
	frac := rank - float64(lo)
	return sorted[lo] + frac*(sorted[hi]-sorted[lo])
}

// StatsOf computes Stats over values (sorted in place).
func StatsOf(values []float64) Stats {
	if len(values) == 0 {
		return Stats{}
	}
	slices.Sort(values)
	var sum float64
	for _, v := range values {
		sum += v
	}
	return Stats{
		Count: len(values),
		Mean:  sum / float64(len(values)),
		P50:   Percentile(values, 50),
		P90:   Percentile(values, 90),
		P99:   Percentile(values, 99),
		Max:   values[len(values)-1],
	}
}

// Summary is the digest of one run.
type Summary struct {
	Label    string `json:"label"`
	Requests int    `json:"requests"`
	OK       int    `json:"ok"`
	Failed   int    `json:"failed"`
	// DurationS spans the first send to the last response's end.
	DurationS float64 `json:"duration_s"`
	// RequestRate counts successful requests per second; OutputTokenRate
	// their completion tokens per second.
	RequestRate     float64 `json:"request_rate"`
	OutputTokenRate float64 `json:"output_token_rate"`
	// TTFT and E2E over successful requests; ITL pools every gap between
	// content chunks of successful requests.
	TTFT Stats `json:"ttft_ms"`
	ITL  Stats `json:"itl_ms"`
	E2E  Stats `json:"e2e_ms"`
	// HitRate is CachedTokens / PromptTokens over successful requests.
	PromptTokens int64   `json:"prompt_tokens"`
	CachedTokens int64   `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// DeadlineRequests carried a deadline; DeadlineMisses missed it.
	DeadlineRequests int `json:"deadline_requests"`
	DeadlineMisses   int `json:"deadline_misses"`
	// SendLag is how late requests were sent against the (scaled) trace.
	SendLag  Stats          `json:"send_lag_ms"`
	Outcomes map[string]int `json:"outcomes"`
	Classes  []ClassSummary `json:"classes"`
}

// ClassSummary is the per-class part of a Summary. Requests without a class
// are reported under the empty name.
type ClassSummary struct {
	Class            string         `json:"class"`
	Requests         int            `json:"requests"`
	OK               int            `json:"ok"`
	DeadlineRequests int            `json:"deadline_requests"`
	DeadlineMisses   int            `json:"deadline_misses"`
	TTFT             Stats          `json:"ttft_ms"`
	Outcomes         map[string]int `json:"outcomes"`
}

// Summarize digests a run's results.
func Summarize(label string, results []Result) Summary {
	s := Summary{Label: label, Requests: len(results), Outcomes: map[string]int{}}
	var ttft, itl, e2e, lag []float64
	type classAcc struct {
		sum  ClassSummary
		ttft []float64
	}
	classes := map[string]*classAcc{}
	var first, last time.Duration
	var outTokens int64
	for i := range results {
		r := &results[i]
		if i == 0 || r.Sent < first {
			first = r.Sent
		}
		last = max(last, r.Sent+r.E2E)
		lag = append(lag, ms(max(0, r.Sent-r.Scheduled)))
		label := r.OutcomeLabel()
		s.Outcomes[label]++
		c := classes[r.Class]
		if c == nil {
			c = &classAcc{sum: ClassSummary{Class: r.Class, Outcomes: map[string]int{}}}
			classes[r.Class] = c
		}
		c.sum.Requests++
		c.sum.Outcomes[label]++
		if r.Deadline > 0 {
			s.DeadlineRequests++
			c.sum.DeadlineRequests++
			if r.DeadlineMissed {
				s.DeadlineMisses++
				c.sum.DeadlineMisses++
			}
		}
		if r.Outcome != OutcomeOK {
			s.Failed++
			continue
		}
		s.OK++
		c.sum.OK++
		e2e = append(e2e, ms(r.E2E))
		if r.Chunks > 0 {
			ttft = append(ttft, ms(r.TTFT))
			c.ttft = append(c.ttft, ms(r.TTFT))
		}
		for _, d := range r.ITL {
			itl = append(itl, ms(d))
		}
		outTokens += int64(r.CompletionTokens)
		s.PromptTokens += int64(r.PromptTokens)
		s.CachedTokens += int64(r.CachedTokens)
	}
	s.DurationS = (last - first).Seconds()
	if s.DurationS > 0 {
		s.RequestRate = float64(s.OK) / s.DurationS
		s.OutputTokenRate = float64(outTokens) / s.DurationS
	}
	if s.PromptTokens > 0 {
		s.HitRate = float64(s.CachedTokens) / float64(s.PromptTokens)
	}
	s.TTFT, s.ITL, s.E2E, s.SendLag = StatsOf(ttft), StatsOf(itl), StatsOf(e2e), StatsOf(lag)
	for _, c := range classes {
		c.sum.TTFT = StatsOf(c.ttft)
		s.Classes = append(s.Classes, c.sum)
	}
	slices.SortFunc(s.Classes, func(a, b ClassSummary) int { return cmp.Compare(a.Class, b.Class) })
	return s
}

// WriteJSON writes summaries as an indented JSON array.
func WriteJSON(w io.Writer, sums ...Summary) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(sums); err != nil {
		return fmt.Errorf("write summary json: %w", err)
	}
	return nil
}

// WriteMarkdown writes one comparison table row per summary (latencies in
// ms), then each run's per-class table.
func WriteMarkdown(w io.Writer, sums ...Summary) error {
	var b strings.Builder
	b.WriteString("| run | requests | ok | req/s | out tok/s | TTFT p50 | TTFT p90 | TTFT p99 | TTFT mean | ITL p50 | ITL p90 | ITL p99 | ITL mean | E2E p50 | E2E p90 | E2E p99 | E2E mean | hit rate | deadline misses |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, s := range sums {
		fmt.Fprintf(&b, "| %s | %d | %d | %.2f | %.1f | %s | %s | %s | %.1f%% | %d/%d |\n",
			mdEscape(s.Label), s.Requests, s.OK, s.RequestRate, s.OutputTokenRate,
			statCells(s.TTFT), statCells(s.ITL), statCells(s.E2E), 100*s.HitRate, s.DeadlineMisses, s.DeadlineRequests)
	}
	for _, s := range sums {
		fmt.Fprintf(&b, "\n### %s: per class\n\n", mdEscape(s.Label))
		b.WriteString("| class | requests | ok | TTFT p50 | TTFT p99 | deadline misses | outcomes |\n")
		b.WriteString("|---|---:|---:|---:|---:|---:|---|\n")
		for _, c := range s.Classes {
			name := c.Class
			if name == "" {
				name = "(none)"
			}
			fmt.Fprintf(&b, "| %s | %d | %d | %.1f | %.1f | %d/%d | %s |\n", mdEscape(name), c.Requests, c.OK,
				c.TTFT.P50, c.TTFT.P99, c.DeadlineMisses, c.DeadlineRequests, outcomeList(c.Outcomes))
		}
		if s.SendLag.Max > 0 {
			fmt.Fprintf(&b, "\nSend lag behind the trace schedule: p50 %.1f ms, p99 %.1f ms, max %.1f ms.\n",
				s.SendLag.P50, s.SendLag.P99, s.SendLag.Max)
		}
	}
	_, err := io.WriteString(w, b.String())
	if err != nil {
		return fmt.Errorf("write summary markdown: %w", err)
	}
	return nil
}

// statCells renders p50, p90, p99 and mean as four table cells.
func statCells(st Stats) string {
	return fmt.Sprintf("%.1f | %.1f | %.1f | %.1f", st.P50, st.P90, st.P99, st.Mean)
}

// outcomeList renders outcome counts as "label n, ..." sorted by label.
func outcomeList(m map[string]int) string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return mdEscape(strings.Join(parts, ", "))
}

// mdEscape keeps a value from breaking a table row.
func mdEscape(s string) string {
	return strings.NewReplacer("|", "\\|", "\n", " ", "\r", " ").Replace(s)
}
