package cluster

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// ConfigVersion is one version of the policy classes configuration.
type ConfigVersion struct {
	Raw []byte
	// Revision is the etcd mod revision of this version; versions are
	// delivered in increasing Revision order.
	Revision int64
}

// SeedConfig stores raw under Keys.PolicyConfig() of cluster. Unless
// overwrite is set it only does so when the key is absent (one transaction),
// so replicas started with a local file do not clobber an operator's newer
// version. It reports whether raw was written.
func SeedConfig(ctx context.Context, client *clientv3.Client, cluster string, raw []byte, overwrite bool) (bool, error) {
	key := wire.NewKeys(cluster).PolicyConfig()
	if overwrite {
		if _, err := client.Put(ctx, key, string(raw)); err != nil {
			return false, fmt.Errorf("seed policy config: %w", err)
		}
		return true, nil
	}
	resp, err := client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, string(raw))).
		Commit()
	if err != nil {
		return false, fmt.Errorf("seed policy config: %w", err)
	}
	return resp.Succeeded, nil
}

// ConfigWatcher delivers every version of the policy configuration, in
// revision order, to a callback. The callback runs on Run's goroutine: while
// it runs, later versions wait (nothing else is held up). After a watch error
// the key is read again, so a version can be skipped only if it was replaced
// while the watch was down; the newest version is always delivered.
type ConfigWatcher struct {
	w       watcher
	deliver func(ConfigVersion)
	last    int64 // only touched by Run's goroutine
	started atomic.Bool
}

// NewConfigWatcher builds a watcher of cluster's policy config key.
func NewConfigWatcher(client *clientv3.Client, cfg RegistryConfig, onVersion func(ConfigVersion), deps Deps) (*ConfigWatcher, error) {
	return newConfigWatcher(client, cfg, onVersion, "config", deps)
}

func newConfigWatcher(client *clientv3.Client, cfg RegistryConfig, onVersion func(ConfigVersion), name string, deps Deps) (*ConfigWatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if onVersion == nil {
		return nil, fmt.Errorf("%w: nil config callback", ErrInvalidConfig)
	}
	deps = deps.withDefaults()
	f := promauto.With(prometheus.WrapRegistererWith(prometheus.Labels{"registry": name}, deps.Registerer))
	cw := &ConfigWatcher{deliver: onVersion}
	cw.w = watcher{
		client: client, key: wire.NewKeys(cfg.Cluster).PolicyConfig(), retry: cfg.RetryInterval,
		clock: deps.Clock, log: deps.Logger.Named(name),
		relists: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterWatchRelists,
			Help: "Times a registry watch ended with an error and the prefix was listed again.",
		}),
		onList: func(_ int64, kvs []*mvccpb.KeyValue) {
			for _, kv := range kvs {
				cw.offer(kv)
			}
		},
		onEvents: func(_ int64, evs []*clientv3.Event) {
			for _, ev := range evs {
				if ev.Type == clientv3.EventTypePut {
					cw.offer(ev.Kv)
				}
			}
		},
	}
	return cw, nil
}

func (c *ConfigWatcher) offer(kv *mvccpb.KeyValue) {
	if kv.ModRevision <= c.last {
		return
	}
	c.last = kv.ModRevision
	c.deliver(ConfigVersion{Raw: kv.Value, Revision: kv.ModRevision})
}

// Run delivers versions until ctx ends; it returns nil then. A deleted key
// delivers nothing: the last version stays in force.
func (c *ConfigWatcher) Run(ctx context.Context) error {
	if !c.started.CompareAndSwap(false, true) {
		return fmt.Errorf("cluster: ConfigWatcher.Run called twice")
	}
	return c.w.run(ctx)
}
