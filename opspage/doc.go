// Package opspage is the operators' page: a live view of the whole router
// tier that every replica serves at / (of its admin listener when one is
// set), embedded in the binary as plain HTML, CSS and JavaScript.
//
// The page polls /debug/tier once a second. That endpoint answers with this
// replica's /debug/cluster document and every other registered replica's,
// fetched over HTTP in parallel with a short timeout (Config.PeerTimeout);
// a peer that does not answer in time is listed as unreachable with the
// error, never waited for. The browser merges the documents: the registry
// and ownership from the serving replica, each class's counters from its
// owner, bookings summed over replicas, decisions and routing-quality
// totals from all, each tenant's use from every replica whose scheduler
// accounts it (quotas are enforced per class owner), and each worker's
// calibration per replica (each owner's selector calibrates its own)
// (docs/operations.md, "The operators' page"; docs/api.md, /debug/cluster).
//
// Concurrency: a Page is immutable after New. Each /debug/tier request
// starts one goroutine per peer and waits for all of them before it
// answers; nothing outlives the request.
package opspage
