package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"sort"
	"sync"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Counter names the suite reads.
const (
	MetricReceived       = "switchyard_router_admission_received_total"
	MetricAdmitted       = "switchyard_router_admission_admitted_total"
	MetricRetried        = "switchyard_router_admission_retried_total"
	MetricWorkerRequests = "switchyard_worker_http_requests_total"
	// MetricFirstByteTimeouts counts a router's attempts abandoned after
	// the first-byte timeout and retried elsewhere.
	MetricFirstByteTimeouts = "switchyard_router_first_byte_timeouts_total"
	// OutcomeWorkerUnread is MetricWorkerRequests' outcome for a request
	// whose body never arrived whole.
	OutcomeWorkerUnread = "unread"
	// MetricDegradedAdmissions counts what routers admitted locally in a
	// degraded mode (NATS or etcd unreachable).
	MetricDegradedAdmissions = "switchyard_admission_degraded_admissions_total"
	// MetricDisaggDecisions counts the routers' prefill/decode decisions
	// (label mode: disaggregated or aggregated): a disaggregated request is
	// served by two workers, one leg each.
	MetricDisaggDecisions = "switchyard_router_disagg_decisions_total"
	metricProcessStart    = "process_start_time_seconds"
)

// Sample is one scrape of one process: the sums of the counters the suite
// reads (over all label sets, optionally filtered) and the process start
// time, which tells a restarted process from a counter that went backwards.
type Sample struct {
	Values map[string]float64
	Start  float64
}

// ParseMetrics sums every counter or gauge of the named families over their
// label sets; where is an optional label filter (name -> value). It reads
// the Prometheus text format and rejects malformed input with an error.
func ParseMetrics(r io.Reader, names []string, where map[string]string) (Sample, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return Sample{}, fmt.Errorf("parse metrics: %w", err)
	}
	s := Sample{Values: make(map[string]float64, len(names))}
	for _, n := range names {
		s.Values[n] = sumFamily(fams[n], where)
	}
	if f := fams[metricProcessStart]; f != nil && len(f.GetMetric()) > 0 {
		s.Start = f.GetMetric()[0].GetGauge().GetValue()
	}
	return s, nil
}

func sumFamily(f *dto.MetricFamily, where map[string]string) float64 {
	var sum float64
	for _, m := range f.GetMetric() {
		if !labelsMatch(m, where) {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum
}

func labelsMatch(m *dto.Metric, where map[string]string) bool {
	for k, v := range where {
		found := false
		for _, lp := range m.GetLabel() {
			if lp.GetName() == k && lp.GetValue() == v {
				found = true
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Scrape fetches url (a /metrics endpoint) and parses it.
func Scrape(ctx context.Context, client *http.Client, url string, names []string, where map[string]string) (Sample, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return Sample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("scrape %s: status %d", url, resp.StatusCode)
	}
	return ParseMetrics(resp.Body, names, where)
}

// ResetSum adds up counters from several processes across restarts: each
// process's lifetime (source, start time) contributes its last observed
// value, so the total only grows while processes come and go. A counter that
// goes down within one lifetime breaks the exporter's monotonicity promise
// and is counted in Regressions instead of being mistaken for a restart.
type ResetSum struct {
	lives       map[string]map[float64]float64 // source -> start -> last value
	Regressions int
}

// NewResetSum returns an empty sum.
func NewResetSum() *ResetSum { return &ResetSum{lives: map[string]map[float64]float64{}} }

// Observe records one scrape of source's counter.
func (s *ResetSum) Observe(source string, start, value float64) {
	l := s.lives[source]
	if l == nil {
		l = map[float64]float64{}
		s.lives[source] = l
	}
	if prev, ok := l[start]; ok && value < prev {
		s.Regressions++
		return
	}
	l[start] = value
}

// Total is the sum over every process lifetime seen.
func (s *ResetSum) Total() float64 {
	var t float64
	for _, l := range s.lives {
		for _, v := range l {
			t += v
		}
	}
	return t
}

// Restarts is how many lifetimes beyond the first each source had, summed.
func (s *ResetSum) Restarts() int {
	n := 0
	for _, l := range s.lives {
		n += len(l) - 1
	}
	return n
}

// CounterWatch scrapes a set of /metrics endpoints periodically and keeps a
// ResetSum per counter name, plus the history of the aggregated totals so a
// test can check they never went down.
type CounterWatch struct {
	client   *http.Client
	sources  map[string]string // name -> /metrics URL
	names    []string
	interval time.Duration
	where    map[string]string // label filter (Where); nil: every series
	// scraping serializes the scrapes of each source (scrape and record as
	// one step): two concurrent scrapes of one source (Run's, and a test's
	// PollSource on a stopping router) recorded out of order would look
	// like a counter going backwards.
	scraping map[string]*sync.Mutex

	mu      sync.Mutex
	sums    map[string]*ResetSum
	decline map[string]int // aggregated total went down between two polls
	last    map[string]float64
	errors  int
}

// NewCounterWatch watches names on sources (source name -> metrics URL).
func NewCounterWatch(client *http.Client, sources map[string]string, names []string, interval time.Duration) *CounterWatch {
	w := &CounterWatch{client: client, sources: sources, names: names, interval: interval,
		sums: map[string]*ResetSum{}, decline: map[string]int{}, last: map[string]float64{},
		scraping: map[string]*sync.Mutex{}}
	for src := range sources {
		w.scraping[src] = &sync.Mutex{}
	}
	for _, n := range names {
		w.sums[n] = NewResetSum()
	}
	return w
}

// Where makes w sum only the series whose labels match (name -> value),
// for every name it watches; call it before the first poll.
func (w *CounterWatch) Where(labels map[string]string) *CounterWatch {
	w.where = labels
	return w
}

// Poll scrapes every source once. Unreachable sources are counted and
// skipped: a dead process keeps its last observed values.
func (w *CounterWatch) Poll(ctx context.Context) {
	keys := make([]string, 0, len(w.sources))
	for k := range w.sources {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, src := range keys {
		w.PollSource(ctx, src)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, n := range w.names {
		t := w.sums[n].Total()
		if t < w.last[n] {
			w.decline[n]++
		}
		w.last[n] = t
	}
}

// PollSource scrapes one source once, as Poll does for all; it reports
// whether the scrape succeeded.
func (w *CounterWatch) PollSource(ctx context.Context, src string) bool {
	if m := w.scraping[src]; m != nil {
		m.Lock()
		defer m.Unlock()
	}
	s, err := Scrape(ctx, w.client, w.sources[src], w.names, w.where)
	w.mu.Lock()
	defer w.mu.Unlock()
	if err != nil {
		w.errors++
		return false
	}
	for _, n := range w.names {
		w.sums[n].Observe(src, s.Start, s.Values[n])
	}
	return true
}

// Run polls every interval until ctx is done, then polls once more.
func (w *CounterWatch) Run(ctx context.Context) error {
	t := time.NewTicker(w.interval)
	defer t.Stop()
	for {
		w.Poll(ctx)
		select {
		case <-ctx.Done():
			w.Poll(context.WithoutCancel(ctx))
			return nil
		case <-t.C:
		}
	}
}

// Total is the aggregated, reset-aware total of name.
func (w *CounterWatch) Total(name string) float64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.sums[name].Total()
}

// Health reports counter regressions within one process lifetime, declines
// of an aggregated total, restarts seen, and failed scrapes.
func (w *CounterWatch) Health(name string) (regressions, declines, restarts, scrapeErrors int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.sums[name]
	return s.Regressions, w.decline[name], s.Restarts(), w.errors
}
