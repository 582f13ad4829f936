//go:build e2e

package e2e

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
)

// The disaggregated variant (deploy/docker-compose.pd.yml, `E2E_VARIANT=pd
// e2e/run.sh`): worker-1 and worker-2 prefill, worker-3 and worker-4
// decode, worker-5 of role both, all speaking vLLM's kv_transfer_params.
// Its scenarios are the TestPD* tests; they skip against other projects.
var (
	pdPrefills = []string{"worker-1", "worker-2"}
	pdDecodes  = []string{"worker-3", "worker-4"}
	pdBoth     = []string{"worker-5"}
)

func init() {
	if variant == "pd" {
		workerIDs = []string{"worker-1", "worker-2", "worker-3", "worker-4", "worker-5"}
	}
}

func newPDSuite(t *testing.T) *suite {
	t.Helper()
	if variant != "pd" {
		t.Skip("a PD-variant scenario: it needs deploy/docker-compose.pd.yml running (E2E_VARIANT=pd e2e/run.sh)")
	}
	return newSuite(t)
}

// killAndRestartUnderLoad kills victim (kill -9) a third into the load,
// waits for every router to drop it, restarts it a third later and waits
// for it to be back, then checks the shared invariants with allowed as
// the failures that may happen.
func (s *suite) killAndRestartUnderLoad(r *scenarioReport, victim string, allowed func(Result) bool) {
	t := s.t
	l := s.startLoad()
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	r.Notes = append(r.Notes, "killed "+victim)
	s.heal(victim, false)
	require.NoError(t, s.compose.Kill(s.ctx, victim))
	start := time.Now()
	testenv.Eventually(t, settleBound, func() bool {
		ok, _ := Settled(s.views(routerIDs), routerIDs, classes, len(workerIDs)-1)
		return ok
	}, "routers dropping the killed %s", victim)
	r.Failover = time.Since(start).Round(100 * time.Millisecond).String()
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	require.NoError(t, s.compose.Start(s.ctx, victim))
	s.waitHealthy(victim)
	s.waitSettled(routerIDs, settleBound)
	s.pause(time.Duration(loadSeconds/3) * time.Second)
	l.stop()
	// The killed worker's own counter since its last scrape died with it,
	// and a disaggregated request is served by two workers: the workers'
	// total is only bounded; the routers' is exact.
	l.verdict(r, allowed, true, false)
}

// A prefill leg ends before the client's first byte (it is not streamed):
// a killed prefill's requests are retried on the other prefill or run
// aggregated, and no client sees a failure.
func TestPDKillingAPrefillWorkerUnderLoadLosesNoRequest(t *testing.T) {
	s := newPDSuite(t)
	r := newReport(t, "PD1 kill prefill")
	s.killAndRestartUnderLoad(r, pdPrefills[0], none)
}

// A decode leg streams to the client: only the streams already flowing
// from the killed decode may fail (an error after the first byte, as for
// any worker); everything else is served.
func TestPDKillingADecodeWorkerFailsOnlyTheStreamsOnIt(t *testing.T) {
	s := newPDSuite(t)
	r := newReport(t, "PD2 kill decode")
	victim := pdDecodes[0]
	s.killAndRestartUnderLoad(r, victim, func(x Result) bool {
		return x.Worker == victim && (x.Outcome == OutcomeStreamError || x.Outcome == OutcomeTruncated)
	})
}

// The worker of role both serves the short requests; killed, they go
// disaggregated (or wait for it) and only its own streams may fail.
func TestPDKillingTheAggregatedWorkerFailsOnlyTheStreamsOnIt(t *testing.T) {
	s := newPDSuite(t)
	r := newReport(t, "PD3 kill both")
	victim := pdBoth[0]
	s.killAndRestartUnderLoad(r, victim, func(x Result) bool {
		return x.Worker == victim && (x.Outcome == OutcomeStreamError || x.Outcome == OutcomeTruncated)
	})
}
