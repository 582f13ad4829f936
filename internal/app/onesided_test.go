package app

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics"
)

// One-sided faults: a replica loses one of its links (NATS, etcd, gossip)
// and keeps the others (docs/architecture.md, "Failures").

// startCutOwner starts r1..r3 with the replica that rendezvous places class
// on connected to NATS through a proxy the test can cut, and waits for the
// placement. It returns that replica, the other two, and the proxy.
func startCutOwner(t *testing.T, c *testCluster, class string) (*runningReplica, []*runningReplica, *testenv.Proxy) {
	t.Helper()
	ids := []string{"r1", "r2", "r3"}
	ownerID := cluster.Place(class, ids)
	px := testenv.StartProxy(t, strings.TrimPrefix(c.nats.URL, "nats://"))
	var owner *runningReplica
	var others []*runningReplica
	for _, id := range ids {
		if id == ownerID {
			owner = c.startReplicaWith(id, "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.NATSURL = "nats://" + px.Addr() })
			continue
		}
		others = append(others, c.startReplica(id))
	}
	c.waitPlaced(defaultClasses, ids...)
	return owner, others, px
}

// An owner whose NATS link is cut while its etcd session stays healthy used
// to keep its classes for as long as the cut lasted, and every other
// replica's requests for them waited NoOwnerTimeout (30 s) for a 503. Now
// it withdraws from placement after -nats-unreachable-after (2 s): its
// classes move to the replicas that can serve them, it keeps serving its
// own entries in degraded mode, and it takes its share back once NATS is
// back. The client gives up after 15 s, so a request that waits for the
// old 30 s fails the test.
func TestAnOwnerCutFromNATSHandsItsClassesToTheReplicasThatCanServeThem(t *testing.T) {
	c := newTestCluster(t, 2)
	const class = "interactive"
	owner, others, px := startCutOwner(t, c, class)
	httpc := &http.Client{Timeout: 15 * time.Second}

	px.Cut()
	for i, r := range others {
		for n := range 3 {
			a := completeVia(httpc, r.status.HTTPAddr, class, 10*i+n, shortCompletion)
			require.NoError(t, a.err, "entering %s: the request must not wait for the cut owner", r.status.ID)
			require.Equal(t, http.StatusOK, a.status, "entering %s: %s", r.status.ID, a.code)
		}
	}
	for _, r := range others {
		got := r.status.Owners()[class].Replica
		require.NotEqual(t, owner.status.ID, got, "%s sees the class moved off the cut owner", r.status.ID)
		require.NotEmpty(t, got)
	}
	require.Equal(t, 1.0, gaugeValue(t, owner, metrics.NameRouterNATSWithdrawn), "the cut owner shows its withdrawal")
	_, body := readyz(t, owner)
	require.Contains(t, body, "withdrawn: NATS unreachable")
	require.Empty(t, owner.status.Owned(), "the cut owner owns nothing")

	// Its own entries are served, admitted by its own scheduler.
	a := completeVia(httpc, owner.status.HTTPAddr, class, 99, shortCompletion)
	require.NoError(t, a.err)
	require.Equal(t, http.StatusOK, a.status, a.code)

	px.Restore()
	testenv.Eventually(t, 15*time.Second, func() bool { return gaugeValue(t, owner, metrics.NameRouterNATSWithdrawn) == 0 },
		"the owner to register as ready again once NATS is back")
	c.waitPlaced(defaultClasses, "r1", "r2", "r3")
}

// A replica cut from gossip only keeps everything that rests on its lease
// and NATS: placement and ownership use etcd alone, so it keeps owning the
// classes rendezvous gives it and admits them for every entry, and it
// enters requests for the others' classes as usual. What it loses is soft
// state (docs/architecture.md, "Failures"): the others' booked loads and
// predictions, and they its own. Here the replica never joins the others'
// gossip, the steady state of a cut that lasts.
func TestAReplicaCutFromGossipOnlyKeepsItsClassesAndServesEveryEntry(t *testing.T) {
	c := newTestCluster(t, 2)
	const class = "interactive"
	ids := []string{"r1", "r2", "r3"}
	isolatedID := cluster.Place(class, ids)
	var others []*runningReplica
	for _, id := range ids {
		if id != isolatedID {
			others = append(others, c.startReplica(id))
		}
	}
	isolated := c.startReplicaWith(isolatedID, "127.0.0.1:0", func(cfg *ReplicaConfig) { cfg.Gossip.Join = nil })
	c.waitPlaced(defaultClasses, ids...)
	testenv.Eventually(t, 10*time.Second, func() bool {
		return gaugeValue(t, others[0], metrics.NameGossipMembers) == 2 && gaugeValue(t, isolated, metrics.NameGossipMembers) == 1
	}, "the others gossip with each other only, the isolated replica with nobody")

	httpc := &http.Client{Timeout: 15 * time.Second}
	for i, r := range append(others, isolated) {
		for j, cl := range defaultClasses {
			a := completeVia(httpc, r.status.HTTPAddr, cl, 10*i+j, shortCompletion)
			require.NoError(t, a.err, "entering %s, class %s", r.status.ID, cl)
			require.Equal(t, http.StatusOK, a.status, "entering %s, class %s: %s", r.status.ID, cl, a.code)
		}
	}
	require.Equal(t, []string{class}, intersect(isolated.status.Owned(), []string{class}), "it still owns its class")
	require.Zero(t, gaugeValue(t, isolated, metrics.NameRouterNATSWithdrawn), "a gossip cut is no reason to withdraw")
}

func intersect(a, b []string) []string {
	var out []string
	for _, x := range a {
		if contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}
