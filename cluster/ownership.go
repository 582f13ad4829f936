package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/wire"
)

// Owner is the current owner of a class as recorded in etcd.
type Owner struct {
	Replica string
	// Epoch is the create revision of the ownership key: it grows with every
	// new claim of the class, so a grant with an older epoch is stale.
	Epoch int64
	Lease clientv3.LeaseID
}

// ReleaseReason says why this replica stopped owning a class.
type ReleaseReason int

// Release reasons. They start at one so the zero value is never a reason.
const (
	// ReleaseHandoff: a settled, ready replica should own the class now.
	ReleaseHandoff ReleaseReason = iota + 1
	// ReleaseFenced: the session lease was not renewed for TTL/2; the class
	// may already have a new owner. It is re-acquired (same epoch) if the
	// lease turns out to be alive when renewals resume.
	ReleaseFenced
	// ReleaseSessionLost: the session ended (lease expired, client closed).
	ReleaseSessionLost
	// ReleaseLost: the key changed hands or vanished without this replica
	// deleting it.
	ReleaseLost
	// ReleaseRemoved: the class is no longer in the policy config.
	ReleaseRemoved
	// ReleaseShutdown: Ownership.Run's context ended.
	ReleaseShutdown
)

func (r ReleaseReason) String() string {
	switch r {
	case ReleaseHandoff:
		return "handoff"
	case ReleaseFenced:
		return "fenced"
	case ReleaseSessionLost:
		return "session_lost"
	case ReleaseLost:
		return "lost"
	case ReleaseRemoved:
		return "removed"
	case ReleaseShutdown:
		return "shutdown"
	}
	return fmt.Sprintf("release_reason(%d)", int(r))
}

// Callbacks tell the app which classes it may admit. Both run synchronously
// on Ownership.Run's goroutine, so they see a strict acquire/release
// alternation per class and must not block for long or call back into
// Ownership.Run's decisions (reading Owners is fine).
//
// OnAcquire runs after the claim transaction committed: from then on the
// app admits the class, stamping grants with epoch. When it returns an error
// the app could not start admitting: the class is not held, its key is
// deleted, and claiming it is retried after RetryInterval. OnRelease runs before
// the key is deleted (handoff, removal, shutdown) or as soon as the loss is
// known (fence, lost key): when it returns the app must already have stopped
// admitting and rejected its queued entries with ownership_moved.
type Callbacks struct {
	OnAcquire func(class string, epoch int64) error
	OnRelease func(class string, reason ReleaseReason)
	// OnPolicy delivers each usable policy config version to the app.
	OnPolicy func(v ConfigVersion)
}

// ClassNames extracts the class names from the raw policy config; the
// frontend owns the YAML schema, so the app passes this in.
type ClassNames func(raw []byte) ([]string, error)

// Ownership places policy classes on replicas and keeps this replica's share
// claimed. See doc.go for the protocol.
type Ownership struct {
	cfg        OwnershipConfig
	client     *clientv3.Client
	session    *Session
	replicas   *Replicas
	cb         Callbacks
	classNames ClassNames
	keys       wire.Keys
	log        *zap.Logger
	clock      clock.Clock

	owners  *cache[Owner]
	config  *ConfigWatcher
	classes atomic.Pointer[classSet]
	poke    chan struct{} // size one: "a policy version is pending"
	// pendingCfg is the newest policy version not yet applied by Run.
	pendingCfg atomic.Pointer[ConfigVersion]
	started    atomic.Bool

	// Only Run's goroutine touches the fields below.
	held         map[string]int64 // class -> epoch this replica believes it owns
	relinquished map[string]int64 // class -> epoch released by us and (to be) deleted
	waitRev      map[string]int64 // class -> owner view revision to wait for before judging it again
	retryAt      time.Time
	lease        clientv3.LeaseID         // the session lease the claims above were made under
	tracked      atomic.Pointer[[]string] // classes in relinquished or waitRev, for tests

	ownedGauge    prometheus.Gauge
	acquisitions  prometheus.Counter
	acquireErrors prometheus.Counter
	losses        *prometheus.CounterVec
	handoffs      prometheus.Counter
	configErrors  prometheus.Counter
}

