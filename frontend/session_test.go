package frontend

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// sessionFleet is a frontend over a real actor and three real upstream
// workers; w0 runs one request at a time.
type sessionFleet struct {
	actor *scheduler.Actor
	ups   []*upstream
	table *scheduler.SessionTable
	reg   *prometheus.Registry
	base  string
}

func newSessionFleet(t *testing.T, policyYAML string) *sessionFleet {
	t.Helper()
	pol, err := ParsePolicy([]byte(policyYAML))
	require.NoError(t, err)
	f := &sessionFleet{table: scheduler.NewSessionTable(100, time.Hour)}
	var sws []scheduler.Worker
	var entries staticWorkers
	for i := range 3 {
		up := newUpstream(t, 2)
		f.ups = append(f.ups, up)
		id := fmt.Sprintf("w%d", i)
		sws = append(sws, scheduler.Worker{ID: id, URL: up.URL(), BlockSize: 16, KVBlocks: 1024, MaxRunning: map[bool]int{true: 1}[i == 0]})
		entries = append(entries, WorkerEntry{ID: id, URL: up.URL(), Model: "m", BlockSize: 16})
	}
	actor := startActor(t, pol, sws)
	f.actor = actor
	s, reg := newTestServer(t, DefaultConfig(), Deps{Admitter: NewLocalAdmitter(actor), Workers: entries, Policy: pol, Sessions: f.table})
	f.reg, f.base = reg, startServer(t, s)
	return f
}

func (f *sessionFleet) turn(t *testing.T, body string, headers map[string]string) string {
	t.Helper()
	code, h, out := post(t, f.base+"/v1/completions", body, headers)
	require.Equal(t, 200, code, out)
	return h.Get(HeaderRoutedWorker)
}

func (f *sessionFleet) outcomes(outcome, source string) float64 {
	return testutil.ToFloat64(newSessionMetricsView(f.reg, metricSessionRequests, map[string]string{"outcome": outcome, "source": source}))
}

func (f *sessionFleet) moves(reason string) float64 {
	return testutil.ToFloat64(newSessionMetricsView(f.reg, metricSessionMoves, map[string]string{"reason": reason}))
}

// newSessionMetricsView reads one labelled counter from a registry.
func newSessionMetricsView(reg *prometheus.Registry, name string, labels map[string]string) prometheus.Collector {
	return gatheredCounter{reg: reg, name: name, labels: labels}
}

type gatheredCounter struct {
	reg    *prometheus.Registry
	name   string
	labels map[string]string
}

func (g gatheredCounter) Describe(chan<- *prometheus.Desc) {}

func (g gatheredCounter) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() != g.name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if v, ok := g.labels[lp.GetName()]; ok && v != lp.GetValue() {
					continue next
				}
			}
			ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.CounterValue, m.GetCounter().GetValue())
			return
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name, "", nil, nil), prometheus.CounterValue, 0)
}

const sessionPolicy = "classes: [{name: c}]\n"

func TestEveryTurnOfASessionRunsOnItsFirstTurnsWorker(t *testing.T) {
	f := newSessionFleet(t, sessionPolicy)
	for i := range 6 {
		key := map[string]string{"x-session-id": fmt.Sprintf("s%d", i)}
		first := f.turn(t, `{"model":"m","prompt":"turn one"}`, key)
		for turn := 2; turn <= 3; turn++ {
			require.Equalf(t, first, f.turn(t, fmt.Sprintf(`{"model":"m","prompt":"a different turn %d"}`, turn), key), "session %d turn %d", i, turn)
		}
	}
	require.Equal(t, 6.0, f.outcomes(sessionNew, sessionKeyHeader))
	require.Equal(t, 12.0, f.outcomes(sessionHit, sessionKeyHeader))
	require.Equal(t, 6, f.table.Len())
}

func TestPromptCacheKeyNamesASessionAndUserOnlyWhenThePolicySaysSo(t *testing.T) {
	f := newSessionFleet(t, sessionPolicy+"sessions: {classes: {c: {user: false}}, tenants: {}}\n")
	w := f.turn(t, `{"model":"m","prompt":"x","prompt_cache_key":"pck-1"}`, nil)
	require.Equal(t, w, f.turn(t, `{"model":"m","prompt":"y","prompt_cache_key":"pck-1"}`, nil))
	require.Equal(t, 1.0, f.outcomes(sessionHit, sessionKeyPCK))
	f.turn(t, `{"model":"m","prompt":"x","user":"alice"}`, nil)
	require.Equal(t, 1, f.table.Len(), "user is not a session key by default")

	g := newSessionFleet(t, sessionPolicy+"sessions: {user: true}\n")
	w = g.turn(t, `{"model":"m","prompt":"x","user":"alice"}`, nil)
	require.Equal(t, w, g.turn(t, `{"model":"m","prompt":"y","user":"alice"}`, nil))
	require.Equal(t, 1.0, g.outcomes(sessionHit, sessionKeyUser))
}

