package frontend

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/tenant"
)

// adminKeys is a keys file with one tenant and one admin.
func adminKeys(t *testing.T) *tenant.Set {
	t.Helper()
	set, err := tenant.NewSetWithAdmins([]tenant.Tenant{acme}, []tenant.Admin{{ID: "prometheus", Keys: []string{tenant.HashKey("sk-admin")}}})
	require.NoError(t, err)
	return set
}

// adminDeps serves fixed /metrics and /debug/cluster documents.
func adminDeps(keys *tenant.Set) Deps {
	d := Deps{Admitter: grantInOrder(&grantRecorder{}), Workers: staticWorkers{},
		MetricsHandler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "metrics\n") }),
		ClusterInfo:    func(context.Context) (json.RawMessage, error) { return json.RawMessage(`{"workers":[]}`), nil },
	}
	if keys != nil {
		d.Tenants, d.Admins = keys, keys
	}
	return d
}

// getWithKey GETs url with key as a bearer token ("" sends none).
func getWithKey(t *testing.T, url, key string) (int, http.Header) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	require.NoError(t, err)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

func TestWithKeysAndNoAdminListenerMetricsAndDebugNeedAnAdminKey(t *testing.T) {
	s, _ := newTestServer(t, DefaultConfig(), adminDeps(adminKeys(t)))
	api := startServer(t, s)
	for _, path := range []string{"/metrics", "/debug/cluster"} {
		code, h := getWithKey(t, api+path, "")
		assert.Equal(t, http.StatusUnauthorized, code, "%s without a key", path)
		assert.Contains(t, h.Get("WWW-Authenticate"), "Bearer")
		code, _ = getWithKey(t, api+path, "sk-unknown")
		assert.Equal(t, http.StatusUnauthorized, code, "%s with an unknown key", path)
		code, _ = getWithKey(t, api+path, "sk-acme")
		assert.Equal(t, http.StatusForbidden, code, "%s with a tenant's key", path)
		code, _ = getWithKey(t, api+path, "sk-admin")
		assert.Equal(t, http.StatusOK, code, "%s with the admin key", path)
	}
	assert.Equal(t, 2.0, testutil.ToFloat64(s.lis.gate.missing))
	assert.Equal(t, 2.0, testutil.ToFloat64(s.lis.gate.invalid))
	assert.Equal(t, 2.0, testutil.ToFloat64(s.lis.gate.notAdmin))
	code, _ := getWithKey(t, api+"/healthz", "")
	assert.Equal(t, http.StatusOK, code, "health checks stay open for load balancers")
	status, _, _ := post(t, api+"/v1/completions", `{"model":"m","prompt":"hi"}`, bearer("sk-admin"))
	assert.Equal(t, http.StatusUnauthorized, status, "an admin key is not a tenant's: it cannot use the API")
}

func TestWithKeysButNoAdminsTheAdminRoutesOnTheAPIListenerAreClosed(t *testing.T) {
	set, err := tenant.NewSet([]tenant.Tenant{acme})
	require.NoError(t, err)
	d := adminDeps(nil)
	d.Tenants = set // as a caller that knows nothing of admin keys
	s, _ := newTestServer(t, DefaultConfig(), d)
	api := startServer(t, s)
	code, _ := getWithKey(t, api+"/debug/cluster", "sk-acme")
	assert.Equal(t, http.StatusForbidden, code)
	code, _ = getWithKey(t, api+"/metrics", "")
	assert.Equal(t, http.StatusUnauthorized, code)
}

func TestWithoutKeysTheAdminRoutesStayOpenOnTheAPIListener(t *testing.T) {
	s, _ := newTestServer(t, DefaultConfig(), adminDeps(nil))
	api := startServer(t, s)
	for _, path := range []string{"/metrics", "/debug/cluster"} {
		code, _ := getWithKey(t, api+path, "")
		assert.Equal(t, http.StatusOK, code, path)
	}
	assert.Nil(t, s.lis.gate)
}

func TestWithKeysAndAnAdminListenerTheAdminRoutesAreServedThereOnly(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AdminAddr = "127.0.0.1:0"
	s, _ := newTestServer(t, cfg, adminDeps(adminKeys(t)))
	api := startServer(t, s)
	admin := serveAdmin(t, s)
	for _, path := range []string{"/metrics", "/debug/cluster"} {
		code, _ := getWithKey(t, api+path, "sk-admin")
		assert.Equal(t, http.StatusNotFound, code, "%s is not on the API listener, even with the admin key", path)
		code, _ = getWithKey(t, admin+path, "")
		assert.Equal(t, http.StatusOK, code, "%s on the admin listener", path)
	}
}

func TestAnAdminPageRegisteredWithHandleAdminIsGatedLikeMetrics(t *testing.T) {
	page := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "<html>") })

	s, _ := newTestServer(t, DefaultConfig(), adminDeps(adminKeys(t)))
	s.HandleAdmin("GET /{$}", page)
	api := startServer(t, s)
	code, _ := getWithKey(t, api+"/", "sk-acme")
	assert.Equal(t, http.StatusForbidden, code)
	code, _ = getWithKey(t, api+"/", "sk-admin")
	assert.Equal(t, http.StatusOK, code)
	code, _ = getWithKey(t, api+"/nothing-here", "sk-admin")
	assert.Equal(t, http.StatusNotFound, code, "only / itself is the page")

	cfg := DefaultConfig()
	cfg.AdminAddr = "127.0.0.1:0"
	s2, _ := newTestServer(t, cfg, adminDeps(adminKeys(t)))
	s2.HandleAdmin("GET /{$}", page)
	api2 := startServer(t, s2)
	admin2 := serveAdmin(t, s2)
	code, _ = getWithKey(t, admin2+"/", "")
	assert.Equal(t, http.StatusOK, code)
	code, _ = getWithKey(t, api2+"/", "sk-admin")
	assert.Equal(t, http.StatusNotFound, code)
}

// serveAdmin serves s's admin listener on a loopback port until the test
// ends and returns its base URL.
func serveAdmin(t *testing.T, s *Server) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.ServeAdmin(ctx, ln) }()
	t.Cleanup(func() { cancel(); require.NoError(t, <-done) })
	return "http://" + ln.Addr().String()
}
