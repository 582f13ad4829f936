package adapter

import (
	"bytes"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// routes is the adapter's own HTTP API: /metrics, /healthz (the process
// lives), /readyz (registered, and the event stream followed when there is
// one) and the tokenizer files under /tokenizer/<name>.
func (a *Adapter) routes() http.Handler {
	mux := http.NewServeMux()
	if a.deps.Gatherer != nil {
		g := a.deps.Gatherer
		if a.tierReg != nil {
			g = prometheus.Gatherers{a.deps.Gatherer, a.tierReg}
		}
		mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	}
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := a.ready(); why != "" {
			http.Error(w, why, http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /tokenizer/{name}", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		for _, f := range a.files {
			if f.Name == name {
				ct := "application/json"
				if strings.HasSuffix(name, ".jinja") {
					ct = "text/plain; charset=utf-8"
				}
				w.Header().Set("Content-Type", ct)
				http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(f.Data))
				return
			}
		}
		http.NotFound(w, r)
	})
	return mux
}
