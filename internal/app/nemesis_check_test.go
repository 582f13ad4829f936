package app

// The nemesis's checker: what it samples during the run (queues, counters)
// and what it asserts once the run has quiesced. Each invariant has a name
// that the final table counts (checked, violations); docs/testing.md lists
// them.

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/switchyard/switchyard/metrics"
)

// nemesisGoleakOptions are TestMain's: goroutines of third-party libraries
// that outlive their owners until the process ends.
func nemesisGoleakOptions() []goleak.Option {
	return []goleak.Option{
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	}
}

// nemesisLeakBaseline is every goroutine alive before a seed's run.
func nemesisLeakBaseline() goleak.Option { return goleak.IgnoreCurrent() }

// checkLeaks asserts that the run, torn down, left no goroutine behind.
func (r *nemesisRun) checkLeaks(baseline goleak.Option) {
	r.check("no_goroutine_leaked", 1)
	var err error
	for range 10 { // goleak retries for about a second each time; teardown can take longer
		if err = goleak.Find(append(nemesisGoleakOptions(), baseline)...); err == nil {
			return
		}
	}
	r.violate("no_goroutine_leaked", "%s", truncate(err.Error(), 4000))
}

// monitor samples, until ctx ends, every replica's queues (class_limit) and
// every registry's counters (counters_never_decrease).
func (r *nemesisRun) monitor(ctx context.Context) {
	last := map[*prometheus.Registry]map[string]float64{}
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			r.sampleCounters(last) // one last look
			return
		case <-tick.C:
		}
		r.sampleQueues()
		r.sampleOneSided()
		if n%3 == 0 {
			r.sampleCounters(last)
		}
	}
}

// sampleQueues checks that no replica queues more of a class than its
// limit: limits.requests times the workers the class may use.
func (r *nemesisRun) sampleQueues() {
	sum := map[string]int{}
	for _, s := range r.slots {
		cur := s.current()
		if cur == nil {
			continue
		}
		if cur.status.Degraded() {
			// NATS unreachable, or the etcd session unhealthy (the fallback):
			// the replica admits locally (design §4.10).
			r.noteDegraded()
		}
		snap := cur.status.Snapshot()
		for _, c := range nemesisClasses {
			depth := snap.Classes[c.name].QueueDepth
			sum[c.name] += depth
			r.check("class_limit", 1)
			if limit := c.limit * len(c.workers); depth > limit {
				r.violate("class_limit", "%s queued %d of class %s at %v, limit %d", s.id, depth, c.name, r.elapsed(), limit)
			}
			r.mu.Lock()
			r.queuePeak[c.name] = max(r.queuePeak[c.name], depth)
			r.mu.Unlock()
		}
	}
	degraded := r.inDegradedWindow()
	for i, w := range r.workers {
		peak := metricValue(w.reg, "switchyard_engine_peak_live_requests")
		if peak <= r.capPeak[i] {
			continue
		}
		r.capPeak[i] = peak
		if peak > nemesisCap {
			if degraded { // allowed by design; shown in the table
				r.mu.Lock()
				r.capDegraded = append(r.capDegraded, fmt.Sprintf("w%d %v at %v", i+1, peak, r.elapsed()))
				r.mu.Unlock()
				continue
			}
			r.violate("worker_cap", "w%d held %v requests at once by %v, cap %d, no replica degraded", i+1, peak, r.elapsed(), nemesisCap)
		}
	}
	r.mu.Lock()
	for k, v := range sum {
		r.queueSum[k] = max(r.queueSum[k], v)
	}
	r.mu.Unlock()
}

// registries is every registry whose counters may still move: each
// replica incarnation's until 10 s after it stopped (its final export is
// compared once more; a soak restarts replicas hundreds of times), and each
// worker's.
func (r *nemesisRun) registries() []*prometheus.Registry {
	var out []*prometheus.Registry
	settled := time.Now().Add(-10 * time.Second).UnixNano()
	for _, s := range r.slots {
		s.mu.Lock()
		for _, inc := range s.all {
			if at := inc.stoppedAt.Load(); at == 0 || at > settled {
				out = append(out, inc.reg)
			}
		}
		s.mu.Unlock()
	}
	for _, w := range r.workers {
		out = append(out, w.reg)
	}
	return out
}

