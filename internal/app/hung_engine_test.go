package app

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// frozenEngine stands in front of a simulated worker's HTTP server as its
// engine would behind an adapter: while frozen (a SIGSTOPped engine) it
// accepts connections and reads requests but answers nothing, and the
// requests it holds wait until their client gives up; thawed, it passes
// everything through. The worker's registration, KV events and load
// reports go on as before: only the engine hangs.
type frozenEngine struct {
	frozen atomic.Bool
	held   atomic.Int32 // requests that met the freeze
	proxy  *httputil.ReverseProxy
	closed chan struct{} // closed when the test ends: releases what is held
}

func (f *frozenEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if f.frozen.Load() {
		f.held.Add(1)
		// Read the request as a stopped engine's kernel would buffer it;
		// net/http notices the client leaving only once the body is read.
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-f.closed:
		}
		return
	}
	f.proxy.ServeHTTP(w, r)
}

// startFrozenWorker runs a simulated worker registered under id whose
// advertised URL is a frozenEngine in front of it.
func startFrozenWorker(t *testing.T, c *testCluster, id string) *frozenEngine {
	t.Helper()
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	target, err := url.Parse("http://" + listen)
	require.NoError(t, err)
	tr := &http.Transport{}
	f := &frozenEngine{proxy: httputil.NewSingleHostReverseProxy(target), closed: make(chan struct{})}
	f.proxy.Transport = tr
	front := &http.Server{Handler: f, ReadHeaderTimeout: 5 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = front.Serve(ln)
	}()
	t.Cleanup(func() {
		close(f.closed)
		_ = front.Shutdown(context.Background())
		<-served
		tr.CloseIdleConnections()
	})
	cfg := testWorkerConfig()
	cfg.ID = id
	cfg.Listen = listen
	cfg.AdvertiseURL = "http://" + ln.Addr().String()
	cfg.EtcdEndpoints = c.etcd.Endpoints
	cfg.NATSURL = c.nats.URL
	c.workers = append(c.workers, startWorker(t, cfg))
	return f
}

// schedulable lists the workers a replica's admission actor selects from.
func schedulable(t *testing.T, r *runningReplica) []string {
	t.Helper()
	var ids []string
	err := r.status.actor.Do(context.Background(), func(c *scheduler.Core) {
		for _, w := range c.Workers() {
			ids = append(ids, w.ID)
		}
	})
	require.NoError(t, err)
	return ids
}

// hungEngine is a worker's engine the test can make hang: freeze stops it
// answering; held counts the requests it got while frozen (-1: unknown).
type hungEngine struct {
	freeze func()
	held   func() int
}

