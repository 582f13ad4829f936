package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/scheduler"
)

// BucketStore keeps each class's carried tenant bucket levels
// (cluster.Buckets). Save must fail when this replica no longer owns the
// class at epoch.
type BucketStore interface {
	Save(ctx context.Context, class string, epoch int64, data []byte) error
	Load(ctx context.Context, class string) ([]byte, error)
}

// BucketActor exports and merges a class's tenant bucket levels on the
// actor's turn (ActorBuckets adapts a *scheduler.Actor).
type BucketActor interface {
	TenantBuckets(ctx context.Context, class string) ([]scheduler.TenantBucket, error)
	MergeTenantBuckets(ctx context.Context, class string, carried []scheduler.TenantBucket) error
}

// ActorBuckets adapts a scheduler actor to BucketActor.
func ActorBuckets(a *scheduler.Actor) BucketActor { return actorBuckets{a} }

type actorBuckets struct{ a *scheduler.Actor }

func (b actorBuckets) TenantBuckets(ctx context.Context, class string) ([]scheduler.TenantBucket, error) {
	var out []scheduler.TenantBucket
	err := b.a.Do(ctx, func(c *scheduler.Core) { out = c.TenantBuckets(class) })
	return out, err
}

func (b actorBuckets) MergeTenantBuckets(ctx context.Context, class string, carried []scheduler.TenantBucket) error {
	return b.a.Do(ctx, func(c *scheduler.Core) { c.MergeTenantBuckets(class, carried) })
}

// BucketSync makes a class's token buckets travel with it (design §16):
// while this replica owns a class it saves the levels of the tenants the
// class charged every interval (only when they changed), and once more,
// exactly, when it hands the class off (a bucket that is only refilling
// since the last save is not saved again); a new owner merges the saved levels
// before it admits anything (Acquired). So a graceful move carries the
// buckets exactly, and a crash loses at most the last interval's charges.
// Saves of one class are serialized, and the store refuses a save from a
// replica that no longer owns the class at its epoch.
type BucketSync struct {
	store    BucketStore
	actor    BucketActor
	server   *Server
	interval time.Duration
	timeout  time.Duration
	clock    clock.Clock
	log      *zap.Logger
	m        *Metrics

	mu   sync.Mutex                          // serializes saves
	last map[string][]scheduler.TenantBucket // per class, the levels last saved
	// finalFailed is when a final save last failed: the final saves of
	// the next timeout are skipped, so that a stop releasing many classes
	// while etcd does not answer waits one timeout, not one per class.
	finalFailed time.Time
}

// NewBucketSync returns the bucket carrier of the classes server owns.
// interval is the save period; timeout bounds each etcd operation.
func NewBucketSync(store BucketStore, actor BucketActor, server *Server, interval, timeout time.Duration, clk clock.Clock, log *zap.Logger, m *Metrics) *BucketSync {
	return &BucketSync{store: store, actor: actor, server: server, interval: interval, timeout: timeout,
		clock: clockOr(clk), log: log.Named("bucket_sync"), m: m, last: map[string][]scheduler.TenantBucket{}}
}

// Run saves the owned classes' levels every interval until ctx ends.
func (b *BucketSync) Run(ctx context.Context) error {
	t := b.clock.NewTicker(b.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
		for _, class := range b.server.OwnedClasses() {
			if epoch, ok := b.server.Owns(class); ok {
				b.save(ctx, class, epoch, false)
			}
		}
	}
}

// Acquired merges the levels saved for class into the actor. It runs before
// the class is admitted here (OnAcquire, before Server.Own). On error the
// buckets start as they are (full for unseen tenants): counted and logged,
// never a reason to refuse the class.
func (b *BucketSync) Acquired(class string) {
	b.mu.Lock()
	delete(b.last, class)
	b.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	data, err := b.store.Load(ctx, class)
	if err == nil && data != nil {
		var carried []scheduler.TenantBucket
		if err = json.Unmarshal(data, &carried); err != nil {
			err = fmt.Errorf("decode buckets of class %s: %w", class, err)
		} else {
			err = b.actor.MergeTenantBuckets(ctx, class, carried)
		}
	}
	if err != nil {
		b.m.bucketSyncErrors.WithLabelValues("load").Inc()
		b.log.Warn("carried buckets not loaded: they start full", zap.String("class", class), zap.Error(err))
	}
}

// Released saves class's levels once more after this replica stopped
// admitting it at epoch (OnRelease of a hand-off or a shutdown, after
// Server.Disown and before the owner key is deleted): the next owner then
// starts from exactly these levels.
func (b *BucketSync) Released(class string, epoch int64) {
	b.mu.Lock()
	skip := !b.finalFailed.IsZero() && b.clock.Now().Sub(b.finalFailed) < b.timeout
	b.mu.Unlock()
	if skip {
		b.m.bucketSyncErrors.WithLabelValues("save").Inc()
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.timeout)
	defer cancel()
	if !b.save(ctx, class, epoch, true) {
		b.mu.Lock()
		b.finalFailed = b.clock.Now()
		b.mu.Unlock()
	}
}

// save stores class's levels at epoch; false when they could not be.
func (b *BucketSync) save(ctx context.Context, class string, epoch int64, final bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.server.Owns(class); !ok && !final {
		return true // released meanwhile: its final save has run or is not ours to do
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	levels, err := b.actor.TenantBuckets(ctx, class)
	if err != nil {
		return false // the actor stopped: the replica is stopping
	}
	data, err := json.Marshal(levels)
	if err != nil {
		b.m.bucketSyncErrors.WithLabelValues("save").Inc()
		return false
	}
	if prev, ok := b.last[class]; ok && !final && sameAsRefilled(prev, levels) {
		return true // nothing charged since: the saved levels refill to these
	}
	if err := b.store.Save(ctx, class, epoch, data); err != nil {
		b.m.bucketSyncErrors.WithLabelValues("save").Inc()
		b.log.Warn("buckets not saved", zap.String("class", class), zap.Bool("final", final), zap.Error(err))
		return false
	}
	b.last[class] = levels
	return true
}

// Saved returns the levels of class this replica last saved (a copy), and
// false when it has saved none since it acquired the class. A crash
// refunds what was charged since then: the successor starts from these.
func (b *BucketSync) Saved(class string) ([]scheduler.TenantBucket, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	levels, ok := b.last[class]
	return slices.Clone(levels), ok
}

// sameAsRefilled reports whether cur is what prev becomes by refilling
// alone (as the next owner refills a saved level from its time), so that
// saving cur would carry nothing new: a bucket that is only refilling
// costs no writes.
func sameAsRefilled(prev, cur []scheduler.TenantBucket) bool {
	if len(prev) != len(cur) {
		return false
	}
	for i, p := range prev {
		c := cur[i]
		if p.Tenant != c.Tenant || p.RequestsPerMinute != c.RequestsPerMinute || p.TokensPerMinute != c.TokensPerMinute {
			return false
		}
		// The Core refills in steps, this in one: allow their rounding.
		if math.Abs(refilled(p.Requests, p.RequestsPerMinute, c.At-p.At)-c.Requests) > 1e-6*float64(max(1, p.RequestsPerMinute)) ||
			math.Abs(refilled(p.Tokens, p.TokensPerMinute, c.At-p.At)-c.Tokens) > 1e-6*float64(max(1, p.TokensPerMinute)) {
			return false
		}
	}
	return true
}

func refilled(level float64, perMinute int, elapsed int64) float64 {
	if perMinute <= 0 || elapsed <= 0 {
		return level
	}
	return min(float64(perMinute), level+float64(perMinute)*float64(elapsed)/float64(time.Minute))
}
