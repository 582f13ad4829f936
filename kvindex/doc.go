// Package kvindex knows which worker holds which prompt prefix in its KV cache.
//
// It owns:
//   - block hashing, the same on routers and engines (hash.go: xxh3-64 seed
//     1337 of little-endian u32 tokens, chained sequence hashes, salts);
//   - the exact prefix index (Index), built from every worker's KV events:
//     sequence hash → set of workers, with Lookup returning each worker's
//     matched depth in blocks;
//   - event application per worker (apply.go): stored/removed/cleared events,
//     gap detection (skipped id, unknown parent, restart, id going back,
//     more blocks than the engine holds), buffering while a dump is in flight
//     and replay of the events after the dump's AsOfID;
//   - predicted entries (predict.go) with a TTL, merged into lookups.
//
// It does no I/O: the NATS ingest that feeds it (subscription, decoding,
// dump repair, prediction sweeps) is the adapter package kvingest. It
// imports nothing of ours but the leaf packages wire and metrics, and no
// network package (scripts/depcheck.sh checks both).
//
// # Concurrency
//
// Index methods are safe for concurrent use. Lookup takes no lock: each
// shard is an open-addressing table read with atomic loads under a sequence
// counter (table.go). Writers serialise per shard on a mutex, and event
// application serialises per worker on that worker's mutex, so different
// workers apply in parallel. Dropping a worker's entries (gap, restart,
// cleared cache, removal) never scans on the apply path: the worker's
// interned id is retired (masked out of lookups at once) and the worker
// continues under a fresh id; one ClearStale scan later reclaims every
// retired id together. Lock order: worker mutex, clear mutex, registry
// mutex, mask mutex; shard mutexes are innermost. The Index starts no
// goroutine.
//
// # Lookup cost
//
// A routing lookup walks up to hundreds of sequence hashes through tables
// far larger than the CPU caches, so it is bound by cache and TLB misses,
// not by instructions. Four things keep those misses off its critical path
// (numbers and the measurements behind each are in the comments at the
// code): Lookup computes the addresses of a batch of hashes' lines first and
// then loads them in a loop of independent loads, so the misses overlap
// (preload, index.go); every probe starts at a cache line's first slot and
// the reader tests the whole line with conditional moves instead of a
// branch per slot (table.get); once at most four workers still match, the
// walk tracks them as a list of ids instead of a bitset (walkFew); and the
// index has 32 large tables that the kernel is asked to back with 2 MiB
// pages (hugepage_linux.go). BenchmarkLookup measures it.
//
// Writers feed it from outside: kvingest applies batches from several
// goroutines, one per worker at a time, and repairs the workers it resets
// (NeedingDump, ResyncNotify, ApplyDump).
package kvindex
