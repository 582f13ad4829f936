package app

// The nemesis's one-sided faults and the invariants that watch them: a
// replica loses one of its links (NATS, etcd, gossip) and keeps the others
// (docs/testing.md, "One-sided faults"). The faults are applied here; the
// invariants are sampled by the monitor (sampleOneSided) and checked on the
// records after the run (checkOneSidedRecords).

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// The load's tenants, one per class (the keys file closes the API): gold's
// has no quota; silver's a concurrency quota, which the silver load
// exceeds, so it binds (tenant_concurrency); bronze's a requests-per-minute
// quota the bronze load spends within seconds, so its bucket is mostly
// empty when the class moves (bucket_no_refill).
const (
	nemesisSilverConcurrent = 3
	nemesisBronzeRPM        = 20
)

func nemesisKey(class string) string { return "sk-nemesis-" + class }

// writeNemesisKeys writes the tenants' keys file and returns its path.
func writeNemesisKeys(t *testing.T) string {
	t.Helper()
	body := fmt.Sprintf(`tenants:
  - id: gold-t
    keys: [%q]
    default_class: gold
    classes: [gold]
  - id: silver-t
    keys: [%q]
    default_class: silver
    classes: [silver]
    quota: {concurrent: %d}
  - id: bronze-t
    keys: [%q]
    default_class: bronze
    classes: [bronze]
    quota: {requests_per_minute: %d}
`, tenant.HashKey(nemesisKey("gold")), tenant.HashKey(nemesisKey("silver")), nemesisSilverConcurrent,
		tenant.HashKey(nemesisKey("bronze")), nemesisBronzeRPM)
	path := filepath.Join(t.TempDir(), "keys.yaml")
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// Bounds of the one-sided invariants.
const (
	// quietAfter is how long after a fault that moves classes or bookings
	// heals the ledger and the tenant's concurrency must be exact again: a
	// reconnect, a claim after the settle period, an adopt round trip, with
	// room for a starved machine.
	quietAfter = 4 * time.Second
	// classRetry is one retry of the entry's admission after the release
	// bound, and classSlack room for -race on a shared machine.
	classRetry = time.Second
	classSlack = 2 * time.Second
	// ledgerPersist is how many consecutive ledger samples (500 ms apart)
	// must disagree with the live streams: a booking and its stream start
	// and end a few milliseconds apart, which one sample can straddle.
	ledgerPersist = 3
	// ledgerLeakPersist is the same for a ledger above the live streams: a
	// lost done mark holds its booking until the renewal window passes
	// (docs/testing.md), about the booking expiry.
	ledgerLeakPersist = 2*int(nemesisExpiry/time.Second)*2 + 4
	// bucketSlack is what a move may refund: the charges since the old
	// owner's last save (-bucket-sync-interval, 1 s) after a crash, and
	// rounding.
	bucketSlack = 5
	// bucketSkew is the clock_skew fault's offset: a saved level's time
	// is on the old owner's clock, which may be this far off the new
	// owner's (and the checker's).
	bucketSkew = 500 * time.Millisecond
	// bucketRounding allows for the Core's refill in steps and the
	// sampling of levels off the actors' turns.
	bucketRounding = 0.5
	// bucketWatch is how long after a move the new owner's level is watched.
	bucketWatch = 5 * time.Second
)

// natsBound is how long a class may stay with an owner cut from NATS (or
// with no reachable owner) while a majority of replicas is live and
// connected: the release bound (-nats-unreachable-after) plus one retry.
func natsBound() time.Duration {
	return DefaultReplicaConfig().Admission.OwnerUnreachableAfter + classRetry + classSlack
}

// leaseBound is the same for an owner that is down or cut from etcd: its
// lease expires after the TTL, then the others claim.
const leaseBound = nemesisTTL + classRetry + classSlack

// disturbs reports whether a fault kind moves classes or bookings while it
// lasts: the ledger and the tenant's concurrency are checked only quietAfter
// past the last such fault (the documented windows: degraded mode, a
// crash's lease, an adoption).
func disturbs(kind string) bool {
	switch kind {
	case faultCrash, faultGraceful, faultNATSCut, faultOwnerNATSCut, faultEntryNATSCut,
		faultEtcdRestart, faultEtcdOutage, faultSession, faultEtcdCutOne:
		return true
	}
	return false
}

// settle ends one disturbing fault.
func (r *nemesisRun) settle() {
	until := time.Now().Add(quietAfter).UnixNano()
	for {
		cur := r.disturbedUntil.Load()
		if cur >= until || r.disturbedUntil.CompareAndSwap(cur, until) {
			break
		}
	}
	r.disturbing.Add(-1)
}

// quiet reports whether no fault moves classes or bookings now, none did
// within quietAfter, and no replica admits in degraded mode.
func (r *nemesisRun) quiet() bool {
	return r.disturbing.Load() == 0 && time.Now().UnixNano() >= r.disturbedUntil.Load() && !r.inDegradedWindow()
}

// cutNATS cuts the replica's NATS link for d (degraded mode).
func (r *nemesisRun) cutNATS(s *nemesisSlot, inc *nemesisReplica, d time.Duration) {
	r.degraded.Add(1)
	defer r.leaveDegraded()
	s.cutFor(inc.natsPx, &s.natsCuts, d)
}

// cutEtcd cuts the replica's etcd link for d.
func (r *nemesisRun) cutEtcd(s *nemesisSlot, inc *nemesisReplica, d time.Duration) {
	s.cutFor(inc.etcdProxy, &s.etcdCuts, d)
}

// cutFor holds px cut for d, counting the cut in cuts meanwhile, and
// records the interval among the slot's cuts.
func (s *nemesisSlot) cutFor(px *faultProxy, cuts *atomic.Int32, d time.Duration) {
	cuts.Add(1)
	began := time.Now()
	px.hold()
	time.Sleep(d)
	px.release()
	cuts.Add(-1)
	s.mu.Lock()
	s.cut = append(s.cut, downInterval{from: began, to: time.Now()})
	s.mu.Unlock()
}

// healthy reports whether s is live and connected now: up, not stopping,
// with its NATS and etcd links (a gossip cut leaves it healthy: gossip is
// soft state).
func (r *nemesisRun) healthy(s *nemesisSlot) bool {
	cur := s.current()
	return cur != nil && !cur.stopping.Load() && s.natsCuts.Load() == 0 && s.etcdCuts.Load() == 0 && r.etcdDown.Load() == 0
}

// slotByID is the slot named id (nil: none).
func (r *nemesisRun) slotByID(id string) *nemesisSlot {
	for _, s := range r.slots {
		if s.id == id {
			return s
		}
	}
	return nil
}

// ownerSlot is the slot that owns class as the first live replica sees it.
func (r *nemesisRun) ownerSlot(class string) *nemesisSlot {
	for _, s := range r.slots {
		if cur := s.current(); cur != nil {
			return r.slotByID(cur.status.Owners()[class].Replica)
		}
	}
	return nil
}

func (r *nemesisRun) applyOneSided(ev faultEvent) {
	s := r.slots[ev.slot]
	switch ev.kind {
	case faultOwnerNATSCut:
		class := nemesisClasses[ev.class].name
		o := r.ownerSlot(class)
		var cur *nemesisReplica
		if o != nil {
			cur = o.current()
		}
		if cur == nil {
			r.countFault(ev.kind + "_no_owner")
			return
		}
		r.t.Logf("%v: %s: %s owns %s", r.elapsed(), ev.kind, o.id, class)
		r.cutNATS(o, cur, ev.dur)
	case faultEntryNATSCut:
		// An entry that owns no class, if one is healthy: an owner's cut is
		// owner_nats_cut.
		if cur := s.current(); cur == nil || len(cur.status.Owned()) > 0 {
			for _, o := range r.slots {
				if c := o.current(); c != nil && len(c.status.Owned()) == 0 && r.healthy(o) {
					s = o
					break
				}
			}
		}
		cur := s.current()
		if cur == nil {
			return
		}
		// Streams that outlive the cut and the booking expiry, so that the
		// owner frees their bookings while they run: gold requests entered
		// at the entry, long enough to be live quietAfter past the heal.
		r.longStreams(s, ev, 2)
		r.t.Logf("%v: %s: %s (owns %v)", r.elapsed(), ev.kind, s.id, cur.status.Owned())
		r.cutNATS(s, cur, ev.dur)
	case faultEtcdCutOne:
		cur := s.current()
		if cur == nil {
			return
		}
		r.cutEtcd(s, cur, ev.dur)
	case faultGossipCutOne:
		if s.current() == nil {
			return
		}
		if err := s.keyring.isolate(); err != nil {
			r.violate("harness", "gossip_cut_one on %s: %v", s.id, err)
			return
		}
		time.Sleep(ev.dur)
		if err := s.keyring.rejoin(); err != nil {
			r.violate("harness", "gossip_cut_one on %s: heal: %v", s.id, err)
		}
	}
}

// longStreamTokens is the max_tokens of entry_nats_cut's long requests: at
// the simulated engine's 8 ms or more a token they would run 40 s or more,
// so they run until the client abandons them, longStreamAfter past the heal
// (the ledger is checked from quietAfter past it).
const (
	longStreamTokens = 5000
	longStreamAfter  = quietAfter + 5*time.Second
)

// longStreams sends n long gold requests to s (recorded like the load's)
// and waits until they are likely streaming.
func (r *nemesisRun) longStreams(s *nemesisSlot, ev faultEvent, n int) {
	client := &http.Client{Timeout: 90 * time.Second}
	for k := range n {
		req := loadRequest{at: ev.at, slot: s.idx, class: 0, words: 40, maxTokens: longStreamTokens}
		abandon := time.Now().Add(longStreamWait + ev.dur + longStreamAfter)
		r.extra.Add(1)
		go func() {
			defer r.extra.Done()
			// The gold queue is often full: try again (each attempt is a
			// request of its own for the checker) until one is admitted.
			for attempt := range 20 {
				req.abandonAfter = time.Until(abandon)
				rec := r.send(client, req, 1_000_000_000+int(ev.at/time.Millisecond)*100+k*20+attempt) // apart from the load's indexes
				r.mu.Lock()
				r.records = append(r.records, rec)
				r.mu.Unlock()
				r.done.Add(1)
				if rec.outcome == outcomeTyped && rec.code == "queue_full" {
					time.Sleep(100 * time.Millisecond)
					continue
				}
				r.t.Logf("%v: %s's long stream on %s ended after %v: %s %s (attempt %d)", r.elapsed(), ev.kind, s.id,
					rec.end.Sub(rec.start).Truncate(time.Millisecond), rec.outcome, rec.code, attempt+1)
				return
			}
		}()
	}
	time.Sleep(longStreamWait)
}

// longStreamWait is how long the long streams get to be admitted and
// dispatched before the cut.
const longStreamWait = 1500 * time.Millisecond

// oneSidedState is the one-sided invariants' sampling state, owned by the
// monitor goroutine.
type oneSidedState struct {
	n int // samples taken

	// class_served_within: since when each class has had a view pointing at
	// an owner that is not live and connected, and the bound for its cause.
	badSince map[string]time.Time
	badBound map[string]time.Duration
	badTold  map[string]bool
	// waitOn is, per class in such a period, the replica it waits for
	// (waitingOn); a second fault on a new one restarts the period.
	waitOn map[string]string
	// fewHealthy are the intervals with fewer than a majority of replicas
	// live and connected (the invariant does not apply then).
	fewHealthy []downInterval // guarded by nemesisRun.mu

	// ledger_matches_streams: consecutive disagreeing samples per worker.
	under, over map[string]int

	// bucket_no_refill: the bronze owner's incarnation, its last level,
	// and a move being watched.
	bucketOwner *nemesisReplica
	bucketLevel float64
	bucketAt    time.Time
	bucketKnown bool
	// saved is the owner's last successfully saved level of bronze-t
	// (BucketSync.Saved): what a crash leaves its successor.
	saved savedBucket
	watch *bucketMove
}

// savedBucket is a level an owner last saved, at when (its own clock).
type savedBucket struct {
	known bool
	level float64
	at    time.Time
}

type bucketMove struct {
	from, to string
	level    float64   // the old owner's last level
	at       time.Time // when it was read
	saved    savedBucket
	until    time.Time
	told     bool
}

// sampleOneSided runs the one-sided invariants' samples: every call
// (100 ms) the class owners, the tenant's concurrency and the bronze
// bucket; every fifth the ledgers.
func (r *nemesisRun) sampleOneSided() {
	st := &r.oneSided
	if st.badSince == nil {
		st.badSince, st.badBound, st.badTold = map[string]time.Time{}, map[string]time.Duration{}, map[string]bool{}
		st.waitOn = map[string]string{}
		st.under, st.over = map[string]int{}, map[string]int{}
	}
	st.n++
	r.sampleOwners()
	quiet := r.quiet()
	r.sampleTenantConcurrency(quiet)
	r.sampleBucket()
	if st.n%5 == 0 {
		r.sampleLedger(quiet)
	}
}

// sampleOwners checks class_served_within: while a majority of replicas is
// live and connected, every one of them sees each class owned by one of
// them within natsBound (owner cut from NATS) or leaseBound (owner down or
// cut from etcd) of the class's owner losing its link.
func (r *nemesisRun) sampleOwners() {
	st := &r.oneSided
	var healthy []*nemesisSlot
	ids := map[string]bool{}
	for _, s := range r.slots {
		if r.healthy(s) {
			healthy = append(healthy, s)
			ids[s.id] = true
		}
	}
	now := time.Now()
	r.mu.Lock()
	n := len(st.fewHealthy)
	open := n > 0 && st.fewHealthy[n-1].to.IsZero()
	if len(healthy) <= nemesisReplicas/2 {
		if !open {
			st.fewHealthy = append(st.fewHealthy, downInterval{from: now})
		}
		r.mu.Unlock()
		clear(st.badSince)
		clear(st.badTold)
		clear(st.waitOn)
		return
	}
	if open {
		st.fewHealthy[n-1].to = now
	}
	r.mu.Unlock()
	for _, c := range nemesisClasses {
		r.check("class_served_within", 1)
		var bad []string
		bound := natsBound()
		for _, h := range healthy {
			cur := h.current()
			if cur == nil {
				continue
			}
			owner := cur.status.Owners()[c.name].Replica
			if ids[owner] {
				continue
			}
			bad = append(bad, fmt.Sprintf("%s sees %q", h.id, owner))
			if o := r.slotByID(owner); o == nil || o.current() == nil || o.etcdCuts.Load() > 0 || o.natsCuts.Load() == 0 {
				bound = leaseBound // no owner, or it is down or cut from etcd
			}
		}
		if len(bad) == 0 {
			delete(st.badSince, c.name)
			delete(st.badTold, c.name)
			delete(st.waitOn, c.name)
			continue
		}
		since, ok := st.badSince[c.name]
		if ok && r.etcdBackAfter(since) {
			// A whole-etcd fault (etcd_restart, etcd_outage) ended since
			// the period began: etcd extends every lease by its TTL when it
			// comes back (its lessor's promotion), so the lease the class
			// waits for runs again from then. The monitor may not sample
			// during a short restart, which would have restarted it too.
			ok = false
			delete(st.badTold, c.name)
		}
		on := r.waitingOn(c.name, healthy)
		if prev, seen := st.waitOn[c.name]; ok && seen && on != prev && on != "" && !ids[on] {
			// A second fault: the replica the class waits for now (its
			// successor) is itself down or cut. Ownership is a lease, so
			// the class waits for that replica's lease in turn: the
			// bound runs again from here (docs/testing.md).
			ok = false
			delete(st.badTold, c.name)
		}
		st.waitOn[c.name] = on
		if !ok {
			since = now
			st.badSince[c.name], st.badBound[c.name] = now, bound
		}
		st.badBound[c.name] = max(st.badBound[c.name], bound)
		if now.Sub(since) > st.badBound[c.name] && !st.badTold[c.name] {
			st.badTold[c.name] = true
			r.violate("class_served_within", "class %s had no live, connected owner for %v (bound %v) with %d of %d replicas live and connected, at %v: %s",
				c.name, now.Sub(since).Truncate(time.Millisecond), st.badBound[c.name], len(healthy), nemesisReplicas, r.elapsed(), strings.Join(bad, ", "))
		}
	}
}

// etcdBackAfter reports whether a whole-etcd fault ended after t.
func (r *nemesisRun) etcdBackAfter(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, d := range r.etcdCuts {
		if !d.to.IsZero() && d.to.After(t) {
			return true
		}
	}
	return false
}

// waitingOn is the replica class waits for, as the first live, connected
// replica sees it: its registered owner, or with none the replica its
// ownership would let claim (Ownership.Claimant: the rendezvous winner
// among the replicas registered ready). That is the tier's own placement,
// not one computed from the harness's slots: a replica that crashed, or is
// cut from etcd, stays registered ready until its lease expires, and the
// others leave the class to it meanwhile, whatever state its slot is in
// (the soak's silver at 19m8s waited on n5, crashed with its etcd link
// broken before it could write itself not ready, which slots not stopping
// and not cut from NATS did not name).
func (r *nemesisRun) waitingOn(class string, healthy []*nemesisSlot) string {
	for _, h := range healthy {
		if cur := h.current(); cur != nil {
			if o := cur.status.Owners()[class].Replica; o != "" {
				return o
			}
			return cur.status.own.Claimant(class)
		}
	}
	return ""
}

// liveOn is the requests a worker holds now (running and waiting).
func (r *nemesisRun) liveOn(i int) int {
	w := r.workers[i]
	return int(metricValue(w.reg, "switchyard_engine_running_requests") + metricValue(w.reg, "switchyard_engine_waiting_requests"))
}

// workerIndex is w's index in r.workers ("w4" → 3).
func workerIndex(w string) int {
	var i int
	_, _ = fmt.Sscanf(w, "w%d", &i)
	return i - 1
}

// sampleTenantConcurrency checks tenant_concurrency: silver's workers serve
// only silver-t, so what they hold is the tenant's concurrency; outside the
// documented windows it never exceeds the quota. A worker's count is a lower
// bound of the router's (it takes a request after its booking and drops it
// before the done mark), so one sample over the quota is a violation.
func (r *nemesisRun) sampleTenantConcurrency(quiet bool) {
	if !quiet {
		return
	}
	live := 0
	var per []string
	for _, w := range nemesisClasses[1].workers {
		n := r.liveOn(workerIndex(w))
		live += n
		per = append(per, fmt.Sprintf("%s %d", w, n))
	}
	r.check("tenant_concurrency", 1)
	if live > nemesisSilverConcurrent {
		r.violate("tenant_concurrency", "silver-t had %d streams at once at %v (%s), quota %d, no fault or degraded window",
			live, r.elapsed(), strings.Join(per, ", "), nemesisSilverConcurrent)
	}
}

// sampleLedger checks ledger_matches_streams: outside the documented
// windows, the bookings of every worker over every replica's ledger (the
// class owner's, and a degraded replica's own) equal the requests the worker
// holds, within ledgerPersist samples for an under-count (a stream the tier
// forgot: workers and quotas oversubscribed) and ledgerLeakPersist for an
// over-count (a booking that outlives its stream).
func (r *nemesisRun) sampleLedger(quiet bool) {
	st := &r.oneSided
	if !quiet {
		clear(st.under)
		clear(st.over)
		return
	}
	booked := map[string]int{}
	by := map[string][]string{} // worker -> "replica n" with bookings there, for the message
	for _, s := range r.slots {
		cur := s.current()
		if cur == nil {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		snap, err := cur.status.Flush(ctx)
		cancel()
		if err != nil {
			return // no sample
		}
		for w, l := range snap.Workers {
			booked[w] += l.ActiveRequests
			if l.ActiveRequests > 0 {
				by[w] = append(by[w], fmt.Sprintf("%s %d", s.id, l.ActiveRequests))
			}
		}
	}
	if !r.quiet() { // a fault began while the ledgers were read
		return
	}
	for i := range r.workers {
		w := fmt.Sprintf("w%d", i+1)
		live := r.liveOn(i)
		r.check("ledger_matches_streams", 1)
		switch {
		case booked[w] < live:
			st.under[w]++
			st.over[w] = 0
			if st.under[w] == ledgerPersist {
				r.violate("ledger_matches_streams", "%s holds %d requests but the ledgers book %d, for %d samples at %v (quiet %v after the last fault)",
					w, live, booked[w], ledgerPersist, r.elapsed(), quietAfter)
			}
		case booked[w] > live:
			st.over[w]++
			st.under[w] = 0
			if st.over[w] == ledgerLeakPersist {
				r.violate("ledger_matches_streams", "the ledgers book %d requests on %s (%s) but it holds %d, for %d samples at %v",
					booked[w], w, strings.Join(by[w], ", "), live, ledgerLeakPersist, r.elapsed())
			}
		default:
			st.under[w], st.over[w] = 0, 0
		}
	}
}

// sampleBucket checks bucket_no_refill: when bronze moves, its new owner's
// level of bronze-t's requests bucket is never above the old owner's last
// level refilled by the time between (plus bucketSlack): a move never
// refills a bucket. Full buckets are not exported (TenantBuckets), so a
// sample without the tenant says nothing.
func (r *nemesisRun) sampleBucket() {
	st := &r.oneSided
	const class = "bronze"
	o := r.ownerSlot(class)
	if o == nil {
		return
	}
	cur := o.current()
	if cur == nil {
		return
	}
	if _, admits := cur.status.server.Owns(class); !admits {
		// Named owner, not admitting yet: a new owner merges the carried
		// levels (BucketSync.Acquired) before Server.Own, so until then
		// its Core still holds whatever it last had of the tenant
		// (refilled), which admits nothing.
		return
	}
	var level float64
	known := false
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	err := cur.status.actor.Do(ctx, func(c *scheduler.Core) {
		for _, b := range c.TenantBuckets(class) {
			if b.Tenant == "bronze-t" {
				level, known = b.Requests, true
			}
		}
	})
	cancel()
	if err != nil {
		return
	}
	now := time.Now()
	if cur != st.bucketOwner {
		if st.bucketOwner != nil && st.bucketKnown {
			from := "?"
			for _, s := range r.slots {
				s.mu.Lock()
				for _, inc := range s.all {
					if inc == st.bucketOwner {
						from = s.id
					}
				}
				s.mu.Unlock()
			}
			st.watch = &bucketMove{from: from, to: o.id, level: st.bucketLevel, at: st.bucketAt, saved: st.saved, until: now.Add(bucketWatch)}
		}
		st.bucketOwner, st.bucketKnown, st.saved = cur, false, savedBucket{}
	}
	if cur.status.buckets != nil {
		if levels, ok := cur.status.buckets.Saved(class); ok {
			st.saved = savedBucket{known: true, level: nemesisBronzeRPM} // a full bucket is not saved
			for _, b := range levels {
				if b.Tenant == "bronze-t" {
					st.saved.level, st.saved.at = b.Requests, time.Unix(0, b.At)
				}
			}
		}
	}
	if !known {
		return
	}
	if w := st.watch; w != nil && now.Before(w.until) {
		r.check("bucket_no_refill", 1)
		bound, basis := w.bound(now)
		if level > bound && !w.told {
			w.told = true
			r.violate("bucket_no_refill", "bronze moved from %s to %s: bronze-t's bucket was %.1f there, %.1f here %v later (bound %.1f, %s), at %v",
				w.from, w.to, w.level, level, now.Sub(w.at).Truncate(time.Millisecond), bound, basis, r.elapsed())
		}
	}
	st.bucketLevel, st.bucketAt, st.bucketKnown = level, now, true
}

// bound is the most bronze-t's bucket may hold at the new owner at now,
// and what it is based on. A hand-off carries the levels exactly (the
// final save), a crash leaves the last successful save: either way the new
// owner starts from the old owner's last saved level, refilled from the
// save's time. That save may be older than one -bucket-sync-interval
// when saves were slow or failed (etcd faults): the refund is then larger,
// and what the tier promises (docs/tenants.md) is exactly this: the
// charges since the last save. The save's time is on the old owner's
// clock, which clock_skew may have set up to bucketSkew off the new
// owner's. With no save known since the old owner acquired the class (a
// crash within the first interval), the old owner's last sampled level
// refilled plus bucketSlack.
func (w *bucketMove) bound(now time.Time) (float64, string) {
	rpm := float64(nemesisBronzeRPM)
	if w.saved.known {
		if w.saved.level >= rpm {
			return rpm, "its last save was full"
		}
		d := now.Sub(w.saved.at) + bucketSkew
		return min(rpm, w.saved.level+rpm*d.Minutes()+bucketRounding),
			fmt.Sprintf("its last save %.1f at %v before the move", w.saved.level, w.at.Sub(w.saved.at).Truncate(time.Millisecond))
	}
	return min(rpm, w.level+rpm*now.Sub(w.at).Minutes()+bucketSlack), "no save seen: its last level + 5"
}

// checkOneSidedRecords is class_served_within on the requests: none entered
// at a live, connected replica while a majority was live and connected
// waited past natsBound for a class without a reachable owner
// (ownership_moved).
func (r *nemesisRun) checkOneSidedRecords(records []*requestRecord) {
	r.mu.Lock()
	few := append([]downInterval(nil), r.oneSided.fewHealthy...)
	etcd := append([]downInterval(nil), r.etcdCuts...)
	r.mu.Unlock()
	overlaps := func(iv []downInterval, from, to time.Time) bool {
		for _, d := range iv {
			end := d.to
			if end.IsZero() {
				end = time.Now()
			}
			if !d.from.After(to) && !end.Before(from) {
				return true
			}
		}
		return false
	}
	for _, rec := range records {
		if rec.code != "ownership_moved" {
			continue
		}
		s := r.allSlots[rec.slot]
		waited := rec.end.Sub(rec.start)
		r.check("class_served_within", 1)
		s.mu.Lock()
		cut := overlaps(s.cut, rec.start, rec.end)
		s.mu.Unlock()
		if waited <= natsBound() || cut || s.wasDown(rec.start, rec.end) || overlaps(few, rec.start, rec.end) || overlaps(etcd, rec.start, rec.end) {
			continue
		}
		r.violate("class_served_within", "a %s request entered at %s (live and connected, with a majority) at %v waited %v for ownership_moved",
			nemesisClasses[rec.class].name, s.id, rec.start.Sub(r.start).Truncate(time.Millisecond), waited.Truncate(time.Millisecond))
	}
}
