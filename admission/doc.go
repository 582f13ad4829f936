// Package admission carries admission between router replicas (design §4):
// the entry replica that received a request asks the replica that owns the
// request's policy class to admit it, over NATS when the owner is another
// replica and in-process when it is this one.
//
// Server is the owner side. While this replica owns a class (Own), it
// subscribes to admit.<class>, cancel.<class> and adopt.<class> and feeds the
// local admission actor; it always listens on life.<self> for lifecycle marks
// of the bookings it granted. Every admit enqueues through an ownership gate
// that runs on the actor's turn (scheduler.Actor.EnqueueIf), and the epoch a
// grant carries is read there. Disown leaves the owned set first, unsubscribes,
// and then rejects the class's queued entries with ownership_lost on a later
// actor turn, so no request passes the gate after the queue was emptied and
// entry replicas resubmit the rejected ones to the next owner. A cancel
// withdraws only the attempt it names. The owner has a random instance id
// that grants carry; lifecycle marks that name another instance (this
// replica's previous life) are dropped. Replies are published by Run's
// replier goroutine, off the scheduling turn.
//
// Client is the entry side and implements the frontend's Admitter. It follows
// class ownership as the cluster layer reports it (OwnersChanged), retries
// with backoff while a class has no owner, resubmits requests whose owner
// moved or died (as retries, never as new arrivals), ignores grants fenced by
// a newer epoch, renews its in-flight bookings, and re-homes them (adopt) when
// their class moves. It waits on an injected clock (ClientConfig.Clock): the
// backoffs, the abandon grace (a deadline Run's timer enforces) and the
// reply timeout of an admit without a deadline (OwnerReplyTimeout), after
// which the attempt is cancelled and resubmitted. A request that reached an
// owner is counted there, so the entry never counts a second outcome for it. When NATS is unreachable it admits every class on the
// local actor (degraded mode, counted and exported) and returns to normal by
// itself once NATS is back. While the replica's etcd session is unhealthy
// (ClientConfig.ClusterHealthy) no owner can be trusted to admit, so a
// request that has waited EtcdDegradedAfter for one is admitted on the local
// actor the same way; that mode too ends by itself. Every such degraded
// admission enforces tenant quotas and class limits under the policy
// file's degraded quota policy (SetDegradedPolicy): split among the
// replicas last seen alive (ClientConfig.ReplicasAlive), whole, or closed.
// A new owner's adoption hold ends when every live entry (WithEntries) has
// reported its re-home round for the class and epoch, or at its bound.
// Leave, called when the
// replica stops for good, answers every request that would wait for an
// owner at once (ownership_lost) instead.
//
// The Client's methods are grouped one concern per file: client.go (config,
// type, constructor), admit.go (Admit and the wait for an owner), remote.go
// and local.go (one attempt at a remote owner or on this replica's actor),
// owners.go (ownership changes, abandoning and lost connections), health.go
// (degraded modes), degraded.go (the degraded quota policy), run.go (Run
// and Leave), bookings.go (tracking, renewal and release of in-flight
// bookings), rehome.go (moving them to a new owner), counts.go and
// ticket.go. On the owner side, adopthold.go ends adoption holds. status.go
// is the status probe, both sides: an entry asks the owner about an attempt
// that has had no answer for ClientConfig.StatusAfter.
//
// Quota leases a tenant's quota across the class owners its requests go to
// (capacity leasing, docs/tenants.md): quota.go is the holder side (the
// check before a request reaches the actor, and its release when the
// booking ends), quotaowner.go the quota owner's ledger, quotabuckets.go
// the carry of its central buckets with the home class.
//
// Concurrency: Server and Client are safe for concurrent use. Each has
// Run(ctx), which owns the goroutines they need (Server: the replier, beside
// NATS's own delivery goroutines; Client: the renew, re-home and abandon
// loop) and returns after they have exited. NATS handlers never block on the
// network; they may block briefly on the actor's input channel, which is the
// intended backpressure.
package admission
