// Package scheduler is Switchyard's admission core (design §5): per-class
// policy queues, deficit round robin across classes, the worker selector and
// the booking ledger. It decides when a request may start and on which
// worker. It does no I/O and imports nothing of ours.
//
// It owns:
//   - Core: the whole algorithm, synchronous. It starts nothing, reads time
//     only from the injected Clock and is not safe for concurrent use. The
//     simulator drives it directly in virtual time. Its methods are grouped
//     one concern per file: core.go (the type, its constructor), enqueue.go,
//     drain.go (the drain loop and admit), drr.go (deficit round robin
//     across classes), candidates.go (a class's next dispatchable entry and
//     the blocked-class memo), cancel.go (cancel, expiry, wake-ups),
//     bookings.go (the booking ledger), membership.go (workers), classes.go
//     (class configuration, removal, shutdown) and snapshot.go.
//   - Actor: one goroutine (Run) that owns one Core. All mutation arrives on
//     its unbuffered input channels, so admission is serialized without
//     locks; readers outside get immutable *Snapshot values through an
//     atomic pointer. Admit blocks a request goroutine until the outcome.
//
// The worker selector has two costs (Config.Selector): design §5's block
// counts (selector.go) and the predicted time to first token under the
// engine's step-time model, calibrated per worker from first-token marks as
// overhead + scale × prediction (selector_ttft.go; the default). No external
// sources were read for either. A selection index (selindex.go) keeps idle
// workers in equal-cost buckets and loaded workers in order of a cost lower
// bound, so a decision over a large fleet evaluates the prefix holders, one
// worker per bucket and the few loaded workers whose bound is below the best;
// it chooses exactly what the full scan would (a differential test checks).
//
// Tenants (tenants.go): a request may carry its tenant; the Core enforces
// the tenant's quota (concurrency in its ledger, requests and tokens per
// minute as token buckets, corrected by FinishUsage) like a class limit, and
// shares a class between its tenants by deficit round robin by weight. A
// class whose queue holds one tenant's requests keeps the single-queue path.
//
// It declares what it consumes in ports.go: LoadView (other replicas'
// booked load, fed by gossip). Time comes from the injected clock.Clock
// (internal/clock): clock.Real in production, clock.Fake in tests, the
// simulator's virtual clock in bench.
//
// The one admission path: every request is queued and the same turn drains
// what is dispatchable (an arrival never bypasses a backlog); popping picks
// a class by DRR and its entry by (strict priority, due time, policy score,
// arrival); then project load, select a worker, book, respond; a refused
// response rolls the booking back. DESIGN.md has a diagram. Every Enqueue is
// completed exactly once through its Responder; counters settle exactly once
// per request, whichever path (grant, rejection, expiry, cancel) ends it.
package scheduler