// startStoppedChildWorker runs a simulated worker registered under id whose
// advertised URL is a reverse proxy in a child process (the test binary
// re-executed, runEngineChildIfAsked): freezing it sends the child SIGSTOP,
// as an operator's `kill -STOP` of an engine would. The kernel still
// accepts and buffers the routers' connections; nothing answers.
func startStoppedChildWorker(t *testing.T, c *testCluster, id string) hungEngine {
	t.Helper()
	listen := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), engineChildEnv+"=http://"+listen)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	stopped := atomic.Bool{}
	t.Cleanup(func() {
		if stopped.Load() {
			_ = cmd.Process.Signal(syscall.SIGCONT)
		}
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the engine child did not start")
	cfg := testWorkerConfig()
	cfg.ID = id
	cfg.Listen = listen
	cfg.AdvertiseURL = "http://" + strings.TrimSpace(addr)
	cfg.EtcdEndpoints = c.etcd.Endpoints
	cfg.NATSURL = c.nats.URL
	c.workers = append(c.workers, startWorker(t, cfg))
	return hungEngine{
		freeze: func() {
			stopped.Store(true)
			require.NoError(t, cmd.Process.Signal(syscall.SIGSTOP))
			// The load starts once the kernel has stopped the child (state
			// T in /proc/<pid>/stat), not merely once the signal was sent.
			stat := fmt.Sprintf("/proc/%d/stat", cmd.Process.Pid)
			if _, err := os.Stat(stat); err == nil {
				testenv.Eventually(t, 5*time.Second, func() bool {
					b, err := os.ReadFile(stat)
					if err != nil {
						return false
					}
					// pid (comm) state ...: the state follows the last ')'.
					i := bytes.LastIndexByte(b, ')')
					return i >= 0 && i+2 < len(b) && b[i+2] == 'T'
				}, "the engine child is stopped")
			}
		},
		held: func() int { return -1 },
	}
}

// engineChildEnv names the engine child's target (the worker's base URL).
const engineChildEnv = "SWITCHYARD_APP_ENGINE_CHILD"

// runEngineChildIfAsked makes the test binary startStoppedChildWorker's
// engine: in the child it serves a reverse proxy to the worker on a
// loopback port, prints the address and runs until its stdin closes (so it
// never outlives the parent), then exits without running any test;
// otherwise it returns at once. TestMain calls it first.
func runEngineChildIfAsked() {
	target := os.Getenv(engineChildEnv)
	if target == "" {
		return
	}
	u, err := url.Parse(target)
	if err != nil {
		fmt.Fprintln(os.Stderr, "engine child:", err)
		os.Exit(1)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "engine child:", err)
		os.Exit(1)
	}
	fmt.Println(ln.Addr().String())
	srv := &http.Server{Handler: httputil.NewSingleHostReverseProxy(u), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	_, _ = io.Copy(io.Discard, os.Stdin)
	os.Exit(0)
}

// TestAHungEngineCostsAFirstByteTimeoutAndEveryReplicaStopsSelectingIt is
// the SIGSTOPped-engine case of docs/architecture.md's failure table: one
// of three workers stops answering under load over three routers; no
// request waits much longer than the first-byte cap, all succeed on the
// other workers, and once some replica reached the consecutive-timeout
// threshold no replica selects the hung worker. The engine hangs two ways:
// a front that holds every request (counting them), and a child process
// sent SIGSTOP. The load comes in rounds until a replica suspects the
// worker: the threshold counts one replica's timeouts, and a round can end
// with the hung worker tried once at each replica (the third case makes
// that every round's outcome).
func TestAHungEngineCostsAFirstByteTimeoutAndEveryReplicaStopsSelectingIt(t *testing.T) {
	t.Run("a front that answers nothing", func(t *testing.T) {
		c := newTestCluster(t, 2)
		f := startFrozenWorker(t, c, "w3")
		testHungEngine(t, c, hungEngine{freeze: func() { f.frozen.Store(true) }, held: func() int { return int(f.held.Load()) }}, 90)
	})
	t.Run("a SIGSTOPped process", func(t *testing.T) {
		c := newTestCluster(t, 2)
		testHungEngine(t, c, startStoppedChildWorker(t, c, "w3"), 90)
	})
	t.Run("one request per replica a round", func(t *testing.T) {
		// A request meets the hung engine at most once (its retry goes
		// elsewhere), so no replica can reach the threshold of two in one
		// such round.
		c := newTestCluster(t, 2)
		f := startFrozenWorker(t, c, "w3")
		testHungEngine(t, c, hungEngine{freeze: func() { f.frozen.Store(true) }, held: func() int { return int(f.held.Load()) }}, 3)
	})
}

// raisedSuspicion reports whether r itself marked worker suspect (its own
// record, not one it learnt by gossip).
func raisedSuspicion(r *runningReplica, worker string) bool {
	s := r.status.suspects
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.local[worker].SuspectSince != 0
}

// testHungEngine freezes c's worker w3 and sends rounds of perRound
// requests over three replicas until one of them suspects w3.
func testHungEngine(t *testing.T, c *testCluster, hung hungEngine, perRound int) {
	const firstByteCap = 2 * time.Second
	mutate := func(cfg *ReplicaConfig) {
		cfg.Frontend.FirstByteFloor, cfg.Frontend.FirstByteCap = 500*time.Millisecond, firstByteCap
		cfg.Frontend.SuspectAfter = 2
		cfg.Frontend.SuspectTTL = 5 * time.Minute // outlasts the test: expiry is tested in gossip
	}
	rs := []*runningReplica{c.startReplicaWith("r1", "127.0.0.1:0", mutate), c.startReplicaWith("r2", "127.0.0.1:0", mutate), c.startReplicaWith("r3", "127.0.0.1:0", mutate)}
	c.waitOwned(defaultClasses, "r1", "r2", "r3")
	for _, r := range rs {
		testenv.Eventually(t, 15*time.Second, func() bool { return len(schedulable(t, r)) == 3 }, "%s schedules the three workers", r.status.ID)
	}

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	t.Cleanup(client.CloseIdleConnections)
	hung.freeze()
	// A request that waited on the hung engine for its whole hang fails
	// here: the client gives up well before the freeze would end (never).
	limit := firstByteCap + 8*time.Second
	type outcome struct {
		worker string
		took   time.Duration
		err    error
	}
	// run sends n requests; every prompt is new (sent counts them), so no
	// session or cached prefix ties a request to a worker.
	sent := 0
	run := func(n int) []outcome {
		base := sent
		sent += n
		out := make([]outcome, n)
		var wg sync.WaitGroup
		sem := make(chan struct{}, 12) // 12 in flight over the three routers
		for i := range n {
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer wg.Done()
				defer func() { <-sem }()
				r := rs[i%len(rs)]
				ctx, cancel := context.WithTimeout(context.Background(), limit)
				defer cancel()
				body := fmt.Sprintf(`{"model":%q,"prompt":"hung engine %d","max_tokens":4,"stream":true}`, testModel, base+i)
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.status.HTTPAddr+"/v1/completions", strings.NewReader(body))
				req.Header.Set("Content-Type", "application/json")
				start := time.Now()
				resp, err := client.Do(req)
				if err != nil {
					out[i] = outcome{err: err, took: time.Since(start)}
					return
				}
				defer resp.Body.Close()
				b, err := io.ReadAll(resp.Body)
				out[i] = outcome{worker: resp.Header.Get(frontend.HeaderRoutedWorker), took: time.Since(start), err: err}
				if err == nil && (resp.StatusCode != http.StatusOK || !strings.Contains(string(b), "[DONE]")) {
					out[i].err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
				}
			}()
		}
		wg.Wait()
		return out
	}
	check := func(phase string, out []outcome) time.Duration {
		var slowest time.Duration
		for i, o := range out {
			require.NoError(t, o.err, "%s: request %d (after %v)", phase, i, o.took)
			assert.NotEqual(t, "w3", o.worker, "%s: request %d was answered by the hung worker", phase, i)
			slowest = max(slowest, o.took)
		}
		return slowest
	}

	timeouts := func() float64 {
		n := 0.0
		for _, r := range rs {
			n += counterSum(t, r.reg, "switchyard_router_first_byte_timeouts_total")
		}
		return n
	}
	// SuspectAfter is two consecutive timeouts at one replica. A round can
	// end without one: each request meets the hung engine at most once, and
	// the other two workers absorb a round quickly, so the hung one may be
	// tried once at each replica (seen: one timeout at each of two
	// replicas, all 90 answered within 521 ms, no suspicion). Another round
	// then follows, as more traffic would in production. With one request
	// per replica a round most rounds miss w3 altogether (one run with
	// -cpu 1 took 148 rounds, 7 s): the rounds are bounded by wall time,
	// the time real requests take, not by their number.
	const loadFor = time.Minute
	loadUntil := time.Now().Add(loadFor)
	var slowest time.Duration
	raisedBy := func() []string {
		var ids []string
		for _, r := range rs {
			if raisedSuspicion(r, "w3") {
				ids = append(ids, r.status.ID)
			}
		}
		return ids
	}
	for round := 1; len(raisedBy()) == 0; round++ {
		require.True(t, time.Now().Before(loadUntil), "no replica marked the hung worker suspect after %v: %d rounds of %d requests, %v first-byte timeouts",
			loadFor, round-1, perRound, timeouts())
		was := timeouts()
		slowest = max(slowest, check(fmt.Sprintf("under the hang, round %d", round), run(perRound)))
		if timeouts() > was {
			t.Logf("round %d: %v first-byte timeouts so far; w3 suspected by %v", round, timeouts(), raisedBy())
		}
	}
	require.Positive(t, timeouts(), "some requests went to the hung engine before it was suspected, and timed out")
	if held := hung.held(); held >= 0 {
		// The counter has no worker label: a healthy worker slow to start
		// under load (the race detector on a busy machine) adds its own.
		assert.GreaterOrEqual(t, timeouts(), float64(held), "every request the hung engine held was a counted first-byte timeout")
	}
	t.Logf("hung engine: %v first-byte timeouts, slowest answer %v (first-byte cap %v)", timeouts(), slowest, firstByteCap)
	for _, r := range rs {
		t.Logf("%s after the hang: health view %s", r.status.ID, healthView(r))
	}

	// A replica that did not suspect the worker itself learns another's
	// suspicion by gossip: a broadcast within a few gossip rounds, or, when
	// a broadcast misses it, the next push-pull repair (gossip.Config's
	// PushPullInterval). The wait covers one push-pull interval and more;
	// it ends as soon as every replica skips the worker.
	settle := gossip.DefaultConfig().PushPullInterval + 10*time.Second
	for _, r := range rs {
		if !contains(schedulable(t, r), "w3") {
			continue
		}
		for _, o := range rs {
			t.Logf("%s still selects w3 after the hang; %s: own first-byte timeouts %v, suspicions raised %v, suspects in its view %v, gossip fetches %v, members %v, departing %v, dropped %v, decode errors %v",
				r.status.ID, o.status.ID, counterSum(t, o.reg, "switchyard_router_first_byte_timeouts_total"),
				counterSum(t, o.reg, "switchyard_router_worker_suspicions_total"),
				gaugeValue(t, o, "switchyard_router_workers_suspected"), counterSum(t, o.reg, "switchyard_gossip_fetches_total"),
				gaugeValue(t, o, "switchyard_gossip_members"), gaugeValue(t, o, "switchyard_gossip_departing_origins"),
				counterSum(t, o.reg, "switchyard_gossip_dropped_messages_total"), counterSum(t, o.reg, "switchyard_gossip_decode_errors_total"))
			t.Logf("%s: health view %s; schedules %v", o.status.ID, healthView(o), schedulable(t, o))
		}
		testenv.Eventually(t, settle, func() bool { return !contains(schedulable(t, r), "w3") },
			"%s stops selecting the hung worker (gossip fetches when the wait began: %v)", r.status.ID,
			counterSum(t, r.reg, "switchyard_gossip_fetches_total"))
	}
	before, heldBefore := timeouts(), hung.held()
	check("after the suspicion", run(45))
	if heldBefore >= 0 {
		assert.Equal(t, heldBefore, hung.held(), "no replica sent the hung worker anything once it was suspected")
	} else { // a stopped process counts nothing: its timeouts tell
		assert.Equal(t, before, timeouts(), "no replica sent the hung worker anything once it was suspected")
	}
}

// healthView describes a replica's joined health records: per worker, its
// newest suspicion and recovery (ms before now) and whether it is suspect.
func healthView(r *runningReplica) string {
	s := r.status.suspects
	now := s.now()
	view := *s.view.Load()
	ws := make([]string, 0, len(view))
	for w := range view {
		ws = append(ws, w)
	}
	slices.Sort(ws)
	var b strings.Builder
	for _, w := range ws {
		h := view[w]
		ago := func(ns int64) string {
			if ns == 0 {
				return "never"
			}
			return now.Sub(time.Unix(0, ns)).Round(time.Millisecond).String() + " ago"
		}
		fmt.Fprintf(&b, "[%s suspect %s, recovered %s, suspected %v] ", w, ago(h.SuspectSince), ago(h.RecoveredAt), h.Suspected(now, s.ttl))
	}
	return b.String()
}