func TestConfiguredSessionHeadersAreReadInOrder(t *testing.T) {
	p := &parsedRequest{promptCacheKey: "pck", user: "u"}
	hs := []string{"x-session-id", "X-Dynamo-Session-ID", "x-session-token", "X-SMG-Routing-Key"}
	h := map[string][]string{"X-Smg-Routing-Key": {"smg"}, "X-Dynamo-Session-Id": {"dyn"}}
	key, src := sessionKey(hs, h, p, true)
	require.Equal(t, "dyn", key)
	require.Equal(t, sessionKeyHeader, src)
	key, src = sessionKey(hs, nil, p, true)
	require.Equal(t, []string{"pck", sessionKeyPCK}, []string{key, src})
	p.promptCacheKey = ""
	key, src = sessionKey(hs, nil, p, true)
	require.Equal(t, []string{"u", sessionKeyUser}, []string{key, src})
	key, _ = sessionKey(hs, nil, p, false)
	require.Empty(t, key)
	require.NotEqual(t, sessionID("t1", "m", "1"), sessionID("t2", "m", "1"), "tenants' sessions are apart")
	require.NotEqual(t, sessionID("", "ab", "c"), sessionID("", "a", "bc"))
}

func TestASessionWhoseWorkerLeftOrIsNotAllowedMovesAndSaysWhy(t *testing.T) {
	f := newSessionFleet(t, sessionPolicy)
	now := time.Now()
	gone := sessionID("", "m", "gone")
	f.table.Record(gone, "w9", now, now.Add(time.Hour))
	w := f.turn(t, `{"model":"m","prompt":"x"}`, map[string]string{"x-session-id": "gone"})
	require.NotEqual(t, "w9", w)
	require.Equal(t, 1.0, f.moves(moveWorkerGone))
	got, _ := f.table.Lookup(gone, time.Now())
	require.Equal(t, w, got, "the session now lives where it went")

	f.table.Record(sessionID("", "m", "fenced"), "w1", now, now.Add(time.Hour))
	w = f.turn(t, `{"model":"m","prompt":"x"}`, map[string]string{"x-session-id": "fenced", HeaderAllowedWorkers: "w0,w2"})
	require.NotEqual(t, "w1", w)
	require.Equal(t, 1.0, f.moves(moveNotEligible))
	require.Equal(t, 2.0, f.outcomes(sessionMoved, sessionKeyHeader))
}

func TestSoftAffinityLeavesASaturatedWorkerAndHardAffinityWaitsForIt(t *testing.T) {
	for _, mode := range []string{AffinitySoft, AffinityHard} {
		t.Run(mode, func(t *testing.T) {
			f := newSessionFleet(t, sessionPolicy+"sessions: {affinity: "+mode+"}\n")
			f.ups[0].gate = make(chan struct{})
			// Occupy w0, the only slot it has.
			busy := postInBackground(f.base+"/v1/completions", `{"model":"m","prompt":"occupy"}`, map[string]string{HeaderWorker: "w0"})
			testenv.Eventually(t, 5*time.Second, func() bool { return f.ups[0].requests.Load() == 1 }, "w0 is busy")
			now := time.Now()
			f.table.Record(sessionID("", "m", "s"), "w0", now, now.Add(time.Hour))
			if mode == AffinitySoft {
				require.NotEqual(t, "w0", f.turn(t, `{"model":"m","prompt":"next"}`, map[string]string{"x-session-id": "s"}))
				require.Equal(t, 1.0, f.moves(moveSaturated))
				close(f.ups[0].gate)
				require.Equal(t, 200, <-busy)
				return
			}
			done := make(chan string, 1)
			go func() {
				_, h, _ := post(t, f.base+"/v1/completions", `{"model":"m","prompt":"next"}`, map[string]string{"x-session-id": "s"})
				done <- h.Get(HeaderRoutedWorker)
			}()
			testenv.Eventually(t, 5*time.Second, func() bool {
				snap, err := f.actor.Flush(context.Background())
				require.NoError(t, err)
				return snap.Classes["c"].QueueDepth == 1
			}, "the hard session's turn queues for its busy worker")
			require.Empty(t, done, "a hard session does not leave its busy worker")
			close(f.ups[0].gate)
			require.Equal(t, 200, <-busy)
			require.Equal(t, "w0", <-done)
			require.Equal(t, 1.0, f.outcomes(sessionHit, sessionKeyHeader))
		})
	}
}

