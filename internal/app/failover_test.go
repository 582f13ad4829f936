package app

import (
	"context"
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/internal/testenv"
)

// classPlacedOn returns a class name that rendezvous hashing places on want
// among ids.
func classPlacedOn(want string, ids []string) string {
	for i := 0; ; i++ {
		name := fmt.Sprintf("gold-%d", i)
		if cluster.Place(name, ids) == want {
			return name
		}
	}
}

// startOwnerTestCluster starts etcd, NATS and two workers that run two
// requests each, so the rest queue at the class owner; speedup divides the
// workers' simulated step times. It returns the replica ids r1..r3 (no
// replica runs yet), one FCFS class that the ids place on r1, and the
// policy YAML of that class.
func startOwnerTestCluster(t *testing.T, speedup float64) (ids []string, class string, policy []byte, c *testCluster) {
	t.Helper()
	ids = []string{"r1", "r2", "r3"}
	class = classPlacedOn("r1", ids)
	policy = []byte(fmt.Sprintf("default_class: %s\nclasses:\n  - name: %s\n    policy: fcfs\n    quantum: 1024\n", class, class))
	c = &testCluster{t: t, etcd: testenv.StartEtcd(t), nats: testenv.StartNATS(t), replicas: map[string]*runningReplica{}}
	for i := 1; i <= 2; i++ {
		cfg := testWorkerConfig()
		cfg.ID = fmt.Sprintf("w%d", i)
		cfg.EtcdEndpoints, cfg.NATSURL = c.etcd.Endpoints, c.nats.URL
		cfg.Engine.MaxNumSeqs = 2 // two running requests per worker: the rest queue at the owner
		cfg.Engine.Speedup = speedup
		c.workers = append(c.workers, startWorker(t, cfg))
	}
	return ids, class, policy, c
}

// counterSum adds up every series of a counter in a registry.
func counterSum(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func TestAKilledOwnersClassMovesAndEveryPendingRequestIsAdmittedOnce(t *testing.T) {
	ids, class, policy, c := startOwnerTestCluster(t, 20)
	etcdURL, err := url.Parse(c.etcd.Endpoints[0])
	require.NoError(t, err)
	natsURL, err := url.Parse(c.nats.URL)
	require.NoError(t, err)
	etcdProxy, natsProxy := testenv.StartProxy(t, etcdURL.Host), testenv.StartProxy(t, natsURL.Host)

	const ttl = 2 * time.Second
	withPolicy := func(cfg *ReplicaConfig) { cfg.PolicyYAML = policy; cfg.Session.TTL = ttl }
	r1 := c.startReplicaWith("r1", "127.0.0.1:0", func(cfg *ReplicaConfig) {
		withPolicy(cfg)
		cfg.EtcdEndpoints = []string{"http://" + etcdProxy.Addr()}
		cfg.NATSURL = "nats://" + natsProxy.Addr()
	})
	r2 := c.startReplicaWith("r2", "127.0.0.1:0", withPolicy)
	r3 := c.startReplicaWith("r3", "127.0.0.1:0", withPolicy)
	c.waitPlaced([]string{class}, ids...)

	const n = 24
	wait := startCompletions([]*runningReplica{r2, r3}, n, 64)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return r1.status.Snapshot().Classes[class].QueueDepth >= 4
	}, "requests queue at the owner r1")
	queuedAtCut := r1.status.Snapshot().Classes[class].QueueDepth

	// r1 "dies": cut from etcd and NATS without any graceful release.
	r1.crashed = true
	etcdProxy.Cut()
	natsProxy.Cut()
	cutAt := time.Now()
	testenv.Eventually(t, ttl+time.Second+500*time.Millisecond, func() bool {
		o := r2.status.Owners()[class]
		return o.Replica != "" && o.Replica != "r1"
	}, "the class moves within TTL + 1 s (plus scheduling slack)")
	t.Logf("class %s moved %v after the cut (TTL %v); %d requests were queued at r1", class, time.Since(cutAt), ttl, queuedAtCut)

	for _, err := range wait() {
		require.NoError(t, err, "every request pending anywhere completes after the failover")
	}
	served := 0.0
	for _, w := range c.workers {
		served += counterSum(t, w.reg, "switchyard_worker_http_requests_total")
	}
	require.Equal(t, float64(n), served, "the workers served each request exactly once: nothing was admitted twice")
	var retried uint64
	for _, r := range []*runningReplica{r2, r3} {
		snap, err := r.status.Flush(context.Background())
		require.NoError(t, err)
		retried += snap.Classes[class].Counters.Retried
	}
	require.GreaterOrEqual(t, retried, uint64(1), "requests pending at the dead owner were resubmitted as retries")
	etcdProxy.Restore()
	natsProxy.Restore()
}