// NewOwnership builds the manager. replicas must be run by the caller; the
// owner view and the config watch are run by Ownership.Run itself.
func NewOwnership(client *clientv3.Client, session *Session, replicas *Replicas, cfg OwnershipConfig,
	cb Callbacks, classNames ClassNames, deps Deps,
) (*Ownership, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if session == nil || replicas == nil || classNames == nil {
		return nil, fmt.Errorf("%w: ownership needs a session, a replica registry and a ClassNames func", ErrInvalidConfig)
	}
	if cb.OnAcquire == nil {
		cb.OnAcquire = func(string, int64) error { return nil }
	}
	if cb.OnRelease == nil {
		cb.OnRelease = func(string, ReleaseReason) {}
	}
	if cb.OnPolicy == nil {
		cb.OnPolicy = func(ConfigVersion) {}
	}
	deps = deps.withDefaults()
	keys := wire.NewKeys(cfg.Cluster)
	o := &Ownership{
		cfg: cfg, client: client, session: session, replicas: replicas, cb: cb, classNames: classNames,
		keys: keys, log: deps.Logger.Named("ownership"), clock: deps.Clock,
		poke:         make(chan struct{}, 1),
		held:         map[string]int64{},
		relinquished: map[string]int64{},
		waitRev:      map[string]int64{},
	}
	o.owners = newCache(client, keys.Classes(), true, cfg.RetryInterval, cacheSpec[Owner]{
		name: "owners",
		id:   keys.ClassFromOwnerKey,
		decode: func(kv *mvccpb.KeyValue, _ Owner, _ bool) (Owner, error) {
			return decodeOwner(kv.Value, kv.CreateRevision, kv.Lease)
		},
		tombstone: func(prev Owner) (Owner, bool) { return Owner{Epoch: prev.Epoch}, true },
		live:      func(v Owner) bool { return v.Replica != "" },
	}, deps)
	var err error
	rc := RegistryConfig{Cluster: cfg.Cluster, RetryInterval: cfg.RetryInterval}
	o.config, err = newConfigWatcher(client, rc, o.onConfig, "ownership_config", deps)
	if err != nil {
		return nil, err
	}
	o.classes.Store(&classSet{names: []string{}, changed: make(chan struct{})})
	f := promauto.With(deps.Registerer)
	o.ownedGauge = f.NewGauge(prometheus.GaugeOpts{
		Name: metrics.NameClusterClassesOwned, Help: "Classes this replica currently owns.",
	})
	o.acquisitions = f.NewCounter(prometheus.CounterOpts{
		Name: metrics.NameClusterOwnershipAcquisitions, Help: "Classes this replica started owning.",
	})
	o.acquireErrors = f.NewCounter(prometheus.CounterOpts{
		Name: metrics.NameClusterAcquireErrors, Help: "Classes this replica claimed but could not start admitting (released again).",
	})
	o.losses = f.NewCounterVec(prometheus.CounterOpts{
		Name: metrics.NameClusterOwnershipLosses, Help: "Classes this replica stopped owning, by reason.",
	}, []string{"reason"})
	// Every reason starts at zero: a dashboard's rate of losses by reason
	// is 0, not "no data", on a replica that never lost a class.
	for r := ReleaseHandoff; r <= ReleaseShutdown; r++ {
		o.losses.WithLabelValues(r.String())
	}
	o.handoffs = f.NewCounter(prometheus.CounterOpts{
		Name: metrics.NameClusterHandoffs, Help: "Classes handed to a better placed replica.",
	})
	o.configErrors = promauto.With(prometheus.WrapRegistererWith(prometheus.Labels{"registry": "ownership_config"}, deps.Registerer)).
		NewCounter(prometheus.CounterOpts{
			Name: metrics.NameClusterDecodeErrors,
			Help: "Records in a watched etcd registry that could not be decoded and were ignored.",
		})
	return o, nil
}

// decodeOwner parses the value of a class owner key: the owner's replica id.
func decodeOwner(val []byte, createRev, lease int64) (Owner, error) {
	id := string(val)
	if !wire.ValidName(id) {
		return Owner{}, fmt.Errorf("%w: class owner value %q is not a replica id", ErrBadRecord, val)
	}
	if createRev <= 0 {
		return Owner{}, fmt.Errorf("%w: class owner create revision %d", ErrBadRecord, createRev)
	}
	return Owner{Replica: id, Epoch: createRev, Lease: clientv3.LeaseID(lease)}, nil
}

