package engine

import "testing"

// BenchmarkEngineStepDecodeRole is BenchmarkEngineStep with every request a
// decode-role one pulling its prompt by transfer: the cost of parking,
// landing and re-admitting requests on the step's hot path. Compare its
// ns/op with BenchmarkEngineStep's in the same run.
func BenchmarkEngineStepDecodeRole(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Instance = 1
	l := newClosedLoop(b, cfg, 128, true)
	for range 2000 {
		l.step(b)
	}
	st0 := l.e.Stats()
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		l.step(b)
	}
	b.StopTimer()
	st := l.e.Stats()
	if st.Transfers == st0.Transfers {
		b.Fatal("no transfer landed")
	}
	steps := float64(st.Steps - st0.Steps)
	b.ReportMetric(float64(st.OutputTokens-st0.OutputTokens)/steps, "tokens/step")
	b.ReportMetric(float64(st.Running), "running")
}
