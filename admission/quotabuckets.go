package admission

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// The quota owner's central buckets travel with the home class, like the
// Core's buckets travel with every class (BucketSync): while it owns a home
// class it saves the levels of the tenants whose quota it owns every
// interval (when they changed) and once more when it hands the class off;
// the next owner starts each tenant's central buckets from the saved
// levels refilled to now, so a move of the home class never refills them.
// The store is a second BucketStore (cluster.NewQuotaBuckets: quota/<class>
// in etcd), fenced by the owner key's epoch like the Core's.

// UseStore makes the central buckets persist in store every interval
// (timeout bounds each etcd operation). Call it before Run.
func (q *Quota) UseStore(store BucketStore, interval, timeout time.Duration) {
	q.store, q.storeEvery, q.storeTimeout = store, interval, timeout
}

// Acquired loads the central bucket levels saved for home class (OnAcquire,
// before Server.Own): the ledgers started for it from then on begin there.
// On error they start full, counted like BucketSync's loads.
func (q *Quota) Acquired(home string) {
	if q.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.storeTimeout)
	defer cancel()
	data, err := q.store.Load(ctx, home)
	var carried []scheduler.TenantBucket
	if err == nil && data != nil {
		if err = json.Unmarshal(data, &carried); err != nil {
			err = fmt.Errorf("decode quota buckets of class %s: %w", home, err)
		}
	}
	if err != nil {
		q.m.bucketSyncErrors.WithLabelValues("load").Inc()
		q.log.Warn("carried quota buckets not loaded: they start full", zap.String("class", home), zap.Error(err))
		return
	}
	q.lmu.Lock()
	defer q.lmu.Unlock()
	for k, t := range q.ledger { // a ledger of a previous ownership is stale
		if t.home == home {
			delete(q.ledger, k)
		}
	}
	for _, tb := range carried {
		if tb.Tenant != "" && (tb.RequestsPerMinute > 0 || tb.TokensPerMinute > 0) {
			q.carried[ledgerKey(home, tb.Tenant)] = tb
		}
	}
}

// Released saves home's central levels once more after this replica
// stopped owning it at epoch (OnRelease of a hand-off or a shutdown).
func (q *Quota) Released(home string, epoch int64) {
	if q.store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), q.storeTimeout)
	defer cancel()
	q.saveHome(ctx, home, epoch, true)
}

// saveBuckets saves the central levels of every home class owned here.
func (q *Quota) saveBuckets(ctx context.Context) {
	if q.store == nil {
		return
	}
	for _, home := range q.server.OwnedClasses() {
		if epoch, ok := q.server.Owns(home); ok {
			q.saveHome(ctx, home, epoch, false)
		}
	}
}

func (q *Quota) saveHome(ctx context.Context, home string, epoch int64, final bool) {
	now := q.clock.Now().UnixNano()
	var levels []scheduler.TenantBucket
	q.lmu.Lock()
	changed := final
	for _, t := range q.ledger {
		if t.home != home || t.epoch != epoch {
			continue
		}
		if t.charged {
			changed, t.charged = true, false
		}
		tb := scheduler.TenantBucket{Tenant: t.tenant, At: now}
		if c := t.quota.RequestsPerMinute; c > 0 {
			t.rpm.refill(c, now)
			tb.RequestsPerMinute, tb.Requests = c, t.rpm.level
		}
		if c := t.quota.TokensPerMinute; c > 0 {
			t.tpm.refill(c, now)
			tb.TokensPerMinute, tb.Tokens = c, t.tpm.level
		}
		if !t.full(now) {
			levels = append(levels, tb)
		}
	}
	q.lmu.Unlock()
	if !changed {
		return // only refilling since the last save: the next owner refills the saved levels itself
	}
	slices.SortFunc(levels, func(a, b scheduler.TenantBucket) int { return strings.Compare(a.Tenant, b.Tenant) })
	data, err := json.Marshal(levels)
	if err == nil {
		sctx, cancel := context.WithTimeout(ctx, q.storeTimeout)
		err = q.store.Save(sctx, home, epoch, data)
		cancel()
	}
	if err != nil {
		q.m.bucketSyncErrors.WithLabelValues("save").Inc()
		q.log.Warn("quota buckets not saved", zap.String("class", home), zap.Bool("final", final), zap.Error(err))
	}
}

// startCarried sets a new ledger's central buckets from the levels carried
// for it (Acquired), refilled from their save to now.
func (q *Quota) startCarried(t *ledgerTenant, now int64) {
	k := ledgerKey(t.home, t.tenant)
	tb, ok := q.carried[k]
	if !ok {
		return
	}
	delete(q.carried, k)
	at := tb.At
	if at <= 0 || at > now {
		at = now
	}
	if tb.RequestsPerMinute > 0 {
		t.rpm = tokenBucket{level: tb.Requests, at: at}
		t.rpm.refill(tb.RequestsPerMinute, now)
	}
	if tb.TokensPerMinute > 0 {
		t.tpm = tokenBucket{level: tb.Tokens, at: at}
		t.tpm.refill(tb.TokensPerMinute, now)
	}
}
