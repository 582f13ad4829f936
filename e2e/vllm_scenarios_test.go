//go:build e2e

package e2e

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// The vLLM variant (deploy/docker-compose.vllm.yml, `E2E_VARIANT=vllm
// e2e/run.sh`): four engines speaking vLLM's protocol, each behind a
// `switchyard adapter`. Its scenarios are the TestVLLM* tests; run.sh runs
// only those against that project and skips them against the native one.
var (
	variant       = envOr("E2E_VARIANT", "native")
	vllmWorkerIDs = []string{"worker-1", "worker-2", "worker-3", "worker-4"}
	// adapterLeaseTTL is the adapters' etcd lease TTL (switchyard adapter
	// -lease-ttl, default 5 s): a killed adapter's worker must leave every
	// router's view within it, plus leaseSlack for the watch to deliver
	// and the suite's polls on a loaded 2-core machine.
	adapterLeaseTTL = 5 * time.Second
	leaseSlack      = 2 * time.Second
	// predictTTL is how long a router predicts a routed prefix on the
	// worker it chose without any KV event (the routers' PredictTTL, 5 s).
	predictTTL = 5 * time.Second
)

// Metric names the variant reads (docs/metrics.md, enginekv/metrics.go,
// adapter/metrics.go).
const (
	metricPredictedCached = "switchyard_router_predicted_cached_tokens_total"
	metricIndexBlocks     = "switchyard_index_blocks"
	metricIndexGaps       = "switchyard_index_event_gaps_total"
	metricMirrored        = "switchyard_adapter_kv_mirrored_blocks"
	metricMirrorExact     = "switchyard_adapter_kv_mirror_exact"
	metricReplays         = "switchyard_adapter_zmq_replays_total"
	metricSubResets       = "switchyard_adapter_zmq_resets_total"
	metricRepairs         = "switchyard_adapter_kv_repairs_total"
	metricFrames          = "switchyard_adapter_zmq_frames_total"
	metricEngineBatches   = "switchyard_engine_zmq_batches_total"
)

// The shared helpers (newSuite's settle check, startLoad's worker counters)
// read workerIDs; the variant has four workers, on the same loopback ports
// (19001-19004) as the native file's first four.
func init() {
	if variant == "vllm" {
		workerIDs = vllmWorkerIDs
	}
}

func newVLLMSuite(t *testing.T) *suite {
	t.Helper()
	if variant != "vllm" {
		t.Skip("a vLLM-variant scenario: it needs deploy/docker-compose.vllm.yml running (E2E_VARIANT=vllm e2e/run.sh)")
	}
	return newSuite(t)
}

// adapterOf is the compose service of the adapter beside worker id.
func adapterOf(worker string) string { return "adapter-" + strings.TrimPrefix(worker, "worker-") }

// adapterURL is the adapter's published port (19101-19104).
func adapterURL(worker string) string {
	return envOr("E2E_ADAPTER_"+strings.TrimPrefix(worker, "worker-")+"_URL",
		"http://127.0.0.1:1910"+strings.TrimPrefix(worker, "worker-"))
}

// value scrapes one metric family (summed over the label sets matching
// where) from a /metrics URL.
func (s *suite) value(url, name string, where map[string]string) float64 {
	s.t.Helper()
	smp, err := Scrape(s.ctx, s.client, url, []string{name}, where)
	require.NoError(s.t, err)
	return smp.Values[name]
}

// routersSeeing lists the routers whose /debug/cluster lists worker; a
// router that does not answer counts as seeing it (it has not been shown
// to have dropped it).
func (s *suite) routersSeeing(worker string) []string {
	var out []string
	for _, id := range routerIDs {
		ci, err := FetchClusterInfo(s.ctx, s.client, routerAdminURL(id))
		if err != nil {
			out = append(out, id)
			continue
		}
		for _, w := range ci.Workers {
			if w.ID == worker {
				out = append(out, id)
				break
			}
		}
	}
	return out
}

