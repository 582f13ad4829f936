package cluster

import (
	"testing"

	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

// Carried bucket levels are saved only by the owner at its epoch, survive
// the owner key (no lease), and a deposed owner's late save is refused.
func TestBucketsAreSavedOnlyByTheClassOwnerAtItsEpoch(t *testing.T) {
	cli := testenv.StartEtcd(t).Client(t)
	ctx := testenv.Context(t)
	b := NewBuckets(cli, "test")
	ownerKey := wire.NewKeys("test").ClassOwner("gold")

	got, err := b.Load(ctx, "gold")
	require.NoError(t, err)
	require.Nil(t, got, "nothing saved yet")
	require.ErrorIs(t, b.Save(ctx, "gold", 1, []byte("x")), ErrNotOwner, "no owner key: nobody may save")

	put, err := cli.Put(ctx, ownerKey, "r1")
	require.NoError(t, err)
	epoch := put.Header.Revision // the key's create revision
	require.NoError(t, b.Save(ctx, "gold", epoch, []byte(`[{"tenant":"acme"}]`)))

	// The owner goes (its key deleted) and another claims the class.
	_, err = cli.Delete(ctx, ownerKey)
	require.NoError(t, err)
	got, err = b.Load(ctx, "gold")
	require.NoError(t, err)
	require.Equal(t, `[{"tenant":"acme"}]`, string(got), "the levels outlive the owner key")
	_, err = cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(ownerKey), "=", 0)).Then(clientv3.OpPut(ownerKey, "r2")).Commit()
	require.NoError(t, err)
	require.ErrorIs(t, b.Save(ctx, "gold", epoch, []byte("stale")), ErrNotOwner, "the deposed owner's save is refused")
	got, err = b.Load(ctx, "gold")
	require.NoError(t, err)
	require.Equal(t, `[{"tenant":"acme"}]`, string(got))
}

// The quota owners' central buckets live beside the classes' buckets, at
// their own key, fenced by the same owner key.
func TestQuotaBucketsAreKeptApartFromTheClassBuckets(t *testing.T) {
	cli := testenv.StartEtcd(t).Client(t)
	ctx := testenv.Context(t)
	classes, quotas := NewBuckets(cli, "test"), NewQuotaBuckets(cli, "test")
	put, err := cli.Put(ctx, wire.NewKeys("test").ClassOwner("gold"), "r1")
	require.NoError(t, err)
	epoch := put.Header.Revision
	require.NoError(t, classes.Save(ctx, "gold", epoch, []byte("class")))
	require.NoError(t, quotas.Save(ctx, "gold", epoch, []byte("quota")))
	require.ErrorIs(t, quotas.Save(ctx, "gold", epoch+1, []byte("stale")), ErrNotOwner)
	got, err := classes.Load(ctx, "gold")
	require.NoError(t, err)
	require.Equal(t, "class", string(got))
	got, err = quotas.Load(ctx, "gold")
	require.NoError(t, err)
	require.Equal(t, "quota", string(got))
	resp, err := cli.Get(ctx, wire.NewKeys("test").Prefix()+"quota/gold")
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "at quota/<class>")
}
