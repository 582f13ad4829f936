package gossip

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// memberlist's Shutdown does not wait for a probe in flight; the probe
		// goroutine returns on its own once its ack timeout passes.
		goleak.IgnoreAnyFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"),
	)
}

var testKey = []byte("0123456789abcdef")

// testConfig is a replica on loopback with an ephemeral port, the test
// cluster's label and key.
func testConfig(name string) Config {
	c := DefaultConfig()
	c.NodeName = name
	c.BindAddr = "127.0.0.1"
	c.BindPort = 0
	c.ClusterLabel = "switchyard-test"
	c.SecretKey = testKey
	c.JoinRetryInterval = 50 * time.Millisecond
	c.LeaveTimeout = 500 * time.Millisecond
	c.Meta = NodeMeta{HTTPAddr: "127.0.0.1:8080", Version: "test"}
	return c
}

// replica is one running Gossip with its registry and logs.
type replica struct {
	*Gossip
	reg  *prometheus.Registry
	logs *observer.ObservedLogs
	stop func()
}

func startReplica(t testing.TB, cfg Config, opts ...Option) *replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	core, logs := observer.New(zapcore.InfoLevel)
	g, err := New(cfg, zap.New(core), reg, opts...)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	select {
	case <-g.Ready():
	case err := <-done:
		cancel()
		t.Fatalf("replica %s: Run returned before ready: %v", cfg.NodeName, err)
	}
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("replica %s: Run: %v", cfg.NodeName, err)
			}
		})
	}
	t.Cleanup(stop)
	return &replica{Gossip: g, reg: reg, logs: logs, stop: stop}
}

// startCluster starts n replicas named r0..r{n-1}, all joining r0, and waits
// until every one sees all n members.
func startCluster(t testing.TB, n int, mutate func(*Config)) []*replica {
	t.Helper()
	rs := make([]*replica, 0, n)
	for i := range n {
		cfg := testConfig("r" + string(rune('0'+i)))
		if i > 0 {
			cfg.Join = []string{rs[0].Addr()}
		}
		if mutate != nil {
			mutate(&cfg)
		}
		rs = append(rs, startReplica(t, cfg))
	}
	testenv.Eventually(t, 30*time.Second, func() bool {
		for _, r := range rs {
			if len(r.Members()) != n {
				return false
			}
		}
		return true
	}, "all %d replicas see each other", n)
	return rs
}

func counter(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// newManualClock is a clock that moves only when told to (Advance).
func newManualClock() *clock.Fake { return clock.NewFake(time.Now()) }
