package cluster

import (
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/wire"
)

func FuzzDecodeOwner(f *testing.F) {
	f.Add([]byte("replica-1"), int64(7), int64(42))
	f.Add([]byte(""), int64(0), int64(0))
	f.Add([]byte("a/b"), int64(-1), int64(1))
	f.Add([]byte{0xff, 0xfe}, int64(3), int64(0))
	f.Fuzz(func(t *testing.T, val []byte, createRev, lease int64) {
		o, err := decodeOwner(val, createRev, lease)
		if err != nil {
			return
		}
		if !wire.ValidName(o.Replica) || o.Epoch <= 0 {
			t.Fatalf("accepted %q@%d", o.Replica, o.Epoch)
		}
	})
}

func FuzzDecodeReplicaRecord(f *testing.F) {
	prefix := wire.NewKeys(testCluster).Replicas()
	good, _ := wire.EncodeReplicaInfo(&wire.ReplicaInfo{ID: "r1", Ready: true})
	f.Add("r1", good)
	f.Add("r2", good)
	f.Add("r1", []byte(`{"version":2,"id":"r1"}`))
	f.Add("r1", []byte(`null`))
	clock := clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	f.Fuzz(func(t *testing.T, id string, val []byte) {
		kv := &mvccpb.KeyValue{Key: []byte(prefix + id), Value: val, CreateRevision: 1, ModRevision: 1}
		r, err := decodeReplica(prefix, kv, Replica{}, false, clock)
		if err != nil {
			return
		}
		if r.Info.ID != id || r.Info.Ready == r.ReadySince.IsZero() {
			t.Fatalf("accepted %+v under id %q", r, id)
		}
	})
}

func FuzzDecodeWorkerRecord(f *testing.F) {
	prefix := wire.NewKeys(testCluster).Workers()
	good, _ := wire.EncodeWorkerInfo(ptr(testWorker("w1")))
	f.Add("w1", good)
	f.Add("w2", good)
	f.Add("w1", []byte(`{"version":1,"id":"w1","url":"u","block_size":-1}`))
	f.Fuzz(func(t *testing.T, id string, val []byte) {
		kv := &mvccpb.KeyValue{Key: []byte(prefix + id), Value: val}
		w, err := decodeWorker(prefix, kv)
		if err != nil {
			return
		}
		if w.Info.ID != id || w.Info.BlockSize <= 0 {
			t.Fatalf("accepted %+v under id %q", w, id)
		}
	})
}
