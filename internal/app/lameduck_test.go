package app

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// answer is one completion as its client saw it.
type answer struct {
	status     int
	code       string // error.code of an error body
	retryAfter string
	err        error // transport error: no response at all
}

// shortCompletion is the max_tokens of a request that only has to be
// served: at the owner test cluster's speed it holds a worker slot for a
// few milliseconds.
const shortCompletion = 8

// completeVia sends one non-streaming completion of class, asking for
// maxTokens, to the replica at addr and reads the whole answer.
func completeVia(client *http.Client, addr, class string, n, maxTokens int) answer {
	body, _ := json.Marshal(map[string]any{
		"model": testModel, "max_tokens": maxTokens,
		"prompt": fmt.Sprintf("request %d %s", n, strings.Repeat("word ", 30)),
	})
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return answer{err: err}
	}
	req.Header.Set("content-type", "application/json")
	if class != "" {
		req.Header.Set("x-switchyard-class", class)
	}
	resp, err := client.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), err: err}
	var doc struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if resp.StatusCode != http.StatusOK && json.Unmarshal(raw, &doc) == nil {
		a.code = doc.Error.Code
	}
	return a
}

// load is a steady stream of completions to one replica.
type load struct {
	mu  sync.Mutex
	wg  sync.WaitGroup
	out []*answer
}

// sent is how many requests were sent so far.
func (l *load) sent() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.out)
}

// steadyLoad sends completions of maxTokens to addr every interval until
// stop is closed; wait returns every answer, in sending order.
func steadyLoad(addr, class string, maxTokens int, interval time.Duration, stop <-chan struct{}) (l *load, wait func() []answer) {
	client := &http.Client{Timeout: time.Minute, Transport: &http.Transport{}}
	l = &load{}
	mu, wg := &l.mu, &l.wg
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for n := 0; ; n++ {
			a := &answer{}
			mu.Lock()
			l.out = append(l.out, a)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				*a = completeVia(client, addr, class, n, maxTokens)
			}()
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	return l, func() []answer {
		wg.Wait()
		client.CloseIdleConnections()
		res := make([]answer, len(l.out))
		for i, a := range l.out {
			res[i] = *a
		}
		return res
	}
}

func readyzStatus(addr string) int {
	return httpStatus(http.MethodGet, "http://"+addr+"/readyz", nil)
}

// exited reports whether RunReplica returned, without waiting.
func (r *runningReplica) exited() bool {
	select {
	case err, ok := <-r.done:
		if ok {
			r.done <- err // put it back for stop
		}
		return true
	default:
		return false
	}
}

