//go:build e2e

package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// The suite's settings, overridable by environment for other deployments of
// the compose file (run.sh passes the defaults).
var (
	project     = envOr("E2E_PROJECT", "switchyard-e2e")
	loadSeconds = envInt("E2E_LOAD_SECONDS", 24)
	rate        = envInt("E2E_RATE", 25)
	// settleBound is how long ownership may take to settle after a fault:
	// the etcd session TTL (5 s) for the lease to expire, plus claiming and
	// the settle period, with room for a loaded 2-core machine.
	settleBound = time.Duration(envInt("E2E_SETTLE_SECONDS", 30)) * time.Second
	// routerGrace is the routers' stop_grace_period in the compose files:
	// a router must exit 0 (not be killed) within it.
	routerGrace = envInt("E2E_ROUTER_GRACE_SECONDS", 20)
	// sessionTTL is the routers' etcd session TTL (the default).
	sessionTTL = 5 * time.Second
	classes    = []string{"interactive", "batch", "realtime"}
	routerIDs  = []string{"router-1", "router-2", "router-3"}
	workerIDs  = []string{"worker-1", "worker-2", "worker-3", "worker-4", "worker-5", "worker-6", "worker-7", "worker-8"}
)

var (
	reportMu sync.Mutex
	reports  []*scenarioReport
)

func init() {
	collectedReports = func() []*scenarioReport {
		reportMu.Lock()
		defer reportMu.Unlock()
		return reports
	}
}

func addReport(r *scenarioReport) {
	reportMu.Lock()
	defer reportMu.Unlock()
	reports = append(reports, r)
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func envInt(k string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(k)); err == nil && v > 0 {
		return v
	}
	return def
}

// routerURL and workerURL are the loopback ports the compose file publishes,
// over E2E_SCHEME (http; https in the TLS variant, whose CA is E2E_CA_FILE).
func routerURL(id string) string {
	n := strings.TrimPrefix(id, "router-")
	return envOr("E2E_"+strings.ToUpper(strings.ReplaceAll(id, "-", "_"))+"_URL", scheme()+"://127.0.0.1:1808"+n)
}

// routerAdminURL serves a router's /metrics and /debug/cluster: its API URL,
// unless the routers have an admin listener (the TLS variant publishes it,
// plaintext, on 1809N and sets E2E_ROUTER_ADMIN=1).
func routerAdminURL(id string) string {
	if os.Getenv("E2E_ROUTER_ADMIN") != "1" {
		return routerURL(id)
	}
	return "http://127.0.0.1:1809" + strings.TrimPrefix(id, "router-")
}

func workerURL(id string) string {
	n := strings.TrimPrefix(id, "worker-")
	return envOr("E2E_"+strings.ToUpper(strings.ReplaceAll(id, "-", "_"))+"_URL", scheme()+"://127.0.0.1:1900"+n)
}

func scheme() string { return envOr("E2E_SCHEME", "http") }

// clientTLS is the scenarios' TLS configuration: nil unless E2E_CA_FILE names
// the CA that signed the routers' and workers' certificates.
func clientTLS(t *testing.T) *tls.Config {
	t.Helper()
	c, err := ClientTLS(os.Getenv("E2E_CA_FILE"))
	require.NoError(t, err)
	return c
}

type suite struct {
	t       *testing.T
	ctx     context.Context
	client  *http.Client
	compose Compose
}

func newSuite(t *testing.T) *suite {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	t.Cleanup(cancel)
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, TLSClientConfig: clientTLS(t)}}
	t.Cleanup(client.CloseIdleConnections)
	s := &suite{t: t, ctx: ctx, client: client, compose: Compose{Project: project, Network: "switchyard"}}
	// Every scenario starts from a whole, settled cluster, whatever the one
	// before it left behind.
	s.waitSettled(routerIDs, 2*settleBound)
	return s
}

// heal undoes a fault if the scenario that made it stopped half way, so the
// next scenario starts from a whole cluster: it starts the service's
// container and, if cut, reattaches it. Errors mean there was nothing to heal.
func (s *suite) heal(service string, reconnect bool) {
	s.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if reconnect {
			_ = s.compose.Connect(ctx, service)
		}
		_ = s.compose.Start(ctx, service)
	})
}

