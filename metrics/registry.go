package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a fresh registry with the Go runtime and process
// collectors registered. Each process (and each replica in an in-process
// cluster) owns its own registry; nothing uses prometheus.DefaultRegisterer,
// so several replicas in one test process never collide.
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return reg
}

// Handler serves reg in the Prometheus exposition formats. A collector error
// still serves what could be gathered (ContinueOnError) so one broken
// collector does not blank every dashboard; the error is reported through
// promhttp's own error counter on reg.
func Handler(reg *prometheus.Registry) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorHandling:     promhttp.ContinueOnError,
		Registry:          reg,
		EnableOpenMetrics: true,
	})
}