// On stop a router is a lame duck: /readyz fails at once while the API keeps
// serving for the drain delay, its class moves to another replica while its
// watchers still run, so every request that reached it (queued at it as the
// owner, or arriving meanwhile) is admitted by the new owner or answered at
// once with a typed 503 and Retry-After, and RunReplica returns nil.
func TestALameDuckRouterServesWhatReachesItWhileItsClassMovesAndStopsCleanly(t *testing.T) {
	// Real-time workers (speedup 1) and completions of 24 tokens: each holds
	// its worker slot for at least 160 ms (a 17 ms prefill and 24 decode
	// steps of at least 5.7 ms, engine.Polynomial), so the 2x2 slots serve
	// at most 25 requests/s, less than the 37.5/s sent below: a queue forms
	// at the owner however fast the machine. (With the 8-token completions
	// of the other tests at speedup 20 a request holds a slot for about
	// 12 ms and no queue ever forms.)
	ids, class, policy, c := startOwnerTestCluster(t, 1)
	const tokens = 24
	const drain = 3 * time.Second
	withPolicy := func(cfg *ReplicaConfig) {
		cfg.PolicyYAML = policy
		// Short enough that a request stuck without an owner fails the
		// test rather than hanging it.
		cfg.Admission.NoOwnerTimeout = 10 * time.Second
	}
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) { withPolicy(cfg); cfg.DrainDelay = drain })
	r2 := c.startReplicaWith("r2", "127.0.0.1:0", withPolicy)
	c.startReplicaWith("r3", "127.0.0.1:0", withPolicy)
	c.waitPlaced([]string{class}, ids...)

	stop := make(chan struct{})
	loadR1, viaR1 := steadyLoad(r1.status.HTTPAddr, class, tokens, 40*time.Millisecond, stop)
	_, viaR2 := steadyLoad(r2.status.HTTPAddr, class, tokens, 80*time.Millisecond, stop)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return r1.status.Snapshot().Classes[class].QueueDepth >= 3
	}, "requests queue at the owner r1")

	r1.cancel() // SIGTERM
	// Well inside the drain delay: readiness that fails only when the drain
	// ends must not pass.
	testenv.Eventually(t, drain/2, func() bool { return readyzStatus(r1.status.HTTPAddr) == http.StatusServiceUnavailable },
		"/readyz fails as soon as the lame duck begins")
	testenv.Eventually(t, drain, func() bool {
		o := r2.status.Owners()[class]
		return o.Replica != "" && o.Replica != "r1"
	}, "the class moves while r1 still serves")
	require.False(t, r1.exited(), "r1 keeps serving for its drain delay")
	sentBeforeMove := loadR1.sent()

	var exitErr error
	select {
	case exitErr = <-r1.done:
		r1.done <- exitErr
	case <-time.After(time.Minute):
		t.Fatal("r1 did not stop")
	}
	require.NoError(t, exitErr, "a lame duck stops cleanly")
	close(stop)
	r1Answers, r2Answers := viaR1(), viaR2()

	ok, typed, refused := 0, 0, 0
	for i, a := range r1Answers {
		switch {
		case a.err != nil:
			// No answer at all: refused after r1 stopped listening, or
			// written on a keep-alive connection as it closed. Such a
			// request never reached a handler, which the exact counts
			// below check.
			refused++
		case a.status == http.StatusOK:
			ok++
		default:
			require.Equal(t, http.StatusServiceUnavailable, a.status, "request %d via r1: %+v", i, a)
			require.Contains(t, []string{"not_ready", "shutting_down"}, a.code,
				"request %d via r1 was answered before admission, not lost in it: %+v", i, a)
			require.NotEmpty(t, a.retryAfter, "request %d via r1: a 503 says when to retry", i)
			typed++
		}
	}
	for i, a := range r2Answers {
		require.NoError(t, a.err, "request %d via r2", i)
		require.Equal(t, http.StatusOK, a.status, "request %d via r2: %+v", i, a)
	}
	t.Logf("via r1: %d served, %d answered 503 after the drain delay, %d without an answer (after it stopped listening) (%d sent by the time the class moved); via r2: %d served",
		ok, typed, refused, sentBeforeMove, len(r2Answers))
	require.Greater(t, ok, sentBeforeMove, "r1 served requests that arrived after its class had moved")
	served := 0.0
	for _, w := range c.workers {
		served += counterSum(t, w.reg, "switchyard_worker_http_requests_total")
	}
	require.Equal(t, float64(ok+len(r2Answers)), served, "each admitted request ran exactly once")
	require.Equal(t, float64(ok), counterSum(t, r1.reg, metrics.NameAdmissionReceived),
		"r1 received exactly the requests it served: none of those without an answer had entered admission")
}

// proxied are proxies to the test cluster's etcd and NATS: replicas that
// connect through them can be cut off.
type proxied struct {
	etcd, nats *testenv.Proxy
}

func (c *testCluster) proxies(t *testing.T) proxied {
	etcdURL, err := url.Parse(c.etcd.Endpoints[0])
	require.NoError(t, err)
	natsURL, err := url.Parse(c.nats.URL)
	require.NoError(t, err)
	return proxied{etcd: testenv.StartProxy(t, etcdURL.Host), nats: testenv.StartProxy(t, natsURL.Host)}
}

