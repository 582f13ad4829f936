package frontend

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// authMetrics count authentication failures and tenants' refusals. They
// exist only on a replica with keys (Deps.Tenants).
type authMetrics struct {
	missing, unknown prometheus.Counter
	rejected         *prometheus.CounterVec // tenant, reason
}

func newAuthMetrics(reg prometheus.Registerer) *authMetrics {
	f := promauto.With(reg)
	failures := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_auth_failures_total",
		Help: "Requests refused with 401, by reason (missing_api_key, invalid_api_key)."}, []string{"reason"})
	return &authMetrics{
		missing: failures.WithLabelValues("missing_api_key"),
		unknown: failures.WithLabelValues("invalid_api_key"),
		rejected: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_tenant_rejected_total",
			Help: "Requests of a tenant refused, by reason (model_not_allowed, class_not_allowed: 403; quota_exceeded: 429), or moved: class_replaced (a policy rule's class the tenant may not use; admitted in its home class)."},
			[]string{"tenant", "reason"}),
	}
}

// Tenants authenticates API keys (*tenant.Store). Lookup must be safe for
// concurrent use and must not log the key.
type Tenants interface {
	Lookup(key string) (*tenant.Tenant, bool)
}

// Sentinels of authentication and authorization.
var (
	// ErrUnauthorized marks a request without a valid API key (HTTP 401).
	ErrUnauthorized = errors.New("frontend: unauthorized")
	// ErrForbidden marks a model or class the tenant may not use (HTTP 403).
	ErrForbidden = errors.New("frontend: forbidden")
)

const typePermission = "permission_error"

// apiKey extracts the API key: "Authorization: Bearer KEY", else the
// api-key or x-api-key header (the Azure and Anthropic spellings).
func apiKey(h http.Header) string {
	if v := h.Get("Authorization"); v != "" {
		scheme, key, ok := strings.Cut(v, " ")
		if ok && strings.EqualFold(scheme, "Bearer") {
			return strings.TrimSpace(key)
		}
		return ""
	}
	if v := h.Get("api-key"); v != "" {
		return strings.TrimSpace(v)
	}
	return strings.TrimSpace(h.Get("x-api-key"))
}

// authenticate returns the request's tenant, nil when the API is open (no
// keys configured), or a 401.
func (s *Server) authenticate(r *http.Request) (*tenant.Tenant, *APIError) {
	if s.deps.Tenants == nil {
		return nil, nil
	}
	key := apiKey(r.Header)
	if key == "" {
		s.auth.missing.Inc()
		return nil, &APIError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "missing_api_key",
			Message: "no API key: send it as Authorization: Bearer KEY", err: ErrUnauthorized}
	}
	t, ok := s.deps.Tenants.Lookup(key)
	if !ok {
		s.auth.unknown.Inc()
		return nil, &APIError{Status: http.StatusUnauthorized, Type: typeInvalidRequest, Code: "invalid_api_key",
			Message: "the API key is not valid", err: ErrUnauthorized}
	}
	return t, nil
}

// authorize checks the tenant may use the request's model and class, and
// resolves the class of a request that asks for none to the tenant's
// default class. class is what the request asked for by hint ("" when
// none); it returns the class to use ("" = let the policy classify, then
// tenantClass).
func (s *Server) authorize(t *tenant.Tenant, model, class string, pol *Policy) (string, *APIError) {
	if !t.AllowsModel(model) {
		s.auth.rejected.WithLabelValues(t.ID, "model_not_allowed").Inc()
		return "", &APIError{Status: http.StatusForbidden, Type: typePermission, Code: "model_not_allowed", Param: "model",
			Message: fmt.Sprintf("tenant %s may not use model %q", t.ID, model), err: ErrForbidden}
	}
	if class != "" {
		if !mayUseClass(t, class, pol) {
			s.auth.rejected.WithLabelValues(t.ID, "class_not_allowed").Inc()
			return "", &APIError{Status: http.StatusForbidden, Type: typePermission, Code: "class_not_allowed", Param: "x-switchyard-class",
				Message: fmt.Sprintf("tenant %s may not ask for class %q", t.ID, class), err: ErrForbidden}
		}
		return class, nil
	}
	if t.DefaultClass != "" && pol.HasClass(t.DefaultClass) {
		return t.DefaultClass, nil
	}
	return "", nil
}

// homeClass is the class a tenant's requests fall back to: its default
// class when the policy has it, else the policy's default class.
func homeClass(t *tenant.Tenant, pol *Policy) string {
	if t.DefaultClass != "" && pol.HasClass(t.DefaultClass) {
		return t.DefaultClass
	}
	return pol.DefaultClass
}

// mayUseClass reports whether t's requests may be admitted in class: its
// home class or one of its classes.
func mayUseClass(t *tenant.Tenant, class string, pol *Policy) bool {
	return t.AllowsClass(class) || class == homeClass(t, pol)
}

// tenantClass is the class a tenant's request is admitted in when the
// policy classified it (class): the policy's rules match headers and the
// user field, which the client sets, so a rule's class the tenant may not
// use would be a way around its classes. Such a request falls back to the
// tenant's home class instead of being refused: the client did not name
// the class (docs/tenants.md, *What a tenant may do*).
func (s *Server) tenantClass(t *tenant.Tenant, class string, pol *Policy) string {
	if mayUseClass(t, class, pol) {
		return class
	}
	s.auth.rejected.WithLabelValues(t.ID, "class_replaced").Inc()
	return homeClass(t, pol)
}

// schedTenant is the tenant as the scheduler carries it to the class owner.
func schedTenant(t *tenant.Tenant) scheduler.Tenant {
	return scheduler.Tenant{ID: t.ID, Weight: t.Weight, Quota: scheduler.TenantQuota{
		Concurrent: t.Quota.Concurrent, RequestsPerMinute: t.Quota.RequestsPerMinute, TokensPerMinute: t.Quota.TokensPerMinute,
	}}
}

// quotaError is the 429 of a tenant over its quota, with the owner's
// Retry-After (rounded up to whole seconds) or fallback when it gave none.
func quotaError(err error, fallback int) *APIError {
	retry := fallback
	var rej *scheduler.RejectError
	if errors.As(err, &rej) && rej.RetryAfter > 0 {
		retry = int(math.Ceil(rej.RetryAfter.Seconds()))
	}
	return &APIError{Status: http.StatusTooManyRequests, Type: typeRateLimit, Code: "quota_exceeded",
		Message: "the tenant's quota is exhausted: " + err.Error(), RetryAfter: max(retry, 1), err: err}
}

// UsageTicket is the optional part of a Ticket that takes the engine's
// reported token usage before Finish, so the class owner corrects the
// tenant's tokens-per-minute bucket.
type UsageTicket interface {
	SetUsage(tokens int)
}

// reportUsage hands a response's usage (prompt plus output tokens; nil:
// the response had none) to t when the request has a tokens quota.
func (x *exchange) reportUsage(t Ticket, u *usage) {
	if x.tenant == nil || x.tenant.Quota.TokensPerMinute == 0 || u == nil {
		return
	}
	if ut, ok := t.(UsageTicket); ok {
		ut.SetUsage(u.PromptTokens + u.CompletionTokens + u.InputTokens + u.OutputTokens + u.CacheRead)
	}
}
