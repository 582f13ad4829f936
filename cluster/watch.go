package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/metrics"
)

var (
	errCompacted   = errors.New("watch revision compacted")
	errWatchClosed = errors.New("watch channel closed")
)

// watcher lists a key (or prefix) and then watches it from the revision after
// the list, so no change is missed between the two. When the watch ends
// (compaction, leader loss, transport error) it re-lists after a pause: the
// list is the truth, events are only deltas against it.
type watcher struct {
	client  *clientv3.Client
	key     string
	prefix  bool
	retry   time.Duration
	clock   clock.Clock
	log     *zap.Logger
	relists prometheus.Counter

	onList   func(rev int64, kvs []*mvccpb.KeyValue)
	onEvents func(rev int64, evs []*clientv3.Event)
}

func (w *watcher) run(ctx context.Context) error {
	for {
		err := w.once(ctx)
		if ctx.Err() != nil {
			return nil //nolint:nilerr // the watch ends because its context did: a normal stop, not a failure
		}
		w.relists.Inc()
		w.log.Info("re-listing after watch ended", zap.String("key", w.key), zap.Error(err))
		select {
		case <-ctx.Done():
			return nil
		case <-w.clock.After(w.retry):
		}
	}
}

func (w *watcher) opts() []clientv3.OpOption {
	if w.prefix {
		return []clientv3.OpOption{clientv3.WithPrefix()}
	}
	return nil
}

func (w *watcher) once(ctx context.Context) error {
	resp, err := w.client.Get(ctx, w.key, w.opts()...)
	if err != nil {
		return fmt.Errorf("list %s: %w", w.key, err)
	}
	rev := resp.Header.Revision
	w.onList(rev, resp.Kvs)

	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	ch := w.client.Watch(wctx, w.key, append(w.opts(), clientv3.WithRev(rev+1))...)
	for wr := range ch {
		if wr.CompactRevision != 0 {
			return fmt.Errorf("%w at %d", errCompacted, wr.CompactRevision)
		}
		if err := wr.Err(); err != nil {
			return fmt.Errorf("watch %s: %w", w.key, err)
		}
		if len(wr.Events) == 0 {
			continue
		}
		w.onEvents(wr.Header.Revision, wr.Events)
	}
	return errWatchClosed
}

// Snapshot is an immutable view of a watched etcd prefix at Revision. Items
// must not be modified. Changed is closed when a newer snapshot replaces this
// one, so consumers wait for changes without the watch ever blocking on them.
type Snapshot[T any] struct {
	// Revision is the etcd revision the view reflects; 0 before the first list.
	Revision int64
	Items    map[string]T
	changed  chan struct{}
}

// Changed is closed when the snapshot is superseded.
func (s *Snapshot[T]) Changed() <-chan struct{} { return s.changed }

// cacheSpec says how to turn records under a prefix into items.
type cacheSpec[T any] struct {
	name string // metric label and logger name
	// id maps a key to the item id; an error counts as a decode error.
	id func(key string) (string, error)
	// decode builds the item of a put; prev is the current item with that id.
	decode func(kv *mvccpb.KeyValue, prev T, hadPrev bool) (T, error)
	// tombstone, if set, keeps an item (e.g. a class's last epoch) after its
	// key is deleted; live says which items are not tombstones.
	tombstone func(prev T) (T, bool)
	live      func(T) bool
}

// cache is a watched, decoded copy of one etcd prefix.
type cache[T any] struct {
	spec    cacheSpec[T]
	w       watcher
	snap    atomic.Pointer[Snapshot[T]]
	synced  chan struct{}
	started atomic.Bool

	size       prometheus.Gauge
	decodeErrs prometheus.Counter
}