// etcd unavailable for three session TTLs: no router exits, every request
// sent meanwhile is admitted (locally, in degraded mode, after a short bound,
// instead of waiting for an owner that no replica can claim), the mode shows
// on /readyz and in the metrics, and when etcd is back every router takes a
// new lease, the classes are owned again and admission is normal by itself.
func TestAnEtcdOutageLongerThanTheSessionTTLKeepsEveryRouterUpAndServing(t *testing.T) {
	c := newTestCluster(t, 2)
	p := c.proxies(t)
	const ttl = 2 * time.Second
	cfg := func(cfg *ReplicaConfig) {
		cfg.EtcdEndpoints = []string{"http://" + p.etcd.Addr()}
		cfg.Session.TTL = ttl
		cfg.Admission.EtcdDegradedAfter = 500 * time.Millisecond
		cfg.Admission.NoOwnerTimeout = 10 * time.Second
	}
	ids := []string{"r1", "r2", "r3"}
	var rs []*runningReplica
	for _, id := range ids {
		rs = append(rs, c.startReplicaWith(id, "127.0.0.1:0", cfg))
	}
	c.waitPlaced(defaultClasses, ids...)

	p.etcd.Cut()
	cutAt := time.Now()
	for _, r := range rs {
		testenv.Eventually(t, 2*ttl, func() bool {
			code, body := readyz(t, r)
			return code == http.StatusOK && strings.Contains(body, "degraded: etcd")
		}, "%s reports the etcd degraded mode on /readyz", r.status.ID)
	}
	client := &http.Client{Timeout: time.Minute}
	defer client.CloseIdleConnections()
	n := 0
	for time.Since(cutAt) < 3*ttl { // requests all through the outage
		for _, r := range rs {
			for _, class := range defaultClasses {
				a := completeVia(client, r.status.HTTPAddr, class, n, shortCompletion)
				n++
				require.NoError(t, a.err)
				require.Equal(t, http.StatusOK, a.status, "request %d via %s (class %s) during the outage: %+v", n, r.status.ID, class, a)
			}
		}
	}
	degraded := 0.0
	for _, r := range rs {
		require.False(t, r.exited(), "%s stays up through the outage", r.status.ID)
		degraded += counterSum(t, r.reg, metrics.NameAdmissionDegradedAdmissions)
		require.Equal(t, 1.0, gaugeValue(t, r, metrics.NameAdmissionEtcdDegraded))
	}
	require.Positive(t, degraded, "requests without a reachable owner were admitted locally, and counted")

	p.etcd.Restore()
	for _, r := range rs {
		testenv.Eventually(t, 30*time.Second, func() bool {
			code, body := readyz(t, r)
			return code == http.StatusOK && !strings.Contains(body, "degraded")
		}, "%s leaves the degraded mode by itself", r.status.ID)
	}
	c.waitPlaced(defaultClasses, ids...)
	before := degraded
	for _, r := range rs {
		require.False(t, r.exited(), "%s did not exit when etcd came back", r.status.ID)
		require.GreaterOrEqual(t, counterSum(t, r.reg, metrics.NameClusterSessionLeasesLost), 1.0,
			"%s replaced its expired lease", r.status.ID)
		for _, class := range defaultClasses {
			a := completeVia(client, r.status.HTTPAddr, class, n, shortCompletion)
			n++
			require.Equal(t, http.StatusOK, a.status, "%+v", a)
		}
	}
	after := 0.0
	for _, r := range rs {
		after += counterSum(t, r.reg, metrics.NameAdmissionDegradedAdmissions)
	}
	require.Equal(t, before, after, "admission is back to normal: nothing more admitted in degraded mode")
}

