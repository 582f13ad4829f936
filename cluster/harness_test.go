package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest"
	"google.golang.org/grpc"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/wire"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded etcd server and its gRPC stack leave background
		// goroutines that stop asynchronously after Close returns.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
		goleak.IgnoreAnyFunction("google.golang.org/grpc/internal/grpcsync.(*CallbackSerializer).run"),
	)
}

const testCluster = "test"

// yamlClassNames plays the frontend's part: it reads the top-level
// `classes:` list of objects with `name:`.
func yamlClassNames(raw []byte) ([]string, error) {
	var doc struct {
		Classes []struct {
			Name string `yaml:"name"`
		} `yaml:"classes"`
	}
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return nil, err
	}
	if doc.Classes == nil {
		return nil, errors.New("no classes list")
	}
	names := make([]string, len(doc.Classes))
	for i, c := range doc.Classes {
		names[i] = c.Name
	}
	return names, nil
}

func policyYAML(classes ...string) []byte {
	var b strings.Builder
	b.WriteString("classes:\n")
	for _, c := range classes {
		fmt.Fprintf(&b, "  - name: %s\n    quantum: 1000\n", c)
	}
	return []byte(b.String())
}

func classNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("class-%02d", i)
	}
	return out
}

// event is one ownership callback, recorded in the order callbacks ran
// across all replicas of a test (one mutex), which is their real-time order.
type event struct {
	at      time.Time
	replica string
	class   string
	acquire bool
	epoch   int64
	reason  ReleaseReason
}

// timeline records every OnAcquire/OnRelease of every replica.
type timeline struct {
	mu     sync.Mutex
	events []event
}

func (tl *timeline) add(e event) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	e.at = time.Now()
	tl.events = append(tl.events, e)
}

func (tl *timeline) snapshot() []event {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return slices.Clone(tl.events)
}

// requireNoOverlap replays the timeline and fails if a replica acquired a
// class while another replica still believed it owned it, or if a replica's
// acquire/release calls do not alternate.
func (tl *timeline) requireNoOverlap(t *testing.T) {
	t.Helper()
	holder := map[string]string{}
	for i, e := range tl.snapshot() {
		h, held := holder[e.class]
		if e.acquire {
			require.Falsef(t, held, "event %d: %s acquired %s (epoch %d) while %s still owned it", i, e.replica, e.class, e.epoch, h)
			holder[e.class] = e.replica
			continue
		}
		require.Truef(t, held && h == e.replica, "event %d: %s released %s (%v) it did not own (holder %q)", i, e.replica, e.class, e.reason, h)
		delete(holder, e.class)
	}
}

// harness is one embedded etcd and the replicas of a test.
type harness struct {
	t       *testing.T
	etcd    *testenv.Etcd
	admin   *clientv3.Client
	tl      *timeline
	ttl     time.Duration
	settle  time.Duration
	classes []string
}

func newTestCluster(t *testing.T, ttl, settle time.Duration, classes []string) *harness {
	e := testenv.StartEtcd(t)
	c := &harness{t: t, etcd: e, admin: e.Client(t), tl: &timeline{}, ttl: ttl, settle: settle, classes: classes}
	ok, err := SeedConfig(testenv.Context(t), c.admin, testCluster, policyYAML(classes...), false)
	require.NoError(t, err)
	require.True(t, ok)
	return c
}

// node is one replica: its own etcd client (optionally through a proxy),
// session, replica registry and ownership manager.
type node struct {
	id      string
	t       *testing.T
	client  *clientv3.Client
	proxy   *testenv.Proxy
	sess    *Session
	reps    *Replicas
	own     *Ownership
	reg     *prometheus.Registry
	stopOwn context.CancelFunc
	stopAll context.CancelFunc
	ownDone chan error
	allDone sync.WaitGroup
	sessErr chan error
	stopped bool

	mu   sync.Mutex
	held map[string]int64
}