// onConfig runs on the config watcher's goroutine: it hands the version to
// Run's loop, which applies it in order with the claims and releases.
func (o *Ownership) onConfig(v ConfigVersion) {
	o.pendingCfg.Store(&v)
	select {
	case o.poke <- struct{}{}:
	default: // a poke is already pending; it will read the newest version
	}
}

// applyConfig applies the newest policy version, if one is pending, on Run's
// goroutine: classes that left the policy are released first (the app stops
// admitting them and rejects their queues with ownership_moved), then the
// app gets the policy (OnPolicy: its scheduler learns the new classes), and
// only then is the new class set installed, so no class is claimed before
// the app knows it and none is dropped by the app while still owned.
func (o *Ownership) applyConfig() {
	pv := o.pendingCfg.Swap(nil)
	if pv == nil {
		return
	}
	v := *pv
	names, err := o.classNames(v.Raw)
	if err != nil {
		o.configErrors.Inc()
		o.log.Warn("policy config has no usable class list; keeping the previous one",
			zap.Int64("revision", v.Revision), zap.Error(err))
		return
	}
	set := make([]string, 0, len(names))
	for _, n := range names {
		if !wire.ValidName(n) {
			o.configErrors.Inc()
			o.log.Warn("ignoring invalid class name", zap.String("class", n), zap.Int64("revision", v.Revision))
			continue
		}
		set = append(set, n)
	}
	slices.Sort(set)
	set = slices.Compact(set)
	for _, c := range sortedKeys(o.held) {
		if !slices.Contains(set, c) {
			o.release(c, ReleaseRemoved)
		}
	}
	o.cb.OnPolicy(v)
	close(o.classes.Swap(&classSet{names: set, changed: make(chan struct{})}).changed)
}

// classSet is one version of the policy's class names; changed is closed
// when a newer version replaces it.
type classSet struct {
	names   []string
	changed chan struct{}
}

// ClassesView returns the class names from the newest usable policy config
// together with a channel that is closed when a newer policy replaces them:
// like OwnersView, so a follower of both never misses a change. The class
// set and the owners change separately: when a class leaves the policy, its
// owner deletes the key, and another replica may see that deletion before
// its own copy of the policy.
func (o *Ownership) ClassesView() ([]string, <-chan struct{}) {
	cs := o.classes.Load()
	return slices.Clone(cs.names), cs.changed
}

// Owners returns the current owner of every owned class, from the etcd watch.
func (o *Ownership) Owners() map[string]Owner {
	owners, _ := o.OwnersView()
	return owners
}

// OwnersView returns the current owners together with a channel that is
// closed when that view is superseded. Both come from one snapshot, so a
// follower that re-reads the view each time the channel closes never misses
// a change: reading the owners and then asking for "the next change"
// separately would lose a change that lands in between (a handoff is a delete
// and a put milliseconds apart).
func (o *Ownership) OwnersView() (map[string]Owner, <-chan struct{}) {
	snap := o.owners.snapshot()
	out := make(map[string]Owner, len(snap.Items))
	for c, v := range snap.Items {
		if v.Replica != "" {
			out[c] = v
		}
	}
	return out, snap.Changed()
}

// Owner returns the current owner of class, if any.
func (o *Ownership) Owner(class string) (Owner, bool) {
	v, ok := o.owners.snapshot().Items[class]
	return v, ok && v.Replica != ""
}

// Claimant is the replica placement lets claim class while it has no owner
// key: the rendezvous winner among the replicas registered ready, the list
// reconcile claims from. A replica that crashed or is cut from etcd stays
// registered (ready, if it was) until its lease expires, and every other
// replica leaves the class to it meanwhile: etcd's lease is the only
// liveness ownership trusts (docs/architecture.md, "A second fault on the
// successor"). "" when no replica is registered ready. Observability and
// tests read it; reconcile does not call it.
func (o *Ownership) Claimant(class string) string {
	return Place(class, readyReplicas(o.replicas.Snapshot()))
}