// A router cut off from etcd and NATS for longer than its session TTL does
// not exit when it comes back: it takes a new lease, registers again, gets
// its classes back and serves.
func TestARouterCutOffLongerThanItsSessionTTLComesBackWithoutExiting(t *testing.T) {
	c := newTestCluster(t, 2)
	p := c.proxies(t)
	const ttl = 2 * time.Second
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		cfg.EtcdEndpoints = []string{"http://" + p.etcd.Addr()}
		cfg.NATSURL = "nats://" + p.nats.Addr()
		cfg.Session.TTL = ttl
	})
	r2 := c.startReplicaWith("r2", "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Session.TTL = ttl })
	ids := []string{"r1", "r2"}
	c.waitPlaced(defaultClasses, ids...)
	require.NotEmpty(t, r1.status.Owned())

	p.etcd.Cut()
	p.nats.Cut()
	testenv.Eventually(t, 3*ttl, func() bool {
		for _, class := range defaultClasses {
			if r2.status.Owners()[class].Replica != "r2" {
				return false
			}
		}
		return true
	}, "r2 takes every class once r1's lease expired")
	p.etcd.Restore()
	p.nats.Restore()

	c.waitPlaced(defaultClasses, ids...)
	require.False(t, r1.exited(), "r1 did not exit when it came back")
	require.NotEmpty(t, r1.status.Owned(), "r1 owns its classes again")
	require.GreaterOrEqual(t, counterSum(t, r1.reg, metrics.NameClusterSessionLeasesLost), 1.0)
	client := &http.Client{Timeout: time.Minute}
	defer client.CloseIdleConnections()
	for i, class := range defaultClasses {
		a := completeVia(client, r1.status.HTTPAddr, class, i, shortCompletion)
		require.Equal(t, http.StatusOK, a.status, "%+v", a)
	}
}

// A stop whose requests outlive the shutdown grace waited for them twice:
// once in the lame duck (WaitIdle, ShutdownGrace) and again in the API
// server's own shutdown (another ShutdownGrace), about 70 s with the
// defaults, longer than Kubernetes' 30 s termination grace. One grace now
// covers both waits.
func TestAStopWithARequestThatOutlivesTheGraceWaitsTheGraceOnce(t *testing.T) {
	const grace = 3 * time.Second
	c := newTestCluster(t, 0)
	// A very slow engine: the completion below would run for minutes.
	c.addWorker("w1", func(cfg *WorkerConfig) { cfg.Engine.Speedup = 0.05 })
	r := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		cfg.Frontend.ShutdownGrace = grace
		cfg.DrainDelay, cfg.ShutdownLinger = 0, 0
	})
	c.waitOwned(defaultClasses, "r1")
	done := make(chan answer, 1)
	go func() { done <- completeVia(&http.Client{}, r.status.HTTPAddr, "", 1, 2000) }()
	ctx := testenv.Context(t)
	testenv.Eventually(t, 20*time.Second, func() bool {
		snap, err := r.status.Flush(ctx)
		return err == nil && snap.Bookings == 1
	}, "the completion to be admitted and running")

	began := time.Now()
	r.cancel()
	require.NoError(t, <-r.done)
	close(r.done)
	took := time.Since(began)
	t.Logf("stopped in %v with a %v grace", took.Round(time.Millisecond), grace)
	require.GreaterOrEqual(t, took, grace, "the request in flight is given the grace")
	require.Less(t, took, 2*grace-time.Second, "the grace is waited once, not twice")
	a := <-done
	require.True(t, a.err != nil || a.status != http.StatusOK || a.code != "", "the cut request does not look complete: %+v", a)
}

func TestTheDefaultStopFitsKubernetesDefaultGrace(t *testing.T) {
	// A router stopped by Kubernetes gets terminationGracePeriodSeconds
	// (30 s unless the manifest says otherwise) before SIGKILL; with the
	// default settings its whole stop must end first, or the last streams
	// and the final counters are lost to the kill.
	cfg := DefaultReplicaConfig()
	require.Less(t, cfg.StopBound(), KubernetesTerminationGrace,
		"drain %v + grace %v + hand-off %v + 1s + linger %v + revoke: the default stop outlasts Kubernetes' default grace",
		cfg.DrainDelay, cfg.Frontend.ShutdownGrace, cfg.Ownership.OpTimeout, cfg.ShutdownLinger)
}
