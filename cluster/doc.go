// Package cluster is Switchyard's etcd adapter: the process's session lease,
// the replica and worker registries, placement and ownership of policy
// classes, and the policy config key (design §3, §4 steps 7–9, §8).
//
// # Keys
//
// All keys come from wire.Keys: replicas/<id> and workers/<id> hold
// wire.ReplicaInfo / wire.WorkerInfo JSON bound to the registrant's lease;
// classes/<name>/owner holds the owner's replica id bound to the owner's
// lease; config/policy holds the raw policy YAML.
//
// # Session and fencing
//
// A Session is one lease per process, renewed by its own loop so that the
// time of the last successful renewal is known. A renewal counts from when
// its request was sent, so "renewed less than TTL/2 ago" proves the lease
// still has more than TTL/2 to live. When that stops being true the session
// turns unhealthy and Ownership releases every class at once (ReleaseFenced):
// the fence always fires before the server can expire the lease and another
// replica can claim. If renewals resume while the lease lives, the keys are
// still ours and the classes are re-acquired with their old epochs. A lease
// that expired ends the session for good (ErrSessionExpired), unless
// SessionConfig.Regrant is set: then the session grants a new lease (with
// backoff) and lives on, and Ownership releases what it held under the old
// lease and claims again under the new one once the app has registered under
// it. Routers run that way, so an etcd outage or a partition longer than the
// TTL never makes them exit.
//
// # Ownership protocol
//
// Placement is rendezvous hashing (Place, Score) of the class name over
// replica ids. A class without an owner is claimed by the winner among all
// ready replicas, with one transaction: CreateRevision(key) == 0 → put with
// the session lease. The key's create revision is the class's epoch; it only
// grows. An owner hands a class off only when the winner among *settled*
// replicas (ready, as observed here, for at least SettlePeriod without
// interruption, same lease) plus itself is someone else: it calls OnRelease,
// then deletes the key if it still has its epoch and lease; the winner then
// claims it. Because the old owner's OnRelease returns before its delete and
// the new owner's OnAcquire runs after its claim, two replicas never believe
// they own a class at the same time. An owner that dies stops renewing; its
// keys vanish with its lease and the rightful replica claims. A replica that
// is not ready claims nothing and hands its classes to settled replicas.
// Every replica watches all owner keys, so Owners, Owner and NewestEpoch
// answer "who owns class c, at which epoch" locally.
//
// # Concurrency
//
// Nothing starts in a constructor. Session, Replicas, Workers, ConfigWatcher
// and Ownership each have Run(ctx) that returns only after every goroutine it
// started has exited. Each registry's state is written only by its Run
// goroutine and published as an immutable Snapshot through an
// atomic.Pointer; a snapshot's Changed channel is closed when it is
// superseded, so any number of readers can wait for changes and the watch
// never blocks on them. Ownership's state is owned by its Run goroutine;
// Callbacks run synchronously on it. ConfigWatcher's callback runs on its Run
// goroutine. Bad records are counted (switchyard_cluster_decode_errors_total)
// and skipped; nothing panics on bad input.
package cluster