func (s *suite) views(live []string) []ClusterInfo {
	var out []ClusterInfo
	for _, id := range live {
		if ci, err := FetchClusterInfo(s.ctx, s.client, routerAdminURL(id)); err == nil {
			out = append(out, ci)
		}
	}
	return out
}

// waitSettled polls /debug/cluster on the live routers until they agree on
// owners among themselves for every class and see all workers; it returns
// how long that took.
func (s *suite) waitSettled(live []string, bound time.Duration) time.Duration {
	s.t.Helper()
	start := time.Now()
	var why string
	for time.Since(start) < bound {
		ok, w := Settled(s.views(live), live, classes, len(workerIDs))
		if ok {
			return time.Since(start)
		}
		why = w
		select {
		case <-s.ctx.Done():
			s.t.Fatalf("context done while waiting for the cluster: %s", why)
		case <-time.After(100 * time.Millisecond):
		}
	}
	s.t.Fatalf("cluster of %v not settled within %v: %s", live, bound, why)
	return 0
}

func (s *suite) waitHealthy(service string) {
	s.t.Helper()
	testenv.Eventually(s.t, 2*settleBound, func() bool {
		h, err := s.compose.Health(s.ctx, service)
		return err == nil && h == "healthy"
	}, service+" healthy")
}

// load is one scenario's traffic and counters: the driver plus watches on
// the routers' admission counters and the workers' request counters.
type load struct {
	s       *suite
	driver  *Driver
	routers *CounterWatch
	workers *CounterWatch
	// pairs counts the routers' disaggregated decisions (0 outside the pd
	// variant): each is served by a prefill and a decode worker.
	pairs *CounterWatch
	// unread counts the requests workers got no whole body for (the
	// connection failed while the body was sent): they served nothing, and
	// the router re-admits such a request elsewhere (counted as retried).
	unread *CounterWatch
	base   map[string]float64

	stopDriver, stopWatches context.CancelFunc
	driverDone, watchesDone sync.WaitGroup
	stopped                 bool
}

func (s *suite) startLoad() *load {
	s.t.Helper()
	return s.startLoadWith(nil)
}

// startLoadWith starts the load with the driver's config adjusted by mutate.
func (s *suite) startLoadWith(mutate func(*DriverConfig)) *load {
	s.t.Helper()
	cfg := DefaultDriverConfig()
	for _, id := range routerIDs {
		cfg.Targets = append(cfg.Targets, routerURL(id))
	}
	cfg.Rate = float64(rate)
	cfg.APIKey = os.Getenv("E2E_API_KEY")
	if mutate != nil {
		mutate(&cfg)
	}
	// The driver's default client, with the variant's TLS configuration.
	d, err := NewDriver(cfg, &http.Client{Transport: &http.Transport{
		MaxIdleConnsPerHost: 64, DisableCompression: true, TLSClientConfig: clientTLS(s.t)}})
	require.NoError(s.t, err)
	rsrc, wsrc := map[string]string{}, map[string]string{}
	for _, id := range routerIDs {
		rsrc[id] = routerAdminURL(id) + "/metrics"
	}
	for _, id := range workerIDs {
		wsrc[id] = workerURL(id) + "/metrics"
	}
	l := &load{s: s, driver: d,
		routers: NewCounterWatch(s.client, rsrc, []string{MetricReceived, MetricAdmitted, MetricRetried, MetricFirstByteTimeouts}, 250*time.Millisecond),
		workers: NewCounterWatch(s.client, wsrc, []string{MetricWorkerRequests}, 250*time.Millisecond),
		pairs: NewCounterWatch(s.client, rsrc, []string{MetricDisaggDecisions}, 250*time.Millisecond).
			Where(map[string]string{"mode": "disaggregated"}),
		unread: NewCounterWatch(s.client, wsrc, []string{MetricWorkerRequests}, 250*time.Millisecond).
			Where(map[string]string{"outcome": OutcomeWorkerUnread}),
		base: map[string]float64{}}
	// The baseline waits for the counters to settle too: a request sent
	// just before (a scenario's probe) is counted received at its entry
	// replica and admitted at its class's owner, each exported on its own
	// replica's refresh, and half of it in the baseline would count the
	// other half against this load.
	l.settle("counters to settle before the load starts")
	for _, n := range []string{MetricReceived, MetricAdmitted, MetricRetried, MetricFirstByteTimeouts} {
		l.base[n] = l.routers.Total(n)
	}
	l.base[MetricWorkerRequests] = l.workers.Total(MetricWorkerRequests)
	l.base[MetricDisaggDecisions] = l.pairs.Total(MetricDisaggDecisions)
	l.base[baseUnread] = l.unread.Total(MetricWorkerRequests)
	dctx, stopDriver := context.WithCancel(s.ctx)
	wctx, stopWatches := context.WithCancel(s.ctx)
	l.stopDriver, l.stopWatches = stopDriver, stopWatches
	l.driverDone.Add(1)
	go func() { defer l.driverDone.Done(); _ = d.Run(dctx) }()
	for _, w := range []*CounterWatch{l.routers, l.workers, l.pairs, l.unread} {
		l.watchesDone.Add(1)
		go func() { defer l.watchesDone.Done(); _ = w.Run(wctx) }()
	}
	s.t.Cleanup(l.stop)
	return l
}