// readyReplicas is the ids of the replicas registered ready, sorted.
func readyReplicas(reps *Snapshot[Replica]) []string {
	var ready []string
	for _, id := range sortedKeys(reps.Items) {
		if reps.Items[id].Info.Ready {
			ready = append(ready, id)
		}
	}
	return ready
}

// NewestEpoch is the newest epoch this replica has seen for class, also
// after the owner let go of it; 0 if none. A grant with an older epoch is
// stale (design §4 step 8).
func (o *Ownership) NewestEpoch(class string) int64 { return o.owners.snapshot().Items[class].Epoch }

// Run keeps this replica's classes claimed until ctx ends, then releases
// them (OnRelease with ReleaseShutdown, then the keys are deleted so the next
// owners can claim at once). It returns nil on ctx end and ErrSessionExpired
// (wrapped) when the session ends first; everything was released then too.
// A session that replaces a lost lease (SessionConfig.Regrant) does not end
// Run: the classes held under the old lease are released (ReleaseSessionLost)
// and claimed again under the new one once this replica's record is back.
func (o *Ownership) Run(ctx context.Context) error {
	if !o.started.CompareAndSwap(false, true) {
		return errors.New("cluster: Ownership.Run called twice")
	}
	runCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	for _, run := range []func(context.Context) error{o.owners.run, o.config.Run} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := run(runCtx); err != nil {
				errs <- err
			}
		}()
	}
	err := o.loop(ctx, errs)
	cancel()
	wg.Wait()
	return err
}

func (o *Ownership) loop(ctx context.Context, errs <-chan error) error {
	if _, err := o.session.WaitLease(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("ownership: %w", err)
	}
	if err := o.owners.waitSynced(ctx); err != nil {
		return nil
	}
	timer := o.clock.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		o.applyConfig()
		st := o.session.Status()
		ownersSnap := o.owners.snapshot()
		repSnap := o.replicas.Snapshot()
		if ctx.Err() != nil {
			o.shutdown() // the session may have ended with the same context
			return nil
		}
		if st.Done {
			o.releaseAll(ReleaseSessionLost)
			return fmt.Errorf("ownership: %w", ErrSessionExpired)
		}
		if st.Lease != o.lease {
			// A regranting session replaced a lost lease: every key of the
			// old one is gone. Drop what was held under it (already
			// released by the fence, normally) and claim afresh.
			if o.lease != 0 {
				o.releaseAll(ReleaseSessionLost)
				clear(o.relinquished)
				o.log.Info("session lease replaced; claiming again", zap.Int64("old_lease", int64(o.lease)), zap.Int64("lease", int64(st.Lease)))
			}
			o.lease = st.Lease
		}
		var wake time.Duration = -1
		if !st.Healthy {
			o.releaseAll(ReleaseFenced)
		} else {
			wake = o.reconcile(ctx, st.Lease, ownersSnap, repSnap)
		}
		if wake >= 0 {
			timer.Reset(wake)
		} else {
			timer.Stop()
		}
		select {
		case <-ctx.Done():
			o.shutdown()
			return nil
		case err := <-errs:
			o.releaseAll(ReleaseShutdown)
			return fmt.Errorf("ownership: %w", err)
		case <-st.Changed():
		case <-ownersSnap.Changed():
		case <-repSnap.Changed():
		case <-o.poke:
		case <-timer.C():
		}
	}
}

// acquire tells the app it owns class. When the app cannot start admitting
// it (OnAcquire fails), the class is not held: its key is deleted, so that
// another replica (or this one, after RetryInterval) can claim it, instead
// of an owner that serves nobody until its entries time out. It reports
// whether the class is held.
func (o *Ownership) acquire(ctx context.Context, class string, epoch int64) bool {
	if err := o.cb.OnAcquire(class, epoch); err != nil {
		o.acquireErrors.Inc()
		o.log.Warn("could not start admitting an acquired class; releasing its key",
			zap.String("class", class), zap.Int64("epoch", epoch), zap.Error(err))
		o.relinquished[class] = epoch
		_, _ = o.deleteKey(ctx, class, epoch) // retried by reconcile while the key stays ours
		o.retryAt = o.clock.Now().Add(o.cfg.RetryInterval)
		return false
	}
	o.held[class] = epoch
	o.acquisitions.Inc()
	o.ownedGauge.Set(float64(len(o.held)))
	o.log.Info("class acquired", zap.String("class", class), zap.Int64("epoch", epoch))
	return true
}

