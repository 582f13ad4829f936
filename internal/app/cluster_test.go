package app

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/internal/testenv"
)

// testCluster is an in-process Switchyard cluster on real embedded etcd and
// NATS: router replicas from RunReplica and simulated workers from RunWorker.
type testCluster struct {
	t        *testing.T
	etcd     *testenv.Etcd
	nats     *testenv.NATS
	mu       sync.Mutex
	replicas map[string]*runningReplica
	workers  []*runningWorker
}

type runningReplica struct {
	crashed bool // cut off on purpose: its exit error is expected
	status  *ReplicaStatus
	reg     *prometheus.Registry
	cancel  context.CancelFunc
	done    chan error
}

func newTestCluster(t *testing.T, workers int) *testCluster {
	c := &testCluster{t: t, etcd: testenv.StartEtcd(t), nats: testenv.StartNATS(t), replicas: map[string]*runningReplica{}}
	for i := 1; i <= workers; i++ {
		cfg := testWorkerConfig()
		cfg.ID = fmt.Sprintf("w%d", i)
		cfg.EtcdEndpoints = c.etcd.Endpoints
		cfg.NATSURL = c.nats.URL
		c.workers = append(c.workers, startWorker(t, cfg))
	}
	return c
}

func (c *testCluster) startReplica(id string) *runningReplica {
	return c.startReplicaAt(id, "127.0.0.1:0")
}

func (c *testCluster) startReplicaAt(id, httpAddr string) *runningReplica {
	return c.startReplicaWith(id, httpAddr, nil)
}

func (c *testCluster) startReplicaWith(id, httpAddr string, mutate func(*ReplicaConfig)) *runningReplica {
	t := c.t
	t.Helper()
	cfg := DefaultReplicaConfig()
	cfg.ID, cfg.Cluster = id, "test"
	cfg.HTTPAddr = httpAddr
	cfg.EtcdEndpoints = c.etcd.Endpoints
	cfg.NATSURL = c.nats.URL
	cfg.Session.TTL = 5 * time.Second
	cfg.Ownership.SettlePeriod = 200 * time.Millisecond
	cfg.DrainDelay = 0 // tests that stop a replica under load set their own
	cfg.Gossip.BindAddr, cfg.Gossip.BindPort = "127.0.0.1", 0
	c.mu.Lock()
	for _, r := range c.replicas {
		cfg.Gossip.Join = append(cfg.Gossip.Join, r.status.GossipAddr)
	}
	c.mu.Unlock()
	if mutate != nil {
		mutate(&cfg)
	}
	ready := make(chan *ReplicaStatus, 1)
	ctx, cancel := context.WithCancel(context.Background())
	r := &runningReplica{reg: prometheus.NewRegistry(), cancel: cancel, done: make(chan error, 1)}
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel))
	go func() { r.done <- RunReplica(ctx, cfg, log, r.reg, func(s *ReplicaStatus) { ready <- s }) }()
	select {
	case r.status = <-ready:
	case err := <-r.done:
		cancel()
		t.Fatalf("replica %s did not start: %v", id, err)
	case <-time.After(30 * time.Second):
		cancel()
		t.Fatalf("replica %s did not start within 30s", id)
	}
	c.mu.Lock()
	c.replicas[id] = r
	c.mu.Unlock()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *runningReplica) stop(t *testing.T) {
	r.cancel()
	if err, ok := <-r.done; ok {
		close(r.done)
		if !r.crashed {
			require.NoError(t, err)
		}
	}
}

