package cluster

import (
	"context"
	"net/url"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.etcd.io/etcd/server/v3/embed"
	"google.golang.org/grpc"

	"github.com/switchyard/switchyard/internal/links"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

// restartableEtcd is an embedded single-member etcd that a test can stop and
// start again on the same ports and data directory, as an operator's
// restart does: its leases survive the restart (etcd extends them by their
// TTL when its leader is elected again).
type restartableEtcd struct {
	t   *testing.T
	cfg *embed.Config
	e   *embed.Etcd
}

func startRestartableEtcd(t *testing.T) *restartableEtcd {
	t.Helper()
	cfg := embed.NewConfig()
	cfg.Dir = filepath.Join(t.TempDir(), "etcd")
	cfg.Logger, cfg.LogLevel, cfg.LogOutputs = "zap", "fatal", []string{"stderr"}
	clientURL, err := url.Parse("http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)))
	require.NoError(t, err)
	peerURL, err := url.Parse("http://127.0.0.1:" + strconv.Itoa(testenv.FreePort(t)))
	require.NoError(t, err)
	cfg.ListenClientUrls, cfg.AdvertiseClientUrls = []url.URL{*clientURL}, []url.URL{*clientURL}
	cfg.ListenPeerUrls, cfg.AdvertisePeerUrls = []url.URL{*peerURL}, []url.URL{*peerURL}
	cfg.InitialCluster = cfg.Name + "=" + peerURL.String()
	cfg.ListenMetricsUrls = nil
	r := &restartableEtcd{t: t, cfg: cfg}
	r.start()
	t.Cleanup(r.stop)
	return r
}

func (r *restartableEtcd) start() {
	r.t.Helper()
	e, err := embed.StartEtcd(r.cfg)
	require.NoError(r.t, err)
	select {
	case <-e.Server.ReadyNotify():
	case <-time.After(30 * time.Second):
		e.Close()
		r.t.Fatal("embedded etcd did not become ready within 30s")
	}
	r.e = e
}

func (r *restartableEtcd) stop() {
	if r.e != nil {
		r.e.Close()
		r.e = nil
	}
}

func (r *restartableEtcd) env() *testenv.Etcd {
	return &testenv.Etcd{Server: r.e, Endpoints: []string{r.cfg.ListenClientUrls[0].String()}}
}

// e2e scenario 7 stops etcd for three TTLs under load: every owner fences
// itself, and a class has no owner until its owner's session is healthy
// again (same lease: etcd extended it on restart) or replaced. That must
// happen as soon as etcd answers, not when the old lease has run out a TTL
// after etcd's return. The bound here (TTL/2 after etcd is ready) is far
// below the TTL, so an owner that waits for its old lease to expire fails.
func TestAFencedOwnerOwnsItsClassAgainAsSoonAsARestartedEtcdAnswers(t *testing.T) {
	const ttl = 4 * time.Second
	et := startRestartableEtcd(t)
	e := et.env()
	c := &harness{t: t, etcd: e, admin: e.Client(t), tl: &timeline{}, ttl: ttl, settle: 100 * time.Millisecond, classes: []string{"gold"}}
	ok, err := SeedConfig(testenv.Context(t), c.admin, testCluster, policyYAML("gold"), false)
	require.NoError(t, err)
	require.True(t, ok)
	a := c.start("a", nodeOpts{regrant: true, dial: []grpc.DialOption{grpc.WithConnectParams(links.EtcdReconnect)}})
	lease := a.sess.Lease()
	testenv.Eventually(t, 10*time.Second, func() bool { _, held := a.heldClasses()["gold"]; return held }, "a to own gold")
	// As the router's membership does: register again under a new lease.
	reregister := make(chan struct{})
	go func() {
		defer close(reregister)
		st := a.sess.Status()
		for !st.Done {
			<-st.Changed()
			st = a.sess.Status()
			if st.Healthy && st.Lease != lease {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				if a.sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: "a", HTTPAddr: "127.0.0.1:1", Ready: true}) == nil {
					lease = st.Lease
				}
				cancel()
			}
		}
	}()
	t.Cleanup(func() { a.kill(); <-reregister })

	et.stop()
	testenv.Eventually(t, 10*time.Second, func() bool { _, held := a.heldClasses()["gold"]; return !held }, "a to fence itself")
	// Three TTLs away, as in scenario 7 (the session fenced at TTL/2).
	time.Sleep(3 * ttl) //nolint:forbidigo // the outage's length is the scenario, not a wait for progress
	et.start()
	back := time.Now()
	// Watch gold for two TTLs after etcd is back: the longest time it has
	// no owner here is what requests for it wait.
	var gap, longest time.Duration
	var since time.Time
	for time.Since(back) < 2*ttl {
		_, held := a.heldClasses()["gold"]
		switch {
		case !held && since.IsZero():
			since = time.Now()
		case held && !since.IsZero():
			gap, since = time.Since(since), time.Time{}
			longest = max(longest, gap)
		}
		time.Sleep(5 * time.Millisecond) //nolint:forbidigo // sampling ownership over a fixed window
	}
	if !since.IsZero() {
		longest = max(longest, time.Since(since))
	}
	t.Logf("longest time gold had no owner after etcd was back: %v", longest)
	require.Less(t, longest, ttl/2, "the owner waited for its old lease instead of renewing or replacing it as soon as etcd answered")
}