// sampleCounters compares every counter series (and every histogram's
// count) with its previous sample in the same registry.
func (r *nemesisRun) sampleCounters(last map[*prometheus.Registry]map[string]float64) {
	for _, reg := range r.registries() {
		mfs, err := reg.Gather()
		if err != nil {
			r.violate("counters_never_decrease", "gather: %v", err)
			continue
		}
		prev := last[reg]
		if prev == nil {
			prev = map[string]float64{}
			last[reg] = prev
		}
		compared := 0
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				var v float64
				switch mf.GetType() {
				case dto.MetricType_COUNTER:
					v = m.GetCounter().GetValue()
				case dto.MetricType_HISTOGRAM:
					v = float64(m.GetHistogram().GetSampleCount())
				default:
					continue
				}
				key := seriesKey(mf.GetName(), m)
				if old, ok := prev[key]; ok {
					compared++
					if v < old {
						r.violate("counters_never_decrease", "%s went from %v to %v at %v", key, old, v, r.elapsed())
					}
				}
				prev[key] = v
			}
		}
		r.check("counters_never_decrease", compared)
	}
}

func seriesKey(name string, m *dto.Metric) string {
	parts := make([]string, 0, len(m.GetLabel()))
	for _, l := range m.GetLabel() {
		parts = append(parts, l.GetName()+"="+l.GetValue())
	}
	sort.Strings(parts)
	return name + "{" + strings.Join(parts, ",") + "}"
}

// quiesce waits, once the load is answered and every fault healed, until
// every replica's ledger and queues are empty and every engine is idle
// (ledger_empty). Lost marks heal by renewal and expiry, so the wait is
// bounded by the booking expiry plus slack.
func (r *nemesisRun) quiesce() {
	const bound = 30 * time.Second
	deadline := time.Now().Add(bound)
	var pending []string
	for {
		pending = pending[:0]
		for _, s := range r.slots {
			cur := s.current()
			if cur == nil {
				pending = append(pending, s.id+" is down")
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			snap, err := cur.status.Flush(ctx)
			cancel()
			if err != nil {
				pending = append(pending, fmt.Sprintf("%s: flush: %v", s.id, err))
				continue
			}
			queued := 0
			for _, c := range snap.Classes {
				queued += c.QueueDepth
			}
			if snap.Bookings != 0 || queued != 0 {
				pending = append(pending, fmt.Sprintf("%s: %d bookings, %d queued", s.id, snap.Bookings, queued))
			}
		}
		for i, w := range r.workers {
			running := metricValue(w.reg, "switchyard_engine_running_requests")
			waiting := metricValue(w.reg, "switchyard_engine_waiting_requests")
			if running+waiting != 0 {
				pending = append(pending, fmt.Sprintf("w%d: %v running, %v waiting", i+1, running, waiting))
			}
		}
		if len(pending) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.check("ledger_empty", len(r.slots)+len(r.workers))
	for _, p := range pending {
		r.violate("ledger_empty", "%v after the run quiesced: %s", bound, p)
	}
}

// metricValue is the sum of every series of name in reg.
func metricValue(reg prometheus.Gatherer, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			}
		}
	}
	return sum
}

