package app

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/service"
	"github.com/switchyard/switchyard/internal/testenv"
)

// A replica's services stop in the lame duck's order: the drain first, then
// ownership (releasing the classes while the watchers, the membership loop
// and the API still run), then the final counters and the linger, then the
// API, then the rest.
func TestAReplicasServicesStopInTheLameDucksOrder(t *testing.T) {
	m, err := service.New((&replica{}).services()...) // method values only: nothing runs
	require.NoError(t, err)
	stop := slices.Clone(m.Order())
	slices.Reverse(stop)
	at := func(name string) int {
		i := slices.Index(stop, name)
		require.GreaterOrEqual(t, i, 0, "service %s", name)
		return i
	}
	require.Equal(t, []string{"lame_duck", "ownership", "final_metrics"}, stop[:3])
	for _, watcher := range []string{"membership", "session", "workers", "replicas", "admission_client", "admission_server", "scheduler", "gossip", "api", "api_admin", "exporter"} {
		require.Greater(t, at(watcher), at("final_metrics"), "%s still runs while the classes are released and the final counters exported", watcher)
	}
	require.Greater(t, at("api"), at("membership"), "the API outlives the membership loop")
	for _, rest := range []string{"session", "workers", "replicas", "scheduler", "gossip", "kv_ingest", "admission_server", "admission_client", "exporter", "tokenizers", "keys"} {
		require.Greater(t, at(rest), at("api"), "%s stops after the API", rest)
	}
}

func httpStatus(method, url string, body []byte) int {
	req, err := http.NewRequest(method, url, bytes.NewReader(body))
	if err != nil {
		return 0
	}
	req.Header.Set("content-type", "application/json")
	req.Close = true
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode
}

// On stop a replica fails /readyz at once, keeps serving the API through
// its drain delay while its classes move to another replica, then answers
// 503, keeps /metrics up for its linger, and returns nil.
func TestAStoppedReplicaDrainsHandsOffItsClassesAndLingersInOrder(t *testing.T) {
	const drain, linger = 3 * time.Second, 2 * time.Second
	c := newTestCluster(t, 1)
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		cfg.DrainDelay, cfg.ShutdownLinger = drain, linger
	})
	r2 := c.startReplica("r2")
	ids := []string{"r1", "r2"}
	c.waitPlaced(defaultClasses, ids...)
	moving := r1.status.Owned()
	require.NotEmpty(t, moving, "r1 owns classes to hand off")

	base := "http://" + r1.status.HTTPAddr
	completion, err := json.Marshal(map[string]any{"model": testModel, "max_tokens": 4, "prompt": "hello " + strings.Repeat("word ", 20)})
	require.NoError(t, err)
	stoppedAt := time.Now()
	r1.cancel()
	testenv.Eventually(t, drain/2, func() bool { return httpStatus(http.MethodGet, base+"/readyz", nil) == http.StatusServiceUnavailable },
		"/readyz fails as soon as the lame duck begins")
	testenv.Eventually(t, drain, func() bool {
		owners := r2.status.Owners()
		for _, class := range moving {
			if owners[class].Replica != "r2" {
				return false
			}
		}
		return true
	}, "r1's classes move to r2 during the drain delay")
	select {
	case err := <-r1.done:
		r1.done <- err
		t.Fatalf("r1 exited (%v) before its drain delay was over", err)
	default: // r1 still runs when its classes have moved
	}
	for i := 0; i < 3; i++ {
		require.Equal(t, http.StatusOK, httpStatus(http.MethodPost, base+"/v1/completions", completion),
			"r1 still serves the API during its drain delay (request %d, %v after the stop)", i, time.Since(stoppedAt))
	}
	require.Less(t, time.Since(stoppedAt), drain, "the checks above ran within the drain delay")

	testenv.Eventually(t, drain+time.Second, func() bool {
		return httpStatus(http.MethodPost, base+"/v1/completions", completion) == http.StatusServiceUnavailable
	}, "after the drain delay the API answers 503")
	require.Equal(t, http.StatusOK, httpStatus(http.MethodGet, base+"/metrics", nil), "/metrics is up during the linger")

	var exitErr error
	select {
	case exitErr = <-r1.done:
		r1.done <- exitErr // for the cleanup's stop
	case <-time.After(time.Minute):
		t.Fatal("r1 did not stop")
	}
	require.NoError(t, exitErr)
	require.GreaterOrEqual(t, time.Since(stoppedAt), drain+linger, "r1 stopped only after its drain delay and linger")
}