type nodeOpts struct {
	proxied     bool
	notReady    bool
	sessionDeps Deps // Clock for the session, if a test drives it
	// regrant makes the session replace a lost lease (SessionConfig.Regrant).
	regrant bool
	// acquireErr, when set, can fail OnAcquire (the app could not start
	// admitting the class).
	acquireErr func(class string) error
	// policyLog, when set, receives "policy:<classes>" on every OnPolicy and
	// "acquire:<class>"/"release:<class>" on every ownership callback, in
	// the order they ran.
	policyLog *eventLog
	// dial adds gRPC dial options to the node's etcd client (the
	// production reconnect settings, say).
	dial []grpc.DialOption
}

// eventLog is an ordered record of callbacks.
type eventLog struct {
	mu  sync.Mutex
	log []string
}

func (l *eventLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.log = append(l.log, s)
}

func (l *eventLog) snapshot() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.log)
}

func (c *harness) start(id string, o nodeOpts) *node {
	t := c.t
	t.Helper()
	n := &node{id: id, t: t, reg: prometheus.NewRegistry(), held: map[string]int64{}, ownDone: make(chan error, 1), sessErr: make(chan error, 1)}
	endpoints := c.etcd.Endpoints
	if o.proxied {
		n.proxy = testenv.StartProxy(t, strings.TrimPrefix(c.etcd.Endpoints[0], "http://"))
		endpoints = []string{"http://" + n.proxy.Addr()}
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, Logger: zap.NewNop(), DialOptions: o.dial})
	require.NoError(t, err)
	n.client = client
	log := zaptest.NewLogger(t, zaptest.Level(zap.WarnLevel)).Named(id)

	sdeps := o.sessionDeps
	sdeps.Logger, sdeps.Registerer = log, n.reg
	n.sess, err = NewSession(client, SessionConfig{Cluster: testCluster, TTL: c.ttl, Regrant: o.regrant}, sdeps)
	require.NoError(t, err)
	deps := Deps{Logger: log, Registerer: n.reg}
	n.reps, err = NewReplicas(client, RegistryConfig{Cluster: testCluster, RetryInterval: 100 * time.Millisecond}, deps)
	require.NoError(t, err)
	n.own, err = NewOwnership(client, n.sess, n.reps, OwnershipConfig{
		Cluster: testCluster, ReplicaID: id, SettlePeriod: c.settle,
		RetryInterval: 100 * time.Millisecond, OpTimeout: time.Second,
	}, Callbacks{
		OnAcquire: func(class string, epoch int64) error {
			if o.acquireErr != nil {
				if err := o.acquireErr(class); err != nil {
					return err
				}
			}
			n.mu.Lock()
			n.held[class] = epoch
			n.mu.Unlock()
			c.tl.add(event{replica: id, class: class, acquire: true, epoch: epoch})
			if o.policyLog != nil {
				o.policyLog.add("acquire:" + class)
			}
			return nil
		},
		OnRelease: func(class string, reason ReleaseReason) {
			n.mu.Lock()
			epoch := n.held[class]
			delete(n.held, class)
			n.mu.Unlock()
			c.tl.add(event{replica: id, class: class, epoch: epoch, reason: reason})
			if o.policyLog != nil {
				o.policyLog.add("release:" + class)
			}
		},
		OnPolicy: func(v ConfigVersion) {
			if o.policyLog != nil {
				names, _ := yamlClassNames(v.Raw)
				o.policyLog.add("policy:" + strings.Join(names, ","))
			}
		},
	}, yamlClassNames, deps)
	require.NoError(t, err)

	allCtx, stopAll := context.WithCancel(context.Background())
	ownCtx, stopOwn := context.WithCancel(allCtx)
	n.stopAll, n.stopOwn = stopAll, stopOwn
	n.allDone.Add(3)
	go func() { defer n.allDone.Done(); n.sessErr <- n.sess.Run(allCtx) }()
	go func() { defer n.allDone.Done(); _ = n.reps.Run(allCtx) }()
	go func() { defer n.allDone.Done(); n.ownDone <- n.own.Run(ownCtx) }()
	t.Cleanup(n.kill)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = n.sess.WaitLease(ctx)
	require.NoError(t, err)
	require.NoError(t, n.sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: id, HTTPAddr: "127.0.0.1:1", Ready: !o.notReady}))
	return n
}