// stop ends the load, waits for every request's outcome, then lets the
// counters settle (workers count a request when its stream has ended, a hair
// after the client saw [DONE]) before the watches take their last scrape.
func (l *load) stop() {
	if l.stopped {
		return
	}
	l.stopped = true
	l.stopDriver()
	l.driverDone.Wait()
	l.driver.Close()
	l.stopWatches()
	l.watchesDone.Wait()
	l.settle("counters to stop changing after the load ended")
}

// settle polls the routers' and workers' counters until they have been
// unchanged for a quiet period: a request whose count was still on its way
// would have arrived within it.
func (l *load) settle(what string) {
	const quiet = 750 * time.Millisecond
	var prev map[string]float64
	var changed time.Time
	testenv.Eventually(l.s.t, 10*time.Second, func() bool {
		l.routers.Poll(l.s.ctx)
		l.workers.Poll(l.s.ctx)
		l.pairs.Poll(l.s.ctx)
		l.unread.Poll(l.s.ctx)
		cur := map[string]float64{MetricDisaggDecisions: l.pairs.Total(MetricDisaggDecisions), baseUnread: l.unread.Total(MetricWorkerRequests),
			MetricReceived: l.routers.Total(MetricReceived), MetricAdmitted: l.routers.Total(MetricAdmitted),
			MetricRetried: l.routers.Total(MetricRetried), MetricFirstByteTimeouts: l.routers.Total(MetricFirstByteTimeouts),
			MetricWorkerRequests: l.workers.Total(MetricWorkerRequests)}
		if !maps.Equal(prev, cur) {
			prev, changed = cur, time.Now()
			return false
		}
		return time.Since(changed) > quiet
	}, what)
}

// baseUnread is l.base's key for the unread watch's baseline (its metric is
// the workers' requests, filtered).
const baseUnread = "unread"

func (l *load) delta(w *CounterWatch, name string) int {
	return int(w.Total(name) - l.base[name])
}

// pause lets the load run for d, or less when the context ends.
func (s *suite) pause(d time.Duration) {
	select {
	case <-s.ctx.Done():
	case <-time.After(d):
	}
}

