package frontend

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"
	"golang.org/x/net/netutil"

	"github.com/switchyard/switchyard/internal/tlsconf"
)

// listeners is what Serve and ServeAdmin add to the API's handler.
type listeners struct {
	admin            *http.ServeMux         // Config.AdminAddr's routes; nil: on the API's mux
	gate             *adminGate             // admin.go: admin routes on the API's mux need a key; nil: open or elsewhere
	apiTLS, adminTLS *tls.Config            // nil: plaintext
	bounds           *ingressBounds         // bounds.go: in-flight requests and body bytes of the API
	h2errors         *prometheus.CounterVec // bounds.go: HTTP/2 errors by type
}

// initListeners builds what the listeners add to the routes, before any
// route is registered: the admin routes' place and gate, the API's bounds.
func (s *Server) initListeners(reg prometheus.Registerer) {
	s.initAdmin(reg)
	s.lis.bounds = newIngressBounds(s.cfg, reg)
	s.lis.h2errors = http2Errors(reg)
}

// buildTLS builds the API's and the admin listener's TLS configurations
// and the client TLS for engines (nil each where not configured).
func (s *Server) buildTLS() error {
	var err error
	d := s.tlsDeps("http")
	d.NextProtos = tlsconf.HTTPProtos
	if s.lis.apiTLS, err = s.cfg.TLS.Build(d); err != nil {
		return err
	}
	d.Name = "http_admin"
	if s.lis.adminTLS, err = s.cfg.AdminTLS.Build(d); err != nil {
		return err
	}
	if s.cfg.EngineTLS.Enabled() {
		c, err := s.cfg.EngineTLS.Build(s.tlsDeps("engine"))
		if err != nil {
			return err
		}
		s.tr.TLSClientConfig = c
	}
	return nil
}

// wrapListener bounds ln to max concurrent connections (0: no bound) and
// serves TLS on it when tlsCfg is set. The bound counts connections, not
// requests: a client over it waits in the kernel's accept queue.
func wrapListener(ln net.Listener, max int, tlsCfg *tls.Config) net.Listener {
	if max > 0 {
		ln = netutil.LimitListener(ln, max)
	}
	if tlsCfg != nil {
		ln = tls.NewListener(ln, tlsCfg)
	}
	return ln
}

// httpServer is an http.Server with the configured limits. WriteTimeout is
// not net/http's (a deadline on the whole response, which would cut every
// stream longer than it): writeDeadlines applies it to each write instead.
func (s *Server) httpServer(h http.Handler, name string) *http.Server {
	if s.cfg.WriteTimeout > 0 {
		h = writeDeadlines(h, s.cfg.WriteTimeout)
	}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: s.cfg.ReadHeaderTimeout,
		ReadTimeout:       s.cfg.ReadTimeout,
		IdleTimeout:       s.cfg.IdleTimeout,
		MaxHeaderBytes:    s.cfg.MaxHeaderBytes,
		ErrorLog:          zap.NewStdLog(s.log.Named(name)),
		// HTTP/2 (TLS with ALPN h2): MaxConnsPerHost counts connections,
		// and each carries this many requests at once; a client past it
		// is refused by the protocol (and counted).
		HTTP2: &http.HTTP2Config{MaxConcurrentStreams: s.cfg.MaxConcurrentStreams,
			CountError: func(t string) { s.lis.h2errors.WithLabelValues(t).Inc() }},
	}
}

// writeDeadlines gives every write of a response (headers, body, flush)
// at least d to complete, counted from when it starts: a stream of any
// length lives as long as the client keeps reading, and a client that stops
// reading is cut after d to d + d/8. Socket deadlines are wall-clock time,
// so this reads the wall clock, not the injected one.
func writeDeadlines(h http.Handler, d time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		dw := &deadlineWriter{ResponseWriter: w, rc: http.NewResponseController(w), d: d}
		dw.extend()
		h.ServeHTTP(dw, r)
	})
}

type deadlineWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	d     time.Duration
	until time.Time // the deadline last set
}

// extend makes sure the next write has at least d. Moving a socket's
// deadline moves a runtime timer: doing it before every write (a stream
// event is two writes and a flush) was some 60 timer updates per 20-event
// stream. The deadline set is d + d/8 away, so it is moved again only once
// an eighth of d has passed.
func (w *deadlineWriter) extend() {
	now := time.Now()
	if w.until.Sub(now) >= w.d {
		return
	}
	w.until = now.Add(w.d + w.d/8)
	_ = w.rc.SetWriteDeadline(w.until)
}

func (w *deadlineWriter) WriteHeader(code int) {
	w.extend()
	w.ResponseWriter.WriteHeader(code)
}

func (w *deadlineWriter) Write(p []byte) (int, error) {
	w.extend()
	return w.ResponseWriter.Write(p)
}

func (w *deadlineWriter) Flush() {
	w.extend()
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *deadlineWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// AdminHandler serves /metrics, /debug/cluster, /healthz and /readyz when
// Config.AdminAddr is set (nil otherwise: the API's handler serves them).
func (s *Server) AdminHandler() http.Handler {
	if s.lis.admin == nil {
		return nil
	}
	return s.lis.admin
}

// ServeAdmin serves the admin routes on ln (with Config.AdminTLS, and at
// most AdminMaxConns connections) until ctx ends, then shuts down within
// a second. Without Config.AdminAddr it returns at once with an error.
func (s *Server) ServeAdmin(ctx context.Context, ln net.Listener) error {
	if s.lis.admin == nil {
		_ = ln.Close()
		return errors.New("frontend: no admin listener configured (Config.AdminAddr)")
	}
	srv := s.httpServer(s.lis.admin, "http_admin")
	errc := make(chan error, 1) // size one: Serve's single result, read below
	go func() { errc <- srv.Serve(wrapListener(ln, s.cfg.AdminMaxConns, s.lis.adminTLS)) }()
	var err error
	select {
	case err = <-errc:
		_ = srv.Close()
	case <-ctx.Done():
		graceCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		if shutErr := srv.Shutdown(graceCtx); shutErr != nil {
			_ = srv.Close()
		}
		cancel()
		err = <-errc
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

func (s *Server) tlsDeps(name string) tlsconf.Deps {
	return tlsconf.Deps{Name: name, Logger: s.log, Metrics: s.deps.TLSMetrics}
}
