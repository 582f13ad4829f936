package frontend

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/metrics"
)

// The admin routes (/metrics, /debug/*, and whatever else registers with
// HandleAdmin) show what a tenant must not see: engine URLs, which reach
// the engines around every quota, and tenant ids. Where they are served:
//
//   - Config.AdminAddr set: on the admin listener only (404 on the API's),
//     without a key; that listener is protected by where it listens and by
//     Config.AdminTLS (client certificates).
//   - else, with keys (Deps.Tenants or Deps.Admins): on the API listener,
//     to a request with an admin key only (401 without a valid key, 403
//     with a tenant's key).
//   - else (no keys at all): open on the API listener, like the API itself;
//     the router warns at startup.

// Admins authenticates admin keys (*tenant.Store: the keys file's
// admins). LookupAdmin must be safe for concurrent use and must not log
// the key.
type Admins interface {
	LookupAdmin(key string) (id string, ok bool)
}

// adminGate counts the requests it refuses; it exists only where admin
// routes need a key.
type adminGate struct {
	missing, invalid, notAdmin prometheus.Counter
}

func newAdminGate(reg prometheus.Registerer) *adminGate {
	v := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_admin_auth_failures_total",
		Help: "Requests to admin routes on the API listener refused, by reason (missing_api_key, invalid_api_key: 401; not_admin: 403, a tenant's key)."},
		[]string{"reason"})
	return &adminGate{missing: v.WithLabelValues("missing_api_key"), invalid: v.WithLabelValues("invalid_api_key"),
		notAdmin: v.WithLabelValues("not_admin")}
}

// initAdmin decides where the admin routes go (the list above) before any
// is registered.
func (s *Server) initAdmin(reg prometheus.Registerer) {
	if s.cfg.AdminAddr != "" {
		s.lis.admin = http.NewServeMux()
		s.lis.admin.HandleFunc("GET /healthz", s.instrument(metrics.RouteHealthz, s.handleHealthz))
		s.lis.admin.HandleFunc("GET /readyz", s.instrument(metrics.RouteReadyz, s.handleReadyz))
		s.lis.admin.HandleFunc("/", s.instrument(metrics.RouteOther, s.handleUnknown))
		return
	}
	if s.deps.Tenants != nil || s.deps.Admins != nil {
		s.lis.gate = newAdminGate(reg)
	}
}

// HandleAdmin registers h for pattern (an http.ServeMux pattern, e.g.
// "GET /{$}" for an operators' page at /) as an admin route: on the admin
// listener when there is one, else on the API's behind the admin key
// (admin). Safe to call after Serve has started.
func (s *Server) HandleAdmin(pattern string, h http.Handler) {
	if s.lis.admin != nil {
		s.lis.admin.Handle(pattern, h)
		return
	}
	s.mux.Handle(pattern, s.admin(h))
}

// HandleAdminShell registers h for pattern where the admin routes are
// served, but without the admin key: for static content that holds no
// data (the operators' page's HTML, script and style, which then ask the
// user for the key their data routes need). On the admin listener when
// there is one, else on the API's, open.
func (s *Server) HandleAdminShell(pattern string, h http.Handler) {
	if s.lis.admin != nil {
		s.lis.admin.Handle(pattern, h)
		return
	}
	s.mux.Handle(pattern, h)
}

// admin is the gate of an admin route on the API listener: h runs only for
// a request with an admin key when keys are configured; without keys, or
// on the admin listener, it is h itself.
func (s *Server) admin(h http.Handler) http.Handler {
	g := s.lis.gate
	if g == nil || s.lis.admin != nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if e := s.adminRefusal(g, r); e != nil {
			if e.Status == http.StatusUnauthorized {
				w.Header().Set("WWW-Authenticate", `Bearer realm="switchyard admin"`)
			}
			e.write(w)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// adminRefusal is nil for a request with an admin key, else its 401 or 403.
func (s *Server) adminRefusal(g *adminGate, r *http.Request) *APIError {
	key := apiKey(r.Header)
	if key == "" {
		g.missing.Inc()
		return &APIError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "missing_api_key",
			Message: "an admin key is required: send it as Authorization: Bearer KEY", err: ErrUnauthorized}
	}
	if s.deps.Admins != nil {
		if _, ok := s.deps.Admins.LookupAdmin(key); ok {
			return nil
		}
	}
	if s.deps.Tenants != nil {
		if _, ok := s.deps.Tenants.Lookup(key); ok {
			g.notAdmin.Inc()
			return &APIError{Status: http.StatusForbidden, Type: typePermission, Code: "admin_required",
				Message: "this route needs an admin key; a tenant's key does not open it", err: ErrForbidden}
		}
	}
	g.invalid.Inc()
	return &APIError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "invalid_api_key",
		Message: "the API key is not valid", err: ErrUnauthorized}
}
