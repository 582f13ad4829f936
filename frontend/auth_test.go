package frontend

import (
	"io"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

const authPolicy = "classes: [{name: standard}, {name: batch}, {name: realtime}]\nrules: []\ndefault_class: standard"

// authHarness is a frontend with keys over a real actor and one real
// upstream worker (MaxRunning 4).
type authHarness struct {
	s     *Server
	actor *scheduler.Actor
	up    *upstream
	base  string
}

func newAuthHarness(t *testing.T, tenants ...tenant.Tenant) *authHarness {
	t.Helper()
	return newAuthHarnessPolicy(t, authPolicy, tenants...)
}

// newAuthHarnessPolicy is newAuthHarness with the policy document given.
func newAuthHarnessPolicy(t *testing.T, policy string, tenants ...tenant.Tenant) *authHarness {
	t.Helper()
	pol, err := ParsePolicy([]byte(policy))
	require.NoError(t, err)
	up := newUpstream(t, 3)
	actor := startActor(t, pol, []scheduler.Worker{{ID: "w1", URL: up.URL(), BlockSize: 16, KVBlocks: 4096, MaxRunning: 4}})
	set, err := tenant.NewSet(tenants)
	require.NoError(t, err)
	s, _ := newTestServer(t, DefaultConfig(), Deps{
		Admitter: NewLocalAdmitter(actor),
		Workers:  staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16, Models: []string{"other"}}},
		Policy:   pol,
		Tenants:  set,
	})
	return &authHarness{s: s, actor: actor, up: up, base: startServer(t, s)}
}

func bearer(key string) map[string]string { return map[string]string{"Authorization": "Bearer " + key} }

var acme = tenant.Tenant{ID: "acme", Keys: []string{tenant.HashKey("sk-acme")}, Models: []string{"m"},
	DefaultClass: "batch", Classes: []string{"standard"}}

func TestARequestWithoutAKeyIsRefusedWith401(t *testing.T) {
	h := newAuthHarness(t, acme)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, nil)
	require.Equal(t, http.StatusUnauthorized, status, body)
	e := apiErr(t, body)
	assert.Equal(t, "missing_api_key", deref(e.Code))
	assert.Equal(t, "invalid_request_error", e.Type)
	assert.Zero(t, h.up.requests.Load())
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.auth.missing))
}

func TestAnUnknownKeyIsRefusedWith401AndNotEchoed(t *testing.T) {
	h := newAuthHarness(t, acme)
	for _, hdr := range []map[string]string{bearer("sk-nope"), {"Authorization": "Basic c2stYWNtZQ=="}, {"x-api-key": "sk-nope"}} {
		status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, hdr)
		require.Equal(t, http.StatusUnauthorized, status, body)
		assert.NotContains(t, body, "sk-nope")
	}
	assert.Zero(t, h.up.requests.Load())
}

func TestAKnownKeyIsServedByEveryHeaderSpelling(t *testing.T) {
	h := newAuthHarness(t, acme)
	for _, hdr := range []map[string]string{bearer("sk-acme"), {"Authorization": "bearer sk-acme"}, {"api-key": "sk-acme"}, {"x-api-key": "sk-acme"}} {
		status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, hdr)
		require.Equal(t, http.StatusOK, status, body)
	}
	// No class header: the tenant's default class, not the policy's.
	assert.Equal(t, uint64(4), classSnap(t, h.actor, "batch").Counters.Admitted)
	assert.Zero(t, classSnap(t, h.actor, "standard").Counters.Received)
}

func TestAModelTheTenantMayNotUseIsRefusedWith403(t *testing.T) {
	h := newAuthHarness(t, acme)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"other","prompt":"hi"}`, bearer("sk-acme"))
	require.Equal(t, http.StatusForbidden, status, body)
	e := apiErr(t, body)
	assert.Equal(t, "model_not_allowed", deref(e.Code))
	assert.Equal(t, "model", deref(e.Param))
	assert.Zero(t, h.up.requests.Load())
}

func TestAClassHeaderTheTenantMayNotUseIsRefusedWith403(t *testing.T) {
	h := newAuthHarness(t, acme)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`,
		map[string]string{"Authorization": "Bearer sk-acme", HeaderClass: "realtime"})
	require.Equal(t, http.StatusForbidden, status, body)
	assert.Equal(t, "class_not_allowed", deref(apiErr(t, body).Code))
	assert.Zero(t, classSnap(t, h.actor, "realtime").Counters.Received, "a tenant cannot promote itself")

	status, _, body = post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`,
		map[string]string{"Authorization": "Bearer sk-acme", HeaderClass: "standard"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "standard").Counters.Admitted)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.auth.rejected.WithLabelValues("acme", "class_not_allowed")))
}

func TestATenantOverItsConcurrencyQuotaGets429QuotaExceeded(t *testing.T) {
	limited := acme
	limited.Quota = tenant.Quota{Concurrent: 1}
	h := newAuthHarness(t, limited)
	h.up.gate = make(chan struct{})
	done := postInBackground(h.base+"/v1/completions", `{"model":"m","prompt":"first"}`, bearer("sk-acme"))
	waitFor(t, func() bool { return h.up.requests.Load() == 1 })

	status, hdr, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"second"}`, bearer("sk-acme"))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	e := apiErr(t, body)
	assert.Equal(t, "quota_exceeded", deref(e.Code))
	assert.Equal(t, "rate_limit_error", e.Type)
	assert.Equal(t, "1", hdr.Get("Retry-After"))
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.auth.rejected.WithLabelValues("acme", "quota_exceeded")))

	close(h.up.gate)
	require.Equal(t, http.StatusOK, <-done)
	waitFor(t, func() bool { return classSnap(t, h.actor, "batch").Counters.Admitted == 1 })
	status, _, body = post(t, h.base+"/v1/completions", `{"model":"m","prompt":"third"}`, bearer("sk-acme"))
	require.Equal(t, http.StatusOK, status, body)
}