// checkAfterTeardown asserts what the final counters and the client's
// records show: one outcome per request, the workers' caps, and received
// against sent.
func (r *nemesisRun) checkAfterTeardown() {
	r.mu.Lock()
	records := append([]*requestRecord(nil), r.records...)
	r.mu.Unlock()

	// one_outcome: a success or a typed error, or (only where its replica
	// went down meanwhile) a cut or refused connection.
	var ok, typed, cut, wrote, early int
	for _, rec := range records {
		if rec.code == "not_ready" { // answered before admission (the frontend's readiness gate)
			early++
		}
		r.check("one_outcome", 1)
		if rec.wroteRequest || rec.outcome == outcomeOK || rec.outcome == outcomeTyped {
			wrote++
		}
		switch rec.outcome {
		case outcomeOK:
			ok++
		case outcomeTyped:
			typed++
		case outcomeAbandoned: // the harness gave up on it (entry_nats_cut)
			cut++
		case outcomeCut, outcomeRefused:
			if rec.outcome == outcomeCut {
				cut++
			}
			if !r.slotsAll()[rec.slot].wasDown(rec.start, rec.end) {
				r.violate("one_outcome", "request to %s (%s) %s while it was up, after %v: %s",
					r.slotsAll()[rec.slot].id, nemesisClasses[rec.class].name, rec.outcome, rec.end.Sub(rec.start).Truncate(time.Millisecond), rec.detail)
			}
		default:
			r.violate("one_outcome", "request to %s (%s) %s after %v: status %d %s", r.slotsAll()[rec.slot].id,
				nemesisClasses[rec.class].name, rec.outcome, rec.end.Sub(rec.start).Truncate(time.Millisecond), rec.status, rec.detail)
		}
	}

	// worker_cap: no engine ever held more requests than its cap, but
	// while a replica admitted in degraded mode (the monitor samples the
	// peaks and tells the two apart).
	for i, w := range r.workers {
		r.check("worker_cap", 1)
		if peak := metricValue(w.reg, "switchyard_engine_peak_live_requests"); peak > r.capPeak[i] {
			r.violate("worker_cap", "w%d held %v requests at once after the run, cap %d", i+1, peak, nemesisCap)
		}
	}

	// received_matches_sent: every request that reached a replica is
	// counted received exactly once over the whole cluster (every
	// incarnation's final counters). The load sends only valid requests,
	// so each answered one (success or typed error) was received, but for
	// those a starting replica answered not_ready before admission; a cut
	// one may or may not have been.
	received := 0.0
	for _, reg := range r.incarnationRegistries() {
		received += metricValue(reg, metrics.NameAdmissionReceived)
	}
	served := 0.0
	for _, w := range r.workers {
		served += metricValue(w.reg, "switchyard_worker_http_requests_total")
	}
	r.check("received_matches_sent", 1)
	if received < float64(ok+typed-early) || received > float64(wrote) {
		r.violate("received_matches_sent", "received %v, but %d answered (%d ok, %d typed, %d of them not_ready) of %d sent (%d cut)",
			received, ok+typed, ok, typed, early, wrote, cut)
	}
	r.check("served_once", 1)
	if served < float64(ok) || served > float64(ok+cut+typed) {
		r.violate("served_once", "workers served %v requests for %d successes (%d cut, %d typed)", served, ok, cut, typed)
	}
	r.checkOneSidedRecords(records)
	slices.SortFunc(records, func(a, b *requestRecord) int { return cmp.Compare(b.end.Sub(b.start), a.end.Sub(a.start)) })
	if len(records) > 0 {
		r.mu.Lock()
		r.slowest = records[0].end.Sub(records[0].start)
		r.mu.Unlock()
	}
	for _, rec := range records[:min(3, len(records))] {
		r.t.Logf("slow: %v to %s (%s) at %v: %s %s %d %s", rec.end.Sub(rec.start).Truncate(time.Millisecond), r.allSlots[rec.slot].id,
			nemesisClasses[rec.class].name, rec.start.Sub(r.start).Truncate(time.Millisecond), rec.outcome, rec.code, rec.status, rec.detail)
	}
	r.t.Logf("seed %d: sent %d, received %v, answered %d (ok %d, typed %d), cut %d, workers served %v", r.seed, wrote, received, ok+typed, ok, typed, cut, served)
}

// slotsAll is the run's slots; teardown clears r.slots only after the
// last stop, so the records keep their replica.
func (r *nemesisRun) slotsAll() []*nemesisSlot { return r.allSlots }

func (r *nemesisRun) incarnationRegistries() []*prometheus.Registry {
	var out []*prometheus.Registry
	for _, s := range r.allSlots {
		s.mu.Lock()
		for _, inc := range s.all {
			out = append(out, inc.reg)
		}
		s.mu.Unlock()
	}
	return out
}