// verdict checks the invariants every scenario shares and fills the report:
//   - every request sent has exactly one record with a terminal outcome, none
//     malformed, none timed out, and every failure is one allowed says may
//     fail;
//   - no request was served twice: the workers' request count grew by at
//     most one per admitted request (exactly one when no worker died);
//   - the routers' admitted counter (reset-aware, summed over replicas)
//     never exceeds the admitted requests plus the counted retries, and
//     covers every admitted request when exactRouters is set (no router
//     died with unscraped counts);
//   - the routers' received total equals the requests that entered
//     admission when exactRouters is set (at most that otherwise);
//   - no router's counters went backwards within one process lifetime.
func (l *load) verdict(r *scenarioReport, allowed func(Result) bool, exactRouters, exactWorkers bool) {
	t := l.s.t
	t.Helper()
	res := l.driver.Results()
	r.Sent = l.driver.Sent()
	r.Outcomes = Tally(res)
	admitted, succeeded := 0, 0
	seen := map[int]bool{}
	for _, x := range res {
		if !assert.Falsef(t, seen[x.Seq], "request %d recorded twice", x.Seq) {
			r.Failed = true
		}
		seen[x.Seq] = true
		if x.Admitted() {
			admitted++
		}
		if x.Outcome == OutcomeSuccess {
			succeeded++
			continue
		}
		if !allowed(x) {
			r.Failed = true
			t.Errorf("request %d via %s (worker %q, request id %s) ended %s (status %d, code %q): %s",
				x.Seq, x.Target, x.Worker, x.RequestID, x.Outcome, x.Status, x.Code, x.Err)
		}
	}
	if !assert.Equal(t, r.Sent, len(res), "every request sent must end in exactly one outcome") {
		r.Failed = true
	}
	recv := l.delta(l.routers, MetricReceived)
	adm := l.delta(l.routers, MetricAdmitted)
	ret := l.delta(l.routers, MetricRetried)
	wrk := l.delta(l.workers, MetricWorkerRequests)
	pairs := l.delta(l.pairs, MetricDisaggDecisions)
	unread := int(l.unread.Total(MetricWorkerRequests) - l.base[baseUnread])
	wrk -= unread // received, but no whole body: nothing was served
	// An attempt a router abandoned after the first-byte timeout (a worker
	// slower than it, not hung: a queue during a restart) is re-admitted
	// elsewhere, and the first worker may still serve it: the router
	// cannot take back a request it sent (docs/architecture.md, hung
	// engines). Such attempts are counted, and only they may be served
	// twice.
	slow := l.delta(l.routers, MetricFirstByteTimeouts)
	r.Counts = fmt.Sprintf("driver admitted=%d succeeded=%d; routers received=%d admitted=%d retried=%d; workers served=%d",
		admitted, succeeded, recv, adm, ret, wrk)
	if slow > 0 {
		r.Counts += fmt.Sprintf(" (first-byte timeouts=%d)", slow)
	}
	if unread > 0 {
		r.Counts += fmt.Sprintf(" (and %d whose body never arrived)", unread)
	}
	if pairs > 0 {
		r.Counts += fmt.Sprintf(" (disaggregated=%d: two legs each)", pairs)
	}
	fail := func(ok bool) {
		if !ok {
			r.Failed = true
		}
	}
	if exactWorkers {
		fail(assert.GreaterOrEqual(t, wrk, admitted+pairs, "workers must serve each admitted request (a disaggregated one once per leg)"))
		fail(assert.LessOrEqual(t, wrk, admitted+pairs+slow,
			"workers must serve each admitted request exactly once (a disaggregated one once per leg), save an attempt abandoned after the first-byte timeout"))
	} else {
		fail(assert.LessOrEqual(t, wrk, admitted+ret+pairs, "workers must not serve a request twice beyond counted retries (and a disaggregated request's second leg)"))
	}
	// A request admitted, then re-admitted because its worker failed before
	// the first byte, counts twice as admitted and once as retried; a
	// request resubmitted before any grant (owner moved or unreachable)
	// counts once as admitted, by the owner that granted it.
	reached := 0 // requests that entered admission: each must be received once
	for _, x := range res {
		if x.Admitted() || admissionRejections[x.Code] {
			reached++
		}
	}
	if exactRouters {
		fail(assert.GreaterOrEqual(t, adm, admitted, "routers' admitted total must cover every request admitted"))
		fail(assert.Equal(t, reached, recv, "routers' received total must count every request that reached a router exactly once"))
	} else {
		fail(assert.LessOrEqual(t, recv, reached, "routers must not receive a request twice"))
	}
	fail(assert.LessOrEqual(t, adm, admitted+ret, "routers must not admit a request twice beyond counted retries"))
	for _, n := range []string{MetricReceived, MetricAdmitted} {
		reg, dec, restarts, errs := l.routers.Health(n)
		fail(assert.Zerof(t, reg, "%s went backwards within one router lifetime", n))
		fail(assert.Zerof(t, dec, "aggregated %s went backwards", n))
		if n == MetricAdmitted {
			r.Notes = append(r.Notes, fmt.Sprintf("router restarts seen %d, failed scrapes %d", restarts, errs))
		}
	}
	if t.Failed() {
		r.Failed = true
	}
}

func newReport(t *testing.T, name string) *scenarioReport {
	r := &scenarioReport{Name: name, Failover: "-"}
	addReport(r)
	t.Cleanup(func() {
		if t.Failed() {
			r.Failed = true
		}
		if r.Outcomes == nil {
			r.Notes = append(r.Notes, "aborted before its verdict: see the test output")
		}
	})
	return r
}

