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
// retired id together. A lookup during which ClearStale freed ids starts
// again, since a freed id may have changed hands under it (lookupKept in
// index.go). Lock order: worker mutex, clear mutex, registry mutex, mask
// mutex; then shard mutexes, and the holder sets' mutex innermost. The
// Index starts no goroutine.
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
// pages (hugepage_linux.go). A fifth keeps a lookup's cost from growing
// with the number of holders: the holder sets of hashes held by more than
// four workers are immutable and interned, shared by every block with the
// same holders, so a walk through a prefix cached by hundreds of workers
// intersects one set, not one per block (sets.go). BenchmarkLookup and
// bench's BenchmarkScaleIndex measure it.
//
// # Sampled index
//
// With Config.Sample n > 1 (-index.sample) the index keeps only the hashes
// Sampled(h, n) selects, about one in n by a mixed hash: sequence hashes are
// chained, so a kept hash still names its whole prefix. The rule is
// stateless, so apply, dumps, predictions, Held and HeldDepth agree without
// knowing a block's depth; Lookup walks the sampled positions and reports
// depths in blocks, short of the exact depth by up to the gap to the next
// sampled position. EventCounts keep counting every block.
//
// # Offloaded tiers
//
// Engines that offload KV blocks to host memory or disk (vLLM's offloading
// connectors, SGLang's hierarchical cache) report the lower tiers' blocks
// too. Each lower tier of a worker is indexed as one more worker, under
// TierStream's name ("w--cpu", "w--disk"): its adapter publishes it as a
// stream of its own (own instance, ids, gaps and dumps), and a router folds
// its matches back into the worker with SplitTier, where the selector
// prices the blocks beyond the GPU depth at their load time.
//
// Why not a tier bit in the entries: the hot table and Lookup stay exactly
// as measured (BenchmarkLookup is unchanged: no extra load, branch or
// width on the walk), and apply, gap repair and dumps need no tier case.
// The cost: each tier stream takes one interned id (MaxWorkers must count
// them: a fleet of n workers with a CPU tier is 2n ids), a block held on
// both tiers is two entries, a Lookup returns up to one match per tier of
// a worker, and each tier's depth is its own contiguous prefix, so a
// prefix split across tiers (the first blocks on GPU, the next only on
// CPU) is read as the deeper of the two runs rather than their union.
// Engines offload write-through (a stored GPU block is copied down and
// stays below after GPU eviction), so the lower tier holds the prefix
// from its start and the deeper run is the union in practice.
//
// Writers feed it from outside: kvingest applies batches from several
// goroutines, one per worker at a time, and repairs the workers it resets
// (NeedingDump, ResyncNotify, ApplyDump).
package kvindex
