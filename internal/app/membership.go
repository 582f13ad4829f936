package app

import (
	"context"
	"fmt"
	"sort"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/admission"
	"github.com/switchyard/switchyard/cluster"
	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/gossip"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The membership service joins the replica to the cluster and keeps the
// cluster's state flowing into its components: it registers the replica
// once the session and registries are up, then hands the worker registry
// to the scheduler and the index, the owner view to the admission client,
// and this replica's loads and digests to gossip, and exports metrics.

// membershipState is the membership service's own state: set by join,
// then used by follow's goroutine only.
type membershipState struct {
	reg            registration
	workersChanged <-chan struct{}
	ownersChanged  <-chan struct{}
	classesChanged <-chan struct{}
	peersCheckedAt time.Time // last catchUpWithPeers
	sessionsSwept  time.Time // last sweep of expired sessions
	classOwned     *prometheus.GaugeVec
	ownedSeries    map[string]struct{} // classes with a classOwned series
	known          map[string]struct{} // workers with metric series
	// natsWithdrawn is set while this replica is registered as not ready
	// because NATS has been unreachable for the bound (see watchNATS);
	// readyDetail reads it.
	natsWithdrawn   atomic.Bool
	natsDownSince   time.Time // follow's: when NATS was first seen down (zero: up)
	withdrawnGauge  prometheus.Gauge
	withdrawalCount prometheus.Counter
}

// join waits for the session's lease and the registries, seeds the policy
// if the cluster has none, waits for gossip and registers the replica as
// ready; then it applies the registries once. It returns ctx's error if ctx
// ends first.
func (r *replica) join(ctx context.Context) error {
	r.m.known = map[string]struct{}{}
	r.m.classOwned = promauto.With(r.reg).NewGaugeVec(prometheus.GaugeOpts{
		Name: metrics.NameClusterClassOwned,
		Help: "1 if this replica owns the class, 0 if it knows the class but does not own it; summed over replicas, the owners per class.",
	}, []string{metrics.LabelClass})
	r.m.withdrawnGauge = promauto.With(r.reg).NewGauge(prometheus.GaugeOpts{
		Name: metrics.NameRouterNATSWithdrawn,
		Help: "1 while this replica is registered as not ready because NATS has been unreachable longer than the bound: it owns and claims no class.",
	})
	r.m.withdrawalCount = promauto.With(r.reg).NewCounter(prometheus.CounterOpts{
		Name: metrics.NameRouterNATSWithdrawals,
		Help: "Times this replica withdrew from class placement because NATS was unreachable longer than the bound.",
	})
	if _, err := r.session.WaitLease(ctx); err != nil {
		return err
	}
	if err := r.workers.WaitSynced(ctx); err != nil {
		return err
	}
	if err := r.replicas.WaitSynced(ctx); err != nil {
		return err
	}
	if _, err := cluster.SeedConfig(ctx, r.etcd, r.cfg.Cluster, r.cfg.PolicyYAML, false); err != nil {
		return err
	}
	select {
	case <-r.gossip.Ready():
	case <-ctx.Done():
		return ctx.Err()
	}
	info := wire.ReplicaInfo{ID: r.cfg.ID, HTTPAddr: r.httpAddr, AdminAddr: r.adminAddr(), GossipAddr: r.gossip.Addr(), Build: Version(), Ready: true}
	if err := r.session.RegisterReplica(ctx, info); err != nil {
		return err
	}
	r.m.reg = registration{info: info, lease: r.session.Lease(), written: true, ready: true}
	r.m.workersChanged = r.syncWorkers()
	r.m.ownersChanged, r.m.classesChanged = r.syncOwners()
	return nil
}

// follow keeps workers, policy, ownership views, gossip loads, digests and
// metrics flowing until ctx ends, and re-registers the replica when its
// lease changes or the lame duck begins (then as not ready).
func (r *replica) follow(ctx context.Context) error {
	tick := time.NewTicker(r.cfg.Gossip.Interval)
	defer tick.Stop()
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	// NATS's state is polled (on wall time, like the admission client's
	// own poll): the connection reports drops without a channel to wait on.
	natsPoll := time.NewTicker(natsPollInterval)
	defer natsPoll.Stop()
	leave := r.leave
	left := false
	reg := &r.m.reg
	register := func() {
		if !r.register(ctx, reg) {
			retry.Reset(r.cfg.Ownership.RetryInterval)
		}
	}
	sessionChanged := r.session.Status().Changed()
	// Each sync returns the change channel of the very snapshot it applied,
	// so a change landing while one is applied is never missed.
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-natsPoll.C:
			if r.watchNATS(time.Now()) {
				reg.info.Ready = !left && !r.m.natsWithdrawn.Load()
				register()
			}
		case <-leave:
			leave, left = nil, true
			reg.info.Ready = false
			r.log.Info("registering as not ready: the classes move to the other replicas")
			register()
		case <-sessionChanged:
			sessionChanged = r.session.Status().Changed()
			register()
		case <-retry.C:
			register()
		case <-r.m.workersChanged:
			r.m.workersChanged = r.syncWorkers()
		case <-r.m.ownersChanged:
			r.m.ownersChanged, r.m.classesChanged = r.syncOwners()
		case <-r.m.classesChanged:
			r.m.ownersChanged, r.m.classesChanged = r.syncOwners()
		case <-tick.C:
			if r.suspects.refresh() { // a worker became suspect, or no longer is
				r.m.workersChanged = r.syncWorkers()
			}
			r.publishLoads()
		}
	}
}

