package admission

import (
	"context"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
)

// memBuckets is a BucketStore in memory that refuses saves at other epochs
// than owner's, as cluster.Buckets does with etcd.
type memBuckets struct {
	mu    sync.Mutex
	owner int64
	data  map[string][]byte
	saves int
}

func (m *memBuckets) Save(_ context.Context, class string, epoch int64, data []byte) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if epoch != m.owner {
		return errors.New("not the owner")
	}
	m.data[class] = data
	m.saves++
	return nil
}

func (m *memBuckets) Load(_ context.Context, class string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.data[class], nil
}

// bucketOwner is a real actor and owner side (no NATS) with a BucketSync.
func bucketOwner(t *testing.T, store BucketStore) (*BucketSync, *Server, *scheduler.Actor, *Metrics) {
	return bucketOwnerAt(t, store, nil)
}

func bucketOwnerAt(t *testing.T, store BucketStore, clk clock.Clock) (*BucketSync, *Server, *scheduler.Actor, *Metrics) {
	core := scheduler.NewCore(scheduler.DefaultConfig(), clock.Real{}, nil, rand.New(rand.NewPCG(1, 2)))
	core.SetClasses([]scheduler.ClassConfig{fcfs("gold")})
	core.SetWorkers(workers(1, 0))
	actor := scheduler.NewActor(core, clock.Real{}, zap.NewNop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = actor.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	m := NewMetrics(prometheus.NewRegistry())
	srv := NewServer("a", cluster, nil, LocalActor(actor, nil), zap.NewNop(), m)
	return NewBucketSync(store, ActorBuckets(actor), srv, 1, time.Second, clk, zap.NewNop(), m), srv, actor, m
}

func TestAReleasedClassCarriesItsSpentBucketToTheNextOwner(t *testing.T) {
	store := &memBuckets{owner: 7, data: map[string][]byte{}}
	sync, srv, actor, _ := bucketOwner(t, store)
	srv.owned["gold"] = &ownedClass{epoch: 7} // owning without NATS subscriptions
	q := scheduler.TenantQuota{RequestsPerMinute: 2}
	for range 2 {
		r := request("gold", 0)
		r.Tenant = scheduler.Tenant{ID: "acme", Quota: q}
		g := make(chan error, 1)
		actor.Enqueue(r, func(_ scheduler.Grant, err error) bool { g <- err; return true })
		require.NoError(t, <-g)
	}
	sync.save(testenv.Context(t), "gold", 7, false)
	sync.save(testenv.Context(t), "gold", 7, false)
	require.Equal(t, 1, store.saves, "an unchanged level is not saved again")
	delete(srv.owned, "gold")
	sync.Released("gold", 7)
	require.Equal(t, 2, store.saves, "the hand-off saves once more")

	next, _, nextActor, _ := bucketOwner(t, store)
	next.Acquired("gold")
	r := request("gold", 0)
	r.Tenant = scheduler.Tenant{ID: "acme", Quota: q}
	g := make(chan error, 1)
	nextActor.Enqueue(r, func(_ scheduler.Grant, err error) bool { g <- err; return true })
	err := <-g
	require.Equal(t, scheduler.ReasonQuotaExceeded, scheduler.ReasonOf(err), "the spent bucket moved: %v", err)
}

func TestUnreadableCarriedBucketsAreCountedAndTheClassIsStillTaken(t *testing.T) {
	store := &memBuckets{owner: 1, data: map[string][]byte{"gold": []byte("{not json")}}
	sync, _, _, m := bucketOwner(t, store)
	sync.Acquired("gold")
	require.Equal(t, 1.0, testutil.ToFloat64(m.bucketSyncErrors.WithLabelValues("load")))

	valid, err := json.Marshal([]scheduler.TenantBucket{{Tenant: "acme"}}) // no capacity: skipped
	require.NoError(t, err)
	store.data["gold"] = valid
	sync.Acquired("gold")
	require.Equal(t, 1.0, testutil.ToFloat64(m.bucketSyncErrors.WithLabelValues("load")))
}

// A stop that releases many classes while etcd fails waits for one failed
// final save, not one per class: the next ones within the timeout are
// skipped (and counted).
func TestAfterAFailedFinalSaveTheNextOnesWithinTheTimeoutAreSkipped(t *testing.T) {
	store := &memBuckets{owner: 7, data: map[string][]byte{}}
	fake := clock.NewFake(time.Now())
	sync, _, _, m := bucketOwnerAt(t, store, fake)
	sync.Released("gold", 6) // refused: not the owner at 6
	sync.Released("gold", 7)
	require.Zero(t, store.saves, "skipped within the timeout of the failure")
	require.Equal(t, 2.0, testutil.ToFloat64(m.bucketSyncErrors.WithLabelValues("save")))
	fake.Advance(time.Second)
	sync.Released("gold", 7)
	require.Equal(t, 1, store.saves, "saved again once the timeout passed")
}