func TestRequestsPerMinuteOverQuotaSendTheOwnersRetryAfter(t *testing.T) {
	limited := acme
	limited.Quota = tenant.Quota{RequestsPerMinute: 2}
	h := newAuthHarness(t, limited)
	for range 2 {
		status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, bearer("sk-acme"))
		require.Equal(t, http.StatusOK, status, body)
	}
	status, hdr, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, bearer("sk-acme"))
	require.Equal(t, http.StatusTooManyRequests, status, body)
	retry, err := strconv.Atoi(hdr.Get("Retry-After"))
	require.NoError(t, err)
	assert.InDelta(t, 30, retry, 1, "one request refills in 30 s at 2 per minute")
}

func TestTheEnginesReportedUsageReplacesTheTokenEstimate(t *testing.T) {
	// 1000 tokens per minute; each request is estimated at its prompt plus
	// max_tokens 900, but the engine reports 43 tokens used. Without the
	// correction the second request would be over the quota.
	limited := acme
	limited.Quota = tenant.Quota{TokensPerMinute: 1000}
	h := newAuthHarness(t, limited)
	for i := range 3 {
		status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":900}`, bearer("sk-acme"))
		require.Equal(t, http.StatusOK, status, "request %d: %s", i, body)
		waitFor(t, func() bool { snap, _ := h.actor.Flush(t.Context()); return snap.Bookings == 0 })
	}
}

func TestModelsListsOnlyTheTenantsModelsAndNeedsAKey(t *testing.T) {
	h := newAuthHarness(t, acme)
	resp, err := http.Get(h.base + "/v1/models")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode)

	req, _ := http.NewRequest(http.MethodGet, h.base+"/v1/models", nil)
	req.Header.Set("Authorization", "Bearer sk-acme")
	resp, err = http.DefaultClient.Do(req)
	require.NoError(t, err)
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	assert.Contains(t, string(b), `"id":"m"`)
	assert.NotContains(t, string(b), `"id":"other"`)
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, 5*time.Second, cond, "condition")
}

func classSnap(t *testing.T, a *scheduler.Actor, class string) scheduler.ClassSnapshot {
	t.Helper()
	snap, err := a.Flush(t.Context())
	require.NoError(t, err)
	return snap.Classes[class]
}

// rulePolicy sends requests with the header x-tier: gold to realtime by a
// rule: a header any client can set.
const rulePolicy = "classes: [{name: standard}, {name: batch}, {name: realtime}]\n" +
	"rules: [{class: realtime, match: {header: {name: x-tier, value: gold}}}]\ndefault_class: standard"

func TestAPolicyRuleCannotPutATenantInAClassItMayNotUse(t *testing.T) {
	plain := tenant.Tenant{ID: "plain", Keys: []string{tenant.HashKey("sk-plain")}, Classes: []string{"batch"}}
	h := newAuthHarnessPolicy(t, rulePolicy, plain)
	// By header the class is refused, as before.
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`,
		map[string]string{"Authorization": "Bearer sk-plain", HeaderClass: "realtime"})
	require.Equal(t, http.StatusForbidden, status, body)
	// Through the rule, it used to be granted: now the request falls back
	// to the tenant's home class, the policy's default.
	status, _, body = post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`,
		map[string]string{"Authorization": "Bearer sk-plain", "x-tier": "gold"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Zero(t, classSnap(t, h.actor, "realtime").Counters.Received, "a rule cannot promote a tenant")
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "standard").Counters.Admitted)
	assert.Equal(t, 1.0, testutil.ToFloat64(h.s.auth.rejected.WithLabelValues("plain", "class_replaced")))
}

func TestAPolicyRulesClassTheTenantMayUseStands(t *testing.T) {
	gold := tenant.Tenant{ID: "gold", Keys: []string{tenant.HashKey("sk-gold")}, Classes: []string{"realtime"}}
	h := newAuthHarnessPolicy(t, rulePolicy, gold)
	status, _, body := post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`,
		map[string]string{"Authorization": "Bearer sk-gold", "x-tier": "gold"})
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "realtime").Counters.Admitted)
	// Without the header the policy's default class, its home class.
	status, _, body = post(t, h.base+"/v1/completions", `{"model":"m","prompt":"hi"}`, bearer("sk-gold"))
	require.Equal(t, http.StatusOK, status, body)
	assert.Equal(t, uint64(1), classSnap(t, h.actor, "standard").Counters.Admitted)
}