func onlyVia(target string) func(Result) bool {
	return func(x Result) bool {
		return x.Target == target && (x.Outcome == OutcomeTransport || x.Outcome == OutcomeTruncated || x.Outcome == OutcomeTimeout)
	}
}

func none(Result) bool { return false }

// admissionRejections are the error codes of requests that entered admission
// and were rejected there (docs/api.md); other errors (400s, 503 not_ready)
// are answered before admission and are not counted as received.
var admissionRejections = map[string]bool{
	"queue_full": true, "deadline_exceeded": true, "no_endpoints": true, "ownership_moved": true,
	"admission_cancelled": true, "upstream_failed": true,
}

func TestKillingTheBusiestClassOwnerMovesItsClassesAndFailsOnlyItsOwnStreams(t *testing.T) {
	s := newSuite(t)
	r := newReport(t, "1 kill -9 owner of busiest class")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	views := s.views(routerIDs)
	require.NotEmpty(t, views)
	victim := views[0].OwnerOf("interactive")
	require.NotEmpty(t, victim, "interactive must have an owner before the kill")
	live := slices.DeleteFunc(slices.Clone(routerIDs), func(id string) bool { return id == victim })
	r.Notes = append(r.Notes, fmt.Sprintf("killed %s, owners before: %s", victim, OwnerSummary(views[0])))

	// A load balancer would take the dead router out; the streams already
	// on it are the ones allowed to fail.
	l.driver.SetEnabled(routerURL(victim), false)
	s.heal(victim, false)
	require.NoError(t, s.compose.Kill(s.ctx, victim))
	took := s.waitSettled(live, settleBound)
	r.Failover = took.Round(100 * time.Millisecond).String()
	after := s.views(live)
	r.Notes = append(r.Notes, "owners after: "+OwnerSummary(after[0]))

	s.pause(time.Duration(loadSeconds/3) * time.Second)
	require.NoError(t, s.compose.Start(s.ctx, victim))
	s.waitHealthy(victim)
	s.waitSettled(routerIDs, settleBound)
	l.driver.SetEnabled(routerURL(victim), true)
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	// The killed router's counters since its last scrape died with it.
	l.verdict(r, onlyVia(routerURL(victim)), false, true)
}

func TestARouterCutOffFromTheNetworkLosesItsClassesAndGetsThemBackWhenReconnected(t *testing.T) {
	s := newSuite(t)
	r := newReport(t, "2 disconnect/reconnect router")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	views := s.views(routerIDs)
	require.NotEmpty(t, views)
	victim := views[0].OwnerOf("interactive")
	require.NotEmpty(t, victim)
	live := slices.DeleteFunc(slices.Clone(routerIDs), func(id string) bool { return id == victim })
	r.Notes = append(r.Notes, fmt.Sprintf("cut off %s, owners before: %s", victim, OwnerSummary(views[0])))

	l.driver.SetEnabled(routerURL(victim), false)
	s.heal(victim, true)
	before, err := s.compose.State(s.ctx, victim)
	require.NoError(t, err)
	require.NoError(t, s.compose.Disconnect(s.ctx, victim))
	took := s.waitSettled(live, settleBound)
	r.Failover = took.Round(100 * time.Millisecond).String()

	s.pause(time.Duration(loadSeconds/3) * time.Second)
	require.NoError(t, s.compose.Connect(s.ctx, victim))
	rejoin := s.waitSettled(routerIDs, settleBound)
	r.Notes = append(r.Notes, fmt.Sprintf("rejoined and settled %v after reconnecting", rejoin.Round(100*time.Millisecond)))
	// Its session expired while it was cut off: it takes a new lease
	// instead of exiting (and being restarted by Docker).
	after, err := s.compose.State(s.ctx, victim)
	require.NoError(t, err)
	if !assert.Equal(t, before, after, "%s must not exit or restart when it comes back", victim) {
		r.Failed = true
	}
	l.driver.SetEnabled(routerURL(victim), true)
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	// What the cut-off router counted in its last moments before the cut
	// was scraped only once it was back (it does not exit: it takes a new
	// lease), so its totals are bounded, not exact.
	l.verdict(r, onlyVia(routerURL(victim)), false, true)
}

func TestRestartingNATSServesEveryRequest(t *testing.T) {
	restartServesEveryRequest(t, "3 restart NATS", "nats", 10)
}