// natsPollInterval is how often follow looks at the NATS connection.
const natsPollInterval = 100 * time.Millisecond

// watchNATS applies "ownership follows the ability to serve": a replica
// whose NATS connection has been down for the bound
// (Admission.OwnerUnreachableAfter) withdraws from class placement by
// registering as not ready, so the cluster's rendezvous places its classes
// on the replicas that can serve them (Ownership hands them off, the others
// claim), and it claims none until NATS is back; meanwhile it admits its
// own entries' requests locally (the admission client's NATS degraded
// mode). Being registered, with a healthy lease, it is still a member:
// the withdrawal is the same record the lame duck writes, and it is undone
// as soon as the connection is back (then the settle period applies before
// classes move back). It reports whether the withdrawal changed.
func (r *replica) watchNATS(now time.Time) bool {
	if r.nc.IsConnected() {
		r.m.natsDownSince = time.Time{}
		if !r.m.natsWithdrawn.Load() {
			return false
		}
		r.m.natsWithdrawn.Store(false)
		r.m.withdrawnGauge.Set(0)
		r.log.Info("NATS reachable again: registering as ready, classes may be placed here again")
		return true
	}
	if r.m.natsDownSince.IsZero() {
		r.m.natsDownSince = now
	}
	if r.m.natsWithdrawn.Load() || now.Sub(r.m.natsDownSince) < r.cfg.Admission.OwnerUnreachableAfter {
		return false
	}
	r.m.natsWithdrawn.Store(true)
	r.m.withdrawnGauge.Set(1)
	r.m.withdrawalCount.Inc()
	r.log.Warn("NATS unreachable: withdrawing from class placement (registering as not ready); serving own entries in degraded mode",
		zap.Duration("down_for", now.Sub(r.m.natsDownSince)))
	return true
}

// registration is the replica record as last written, and the lease it was
// written under.
type registration struct {
	info    wire.ReplicaInfo
	lease   clientv3.LeaseID
	written bool // a record is in etcd under lease
	ready   bool // the Ready it was written with
}

// register writes the replica record again when the session's lease
// changed (a lost lease was replaced: the old record vanished with it) or
// the record did (not ready in lame duck). It reports false when a write
// failed and should be retried; an unhealthy session waits for its next
// status change instead.
func (r *replica) register(ctx context.Context, reg *registration) bool {
	st := r.session.Status()
	if st.Lease != reg.lease {
		reg.lease, reg.written = st.Lease, false
	}
	if reg.info.Ready != reg.ready {
		reg.written = false
	}
	if reg.written || !st.Healthy || st.Lease == 0 {
		return true
	}
	rctx, cancel := context.WithTimeout(ctx, r.cfg.Ownership.OpTimeout)
	defer cancel()
	if err := r.session.RegisterReplica(rctx, reg.info); err != nil {
		r.log.Warn("registering the replica failed; retrying", zap.Error(err))
		return false
	}
	reg.written = true
	reg.ready = reg.info.Ready
	r.log.Info("replica registered", zap.Int64("lease", int64(st.Lease)), zap.Bool("ready", reg.info.Ready))
	return true
}