func (o *Ownership) release(class string, reason ReleaseReason) {
	epoch := o.held[class]
	delete(o.held, class)
	o.losses.WithLabelValues(reason.String()).Inc()
	if reason == ReleaseHandoff {
		o.handoffs.Inc()
	}
	o.ownedGauge.Set(float64(len(o.held)))
	o.log.Info("class released", zap.String("class", class), zap.Int64("epoch", epoch), zap.Stringer("reason", reason))
	o.cb.OnRelease(class, reason)
}

func (o *Ownership) releaseAll(reason ReleaseReason) {
	for _, c := range sortedKeys(o.held) {
		o.release(c, reason)
	}
}

// shutdown releases every held class and deletes its key, so successors
// need not wait for the lease to expire.
func (o *Ownership) shutdown() {
	held := maps.Clone(o.held)
	o.releaseAll(ReleaseShutdown)
	if !o.session.Healthy() || o.client.Ctx().Err() != nil {
		return // the keys may not be ours any more, or etcd is unreachable: the lease will take them
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.cfg.OpTimeout)
	defer cancel()
	for _, c := range sortedKeys(held) {
		_, _ = o.deleteKey(ctx, c, held[c])
	}
}

// reconcile makes this replica's claims match placement. It returns when
// to look again (-1: only on a change).
func (o *Ownership) reconcile(ctx context.Context, lease clientv3.LeaseID, owners *Snapshot[Owner], reps *Snapshot[Replica]) time.Duration {
	now := o.clock.Now()
	self := o.cfg.ReplicaID
	me, ok := reps.Items[self]
	selfReady := ok && me.Info.Ready && me.Lease == lease
	ready := readyReplicas(reps)
	var settled []string
	wake := time.Duration(-1)
	for _, id := range ready {
		r := reps.Items[id]
		if left := o.cfg.SettlePeriod - now.Sub(r.ReadySince); left <= 0 {
			settled = append(settled, id)
		} else if wake < 0 || left < wake {
			wake = left
		}
	}
	// Handoff candidates: settled replicas, plus this one while it is ready
	// (an owner keeps a class until someone settled beats it).
	targets := settled
	if selfReady && !slices.Contains(targets, self) {
		targets = append(slices.Clone(settled), self)
	}
	if !o.retryAt.IsZero() {
		if now.Before(o.retryAt) {
			if left := o.retryAt.Sub(now); wake < 0 || left < wake {
				wake = left
			}
		} else {
			o.retryAt = time.Time{}
		}
	}
	classes := o.classes.Load().names
	opCtx, cancel := context.WithTimeout(ctx, o.cfg.OpTimeout)
	defer cancel()
	failed := false
	for _, c := range classes {
		if w, ok := o.waitRev[c]; ok {
			if owners.Revision < w {
				continue // our own write is not in the view yet
			}
			delete(o.waitRev, c)
		}
		cur, has := owners.Items[c]
		has = has && cur.Replica != ""
		_, held := o.held[c]
		mine := has && cur.Lease == lease && cur.Replica == self
		switch {
		case mine && o.relinquished[c] == cur.Epoch:
			// Released already; the delete has not landed (or failed): retry.
			if o.retryAt.IsZero() {
				if _, err := o.deleteKey(opCtx, c, cur.Epoch); err != nil {
					failed = true
				}
			}
		case mine:
			if !held {
				// The key is ours and the lease is alive (we are healthy), e.g.
				// after a fence ended, or a claim whose reply was lost.
				if !o.acquire(opCtx, c, cur.Epoch) {
					continue
				}
			}
			if t := Place(c, targets); t != "" && t != self {
				o.release(c, ReleaseHandoff)
				o.relinquished[c] = cur.Epoch
				if _, err := o.deleteKey(opCtx, c, cur.Epoch); err != nil {
					failed = true
				}
			}
		default:
			if held {
				o.release(c, ReleaseLost)
			}
			delete(o.relinquished, c)
			if !has && selfReady && o.retryAt.IsZero() && Place(c, ready) == self {
				if err := o.claim(opCtx, c, lease); err != nil {
					failed = true
				}
			}
		}
	}
	// Classes dropped from the config: let go of them and of stray keys.
	for _, c := range sortedKeys(owners.Items) {
		cur := owners.Items[c]
		if slices.Contains(classes, c) || cur.Replica == "" || cur.Lease != lease {
			continue
		}
		if _, held := o.held[c]; held {
			o.release(c, ReleaseRemoved)
		}
		if w, ok := o.waitRev[c]; ok && owners.Revision < w {
			continue
		}
		o.relinquished[c] = cur.Epoch
		if _, err := o.deleteKey(opCtx, c, cur.Epoch); err != nil {
			failed = true
		}
	}
	for _, c := range sortedKeys(o.held) {
		if !slices.Contains(classes, c) {
			o.release(c, ReleaseRemoved)
		}
	}
	o.forgetRemoved(classes, owners, lease)
	o.publishTracked()
	if failed && ctx.Err() == nil {
		o.retryAt = now.Add(o.cfg.RetryInterval)
		if wake < 0 || o.cfg.RetryInterval < wake {
			wake = o.cfg.RetryInterval
		}
	}
	return wake
}

