// Package gossip carries soft state between router replicas over
// hashicorp/memberlist: each replica's per-worker load aggregates (from its
// admission ledger), predicted prefix entries, KV index digests, and
// per-worker health records (a worker suspected after first-byte timeouts,
// or seen to recover; Health).
//
// # What it owns
//
//   - State, the mergeable soft state: per origin (the replica that authored
//     it) and per worker a last-writer-wins Entry stamped with the origin's
//     version, plus per-origin floors that remove a departed origin's
//     entries. Merge is a pure join: idempotent, commutative, associative.
//     Only an origin authors its own entries; when it sees a claim about
//     itself it did not make (an earlier incarnation, a wrong removal) it
//     re-asserts its value under a newer version.
//   - The codec (versioned binary, magic "SG") and node meta (magic "SM",
//     at most MaxMetaBytes).
//   - The memberlist delegate, the broadcast queue, and a transport wrapper
//     that counts bytes sent.
//
// # Dissemination
//
// Every Interval (50 ms) the owner compares the newest SetLocalLoads and
// SetDigests values with what it last announced. Changed workers get the
// next version and their shards (workers hashed into shards of about 4) are
// queued as named broadcasts "l/<origin>/<bits>/<shard>/<part>": each carries
// the shard's full entries, so a newer one may replace a queued older one
// without losing anything. A receiver that learns something new from a
// message relays it under the same name (epidemic spread; memberlist itself
// only retransmits what its node queued). Predictions are unique broadcasts,
// deduplicated by (origin, id) and relayed once; so are session records
// (sessions.go: which worker a session's latest turn was routed to).
// Push-pull (anti-entropy, and on join) exchanges a digest: per origin its
// floor, newest version, entry count and a hash of its (worker, version)
// pairs. Where a summary differs the replica fetches, over a reliable
// stream, the entries of the buckets that differ (repair.go), so push-pull
// grows with replicas, and with what broadcasts missed, rather than with
// replicas × workers. A departed origin (no longer a live member) keeps its
// entries for GracePeriod; then its floor is raised to its newest version.
//
// Bandwidth is bounded by memberlist, not by load: broadcasts ride at most
// GossipNodes packets (UDP, ≤1400 bytes) per GossipInterval, plus push-pull.
// When changes outpace that, named broadcasts coalesce in the queue (newest
// shard value wins) and propagation lag grows instead of bytes.
//
// # Concurrency
//
// Run owns everything it starts: the memberlist (its goroutines, and the
// counting transport's stream forwarder), a join goroutine, the sender of
// repair fetches and answers (fetch.go), the keyring
// file watcher (with KeyringFile), and the owner loop, which runs on Run's
// goroutine. Run returns only after all have
// exited. New starts nothing.
//
// The owner loop is the only writer of the state. memberlist callbacks
// (NotifyMsg, MergeRemoteState, GetBroadcasts, LocalState, NodeMeta) never
// block: they copy and decode the buffer and hand the result to the owner
// through the inbox with a non-blocking send, counting drops. The inbox and
// the prediction queue are buffered (InboxSize, PredictionQueueSize), as
// their config fields document.
//
// # Encryption and key rotation
//
// memberlist's keyring encrypts every packet and stream (AES-GCM) with the
// primary key and decrypts with any installed key. SetKeys (or a change of
// the KeyringFile) adds new keys, switches the primary and removes the
// rest, in that order; rotating without downtime is three such changes,
// each made on every member before the next (Keys, docs/security.md).
// A member that started without a key cannot be given one: memberlist
// decides at creation whether it encrypts.
//
// Producers (SetLocalLoads, SetDigests, SetLocalHealth, Predict) never block: they publish a
// copy through an atomic pointer or a non-blocking send. Readers
// (RemoteLoad, RemoteDigests) read an immutable snapshot the owner publishes
// through an atomic pointer; LocalState returns the digest encoding the owner
// refreshes at most every 500 ms. The prediction sink is called from the
// owner loop only.
package gossip
