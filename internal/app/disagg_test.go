package app

// Disaggregated prefill and decode end to end: a real replica over real
// simulated workers of each role speaking vLLM's two-leg protocol, with
// the official OpenAI Go client.

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/tenant"
	"github.com/switchyard/switchyard/wire"
)

func roleWorker(role string) func(*WorkerConfig) {
	return func(cfg *WorkerConfig) {
		cfg.PD.Role = role
		cfg.PD.KVTransfer = wire.TransferVLLM
	}
}

// startPDOwner is startOwner with the decider's threshold set.
func (c *testCluster) startPDOwner(n, minTokens int) *runningReplica {
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Scheduler.Disagg.MinTokens = minTokens })
	c.waitOwned(defaultClasses, "r1")
	testenv.Eventually(c.t, 10*time.Second, func() bool {
		return modelWorkers("http://"+r.status.HTTPAddr) == n
	}, "the replica sees %d workers", n)
	return r
}

func labelled(reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Counter != nil {
				sum += m.Counter.GetValue()
			}
		}
	}
	return sum
}

func TestALongPromptGoesPrefillThenDecodeAndAShortOneRunsAggregated(t *testing.T) {
	c := routerTestCluster(t)
	both := c.addWorker("b1", nil)
	pre := c.addWorker("p1", roleWorker(wire.RolePrefill))
	dec := c.addWorker("d1", roleWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 64)
	cl := r.client()
	ctx := testenv.Context(t)

	// Long: prefill on p1 (one token, parameters held), decode on d1 (pulls
	// them: the parameters arrived intact), streamed to the client.
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a long shared context ", 60))},
		MaxTokens: openai.Int(6),
	})
	chunks := 0
	for stream.Next() {
		if len(stream.Current().Choices) > 0 {
			chunks++
		}
	}
	require.NoError(t, stream.Err())
	require.Equal(t, 6, chunks)
	kv := "switchyard_worker_kv_transfers_total"
	require.Equal(t, 1.0, labelled(pre.reg, kv, map[string]string{"role": wire.RolePrefill, "outcome": "held"}))
	require.Equal(t, 1.0, labelled(pre.reg, kv, map[string]string{"outcome": "served"}))
	require.Equal(t, 1.0, labelled(dec.reg, kv, map[string]string{"role": wire.RoleDecode, "outcome": "pulled"}))
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated", "reason": "long_prefill"}))
	require.Zero(t, labelled(r.reg, metrics.NameDisaggRecomputes, nil))
	require.Zero(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))

	// Short: aggregated on the both-worker.
	comp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hi")},
		MaxTokens: openai.Int(4),
	})
	require.NoError(t, err)
	require.Equal(t, int64(4), comp.Usage.CompletionTokens)
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "aggregated", "reason": "short_prefill"}))
	require.Positive(t, labelled(both.reg, "switchyard_worker_http_requests_total", nil))
}

// gauge reads a gauge series of reg with the given labels (-1: none).
func gauge(reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return -1
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			if m.Gauge != nil {
				return m.Gauge.GetValue()
			}
		}
	}
	return -1
}

func TestACancelledPairStreamReleasesBothBookings(t *testing.T) {
	r, _, _ := cancelAPairStream(t, roleWorker)
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated"}))
}

// cancelAPairStream registers a prefill worker p1 and a decode worker d1
// made by role (the protocol's worker options), streams a long completion
// through a pair, cancels it, and checks that both bookings are released.
// It returns the router and both workers for the protocol's own checks.
func cancelAPairStream(t *testing.T, role func(string) func(*WorkerConfig)) (r *runningReplica, pre, dec *runningWorker) {
	t.Helper()
	c := routerTestCluster(t)
	pre = c.addWorker("p1", role(wire.RolePrefill))
	dec = c.addWorker("d1", func(cfg *WorkerConfig) {
		role(wire.RoleDecode)(cfg)
		cfg.Engine.Speedup = 1 // a stream that lasts
	})
	r = c.startPDOwner(2, 64)
	roleActive := func(ro string) float64 {
		return gauge(r.reg, metrics.NameRoleActiveRequests, map[string]string{metrics.LabelRole: ro})
	}
	worker := func(id string) float64 {
		return gauge(r.reg, metrics.NameWorkerActiveRequests, map[string]string{metrics.LabelWorker: id})
	}
	testenv.Eventually(t, 10*time.Second, func() bool {
		return gauge(r.reg, metrics.NameRoleWorkers, map[string]string{metrics.LabelRole: wire.RolePrefill}) == 1 &&
			gauge(r.reg, metrics.NameRoleWorkers, map[string]string{metrics.LabelRole: wire.RoleDecode}) == 1
	}, "one worker of each role")

	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	cl := r.client()
	stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
		Model:     openai.CompletionNewParamsModel(testModel),
		Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("a long shared context ", 60))},
		MaxTokens: openai.Int(4000),
	})
	require.True(t, stream.Next(), "the decode leg streams: %v", stream.Err())
	// The pair is booked on both workers, and the role gauges say so.
	testenv.Eventually(t, 10*time.Second, func() bool {
		return worker("p1") == 1 && worker("d1") == 1 && roleActive(wire.RolePrefill) == 1 && roleActive(wire.RoleDecode) == 1 &&
			roleActive(wire.RoleBoth) == 0
	}, "the pair booked on p1 and d1")
	cancel()
	_ = stream.Close()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return worker("p1") == 0 && worker("d1") == 0 && roleActive(wire.RolePrefill) == 0 && roleActive(wire.RoleDecode) == 0
	}, "the cancel released both bookings (p1 %v, d1 %v)", worker("p1"), worker("d1"))
	return r, pre, dec
}