func (r *runningReplica) client() openai.Client {
	return openai.NewClient(option.WithBaseURL("http://"+r.status.HTTPAddr+"/v1/"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
}

// waitOwned waits until every class has a live owner among ids, as every
// running replica sees it.
func (c *testCluster) waitOwned(classes []string, ids ...string) {
	c.t.Helper()
	testenv.Eventually(c.t, 15*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, r := range c.replicas {
			owners := r.status.Owners()
			for _, class := range classes {
				o, ok := owners[class]
				if !ok || !contains(ids, o.Replica) {
					return false
				}
			}
		}
		return true
	}, "every class owned by one of %v in every replica's view", ids)
}

// waitPlaced waits until every class is owned by the replica rendezvous
// hashing places it on among ids, in every running replica's view.
func (c *testCluster) waitPlaced(classes []string, ids ...string) {
	c.t.Helper()
	testenv.Eventually(c.t, 20*time.Second, func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for _, r := range c.replicas {
			owners := r.status.Owners()
			for _, class := range classes {
				if owners[class].Replica != cluster.Place(class, ids) {
					return false
				}
			}
		}
		return true
	}, "every class owned by its rendezvous placement among %v", ids)
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

var defaultClasses = []string{"interactive", "batch", "realtime"}

func TestAThreeReplicaClusterServesEveryReplicaWithOneOwnerPerClass(t *testing.T) {
	c := newTestCluster(t, 3)
	a, b, d := c.startReplica("r1"), c.startReplica("r2"), c.startReplica("r3")
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")

	owners := map[string]int{}
	for _, r := range []*runningReplica{a, b, d} {
		for _, class := range r.status.Owned() {
			owners[class]++
		}
	}
	for _, class := range defaultClasses {
		require.Equal(t, 1, owners[class], "class %s has exactly one owner", class)
	}

	ctx := testenv.Context(t)
	for _, r := range []*runningReplica{a, b, d} {
		for _, class := range defaultClasses {
			cl := r.client()
			resp, err := cl.Completions.New(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("hello from " + class)},
				MaxTokens: openai.Int(4),
			}, option.WithHeader("x-switchyard-class", class))
			require.NoError(t, err, "replica %s class %s", r.status.ID, class)
			require.NotEmpty(t, resp.Choices)
		}
	}
	total := uint64(0)
	for _, r := range []*runningReplica{a, b, d} {
		snap, err := r.status.Flush(ctx)
		require.NoError(t, err)
		for _, cs := range snap.Classes {
			total += cs.Counters.Admitted
		}
	}
	require.Equal(t, uint64(9), total, "each request admitted exactly once, by its class owner")

	resp, err := http.Get("http://" + a.status.HTTPAddr + "/debug/cluster")
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Contains(t, string(body), `"owners"`)
	require.Contains(t, string(body), `"r3"`)
}

func TestClassesMoveToTheSurvivorsWhenAReplicaLeaves(t *testing.T) {
	c := newTestCluster(t, 2)
	a, b := c.startReplica("r1"), c.startReplica("r2")
	c.waitOwned(defaultClasses, "r1", "r2")
	b.stop(t)
	c.mu.Lock()
	delete(c.replicas, "r2")
	c.mu.Unlock()
	c.waitOwned(defaultClasses, "r1")
	require.ElementsMatch(t, defaultClasses, a.status.Owned())

	cl := a.client()
	for _, class := range defaultClasses {
		_, err := cl.Completions.New(testenv.Context(t), openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel(testModel),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(strings.Repeat("x ", 40))},
			MaxTokens: openai.Int(2),
		}, option.WithHeader("x-switchyard-class", class))
		require.NoError(t, err)
	}
}

// startCompletions sends n completions at once, round-robin over replicas,
// each with a distinct prompt of about 30 words and maxTokens to generate.
// The returned function waits for all of them and returns their errors.
func startCompletions(replicas []*runningReplica, n, maxTokens int) func() []error {
	var wg sync.WaitGroup
	errs := make([]error, n)
	for i := 0; i < n; i++ {
		r := replicas[i%len(replicas)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := r.client()
			_, errs[i] = cl.Completions.New(context.Background(), openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(fmt.Sprintf("request %d %s", i, strings.Repeat("word ", 30)))},
				MaxTokens: openai.Int(int64(maxTokens)),
			})
		}()
	}
	return func() []error {
		wg.Wait()
		return errs
	}
}