// followLoadReports reads the workers' own load reports. Their last KV
// event id reveals a lost trailing batch that no later batch would expose,
// so the index can repair the worker from a dump.
func (r *replica) followLoadReports(ctx context.Context) error {
	reports := promauto.With(r.reg).NewCounterVec(prometheus.CounterOpts{
		Name: "switchyard_router_load_reports_total",
		Help: "Worker load reports received, by result (ok, malformed).",
	}, []string{"result"})
	sub, err := r.nc.Subscribe(wire.NewSubjects(r.cfg.Cluster).LoadAll(), func(m *nats.Msg) {
		lr, err := wire.DecodeLoadReport(m.Data)
		if err != nil {
			reports.WithLabelValues("malformed").Inc()
			return
		}
		reports.WithLabelValues("ok").Inc()
		r.reports.note(lr, time.Now()) // wall time: the page compares it with wall time
		r.ix.NoteLastEventID(lr.Worker, lr.Instance, lr.LastEventID)
	})
	if err != nil {
		return fmt.Errorf("subscribe load reports: %w", err)
	}
	<-ctx.Done()
	_ = sub.Unsubscribe() // fails only when the connection is already closed
	return nil
}

func (r *replica) applyPolicy(v cluster.ConfigVersion) {
	p, err := frontend.ParsePolicy(v.Raw)
	if err != nil {
		r.log.Error("policy in etcd is invalid; keeping the previous one", zap.Int64("revision", v.Revision), zap.Error(err))
		return
	}
	qp, err := admission.ParseQuotaPolicy(p.DegradedQuotas)
	if err != nil { // ParsePolicy accepts only the names admission knows
		r.log.Error("policy in etcd names an unknown degraded quota policy; keeping the previous one", zap.Error(err))
		return
	}
	r.classes.Store(&p.Classes)
	r.actor.SetClasses(p.Classes)
	r.client.SetDegradedPolicy(qp, p.Classes)
	r.fe.SetPolicy(p)
	r.prompts.SetPolicy(p.Tokenizers)
	for _, c := range p.Classes {
		r.adm.InitClass(r.cfg.WorkerType, c.Name)
	}
	r.log.Info("policy applied", zap.Int64("revision", v.Revision), zap.Strings("classes", p.ClassNames()))
}

// replicasAlive is how many router replicas this one sees alive: the
// larger of its live gossip members and its registered replicas (itself
// included, at least 1). The admission client samples it while it is not
// degraded: the split degraded quota policy divides by the count last seen
// (docs/policy.md, "degraded"). The larger count errs on the side of a
// smaller share, never of a multiplied quota.
func (r *replica) replicasAlive() int {
	return max(1, r.gossip.NumMembers(), len(r.replicas.Snapshot().Items))
}

// entryReplicas lists the registered router replicas: every one is an
// entry that re-homes its bookings when a class moves, and a new owner's
// adoption hold ends once each has reported its round (admission.WithEntries).
func (r *replica) entryReplicas() []string {
	items := r.replicas.Snapshot().Items
	out := make([]string, 0, len(items))
	for _, it := range items {
		out = append(out, it.Info.ID)
	}
	return out
}

// gossipDigests is the index's per-worker digests in their gossiped form.
func gossipDigests(ix *kvindex.Index) map[string]gossip.Digest {
	out := map[string]gossip.Digest{}
	for _, d := range ix.Digests(nil) {
		out[d.Worker] = gossip.Digest{LastEventID: d.LastID, Blocks: d.Blocks, Instance: d.Instance}
	}
	return out
}

// catchUpWithPeers compares this replica's index with the digests other
// replicas gossip. For each worker it notes the newest event id a peer
// applied from the same engine instance; an index that lags a peer on a
// worker gone quiet has lost a trailing batch that no later batch will
// reveal, and noting the same id twice while still behind resets the worker
// and fetches its dump (kvindex.Index.NoteLastEventID, which the workers'
// own load reports feed too). own is this replica's digests, as it gossips
// them. It returns how many workers it sent to repair.
func catchUpWithPeers(ix *kvindex.Index, own map[string]gossip.Digest, peers map[string]map[string]gossip.Digest) int {
	ahead := map[string]gossip.Digest{} // worker -> newest peer digest of our instance
	for _, ws := range peers {
		for worker, d := range ws {
			mine, ok := own[worker]
			if !ok || mine.Instance != d.Instance || d.LastEventID <= mine.LastEventID {
				continue
			}
			if d.LastEventID > ahead[worker].LastEventID {
				ahead[worker] = d
			}
		}
	}
	repaired := 0
	for worker, d := range ahead {
		if ix.NoteLastEventID(worker, d.Instance, d.LastEventID) == kvindex.OutcomeResync {
			repaired++
		}
	}
	return repaired
}