func (n *node) setReady(ready bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(n.t, n.sess.RegisterReplica(ctx, wire.ReplicaInfo{ID: n.id, HTTPAddr: "127.0.0.1:1", Ready: ready}))
}

// leave stops the replica gracefully: ownership first (it releases and
// deletes its keys), then the rest, then the lease is revoked.
func (n *node) leave() {
	if n.stopped {
		return
	}
	n.stopped = true
	n.stopOwn()
	<-n.ownDone //nolint:errcheck // waiting for the exit; the loop's error is checked where it is recorded
	n.stopAll()
	n.allDone.Wait()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	require.NoError(n.t, n.sess.Revoke(ctx))
	_ = n.client.Close()
}

// kill stops the replica as a crash would: the client is closed first, so
// nothing it does afterwards reaches etcd and its lease is left to expire.
func (n *node) kill() {
	if n.stopped {
		return
	}
	n.stopped = true
	_ = n.client.Close()
	n.stopAll()
	n.allDone.Wait()
}

func (n *node) heldClasses() map[string]int64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]int64, len(n.held))
	for k, v := range n.held {
		out[k] = v
	}
	return out
}

// etcdOwners reads the owner keys straight from etcd.
func (c *harness) etcdOwners() map[string]Owner {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	keys := wire.NewKeys(testCluster)
	resp, err := c.admin.Get(ctx, keys.Classes(), clientv3.WithPrefix())
	require.NoError(c.t, err)
	out := map[string]Owner{}
	for _, kv := range resp.Kvs {
		class, err := keys.ClassFromOwnerKey(string(kv.Key))
		require.NoError(c.t, err)
		out[class] = Owner{Replica: string(kv.Value), Epoch: kv.CreateRevision, Lease: clientv3.LeaseID(kv.Lease)}
	}
	return out
}

// agreement reports "" when etcd, every live replica's view and every
// replica's callbacks agree that each class has exactly one owner, the one
// placement picks among the live replicas; otherwise it says what differs.
func (c *harness) agreement(live []*node) string {
	want := c.etcdOwners()
	ids := make([]string, 0, len(live))
	for _, n := range live {
		ids = append(ids, n.id)
	}
	for _, class := range c.classes {
		o, ok := want[class]
		if !ok {
			return fmt.Sprintf("class %s has no owner key", class)
		}
		if p := Place(class, ids); o.Replica != p {
			return fmt.Sprintf("class %s owned by %s, placement says %s", class, o.Replica, p)
		}
	}
	if len(want) != len(c.classes) {
		return fmt.Sprintf("%d owner keys for %d classes", len(want), len(c.classes))
	}
	for _, n := range live {
		view := n.own.Owners()
		if len(view) != len(want) {
			return fmt.Sprintf("%s sees %d owners, etcd has %d", n.id, len(view), len(want))
		}
		for class, o := range want {
			v := view[class]
			if v.Replica != o.Replica || v.Epoch != o.Epoch {
				return fmt.Sprintf("%s sees %s owned by %s@%d, etcd says %s@%d", n.id, class, v.Replica, v.Epoch, o.Replica, o.Epoch)
			}
		}
		held := n.heldClasses()
		for class, o := range want {
			epoch, ok := held[class]
			if (o.Replica == n.id) != ok || (ok && epoch != o.Epoch) {
				return fmt.Sprintf("%s believes it owns %s=%v (epoch %d), etcd says %s@%d", n.id, class, ok, epoch, o.Replica, o.Epoch)
			}
		}
	}
	return ""
}

func (c *harness) requireAgreement(live []*node, timeout time.Duration, what string) {
	c.t.Helper()
	var last string
	testenv.Eventually(c.t, timeout, func() bool {
		last = c.agreement(live)
		return last == ""
	}, "%s: replicas and etcd do not agree: %s", what, lazy{&last})
}

// lazy formats the string it points to when the failure message is built.
type lazy struct{ s *string }

func (l lazy) String() string { return *l.s }

func sortedIDs(nodes []*node) []string {
	ids := make([]string, 0, len(nodes))
	for _, n := range nodes {
		ids = append(ids, n.id)
	}
	sort.Strings(ids)
	return ids
}