// indexMatchesMirrors waits until every router indexes exactly the blocks
// the adapters mirror: switchyard_index_blocks counts (block, worker)
// entries over all workers, and each adapter's mirrored gauge is its
// worker's distinct blocks, so with no load running the two agree once
// every event has been applied (and retired entries swept).
func (s *suite) indexMatchesMirrors(r *scenarioReport) {
	s.t.Helper()
	var mirrored float64
	var index []float64
	ok := false
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		mirrored = 0
		for _, w := range workerIDs {
			mirrored += s.value(adapterURL(w)+"/metrics", metricMirrored, nil)
		}
		index = index[:0]
		ok = mirrored > 0
		for _, id := range routerIDs {
			v := s.value(routerAdminURL(id)+"/metrics", metricIndexBlocks, nil)
			index = append(index, v)
			ok = ok && v == mirrored
		}
		if ok {
			break
		}
		s.pause(250 * time.Millisecond)
	}
	r.Notes = append(r.Notes, fmt.Sprintf("adapters mirror %v blocks, routers index %v", mirrored, index))
	if !assert.Truef(s.t, ok, "routers' index (%v blocks) must equal the adapters' mirrors (%v blocks)", index, mirrored) {
		r.Failed = true
	}
}

// probe is one non-streaming chat completion pinned to worker through
// router, with a prompt only probes use: the engine's cached tokens from
// its usage, and the tokens the router predicted cached (the delta of its
// predicted-cached counter; run probes only while no load is running).
type probe struct {
	worker    string
	cached    int
	predicted int
}

func (s *suite) probe(router, worker, prompt string) probe {
	s.t.Helper()
	url := routerURL(router)
	before := s.value(url+"/metrics", metricPredictedCached, nil)
	body, _ := json.Marshal(map[string]any{
		"model": DefaultDriverConfig().Model, "max_tokens": 4,
		"messages": []map[string]string{{"role": "user", "content": prompt}},
	})
	req, err := http.NewRequestWithContext(s.ctx, http.MethodPost, url+"/v1/chat/completions", bytes.NewReader(body))
	require.NoError(s.t, err)
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-switchyard-worker", worker)
	resp, err := s.client.Do(req)
	require.NoError(s.t, err)
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	require.Equalf(s.t, http.StatusOK, resp.StatusCode, "probe via %s: %s", router, raw)
	var doc struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	require.NoError(s.t, json.Unmarshal(raw, &doc))
	after := s.value(url+"/metrics", metricPredictedCached, nil)
	return probe{worker: resp.Header.Get("x-switchyard-routed-worker"), cached: doc.Usage.Details.Cached, predicted: int(after - before)}
}

func probePrompt(tag string) string {
	var b strings.Builder
	for i := range 12 {
		fmt.Fprintf(&b, "probe %s sentence %d, a prefix no load request shares. ", tag, i)
	}
	return b.String()
}

