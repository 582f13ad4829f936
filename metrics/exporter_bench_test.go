package metrics

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func benchSnapshot(instance uint64, classes int) AdmissionSnapshot {
	s := AdmissionSnapshot{Instance: instance, WorkerType: "w", Classes: map[string]AdmissionCounts{}}
	for i := range classes {
		s.Classes[fmt.Sprintf("class-%d", i)] = AdmissionCounts{Rejected: map[string]uint64{
			ReasonDueTimePassed: 0, ReasonQueueFull: 0, ReasonPredictedMiss: 0,
		}}
	}
	return s
}

// advance bumps every counter of every class, as an actor's next snapshot
// after a busy turn would.
func advance(s *AdmissionSnapshot) {
	s.Seq++
	for k, c := range s.Classes {
		c.Received += 3
		c.Admitted += 2
		c.Retried++
		c.Cancelled++
		c.Rejected[ReasonDueTimePassed]++
		c.Rejected[ReasonQueueFull]++
		s.Classes[k] = c
	}
}

// BenchmarkExporterObserve measures one snapshot of 8 classes where every
// series moved (the worst case: every counter gets an Add).
func BenchmarkExporterObserve(b *testing.B) {
	reg := prometheus.NewRegistry()
	exp, err := NewExporter(DefaultExporterConfig(), NewAdmission(reg), reg, nil)
	if err != nil {
		b.Fatal(err)
	}
	s := benchSnapshot(1, 8)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		advance(&s)
		exp.Observe(s)
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*8), "ns/class")
}

// BenchmarkExporterObserveUnchanged measures the common periodic-refresh case:
// the snapshot repeats, so nothing is added.
func BenchmarkExporterObserveUnchanged(b *testing.B) {
	reg := prometheus.NewRegistry()
	exp, err := NewExporter(DefaultExporterConfig(), NewAdmission(reg), reg, nil)
	if err != nil {
		b.Fatal(err)
	}
	s := benchSnapshot(1, 8)
	advance(&s)
	exp.Observe(s)
	b.ReportAllocs()
	n := 0
	for b.Loop() {
		exp.Observe(s)
		n++
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n*8), "ns/class")
}

// BenchmarkExporterObserveParallel has every goroutine publish its own
// instance, so it measures contention on the exporter's single mutex.
func BenchmarkExporterObserveParallel(b *testing.B) {
	reg := prometheus.NewRegistry()
	exp, err := NewExporter(DefaultExporterConfig(), NewAdmission(reg), reg, nil)
	if err != nil {
		b.Fatal(err)
	}
	var next atomic.Uint64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		s := benchSnapshot(next.Add(1), 8)
		for pb.Next() {
			advance(&s)
			exp.Observe(s)
		}
	})
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*8), "ns/class")
}