func TestRestartingEtcdServesEveryRequest(t *testing.T) {
	// SIGTERM, then SIGKILL after 2 s: a graceful etcd stop waits up to ~7 s
	// for its clients' streams, longer than the routers' 5 s session TTL, and
	// this scenario is about a restart the sessions can ride out.
	restartServesEveryRequest(t, "4 restart etcd", "etcd", 2, "etcd restarted with a 2 s stop timeout")
}

// restartServesEveryRequest restarts service (SIGKILL after stopTimeout
// seconds) under load and requires every request to succeed with exact
// counts; the failover time is until every router has settled again.
func restartServesEveryRequest(t *testing.T, name, service string, stopTimeout int, notes ...string) {
	s := newSuite(t)
	r := newReport(t, name)
	r.Notes = append(r.Notes, notes...)
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	start := time.Now()
	require.NoError(t, s.compose.Restart(s.ctx, service, stopTimeout))
	s.waitHealthy(service)
	s.waitSettled(routerIDs, settleBound)
	r.Failover = time.Since(start).Round(100 * time.Millisecond).String()
	s.pause(time.Duration(2*loadSeconds/3) * time.Second)
	l.stop()
	l.verdict(r, none, true, true)
}

func TestKillingAWorkerMidStreamFailsOnlyTheStreamsOnIt(t *testing.T) {
	s := newSuite(t)
	r := newReport(t, "5 kill worker mid-stream")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	var victim string
	testenv.Eventually(t, 10*time.Second, func() bool {
		w, n := l.driver.BusiestWorker()
		victim = w
		return n > 0
	}, "a worker with streams in flight")
	r.Notes = append(r.Notes, "killed "+victim)
	s.heal(victim, false)
	require.NoError(t, s.compose.Kill(s.ctx, victim))
	start := time.Now()
	// Settled with seven workers: the dead one's registration expired.
	testenv.Eventually(t, settleBound, func() bool {
		ok, _ := Settled(s.views(routerIDs), routerIDs, classes, len(workerIDs)-1)
		return ok
	}, "routers dropping the killed worker")
	r.Failover = time.Since(start).Round(100 * time.Millisecond).String()
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	require.NoError(t, s.compose.Start(s.ctx, victim))
	s.waitHealthy(victim)
	s.waitSettled(routerIDs, settleBound)
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	onVictim := func(x Result) bool {
		return x.Worker == victim && (x.Outcome == OutcomeStreamError || x.Outcome == OutcomeTruncated)
	}
	// The killed worker's own counter since its last scrape died with it,
	// so the workers' total is only bounded; the routers' is exact.
	l.verdict(r, onVictim, true, false)
}

