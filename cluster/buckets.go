package cluster

import (
	"context"
	"errors"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/wire"
)

// ErrNotOwner is returned by Buckets.Save when the class's owner key no
// longer has the saver's epoch: a deposed owner must not overwrite what
// the next one carries.
var ErrNotOwner = errors.New("cluster: not the owner of the class at that epoch")

// Buckets keeps each class's carried tenant bucket levels (design §16) at
// buckets/<class>, an opaque value the admission layer encodes. The key
// has no lease: the levels must outlive an owner that crashed, so that the
// next owner starts from them and not from full buckets. One key per class
// of the policy (a class removed from it leaves its key behind, a few
// hundred bytes, overwritten if the class comes back).
type Buckets struct {
	cli  *clientv3.Client
	keys wire.Keys
	dir  string // "buckets/" or "quota/"
}

// NewBuckets returns the bucket store of cluster on cli.
func NewBuckets(cli *clientv3.Client, cluster string) *Buckets {
	return &Buckets{cli: cli, keys: wire.NewKeys(cluster), dir: "buckets/"}
}

// NewQuotaBuckets returns the store of the central buckets of the tenants
// whose home class is the key's class (capacity leasing, design §16), at
// quota/<class>, with the same fencing as NewBuckets'.
func NewQuotaBuckets(cli *clientv3.Client, cluster string) *Buckets {
	return &Buckets{cli: cli, keys: wire.NewKeys(cluster), dir: "quota/"}
}

func (b *Buckets) key(class string) string { return b.keys.Prefix() + b.dir + class }

// Save stores data for class if this replica still owns it at epoch (its
// owner key's create revision): one transaction, so a fenced or deposed
// owner's late save fails with ErrNotOwner instead of overwriting the next
// owner's levels.
func (b *Buckets) Save(ctx context.Context, class string, epoch int64, data []byte) error {
	resp, err := b.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(b.keys.ClassOwner(class)), "=", epoch)).
		Then(clientv3.OpPut(b.key(class), string(data))).
		Commit()
	if err != nil {
		return fmt.Errorf("save buckets of class %s: %w", class, err)
	}
	if !resp.Succeeded {
		return fmt.Errorf("save buckets of class %s at epoch %d: %w", class, epoch, ErrNotOwner)
	}
	return nil
}

// Load returns the levels last saved for class, nil when none were.
func (b *Buckets) Load(ctx context.Context, class string) ([]byte, error) {
	resp, err := b.cli.Get(ctx, b.key(class))
	if err != nil {
		return nil, fmt.Errorf("load buckets of class %s: %w", class, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, nil
	}
	return resp.Kvs[0].Value, nil
}