func newCache[T any](client *clientv3.Client, key string, prefix bool, retry time.Duration, spec cacheSpec[T], deps Deps) *cache[T] {
	deps = deps.withDefaults()
	f := promauto.With(prometheus.WrapRegistererWith(prometheus.Labels{"registry": spec.name}, deps.Registerer))
	c := &cache[T]{
		spec:   spec,
		synced: make(chan struct{}),
		size: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameClusterRegistrySize,
			Help: "Live records in a watched etcd registry.",
		}),
		decodeErrs: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterDecodeErrors,
			Help: "Records in a watched etcd registry that could not be decoded and were ignored.",
		}),
	}
	c.w = watcher{
		client: client, key: key, prefix: prefix, retry: retry, clock: deps.Clock,
		log: deps.Logger.Named(spec.name),
		relists: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterWatchRelists,
			Help: "Times a registry watch ended with an error and the prefix was listed again.",
		}),
		onList: c.onList, onEvents: c.onEvents,
	}
	c.snap.Store(&Snapshot[T]{Items: map[string]T{}, changed: make(chan struct{})})
	return c
}

// run keeps the cache current until ctx ends.
func (c *cache[T]) run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return fmt.Errorf("cluster: %s registry Run called twice", c.spec.name)
	}
	return c.w.run(ctx)
}

func (c *cache[T]) snapshot() *Snapshot[T] { return c.snap.Load() }

func (c *cache[T]) waitSynced(ctx context.Context) error {
	select {
	case <-c.synced:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *cache[T]) badRecord(key string, err error) {
	c.decodeErrs.Inc()
	c.w.log.Warn("ignoring bad record", zap.String("key", key), zap.Error(err))
}

func (c *cache[T]) onList(rev int64, kvs []*mvccpb.KeyValue) {
	old := c.snap.Load()
	items := make(map[string]T, len(kvs))
	for _, kv := range kvs {
		id, err := c.spec.id(string(kv.Key))
		if err != nil {
			c.badRecord(string(kv.Key), err)
			continue
		}
		prev, had := old.Items[id]
		v, err := c.spec.decode(kv, prev, had)
		if err != nil {
			c.badRecord(string(kv.Key), err)
			continue
		}
		items[id] = v
	}
	if c.spec.tombstone != nil {
		for id, prev := range old.Items {
			if _, ok := items[id]; !ok {
				if t, keep := c.spec.tombstone(prev); keep {
					items[id] = t
				}
			}
		}
	}
	c.publish(rev, items)
	select {
	case <-c.synced:
	default:
		close(c.synced)
	}
}

func (c *cache[T]) onEvents(rev int64, evs []*clientv3.Event) {
	old := c.snap.Load()
	items := make(map[string]T, len(old.Items)+1)
	for id, v := range old.Items {
		items[id] = v
	}
	for _, ev := range evs {
		key := string(ev.Kv.Key)
		id, err := c.spec.id(key)
		if err != nil {
			if ev.Type == clientv3.EventTypePut {
				c.badRecord(key, err)
			}
			continue
		}
		prev, had := items[id]
		var drop bool
		if ev.Type == clientv3.EventTypeDelete {
			drop = true
		} else if v, err := c.spec.decode(ev.Kv, prev, had); err != nil {
			// A record that turned bad is no longer trustworthy: forget it.
			c.badRecord(key, err)
			drop = true
		} else {
			items[id] = v
		}
		if drop {
			delete(items, id)
			if had && c.spec.tombstone != nil {
				if t, keep := c.spec.tombstone(prev); keep {
					items[id] = t
				}
			}
		}
	}
	c.publish(rev, items)
}

func (c *cache[T]) publish(rev int64, items map[string]T) {
	old := c.snap.Load()
	c.snap.Store(&Snapshot[T]{Revision: rev, Items: items, changed: make(chan struct{})})
	close(old.changed)
	n := 0
	for _, v := range items {
		if c.spec.live == nil || c.spec.live(v) {
			n++
		}
	}
	c.size.Set(float64(n))
}

// idUnder returns an id function for keys directly under prefix.
func idUnder(prefix string) func(string) (string, error) {
	return func(key string) (string, error) {
		id, ok := strings.CutPrefix(key, prefix)
		if !ok || id == "" || strings.Contains(id, "/") {
			return "", fmt.Errorf("%w: key %q is not a record under %q", ErrBadRecord, key, prefix)
		}
		return id, nil
	}
}
