package metrics

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestAdmissionCountersExportEveryReasonAndDegradedAdmissionsAtZeroForANewClass(t *testing.T) {
	reg := prometheus.NewRegistry()
	adm := NewAdmission(reg)
	exp, err := NewExporter(DefaultExporterConfig(), adm, reg, nil)
	require.NoError(t, err)

	exp.Observe(AdmissionSnapshot{Instance: 1, Seq: 1, WorkerType: "decode", Classes: map[string]AdmissionCounts{
		"interactive": {Received: 5, Retried: 1, Admitted: 3, Cancelled: 0, Rejected: map[string]uint64{
			ReasonDueTimePassed: 1, ReasonQueueFull: 1,
		}},
	}})

	requireGolden(t, reg, "admission.golden",
		NameAdmissionReceived, NameAdmissionRejected, NameAdmissionAdmitted, NameAdmissionRetried, NameAdmissionCancelled,
		NameDegradedAdmissions)
}

func TestAdmissionQueueMetricsExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	adm := NewAdmission(reg)
	adm.QueueDepth.WithLabelValues("decode", "batch").Set(7)
	adm.QueuePendingTokens.WithLabelValues("decode", "batch").Set(9000)
	adm.QueueWait.WithLabelValues("decode", "batch").Observe(0.2)
	adm.Decision.WithLabelValues("decode", "batch").Observe(4e-6)
	adm.DegradedAdmissions.WithLabelValues("batch").Inc()

	requireGolden(t, reg, "admission_queue.golden",
		NameQueueDepth, NameQueuePendingTokens, NameQueueWait, NameDecision, NameDegradedAdmissions)
}

func TestRouterMetricsExposition(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRouter(reg)
	r.TTFT.WithLabelValues("llama", "interactive").Observe(0.3)
	r.ITL.WithLabelValues("llama", "interactive").Observe(0.015)
	r.E2E.WithLabelValues("llama", "interactive").Observe(3)
	r.PromptTokens.WithLabelValues("llama", "interactive").Add(1000)
	r.GeneratedTokens.WithLabelValues("llama", "interactive").Add(200)
	r.CachedTokens.WithLabelValues("llama", "interactive").Add(640)
	r.PredictedCachedTokens.WithLabelValues("llama", "interactive").Add(512)
	r.WorkerActiveRequests.WithLabelValues("worker-1").Set(4)
	r.WorkerPrefillTokens.WithLabelValues("worker-1").Set(2048)
	r.WorkerDecodeBlocks.WithLabelValues("worker-1").Set(130)
	r.DegradedMode.Set(1)
	r.HTTPResponses.WithLabelValues(RouteChatCompletions, "200").Inc()
	r.HTTPResponses.WithLabelValues(RouteOther, "404").Inc()

	requireGolden(t, reg, "router.golden",
		NameTTFT, NameITL, NameE2E, NamePromptTokens, NameGeneratedTokens, NameCachedTokens,
		NamePredictedCachedTokens, NameWorkerActiveRequests, NameWorkerPrefillTokens,
		NameWorkerDecodeBlocks, NameDegradedMode, NameHTTPResponses)
}

func TestUnknownLabelValuesFoldIntoOther(t *testing.T) {
	require.Equal(t, ReasonQueueFull, Reason("queue_full"))
	require.Equal(t, ReasonOther, Reason("req-7f3a9"), "a request id must never become a reason label")
	require.Equal(t, ReasonOther, RejectReasons()[len(RejectReasons())-1], "other must be the last reason")
	require.Contains(t, RejectReasons(), ReasonPredictedMiss)
}

func TestEachReplicaGetsItsOwnRegistry(t *testing.T) {
	// Two replicas in one process (switchyard up) register the same metrics
	// without colliding, because nothing is registered globally.
	for range 2 {
		reg := NewRegistry()
		NewAdmission(reg)
		NewRouter(reg)
		_, err := reg.Gather()
		require.NoError(t, err)
	}
}

func TestHandlerServesTheRegistryOverHTTP(t *testing.T) {
	reg := NewRegistry()
	adm := NewAdmission(reg)
	adm.InitClass("decode", "interactive")
	srv := httptest.NewServer(Handler(reg))
	defer srv.Close()

	resp, err := http.Get(srv.URL)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	text := string(body)
	require.True(t, strings.Contains(text, "go_goroutines "), "Go runtime collector missing")
	require.True(t, strings.Contains(text, "process_"), "process collector missing")
	require.Contains(t, text,
		`switchyard_router_admission_rejected_total{class="interactive",reason="predicted_miss",worker_type="decode"} 0`)
}

func TestRouterRoleLoadsExportEveryRole(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := NewRouter(reg)
	r.SetRoleLoads(map[string]RoleLoad{
		RolePrefill: {Workers: 2, ActiveRequests: 3, PrefillTokens: 4096},
		RoleDecode:  {Workers: 1, ActiveRequests: 3, DecodeBlocks: 300},
	})
	require.Equal(t, 3.0, testutil.ToFloat64(r.RoleActiveRequests.WithLabelValues(RolePrefill)))
	require.Equal(t, 4096.0, testutil.ToFloat64(r.RolePrefillTokens.WithLabelValues(RolePrefill)))
	require.Equal(t, 300.0, testutil.ToFloat64(r.RoleDecodeBlocks.WithLabelValues(RoleDecode)))
	require.Equal(t, 1.0, testutil.ToFloat64(r.RoleWorkers.WithLabelValues(RoleDecode)))
	require.Equal(t, 0.0, testutil.ToFloat64(r.RoleWorkers.WithLabelValues(RoleBoth)))
	// Every role is a series, including the absent one.
	require.Equal(t, len(Roles()), testutil.CollectAndCount(r.RoleWorkers))
	// A role that lost its workers reads 0 again.
	r.SetRoleLoads(nil)
	require.Equal(t, 0.0, testutil.ToFloat64(r.RoleActiveRequests.WithLabelValues(RolePrefill)))
}