// syncWorkers hands the registry to the scheduler and drops departed
// workers from the index. It returns the channel that signals the next
// registry change after the snapshot it applied.
func (r *replica) syncWorkers() <-chan struct{} {
	snap := r.workers.Snapshot()
	ws := make([]scheduler.Worker, 0, len(snap.Items))
	for _, it := range snap.Items {
		wi := it.Info
		ws = append(ws, scheduler.Worker{ID: wi.ID, URL: wi.URL, BlockSize: wi.BlockSize, KVBlocks: wi.KVBlocks, MaxRunning: wi.MaxNumSeqs, Role: wi.RoleOf()})
		_ = r.ix.SetCapacity(wi.ID, wi.KVBlocks)
		setTierCapacities(r.ix, &wi)
	}
	sort.Slice(ws, func(i, j int) bool { return ws[i].ID < ws[j].ID })
	r.actor.SetWorkers(r.suspects.filter(ws)) // suspect workers are registered but not selected
	r.prompts.SetAdvertised(advertisedTokenizers(snap.Items))
	for _, d := range r.ix.Digests(nil) {
		if !streamRegistered(snap.Items, d.Worker) {
			r.ix.RemoveWorker(d.Worker)
		}
	}
	for id := range r.m.known {
		if _, ok := snap.Items[id]; !ok { // departed: drop its series
			r.router.WorkerActiveRequests.DeleteLabelValues(id)
			r.router.WorkerPrefillTokens.DeleteLabelValues(id)
			r.router.WorkerDecodeBlocks.DeleteLabelValues(id)
			r.deleteEngineLoad(id)
			r.sessions.DropWorker(id) // its sessions are free to go anywhere
			delete(r.m.known, id)
		}
	}
	for id := range snap.Items {
		r.m.known[id] = struct{}{}
	}
	return snap.Changed()
}

// syncOwners hands the owner view to the admission client and exports which
// classes this replica owns. It returns the channels that signal the next
// change of the owners and of the policy's classes after the views it
// applied: the exported series depend on both.
func (r *replica) syncOwners() (ownersChanged, classesChanged <-chan struct{}) {
	classes, classesChanged := r.own.ClassesView()
	owners, ownersChanged := r.own.OwnersView()
	out := make(map[string]admission.Owner, len(owners))
	for class, o := range owners {
		out[class] = admission.Owner{Replica: o.Replica, Epoch: o.Epoch}
	}
	// Every class of the policy has a series, 0 while this replica does not
	// own it (also while nobody does), so the sum over replicas is the
	// number of owners and 0 shows; classes gone from the policy lose theirs.
	exported := make(map[string]struct{}, len(classes))
	for _, class := range classes {
		owned := 0.0
		if owners[class].Replica == r.cfg.ID {
			owned = 1
		}
		r.m.classOwned.WithLabelValues(class).Set(owned)
		exported[class] = struct{}{}
	}
	for class := range r.m.ownedSeries {
		if _, ok := exported[class]; !ok {
			r.m.classOwned.DeleteLabelValues(class)
		}
	}
	r.m.ownedSeries = exported
	r.client.OwnersChanged(out)
	return ownersChanged, classesChanged
}

// exportEngineLoad sets worker id's engine-reported load gauges from its
// last load report; a worker that never reported has no series.
func (r *replica) exportEngineLoad(id string) {
	rep, ok := r.reports.get(id)
	if !ok {
		r.deleteEngineLoad(id)
		return
	}
	r.router.WorkerEngineRunning.WithLabelValues(id).Set(float64(rep.r.Running))
	r.router.WorkerEngineWaiting.WithLabelValues(id).Set(float64(rep.r.Waiting))
	r.router.WorkerEngineKVUsage.WithLabelValues(id).Set(rep.r.KVUsage)
	r.router.WorkerEnginePrefixHitRate.WithLabelValues(id).Set(rep.r.PrefixHitRate)
}

func (r *replica) deleteEngineLoad(id string) {
	r.router.WorkerEngineRunning.DeleteLabelValues(id)
	r.router.WorkerEngineWaiting.DeleteLabelValues(id)
	r.router.WorkerEngineKVUsage.DeleteLabelValues(id)
	r.router.WorkerEnginePrefixHitRate.DeleteLabelValues(id)
}

// sessionSweepInterval is how often expired sessions leave the table
// (a lookup drops an expired one itself; the sweep keeps the count honest).
const sessionSweepInterval = 10 * time.Second

