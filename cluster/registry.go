package cluster

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

// Replica is one registered router replica as seen by this process.
type Replica struct {
	Info           wire.ReplicaInfo
	Lease          clientv3.LeaseID
	CreateRevision int64
	ModRevision    int64
	// ReadySince is when this process first saw the replica ready without
	// interruption (its local clock); zero while it is not ready. Placement
	// uses it to let a replica settle before classes are handed to it.
	ReadySince time.Time
}

// Worker is one registered worker.
type Worker struct {
	Info           wire.WorkerInfo
	Lease          clientv3.LeaseID
	CreateRevision int64
	ModRevision    int64
}

// Replicas is the watched replica registry (prefix Keys.Replicas()).
type Replicas struct{ c *cache[Replica] }

// NewReplicas builds the registry; Run fills and maintains it.
func NewReplicas(client *clientv3.Client, cfg RegistryConfig, deps Deps) (*Replicas, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	deps = deps.withDefaults()
	prefix := wire.NewKeys(cfg.Cluster).Replicas()
	clock := deps.Clock
	spec := cacheSpec[Replica]{
		name: "replicas",
		id:   idUnder(prefix),
		decode: func(kv *mvccpb.KeyValue, prev Replica, had bool) (Replica, error) {
			return decodeReplica(prefix, kv, prev, had, clock)
		},
	}
	return &Replicas{c: newCache(client, prefix, true, cfg.RetryInterval, spec, deps)}, nil
}

func decodeReplica(prefix string, kv *mvccpb.KeyValue, prev Replica, had bool, clock clock.Clock) (Replica, error) {
	info, err := wire.DecodeReplicaInfo(kv.Value)
	if err != nil {
		return Replica{}, err
	}
	if want := string(kv.Key)[len(prefix):]; info.ID != want {
		return Replica{}, fmt.Errorf("%w: replica record %q under key of %q", wire.ErrMalformed, info.ID, want)
	}
	r := Replica{Info: *info, Lease: clientv3.LeaseID(kv.Lease), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}
	// A re-registration under a new lease is a new incarnation: it settles anew.
	if info.Ready {
		if had && prev.Info.Ready && prev.Lease == r.Lease {
			r.ReadySince = prev.ReadySince
		} else {
			r.ReadySince = clock.Now()
		}
	}
	return r, nil
}

// Run keeps the registry current until ctx ends; it returns nil then.
func (r *Replicas) Run(ctx context.Context) error { return r.c.run(ctx) }

// Snapshot returns the current immutable view, keyed by replica id.
func (r *Replicas) Snapshot() *Snapshot[Replica] { return r.c.snapshot() }

// WaitSynced blocks until the first list has been applied or ctx ends.
func (r *Replicas) WaitSynced(ctx context.Context) error { return r.c.waitSynced(ctx) }

// Workers is the watched worker registry (prefix Keys.Workers()).
type Workers struct{ c *cache[Worker] }

// NewWorkers builds the registry; Run fills and maintains it.
func NewWorkers(client *clientv3.Client, cfg RegistryConfig, deps Deps) (*Workers, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	prefix := wire.NewKeys(cfg.Cluster).Workers()
	spec := cacheSpec[Worker]{
		name: "workers",
		id:   idUnder(prefix),
		decode: func(kv *mvccpb.KeyValue, _ Worker, _ bool) (Worker, error) {
			return decodeWorker(prefix, kv)
		},
	}
	return &Workers{c: newCache(client, prefix, true, cfg.RetryInterval, spec, deps)}, nil
}

func decodeWorker(prefix string, kv *mvccpb.KeyValue) (Worker, error) {
	info, err := wire.DecodeWorkerInfo(kv.Value)
	if err != nil {
		return Worker{}, err
	}
	if want := string(kv.Key)[len(prefix):]; info.ID != want {
		return Worker{}, fmt.Errorf("%w: worker record %q under key of %q", wire.ErrMalformed, info.ID, want)
	}
	return Worker{Info: *info, Lease: clientv3.LeaseID(kv.Lease), CreateRevision: kv.CreateRevision, ModRevision: kv.ModRevision}, nil
}

// Run keeps the registry current until ctx ends; it returns nil then.
func (w *Workers) Run(ctx context.Context) error { return w.c.run(ctx) }

// Snapshot returns the current immutable view, keyed by worker id.
func (w *Workers) Snapshot() *Snapshot[Worker] { return w.c.snapshot() }

// PublishesEvents reports whether worker registered as publishing KV
// events. An unknown worker counts as publishing: nothing is routed to it.
func (w *Workers) PublishesEvents(worker string) bool {
	it, ok := w.Snapshot().Items[worker]
	return !ok || it.Info.PublishesEvents
}

// WaitSynced blocks until the first list has been applied or ctx ends.
func (w *Workers) WaitSynced(ctx context.Context) error { return w.c.waitSynced(ctx) }
