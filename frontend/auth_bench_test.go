package frontend

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// BenchmarkTenantOverhead measures what API keys and tenant quotas add to a
// request: the same non-streaming completion through two frontends over
// one real admission actor and one real (loopback) worker, one frontend
// open and one with a keys file of 1000 tenants whose quotas (concurrency,
// requests and tokens per minute) are all checked and charged but never
// reached. Each iteration sends one request through each, in alternating
// order, so both see the same machine; added-p50-us is the difference of
// their p50 latencies. auth-ns/op times the frontend's part alone
// (authenticate and authorize) and quota-p50-ns the owner's part (the
// Core's enqueue-to-finish with a tenant minus without), on one goroutine.
func BenchmarkTenantOverhead(b *testing.B) {
	up := newUpstream(b, 1)
	pol := DefaultPolicy()
	actor, stopActor := startBenchActor(pol, []scheduler.Worker{{ID: "w1", URL: up.URL(), BlockSize: 16, KVBlocks: 65536}})
	defer stopActor()
	ws := staticWorkers{{ID: "w1", URL: up.URL(), Model: "m", BlockSize: 16}}

	var tenants []tenant.Tenant
	for i := range 1000 {
		tenants = append(tenants, tenant.Tenant{ID: fmt.Sprintf("t%04d", i), Keys: []string{tenant.HashKey(fmt.Sprintf("sk-%04d", i))},
			Models: []string{"m"}, Quota: tenant.Quota{Concurrent: 1 << 20, RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40}})
	}
	set, err := tenant.NewSet(tenants)
	require.NoError(b, err)
	prompts := toyPrompts(b, "m")
	open, err := New(DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: ws, Policy: pol, Prompts: prompts}, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(b, err)
	keyed, err := New(DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: ws, Policy: pol, Prompts: prompts, Tenants: set}, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(b, err)
	defer open.CloseIdleConnections()
	defer keyed.CloseIdleConnections()

	body := `{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat("the quick brown fox ", 50) + `"}`
	send := func(s *Server, key string) time.Duration {
		req := httptest.NewRequest(http.MethodPost, "/v1/completions", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		rec := httptest.NewRecorder()
		start := time.Now()
		s.Handler().ServeHTTP(rec, req)
		d := time.Since(start)
		if rec.Code != http.StatusOK {
			b.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
		return d
	}
	for range 200 { // warm connections and pools
		send(open, "")
		send(keyed, "sk-0500")
	}
	var plain, auth []time.Duration
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		key := fmt.Sprintf("sk-%04d", i%1000)
		if i%2 == 0 {
			plain = append(plain, send(open, ""))
			auth = append(auth, send(keyed, key))
		} else {
			auth = append(auth, send(keyed, key))
			plain = append(plain, send(open, ""))
		}
	}
	b.StopTimer()
	p50p, p50a := percentile(plain, 0.5), percentile(auth, 0.5)
	b.ReportMetric(float64(p50p.Nanoseconds())/1000, "open-p50-us")
	b.ReportMetric(float64(p50a.Nanoseconds())/1000, "keyed-p50-us")
	b.ReportMetric(float64((p50a-p50p).Nanoseconds())/1000, "added-p50-us")

	// The two parts alone, on this goroutine.
	hdr := httptest.NewRequest(http.MethodPost, "/v1/completions", nil)
	const n = 20000
	start := time.Now()
	for i := range n {
		hdr.Header.Set("Authorization", "Bearer sk-0"+fmt.Sprint(100+i%900))
		t, apiErr := keyed.authenticate(hdr)
		if apiErr != nil {
			b.Fatal(apiErr)
		}
		if _, apiErr := keyed.authorize(t, "m", "", pol); apiErr != nil {
			b.Fatal(apiErr)
		}
	}
	b.ReportMetric(float64(time.Since(start).Nanoseconds())/n, "auth-ns/op")
	b.ReportMetric(quotaCost(b), "quota-p50-ns")
}

// quotaCost is the p50 difference of the Core's enqueue-to-finish time per
// request with a tenant whose quotas are checked and charged and without
// one: two Cores, one request each in turn, each timed alone.
func quotaCost(b *testing.B) float64 {
	newCore := func() *scheduler.Core {
		core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, nil)
		core.SetClasses(DefaultPolicy().Classes)
		core.SetWorkers([]scheduler.Worker{{ID: "w1", URL: "http://w1", BlockSize: 16, KVBlocks: 65536}})
		return core
	}
	plainCore, tenantCore := newCore(), newCore()
	class := DefaultPolicy().Classes[0].Name
	var booking scheduler.BookingID
	respond := func(g scheduler.Grant, err error) bool {
		if err != nil {
			b.Fatal(err)
		}
		booking = g.Booking
		return true
	}
	plainReq := &scheduler.Request{Class: class, PromptTokens: 200, ExpectedOutputTokens: 20, Ingress: time.Now()}
	tenantReq := *plainReq
	tenantReq.Tenant = scheduler.Tenant{ID: "t0500", Weight: 1, Quota: scheduler.TenantQuota{Concurrent: 1 << 20, RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40}}
	const n = 50000
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("r%d", i)
	}
	one := func(core *scheduler.Core, r *scheduler.Request, id string) time.Duration {
		r.ID = id
		start := time.Now()
		core.Enqueue(r, respond)
		core.FinishUsage(booking, 220)
		return time.Since(start)
	}
	plain, tenant := make([]time.Duration, 0, n), make([]time.Duration, 0, n)
	for i := range n {
		plain = append(plain, one(plainCore, plainReq, ids[i]))
		tenant = append(tenant, one(tenantCore, &tenantReq, ids[i]))
	}
	return float64((percentile(tenant, 0.5) - percentile(plain, 0.5)).Nanoseconds())
}