// A tenant's concurrency quota of 1 admits one pair at a time: the pair
// books two workers but holds one slot, and its end frees it.
func TestATenantQuotaOfOneAdmitsOnePairAtATime(t *testing.T) {
	keys := writeKeys(t, fmt.Sprintf(`
tenants:
  - id: acme
    keys: [%q]
    quota: {concurrent: 1}
`, tenant.HashKey("sk-acme")))
	c := routerTestCluster(t)
	c.addWorker("p1", roleWorker(wire.RolePrefill))
	c.addWorker("d1", func(cfg *WorkerConfig) {
		roleWorker(wire.RoleDecode)(cfg)
		cfg.Engine.Speedup = 1 // a stream that lasts
	})
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		cfg.Scheduler.Disagg.MinTokens = 64
		cfg.Tenants.KeysFile = keys
	})
	c.waitOwned(defaultClasses, "r1")
	cl := keyedClient(r, "sk-acme")
	testenv.Eventually(t, 10*time.Second, func() bool {
		var list struct {
			Data []struct {
				Workers int `json:"switchyard_workers"`
			} `json:"data"`
		}
		err := cl.Get(testenv.Context(t), "models", nil, &list)
		return err == nil && len(list.Data) == 1 && list.Data[0].Workers == 2
	}, "the replica sees 2 workers")
	long := func(tag string) openai.CompletionNewParams {
		return openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("context "+tag+" ", 120))},
			MaxTokens: openai.Int(4000),
		}
	}
	ctx, cancel := context.WithCancel(testenv.Context(t))
	defer cancel()
	stream := cl.Completions.NewStreaming(ctx, long("first"))
	require.True(t, stream.Next(), "the first pair streams: %v", stream.Err())
	require.Equal(t, 1.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated"}))

	short := long("second")
	short.MaxTokens = openai.Int(2)
	_, err := cl.Completions.New(testenv.Context(t), short, option.WithMaxRetries(0))
	require.Error(t, err, "a second pair while the first holds the tenant's one slot")
	status, code := apiStatus(t, err)
	require.Equal(t, http.StatusTooManyRequests, status)
	require.Equal(t, "quota_exceeded", code)

	cancel()
	_ = stream.Close()
	testenv.Eventually(t, 10*time.Second, func() bool {
		_, err := cl.Completions.New(testenv.Context(t), short, option.WithMaxRetries(0))
		return err == nil
	}, "the first pair's end frees the slot for the next pair")
	require.Equal(t, 2.0, labelled(r.reg, metrics.NameDisaggDecisions, map[string]string{"mode": "disaggregated"}))
}

// A prefill worker that stops answering (its address closed while its
// record stays registered) under load: its requests are retried on the
// other prefill worker, and every one succeeds.
func TestAStoppedPrefillWorkerUnderLoadIsRetriedOnTheOther(t *testing.T) {
	c := routerTestCluster(t)
	// Each prefill worker is registered behind a front the test closes:
	// "stopped" is connections refused, before the registry knows.
	fronts := map[string]*httptest.Server{}
	workers := map[string]*runningWorker{}
	for _, id := range []string{"p1", "p2"} {
		var target atomic.Value // string: the worker's own URL
		front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			u, _ := url.Parse(target.Load().(string))
			p := httputil.NewSingleHostReverseProxy(u)
			p.ErrorLog = log.New(io.Discard, "", 0) // the router's probes end mid-flight
			p.ServeHTTP(w, r)
		}))
		t.Cleanup(front.Close)
		fronts[id] = front
		// a free port for the worker itself, outside the ephemeral range that
		// other tests' connections draw from
		addr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
		target.Store("http://" + addr)
		workers[id] = c.addWorker(id, func(cfg *WorkerConfig) {
			roleWorker(wire.RolePrefill)(cfg)
			cfg.Listen, cfg.AdvertiseURL = addr, front.URL
		})
	}
	c.addWorker("d1", roleWorker(wire.RoleDecode))
	r := c.startPDOwner(3, 1) // every request a pair, its prefill KV-aware
	cl := r.client()
	ctx := testenv.Context(t)
	prompt := strings.Repeat("the shared context of this test ", 40)
	run := func(tag string) error {
		_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt + tag)},
			MaxTokens: openai.Int(4),
		})
		return err
	}
	require.NoError(t, run("warm"))
	// The warm-up's prefill worker holds the prefix: the selector prefers it.
	reqs := func(id string) float64 { // prefill legs held for a decode
		return labelled(workers[id].reg, "switchyard_worker_kv_transfers_total", map[string]string{"outcome": "held"})
	}
	require.Equal(t, 1.0, reqs("p1")+reqs("p2"), "the warm-up ran as a pair")
	hot, cold := "p1", "p2"
	if reqs("p2") > reqs("p1") {
		hot, cold = "p2", "p1"
	}
	fronts[hot].CloseClientConnections()
	fronts[hot].Close()
	before := reqs(cold)

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- run(fmt.Sprintf(" turn %d", i))
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	require.Positive(t, labelled(r.reg, metrics.NameDisaggLegErrors, map[string]string{"leg": "prefill"}),
		"some prefill legs went to the stopped worker %s and failed", hot)
	require.GreaterOrEqual(t, reqs(cold)-before, 8.0, "every request's prefill ran on %s", cold)
}