// forgetRemoved drops the claim bookkeeping of classes that left the
// policy, once no key of ours exists for them and the view has caught up
// with our last write: nothing will consult it again, and without this the
// maps grow with every class ever removed.
func (o *Ownership) forgetRemoved(classes []string, owners *Snapshot[Owner], lease clientv3.LeaseID) {
	for _, m := range []map[string]int64{o.relinquished, o.waitRev} {
		for c := range m {
			if slices.Contains(classes, c) {
				continue
			}
			if w, ok := o.waitRev[c]; ok && owners.Revision < w {
				continue
			}
			if cur, ok := owners.Items[c]; ok && cur.Replica != "" && cur.Lease == lease {
				continue // our key is still there: the delete is retried
			}
			delete(o.relinquished, c)
			delete(o.waitRev, c)
		}
	}
}

func (o *Ownership) publishTracked() {
	set := map[string]struct{}{}
	for c := range o.relinquished {
		set[c] = struct{}{}
	}
	for c := range o.waitRev {
		set[c] = struct{}{}
	}
	tracked := sortedKeys(set)
	o.tracked.Store(&tracked)
}

// trackedClasses lists the classes the claim bookkeeping remembers.
func (o *Ownership) trackedClasses() []string {
	if p := o.tracked.Load(); p != nil {
		return *p
	}
	return nil
}

// claim takes class with one transaction: only if no key exists, put ours
// with the session lease. The put's revision is the key's create revision,
// the class's new epoch.
func (o *Ownership) claim(ctx context.Context, class string, lease clientv3.LeaseID) error {
	key := o.keys.ClassOwner(class)
	resp, err := o.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, o.cfg.ReplicaID, clientv3.WithLease(lease))).
		Commit()
	if err != nil {
		o.log.Warn("claim failed", zap.String("class", class), zap.Error(err))
		return fmt.Errorf("claim class %s: %w", class, err)
	}
	o.waitRev[class] = resp.Header.Revision
	if !resp.Succeeded {
		return nil // someone else was faster; the watch will tell us who
	}
	o.acquire(ctx, class, resp.Header.Revision)
	return nil
}

// deleteKey deletes class's key only if it is still the one this replica
// created (same epoch and lease).
func (o *Ownership) deleteKey(ctx context.Context, class string, epoch int64) (bool, error) {
	key := o.keys.ClassOwner(class)
	resp, err := o.client.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(key), "=", epoch),
			clientv3.Compare(clientv3.LeaseValue(key), "=", int64(o.session.Lease()))).
		Then(clientv3.OpDelete(key)).
		Commit()
	if err != nil {
		o.log.Warn("releasing class key failed", zap.String("class", class), zap.Error(err))
		return false, fmt.Errorf("delete owner key of %s: %w", class, err)
	}
	o.waitRev[class] = resp.Header.Revision
	return resp.Succeeded, nil
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