// publishLoads shares this replica's booked load and index digests over
// gossip, lets the scheduler re-evaluate its queues against the others'
// load, and exports the admission counters.
func (r *replica) publishLoads() {
	snap := r.actor.Snapshot()
	loads := make(map[string]gossip.WorkerLoad, len(snap.Workers))
	for id, l := range snap.Workers {
		loads[id] = gossip.WorkerLoad{ActiveRequests: l.ActiveRequests, PrefillTokens: l.PrefillTokens, DecodeBlocks: l.DecodeBlocks}
	}
	r.gossip.SetLocalLoads(loads)
	// Projected load per worker: this replica's bookings plus the others'.
	remote := map[string]scheduler.WorkerLoad{}
	engine := map[string]scheduler.EngineLoad{} // the selector ignores stale ones
	roles := map[string]metrics.RoleLoad{}
	for id, it := range r.workers.Snapshot().Items {
		l, o := snap.Workers[id], r.gossip.RemoteLoad(id)
		rl := roles[it.Info.RoleOf()]
		rl.Workers++
		rl.ActiveRequests += l.ActiveRequests + o.ActiveRequests
		rl.PrefillTokens += l.PrefillTokens + o.PrefillTokens
		rl.DecodeBlocks += l.DecodeBlocks + o.DecodeBlocks
		roles[it.Info.RoleOf()] = rl
		remote[id] = scheduler.WorkerLoad{ActiveRequests: o.ActiveRequests, PrefillTokens: o.PrefillTokens, DecodeBlocks: o.DecodeBlocks}
		if rep, ok := r.reports.get(id); ok {
			engine[id] = scheduler.EngineLoad{Running: rep.r.Running, Waiting: rep.r.Waiting, KVUsage: rep.r.KVUsage, At: rep.at}
		}
		r.router.WorkerActiveRequests.WithLabelValues(id).Set(float64(l.ActiveRequests + o.ActiveRequests))
		r.router.WorkerPrefillTokens.WithLabelValues(id).Set(float64(l.PrefillTokens + o.PrefillTokens))
		r.router.WorkerDecodeBlocks.WithLabelValues(id).Set(float64(l.DecodeBlocks + o.DecodeBlocks))
		r.exportEngineLoad(id)
	}
	r.router.SetRoleLoads(roles)
	degraded := 0.0
	if r.client.Degraded() {
		degraded = 1
	}
	r.router.DegradedMode.Set(degraded)
	digests := gossipDigests(r.ix)
	r.gossip.SetDigests(digests)
	if now := time.Now(); now.Sub(r.m.sessionsSwept) >= sessionSweepInterval {
		r.m.sessionsSwept = now
		r.sessions.Sweep(now)
	}
	if now := time.Now(); now.Sub(r.m.peersCheckedAt) >= r.cfg.Gossip.DigestInterval {
		r.m.peersCheckedAt = now
		catchUpWithPeers(r.ix, digests, r.gossip.RemoteDigests())
	}
	r.remote.Store(remote) // a new version only if some load changed
	r.remote.StoreEngine(engine)
	r.actor.Drain()
	r.exporter.Observe(admissionSnapshot(snap, r.cfg.WorkerType))
	r.exporter.Observe(r.client.Counts(r.cfg.WorkerType))
	for class, c := range snap.Classes {
		r.adm.QueueDepth.WithLabelValues(r.cfg.WorkerType, class).Set(float64(c.QueueDepth))
		r.adm.QueuePendingTokens.WithLabelValues(r.cfg.WorkerType, class).Set(float64(c.PendingTokens))
	}
}

func admissionSnapshot(s *scheduler.Snapshot, workerType string) metrics.AdmissionSnapshot {
	out := metrics.AdmissionSnapshot{Instance: s.Instance, Seq: s.Seq, WorkerType: workerType,
		Classes: make(map[string]metrics.AdmissionCounts, len(s.Classes))}
	for class, c := range s.Classes {
		rej := make(map[string]uint64, len(c.Counters.Rejected))
		for r, n := range c.Counters.Rejected {
			rej[r.String()] = n
		}
		// Received is counted at the entry replica (admission.Client.Counts),
		// once per request whatever moved underneath it; the owner's own
		// count of first attempts is not exported, or it would count twice.
		out.Classes[class] = metrics.AdmissionCounts{Retried: c.Counters.Retried,
			Admitted: c.Counters.Admitted, Cancelled: c.Counters.Cancelled, Rejected: rej}
	}
	return out
}