// Load flows to every router throughout, the one being restarted included
// (as real clients and a Kubernetes Service while endpoints propagate do):
// each router is a lame duck on SIGTERM, so nothing it took in is lost, the
// requests it refused before admission (connection refused, 503 not_ready)
// are sent to the next router as a client would, and it exits 0 well inside
// its stop grace period.
func TestRollingRestartOfAllRoutersUnderLoadLosesNoRequestAndEachExitsZeroInItsGrace(t *testing.T) {
	s := newSuite(t)
	r := newReport(t, "6 rolling restart of routers, load on all")
	l := s.startLoadWith(func(cfg *DriverConfig) { cfg.Redirects = 5 })
	s.pause(time.Duration(loadSeconds/4) * time.Second)
	start := time.Now()
	for _, id := range routerIDs {
		s.heal(id, false)
		// Scrape the stopping router as often as it answers: it exports
		// its final counters before it stops listening.
		stopCtx, stopPolling := context.WithCancel(s.ctx)
		var polled sync.WaitGroup
		polled.Add(1)
		go func() {
			defer polled.Done()
			for stopCtx.Err() == nil {
				l.routers.PollSource(stopCtx, id)
				select { // pace the polls; a refused scrape returns at once
				case <-stopCtx.Done():
				case <-time.After(10 * time.Millisecond):
				}
			}
		}()
		inflight := l.driver.InFlight(routerURL(id))
		stopAt := time.Now()
		err := s.compose.Stop(s.ctx, id, routerGrace)
		took := time.Since(stopAt)
		stopPolling()
		polled.Wait()
		require.NoError(t, err)
		st, err := s.compose.State(s.ctx, id)
		require.NoError(t, err)
		r.Notes = append(r.Notes, fmt.Sprintf("%s: %d in flight at SIGTERM, exit %d after %v", id, inflight, st.ExitCode, took.Round(100*time.Millisecond)))
		if !assert.Equal(t, 0, st.ExitCode, "%s must exit 0 on SIGTERM, not be killed at the end of its grace", id) {
			r.Failed = true
		}
		if !assert.Less(t, took, time.Duration(routerGrace)*time.Second, "%s must stop inside its grace period", id) {
			r.Failed = true
		}
		require.NoError(t, s.compose.Start(s.ctx, id))
		s.waitHealthy(id)
		s.waitSettled(routerIDs, settleBound)
		s.pause(2 * time.Second)
	}
	r.Failover = "all three in " + time.Since(start).Round(100*time.Millisecond).String()
	s.pause(time.Duration(loadSeconds/4) * time.Second)
	l.stop()
	redirected := 0
	for _, x := range l.driver.Results() {
		if x.Redirected > 0 {
			redirected++
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("%d requests refused before admission and sent to the next router", redirected))
	l.verdict(r, none, true, true)
}

// etcd stopped for three session TTLs under load: serving needs no etcd.
// No router exits or restarts; a request that finds no owner (every owner
// fenced itself) is admitted by its entry router after a short bound, so no
// request waits more than a few seconds for admission; every request ends in
// success or a typed error; when etcd is back the routers leave the degraded
// mode by themselves and admit through the class owners again.
func TestEtcdStoppedForThreeSessionTTLsTakesNoRouterDownAndAdmissionRecoversByItself(t *testing.T) {
	s := newSuite(t)
	r := newReport(t, "7 etcd stopped for 3 session TTLs")
	before := map[string]ContainerState{}
	for _, id := range routerIDs {
		st, err := s.compose.State(s.ctx, id)
		require.NoError(t, err)
		before[id] = st
	}
	l := s.startLoad()
	degradedSrc := map[string]string{}
	for _, id := range routerIDs {
		degradedSrc[id] = routerAdminURL(id) + "/metrics"
	}
	degraded := NewCounterWatch(s.client, degradedSrc, []string{MetricDegradedAdmissions}, time.Second)
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	s.heal("etcd", false)
	stopAt := time.Now()
	require.NoError(t, s.compose.Stop(s.ctx, "etcd", 2))
	s.pause(3 * sessionTTL)
	require.NoError(t, s.compose.Start(s.ctx, "etcd"))
	outageEnd := time.Now()
	s.waitHealthy("etcd")
	took := s.waitSettled(routerIDs, settleBound)
	r.Failover = fmt.Sprintf("etcd down %v, settled %v after", outageEnd.Sub(stopAt).Round(100*time.Millisecond), took.Round(100*time.Millisecond))
	testenv.Eventually(t, settleBound, func() bool {
		views := s.views(routerIDs)
		if len(views) != len(routerIDs) {
			return false
		}
		for _, v := range views {
			if v.Degraded {
				return false
			}
		}
		return true
	}, "every router leaves the degraded mode by itself")
	degraded.Poll(s.ctx)
	atRecovery := degraded.Total(MetricDegradedAdmissions)
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	degraded.Poll(s.ctx)
	r.Notes = append(r.Notes, fmt.Sprintf("%.0f requests admitted in degraded mode during the outage", atRecovery))
	if !assert.Equal(t, atRecovery, degraded.Total(MetricDegradedAdmissions), "after recovery admission is normal: nothing more admitted in degraded mode") {
		r.Failed = true
	}

	for _, id := range routerIDs {
		st, err := s.compose.State(s.ctx, id)
		require.NoError(t, err)
		if !assert.Equal(t, before[id], st, "%s must not exit or restart", id) {
			r.Failed = true
		}
	}
	var slowest time.Duration
	for _, x := range l.driver.Results() {
		if x.Header.IsZero() || x.Start.Before(stopAt) || x.Start.After(outageEnd) {
			continue
		}
		slowest = max(slowest, x.Header.Sub(x.Start))
	}
	r.Notes = append(r.Notes, fmt.Sprintf("slowest answer to a request sent during the outage: %v", slowest.Round(10*time.Millisecond)))
	if !assert.LessOrEqual(t, slowest, 5*time.Second, "no request waits more than a few seconds for admission") {
		r.Failed = true
	}
	typed := func(x Result) bool { return x.Outcome == OutcomeRejected && x.Code != "" }
	l.verdict(r, typed, true, true)
}