func TestVLLMKillingAnAdapterTakesItsWorkerOutOfEveryRoutersViewWithinTheLeaseTTLAndBack(t *testing.T) {
	s := newVLLMSuite(t)
	r := newReport(t, "V1 kill -9 adapter")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	victim := "worker-2"
	adapter := adapterOf(victim)
	r.Notes = append(r.Notes, "killed "+adapter+" (its engine "+victim+" kept running)")
	s.heal(adapter, false)
	require.NoError(t, s.compose.Kill(s.ctx, adapter))
	killed := time.Now()
	var seeing []string
	testenv.Eventually(t, settleBound, func() bool {
		seeing = s.routersSeeing(victim)
		return len(seeing) == 0
	}, "every router dropping %s after its adapter was killed", victim)
	left := time.Since(killed)
	gone := time.Now()
	r.Failover = "left " + left.Round(100*time.Millisecond).String()
	if !assert.LessOrEqualf(t, left, adapterLeaseTTL+leaseSlack, "%s must leave every router's view within the lease TTL", victim) {
		r.Failed = true
	}

	s.pause(time.Duration(loadSeconds/3) * time.Second)
	restarted := time.Now()
	require.NoError(t, s.compose.Start(s.ctx, adapter))
	s.waitHealthy(adapter)
	s.waitSettled(routerIDs, settleBound)
	back := time.Since(restarted)
	r.Failover += ", back " + back.Round(100*time.Millisecond).String() + " after the restart"
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()

	// Once every router dropped the worker, nothing more is routed to it
	// (a second for grants already decided) until its adapter is back.
	before, during, after := 0, 0, 0
	for _, x := range l.driver.Results() {
		if x.Worker != victim {
			continue
		}
		switch {
		case x.Start.Before(killed):
			before++
		case x.Start.After(gone.Add(time.Second)) && x.Start.Before(restarted):
			during++
			t.Errorf("request %d (sent %v after the worker left every view) was routed to %s", x.Seq, x.Start.Sub(gone), victim)
		case x.Start.After(restarted):
			after++
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("requests on %s: %d before the kill, %d while it was out, %d after its adapter was back", victim, before, during, after))
	// The engine never stopped, so every request is served, exactly once.
	l.verdict(r, none, true, true)
	s.indexMatchesMirrors(r)
}

func TestVLLMRestartingAnEngineResetsTheRoutersIndexForItAndRefillsItWithoutStaleHits(t *testing.T) {
	s := newVLLMSuite(t)
	r := newReport(t, "V2 restart engine")
	victim, via := "worker-3", "router-3"
	prompt := probePrompt(fmt.Sprintf("restart-%d", time.Now().UnixNano()))

	// Before the restart the probe's prefix is cached on the engine and the
	// router predicts it: the check below can see a hit when there is one.
	// The router also predicts a prefix on its own for predictTTL after
	// routing it, so the second probe waits that out: its prediction comes
	// from the index the adapter's events built, or from nothing.
	first := s.probe(via, victim, prompt)
	require.Equal(t, victim, first.worker)
	s.pause(predictTTL + time.Second)
	warm := s.probe(via, victim, prompt)
	if !assert.Positive(t, warm.cached, "the engine must have cached the probe's prefix") ||
		!assert.Equalf(t, warm.cached, warm.predicted, "the routers' index, built from %s's adapter events, must predict what the engine cached", victim) {
		r.Failed = true
	}

	gapsBefore := map[string]float64{}
	for _, id := range routerIDs {
		gapsBefore[id] = s.value(routerAdminURL(id)+"/metrics", metricIndexGaps, nil)
	}
	restartsBefore := s.value(adapterURL(victim)+"/metrics", metricSubResets, map[string]string{"reason": "restart"})

	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	s.heal(victim, false)
	start := time.Now()
	require.NoError(t, s.compose.Restart(s.ctx, victim, 10))
	s.waitHealthy(victim)
	// The adapter's subscriber reconnects, asks the new engine's replay
	// socket for the last batch it took, does not get it back, and starts
	// its mirror over under a new instance, whether or not any request has
	// reached the new engine yet.
	testenv.Eventually(t, settleBound, func() bool {
		return s.value(adapterURL(victim)+"/metrics", metricSubResets, map[string]string{"reason": "restart"}) > restartsBefore
	}, "the adapter of %s seeing the engine's sequence start again", victim)
	s.waitSettled(routerIDs, settleBound)
	r.Failover = time.Since(start).Round(100 * time.Millisecond).String()
	s.pause(time.Duration(2*loadSeconds/3) * time.Second)
	l.stop()
	onVictim := func(x Result) bool {
		return x.Worker == victim && (x.Outcome == OutcomeStreamError || x.Outcome == OutcomeTruncated)
	}
	// The restarted engine's own counter restarted with it, so the workers'
	// total is bounded; the routers' is exact.
	l.verdict(r, onVictim, true, false)

	var gaps []string
	for _, id := range routerIDs {
		gaps = append(gaps, fmt.Sprintf("%s +%v", id, s.value(routerAdminURL(id)+"/metrics", metricIndexGaps, nil)-gapsBefore[id]))
	}
	r.Notes = append(r.Notes, "index resets (event_gaps_total, all reasons) during the scenario: "+strings.Join(gaps, ", "))

	// The new engine holds nothing of the probe's prefix, and neither may
	// the routers: a predicted hit now would be a stale one.
	stale := s.probe(via, victim, prompt)
	r.Notes = append(r.Notes, fmt.Sprintf("probe before the restart: engine cached %d, router predicted %d; after: %d and %d",
		warm.cached, warm.predicted, stale.cached, stale.predicted))
	lostCache := assert.Zero(t, stale.cached, "the restarted engine must have lost its cache")
	noStale := assert.Zero(t, stale.predicted, "the routers must not predict blocks the restarted engine lost")
	if !lostCache || !noStale {
		r.Failed = true
	}
	// And the index refills from the new engine's events (past the
	// router's own prediction again).
	s.pause(predictTTL + time.Second)
	refill := s.probe(via, victim, prompt)
	r.Notes = append(r.Notes, fmt.Sprintf("probe %v after that: engine cached %d, router predicted %d",
		predictTTL+time.Second, refill.cached, refill.predicted))
	if !assert.Positive(t, refill.cached, "the restarted engine must have cached the probe's prefix again") ||
		!assert.Equal(t, refill.cached, refill.predicted, "the refilled index must predict what the engine cached") {
		r.Failed = true
	}
	s.indexMatchesMirrors(r)
}

// netns runs a command in the network namespace of service's container
// (nsenter -n, as root on the Docker host).
func (s *suite) netns(service string, args ...string) (string, error) {
	id, err := s.compose.Container(s.ctx, service)
	if err != nil {
		return "", err
	}
	pid, err := s.compose.docker(s.ctx, "inspect", "-f", "{{.State.Pid}}", id)
	if err != nil {
		return "", err
	}
	out, err := exec.CommandContext(s.ctx, "nsenter", append([]string{"-t", pid, "-n"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("nsenter %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

func (s *suite) containerIP(service string) string {
	s.t.Helper()
	id, err := s.compose.Container(s.ctx, service)
	require.NoError(s.t, err)
	ip, err := s.compose.docker(s.ctx, "inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}", id)
	require.NoError(s.t, err)
	require.NotEmpty(s.t, ip)
	return ip
}

func TestVLLMFramesLostWhileTheAdapterWasCutOffAreReplayedAndTheIndexMatches(t *testing.T) {
	if variant == "vllm" {
		if os.Geteuid() != 0 {
			t.Skip("cutting the adapter's ZeroMQ connection needs root on the Docker host (nsenter into its network namespace)")
		}
		for _, tool := range []string{"nsenter", "iptables", "ss"} {
			if _, err := exec.LookPath(tool); err != nil {
				t.Skipf("cutting the adapter's ZeroMQ connection needs %s on the Docker host: %v", tool, err)
			}
		}
	}
	s := newVLLMSuite(t)
	r := newReport(t, "V3 lost frames, replay")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)

	var victim string
	testenv.Eventually(t, 10*time.Second, func() bool {
		w, n := l.driver.BusiestWorker()
		victim = w
		return n > 0
	}, "a worker with streams in flight")
	adapter := adapterOf(victim)
	am := adapterURL(victim) + "/metrics"
	before := map[string]float64{}
	for _, n := range []string{metricReplays + ":ok", metricReplays + ":failed", metricReplays + ":incomplete"} {
		name, res, _ := strings.Cut(n, ":")
		before[n] = s.value(am, name, map[string]string{"result": res})
	}
	before[metricSubResets] = s.value(am, metricSubResets, nil)
	before[metricRepairs] = s.value(am, metricRepairs, nil)

	// The cut: the adapter's kernel refuses its reconnects to the engine's
	// PUB port with a reset, and its live connection is destroyed (ss -K
	// resets it, so the engine drops the subscriber at once). The engine
	// keeps publishing; a PUB socket sends only to connected subscribers,
	// so everything it publishes now is lost to the adapter.
	engineIP := s.containerIP(victim)
	rule := []string{"OUTPUT", "-p", "tcp", "-d", engineIP, "--dport", "5557", "-j", "REJECT", "--reject-with", "tcp-reset"}
	_, err := s.netns(adapter, append([]string{"iptables", "-I"}, rule...)...)
	require.NoError(t, err)
	restored := false
	restore := func() {
		if !restored {
			restored = true
			_, err := s.netns(adapter, append([]string{"iptables", "-D"}, rule...)...)
			assert.NoError(t, err, "removing the cut's iptables rule")
		}
	}
	t.Cleanup(restore)
	_, err = s.netns(adapter, "ss", "-K", "-tn", "dst", engineIP, "dport", "=", ":5557")
	require.NoError(t, err)
	cut := time.Now()
	engineBefore := s.value(workerURL(victim)+"/metrics", metricEngineBatches, nil)
	framesBefore := s.value(am, metricFrames, map[string]string{"result": "ok"})
	var lost float64
	testenv.Eventually(t, 15*time.Second, func() bool {
		lost = s.value(workerURL(victim)+"/metrics", metricEngineBatches, nil) - engineBefore
		return lost >= 3
	}, "the engine publishing batches while its adapter is cut off (%v so far)", &lost)
	framesDuring := s.value(am, metricFrames, map[string]string{"result": "ok"}) - framesBefore
	restore()
	uncut := time.Now()
	if !assert.Zero(t, framesDuring, "the cut adapter must not have received live batches") {
		r.Failed = true
	}
	r.Notes = append(r.Notes, fmt.Sprintf("cut %s off %s's PUB socket for %v: the engine published %v batches, the adapter received %v of them live",
		adapter, victim, uncut.Sub(cut).Round(100*time.Millisecond), lost, framesDuring))

	// Reconnected, the adapter sees the next live batch beyond the ones it
	// has and replays the gap from the engine's replay ROUTER.
	testenv.Eventually(t, 20*time.Second, func() bool {
		return s.value(am, metricReplays, map[string]string{"result": "ok"}) > before[metricReplays+":ok"]
	}, "the adapter of %s replaying the lost batches", victim)
	r.Failover = "replayed " + time.Since(uncut).Round(100*time.Millisecond).String() + " after the cut ended"
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	l.verdict(r, none, true, true)

	after := func(n string) float64 {
		name, res, ok := strings.Cut(n, ":")
		if !ok {
			return s.value(am, name, nil) - before[n]
		}
		return s.value(am, name, map[string]string{"result": res}) - before[n]
	}
	fail := func(ok bool) {
		if !ok {
			r.Failed = true
		}
	}
	r.Notes = append(r.Notes, fmt.Sprintf("adapter: replays ok +%v failed +%v incomplete +%v, continuity losses +%v, mirror restarts +%v",
		after(metricReplays+":ok"), after(metricReplays+":failed"), after(metricReplays+":incomplete"), after(metricSubResets), after(metricRepairs)))
	// The replay filled the gap: no continuity was lost, so the mirror did
	// not start over and still knows every block the engine holds.
	fail(assert.Zero(t, after(metricReplays+":failed")+after(metricReplays+":incomplete"), "every replay must succeed"))
	fail(assert.Zero(t, after(metricSubResets), "the replay must repair the gap without a reset"))
	fail(assert.Zero(t, after(metricRepairs), "the mirror must not have started over"))
	fail(assert.Equal(t, 1.0, s.value(am, metricMirrorExact, nil), "the mirror must still be exact"))
	s.indexMatchesMirrors(r)
}

func TestVLLMUnderSteadyLoadEveryRequestIsServedAndTheIndexMatchesTheMirrors(t *testing.T) {
	s := newVLLMSuite(t)
	r := newReport(t, "V4 steady load")
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds) * time.Second)
	l.stop()
	l.verdict(r, none, true, true)
	per := map[string]int{}
	for _, x := range l.driver.Results() {
		per[x.Worker]++
	}
	var spread []string
	for _, w := range workerIDs {
		spread = append(spread, w+"="+strconv.Itoa(per[w]))
	}
	r.Notes = append(r.Notes, "requests per worker: "+strings.Join(spread, " "))
	s.indexMatchesMirrors(r)
}
