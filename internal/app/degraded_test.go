package app

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

func readyz(t *testing.T, r *runningReplica) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + r.status.HTTPAddr + "/readyz")
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

// Without NATS a replica admits every class itself (degraded mode), says so
// in /readyz and in switchyard_router_degraded_mode, and goes back to normal
// on its own once NATS is back.
func TestDegradedModeShowsInReadyzAndTheMetricAndEndsByItself(t *testing.T) {
	c := newTestCluster(t, 1)
	r := c.startReplica("r1")
	c.waitOwned(defaultClasses, "r1")
	code, body := readyz(t, r)
	require.Equal(t, http.StatusOK, code)
	require.NotContains(t, body, "degraded")

	addr := c.nats.Server.Addr().String()
	c.nats.Server.Shutdown()
	c.nats.Server.WaitForShutdown()
	testenv.Eventually(t, 10*time.Second, func() bool {
		code, body := readyz(t, r)
		return code == http.StatusOK && strings.Contains(body, "degraded: NATS unreachable")
	}, "/readyz reports degraded mode")
	testenv.Eventually(t, 10*time.Second, func() bool { return gaugeValue(t, r, metrics.NameDegradedMode) == 1 },
		"the degraded-mode gauge is 1")

	testenv.StartNATSAt(t, addr)
	testenv.Eventually(t, 15*time.Second, func() bool {
		code, body := readyz(t, r)
		return code == http.StatusOK && !strings.Contains(body, "degraded")
	}, "normal mode resumes by itself")
	testenv.Eventually(t, 10*time.Second, func() bool { return gaugeValue(t, r, metrics.NameDegradedMode) == 0 },
		"the degraded-mode gauge is back to 0")
}

// gaugeValue reads an unlabelled gauge from the replica's registry.
func gaugeValue(t *testing.T, r *runningReplica, name string) float64 {
	t.Helper()
	mfs, err := r.reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) > 0 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return -1
}
