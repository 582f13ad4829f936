package admission

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const cluster = "test"

// replica is one router replica's admission stack: a real scheduler actor,
// the owner side and the entry side, on a real NATS connection.
type replica struct {
	id     string
	actor  *scheduler.Actor
	server *Server
	client *Client
	quota  *Quota // nil unless the harness leases quotas
	nc     *nats.Conn
	reg    *prometheus.Registry
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

type harness struct {
	t        testing.TB
	nats     *testenv.NATS
	classes  []scheduler.ClassConfig
	workers  []scheduler.Worker
	replicas map[string]*replica
	// sched, when set, adjusts the scheduler config of the replicas
	// started from then on.
	sched func(*scheduler.Config)
	// serverOpts, when set, adds owner side options to the replicas
	// started from then on.
	serverOpts []ServerOption
	// quota, when set, makes the replicas started from then on lease
	// tenants' quotas across owners (Quota).
	quota *QuotaConfig
	// clock, when set, is every replica's clock (scheduler and admission).
	clock clock.Clock
	// quotaStore, when set, keeps the quota owners' central buckets.
	quotaStore BucketStore
}

func newHarness(t *testing.T, classes []scheduler.ClassConfig, workers []scheduler.Worker) *harness {
	return newHarnessTB(t, classes, workers)
}

func newHarnessTB(t testing.TB, classes []scheduler.ClassConfig, workers []scheduler.Worker) *harness {
	return &harness{t: t, nats: testenv.StartNATS(t), classes: classes, workers: workers, replicas: map[string]*replica{}}
}

// start runs a replica until the test ends.
func (h *harness) start(id string, mutate func(*ClientConfig)) *replica {
	return h.startAt(id, h.nats.URL, mutate)
}

// startAt is start with the replica's NATS connection made to url (a
// testenv.Proxy in front of the server, to cut it).
func (h *harness) startAt(id, url string, mutate func(*ClientConfig)) *replica {
	t := h.t
	nc, err := nats.Connect(url, nats.Name(id), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	require.NoError(t, err)
	cfg := scheduler.DefaultConfig()
	if h.sched != nil {
		h.sched(&cfg)
	}
	var clk clock.Clock = clock.Real{}
	if h.clock != nil {
		clk = h.clock
	}
	core := scheduler.NewCore(cfg, clk, nil, rand.New(rand.NewPCG(1, uint64(len(h.replicas)))))
	core.SetClasses(h.classes)
	core.SetWorkers(h.workers)
	actor := scheduler.NewActor(core, clk, zap.NewNop())
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	classes := h.classes
	port := LocalActor(actor, func() []scheduler.ClassConfig { return classes })
	ccfg := DefaultClientConfig()
	if h.clock != nil {
		ccfg.Clock = h.clock
	}
	if mutate != nil {
		mutate(&ccfg)
	}
	srv := NewServer(id, cluster, nc, port, zap.NewNop(), m,
		append([]ServerOption{WithAdoptHold(ccfg.AdoptHold), WithServerClock(ccfg.Clock)}, h.serverOpts...)...)
	cli := NewClient(ccfg, id, cluster, nc, port, srv, zap.NewNop(), m)
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{id: id, actor: actor, server: srv, client: cli, nc: nc, reg: reg, cancel: cancel}
	runs := []func(context.Context) error{actor.Run, srv.Run, cli.Run}
	if h.quota != nil {
		r.quota = NewQuota(*h.quota, srv, cli, zap.NewNop())
		core.SetTenantHook(r.quota)
		if h.quotaStore != nil {
			r.quota.UseStore(h.quotaStore, time.Hour, time.Second)
		}
		runs = append(runs, r.quota.Run)
	}
	for _, run := range runs {
		r.wg.Add(1)
		go func() { defer r.wg.Done(); _ = run(ctx) }()
	}
	t.Cleanup(r.stop)
	h.replicas[id] = r
	return r
}

func (r *replica) stop() {
	r.cancel()
	r.wg.Wait()
	r.nc.Close()
}

// own makes replica id the owner of class at epoch and tells every replica.
func (h *harness) own(class, id string, epoch int64) {
	h.t.Helper()
	for rid, r := range h.replicas {
		if rid != id {
			r.server.Disown(class)
		}
	}
	require.NoError(h.t, h.replicas[id].server.Own(class, epoch))
	for _, r := range h.replicas {
		r.client.OwnersChanged(map[string]Owner{class: {Replica: id, Epoch: epoch}})
	}
}

func (r *replica) snapshot(t testing.TB) *scheduler.Snapshot {
	s, err := r.actor.Flush(context.Background())
	require.NoError(t, err)
	return s
}

func (r *replica) counters(t testing.TB, class string) scheduler.Counters {
	return r.snapshot(t).Classes[class].Counters
}

func fcfs(name string) scheduler.ClassConfig {
	return scheduler.ClassConfig{Name: name, Quantum: 512, Policy: scheduler.PolicyFCFS,
		Limits: scheduler.Limits{Requests: scheduler.Unlimited, ISLTokens: scheduler.Unlimited, CachedTokens: scheduler.Unlimited}}
}

func workers(n, maxRunning int) []scheduler.Worker {
	ws := make([]scheduler.Worker, n)
	for i := range ws {
		ws[i] = scheduler.Worker{ID: "w" + string(rune('0'+i)), URL: "http://127.0.0.1:1", BlockSize: 16, KVBlocks: 4096, MaxRunning: maxRunning}
	}
	return ws
}

var reqSeq struct {
	sync.Mutex
	n int
}

func request(class string, prio int32) *scheduler.Request {
	reqSeq.Lock()
	reqSeq.n++
	id := "req-" + time.Now().Format("150405.000000") + "-" + string(rune('a'+reqSeq.n%26)) + itoa(reqSeq.n)
	reqSeq.Unlock()
	return &scheduler.Request{ID: id, Class: class, StrictPriority: prio, Ingress: time.Now(),
		PromptTokens: 64, BlockHashes: []uint64{1, 2, 3, 4}, ExpectedOutputTokens: 8}
}

func itoa(n int) string {
	if n == 0 {
		return "0"
	}
	var b []byte
	for n > 0 {
		b = append([]byte{byte('0' + n%10)}, b...)
		n /= 10
	}
	return string(b)
}

type admitResult struct {
	t   *Ticket
	err error
	req *scheduler.Request
}

// admitAsync starts an admission and returns where its result arrives.
func admitAsync(ctx context.Context, c *Client, r *scheduler.Request) <-chan admitResult {
	ch := make(chan admitResult, 1)
	go func() {
		t, err := c.Admit(ctx, r)
		ch <- admitResult{t, err, r}
	}()
	return ch
}

// merge delivers every result of chans, in the order they complete, and
// closes the returned channel after the last one.
func merge(chans []<-chan admitResult) <-chan admitResult {
	out := make(chan admitResult, len(chans))
	var wg sync.WaitGroup
	for _, ch := range chans {
		wg.Add(1)
		go func() { defer wg.Done(); out <- <-ch }()
	}
	go func() { wg.Wait(); close(out) }()
	return out
}

// subscriptions returns the owner side's current subscriptions for class.
func (s *Server) subscriptions(class string) []*nats.Subscription {
	s.mu.Lock()
	defer s.mu.Unlock()
	if oc, ok := s.owned[class]; ok {
		return oc.subs
	}
	return nil
}

// occupy admits one request through r and dispatches it: with one slot per
// worker it holds the slot until the test finishes it.
func occupy(t *testing.T, ctx context.Context, r *replica) *Ticket {
	t.Helper()
	tk, err := r.client.Admit(ctx, request("gold", 0))
	require.NoError(t, err)
	tk.Dispatched()
	return tk
}

// admitMany starts n admissions of class gold through c.
func admitMany(ctx context.Context, c *Client, n int) []<-chan admitResult {
	var pending []<-chan admitResult
	for range n {
		pending = append(pending, admitAsync(ctx, c, request("gold", 0)))
	}
	return pending
}

// finishAll requires every pending admission to succeed, dispatches and
// finishes each, and returns how many there were.
func finishAll(t *testing.T, pending []<-chan admitResult) int {
	t.Helper()
	n := 0
	for r := range merge(pending) {
		require.NoError(t, r.err, "request %s must be admitted, not rejected or left waiting", r.req.ID)
		r.t.Dispatched()
		r.t.Finish(false)
		n++
	}
	return n
}
