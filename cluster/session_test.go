package cluster

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func TestSessionRefusesRegistrationsBeforeItHasALease(t *testing.T) {
	e := testenv.StartEtcd(t)
	sess, err := NewSession(e.Client(t), SessionConfig{Cluster: testCluster, TTL: 2 * time.Second}, Deps{})
	require.NoError(t, err)
	err = sess.RegisterReplica(testenv.Context(t), wire.ReplicaInfo{ID: "r1"})
	require.ErrorIs(t, err, ErrNoLease)
	require.False(t, sess.Healthy(), "a session without a lease fences everything")
}

func TestSessionRejectsInvalidRecordsBeforeWritingThem(t *testing.T) {
	e := testenv.StartEtcd(t)
	sess, err := NewSession(e.Client(t), SessionConfig{Cluster: testCluster, TTL: 2 * time.Second}, Deps{})
	require.NoError(t, err)
	runInBackground(t, sess.Run)
	ctx := testenv.Context(t)
	_, err = sess.WaitLease(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: "bad/id"}), wire.ErrMalformed)
	w := testWorker("w1")
	w.KVBlocks = 0
	require.ErrorIs(t, sess.RegisterWorker(ctx, w), wire.ErrMalformed)
}

func TestSessionStaysHealthyWhileRenewingAndRevokeDeletesItsKeys(t *testing.T) {
	e := testenv.StartEtcd(t)
	admin := e.Client(t)
	reg := prometheus.NewRegistry()
	sess, err := NewSession(e.Client(t), SessionConfig{Cluster: testCluster, TTL: 2 * time.Second}, Deps{Registerer: reg})
	require.NoError(t, err)
	ctx, stop := context.WithCancel(testenv.Context(t))
	done := make(chan error, 1)
	go func() { done <- sess.Run(ctx) }()
	_, err = sess.WaitLease(ctx)
	require.NoError(t, err)
	require.True(t, sess.Healthy())
	require.NoError(t, sess.RegisterWorker(ctx, testWorker("w1")))

	// Outlive the TTL: renewals must keep the key alive.
	granted := sess.LastRenewal()
	testenv.Eventually(t, 10*time.Second, func() bool {
		return time.Since(granted) > sess.TTL()*3/2 && testutil.ToFloat64(sess.renewals.WithLabelValues("ok")) >= 4
	}, "renewals did not keep going")
	require.True(t, sess.Healthy())
	resp, err := admin.Get(ctx, wire.NewKeys(testCluster).Worker("w1"))
	require.NoError(t, err)
	require.Len(t, resp.Kvs, 1, "the leased key survives while the session renews")
	require.Equal(t, float64(1), testutil.ToFloat64(sess.healthy))

	stop()
	require.NoError(t, <-done)
	require.True(t, sess.Status().Done, "a stopped session is done")
	require.NoError(t, sess.Revoke(testenv.Context(t)))
	resp, err = admin.Get(testenv.Context(t), wire.NewKeys(testCluster).Workers(), clientv3.WithPrefix())
	require.NoError(t, err)
	require.Empty(t, resp.Kvs, "revoking the lease deletes what was bound to it")
}