func TestSessionPolicyOverridesByClassThenTenantAndRejectsBadValues(t *testing.T) {
	p, err := ParsePolicy([]byte(`
classes: [{name: a}, {name: b}]
default_class: a
sessions:
  margin: 0.25
  margin_ms: 40
  classes: {b: {affinity: hard}}
  tenants: {acme: {affinity: "off"}, zed: {user: true}}
`))
	require.NoError(t, err)
	require.Equal(t, SessionPolicy{Affinity: AffinitySoft, MarginRatio: 0.25, MarginMs: 40}, p.Sessions("a", ""))
	require.Equal(t, AffinityHard, p.Sessions("b", "").Affinity)
	require.Equal(t, AffinityOff, p.Sessions("b", "acme").Affinity)
	require.Equal(t, SessionPolicy{Affinity: AffinityHard, User: true, MarginRatio: 0.25, MarginMs: 40}, p.Sessions("b", "zed"))
	require.Equal(t, DefaultSessionPolicy(), DefaultPolicy().Sessions("default", ""))

	for _, bad := range []string{
		"sessions: {affinity: sticky}",
		"sessions: {margin: -1}",
		"sessions: {classes: {nope: {affinity: hard}}}",
		"sessions: {tenants: {t: {margin_ms: .nan}}}",
		"sessions: {colour: blue}",
	} {
		_, err := ParsePolicy([]byte("classes: [{name: a}]\n" + bad))
		require.ErrorIsf(t, err, ErrBadPolicy, "%s", bad)
	}
}

func TestAmbiguousPromptCacheKeysAreRefused(t *testing.T) {
	for _, body := range []string{
		`{"model":"m","prompt":"x","prompt_cache_key":"a","prompt_cache_key":"b"}`,
		`{"model":"m","prompt":"x","prompt_cache_key":"a","Prompt_Cache_Key":"b"}`,
	} {
		_, e := parseRequest(endpointCompletions, []byte(body), nil)
		require.NotNilf(t, e, "%s", body)
		require.Equal(t, 400, e.Status)
	}
	p, e := parseRequest(endpointCompletions, []byte(`{"model":"m","prompt":"x","prompt_cache_key":"k\u00e9"}`), nil)
	require.Nil(t, e)
	require.Equal(t, "ké", p.promptCacheKey, "an escaped key decodes as encoding/json would")
	require.True(t, strings.HasPrefix(string(p.forward), `{"model"`), "the key is forwarded untouched")
}

func TestASessionForgetsItsWorkerAfterTheTTL(t *testing.T) {
	pol, err := ParsePolicy([]byte(sessionPolicy))
	require.NoError(t, err)
	up := newUpstream(t, 1)
	actor := startActor(t, pol, []scheduler.Worker{{ID: "w0", URL: up.URL(), BlockSize: 16, KVBlocks: 1024}})
	var mu sync.Mutex
	now := time.Now()
	cfg := DefaultConfig()
	cfg.SessionTTL = time.Minute
	s, reg := newTestServer(t, cfg, Deps{Admitter: NewLocalAdmitter(actor), Workers: staticWorkers{{ID: "w0", URL: up.URL(), Model: "m", BlockSize: 16}},
		Policy: pol, Now: func() time.Time { mu.Lock(); defer mu.Unlock(); return now }})
	f := &sessionFleet{reg: reg, base: startServer(t, s)}
	key := map[string]string{"x-session-id": "s"}
	f.turn(t, `{"model":"m","prompt":"x"}`, key)
	f.turn(t, `{"model":"m","prompt":"y"}`, key)
	require.Equal(t, 1.0, f.outcomes(sessionHit, sessionKeyHeader))
	mu.Lock()
	now = now.Add(61 * time.Second)
	mu.Unlock()
	f.turn(t, `{"model":"m","prompt":"z"}`, key)
	require.Equal(t, 2.0, f.outcomes(sessionNew, sessionKeyHeader), "a turn after the TTL starts the session afresh")
	require.Equal(t, 1.0, f.outcomes(sessionHit, sessionKeyHeader))
}
