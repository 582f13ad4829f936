// Package adapter makes one real inference engine (vLLM, SGLang, or any
// OpenAI-compatible server) a first-class worker of a Switchyard cluster
// (design §14). `switchyard adapter` runs one Adapter beside each engine.
//
// # What it owns
//
//   - The worker's etcd record (Registrar): discovered from the engine
//     (discovery.go: /v1/models, vLLM's vllm:cache_config_info, SGLang's
//     /get_server_info), overridden by flags, bound to the adapter's own
//     cluster.Session lease, and present only while the engine's health
//     endpoint answers (FailureThreshold failed probes in a row delete it;
//     the next healthy probe writes it again).
//   - The KV mirror (Mirror, an enginekv.Handler): the engine's cache as
//     Switchyard sequence hashes, and the worker's wire.KVEventBatch stream
//     on NATS kv.<worker> with its own instance, ids from 1 and heartbeats,
//     plus the answers to kvdump.<worker>. Routers therefore treat the
//     engine exactly like the simulated worker, gaps and dumps included.
//   - Load reports (LoadReporter): the engine's Prometheus metrics scraped
//     every LoadInterval into wire.LoadReport on load.<worker>, carrying the
//     mirror's instance and last event id.
//   - Its HTTP port: /metrics, /healthz, /readyz (registered, and when KV
//     events are configured the event subscriber running), and the model's
//     tokenizer files under /tokenizer/<file>, advertised in
//     WorkerInfo.Tokenizer with wire.TokenizerDigest.
//
// # TLS
//
// An https:// engine (EngineURL, MetricsURL) is verified with
// Config.EngineTLS through internal/tlsconf: a CA bundle (default the
// system's roots), an optional client certificate re-read when its files
// change, the expected server name and the lowest version. A request that
// fails at TLS wraps ErrEngineTLS with a hint of what to check, keeps the
// crypto/tls or x509 error, and is counted by reason in
// switchyard_adapter_engine_tls_failures_total (verify, not_tls,
// refused); the registrar logs it with the failed probe and never
// registers an engine it cannot verify. Config.TLS serves the adapter's own
// port over TLS (HTTP/2 by ALPN); the advertised tokenizer URL is then
// https://. The ZMQ event link has no TLS: vLLM and SGLang publish plain
// ZMQ, so it belongs on loopback or inside the pod.
//
// # Data flow
//
//	engine ZMQ PUB ─► enginekv.Subscriber ─► Mirror.Batch/Reset ─► NATS kv.<worker>
//	                                            ▲ kvdump.<worker> ◄── routers
//	engine /metrics ─► LoadReporter ─► NATS load.<worker>
//	engine /health, /v1/models, cache info ─► Registrar ─► etcd workers/<worker>
//
// # Rehashing
//
// Engine block hashes are never routed on (vLLM's are random per process
// unless PYTHONHASHSEED is set). For each stored block the mirror computes
// kvindex.BlockHash(tokens, seed), chained with kvindex.ChainHash from the
// parent's Switchyard hash, where seed is kvindex.ModelSeed of the block's
// lora_name, or of the registered base model for blocks without a LoRA:
// exactly what a router computes with kvindex.SequenceHashes for a request
// to that model name. A bounded map (Shape.MaxEntries, oldest first
// eviction, order.go) takes engine hashes to Switchyard hashes for
// removals and parents; an
// engine hash stored twice (vLLM may cache one hash in two blocks) is
// reference-counted (the maps are adapter/table.go, open addressing without tombstones), and so is a Switchyard hash that several engine hashes
// map to (the engine salts with what events do not carry), so routers lose
// a block only when the engine holds no copy. An engine hash stored again
// with other tokens (a collision) moves to the new Switchyard hash, and the
// old one loses its reference (counted as a conflict). An evicted entry is removed
// on routers too: a miss there, never a stale hit. The order of eviction is
// insertion order, except that an entry that outlived twice the live
// entries' worth of later stores (a hot prefix the engine keeps) counts as
// inserted anew: that keeps the order's memory proportional to the map.
//
// The mirror is an enginekv.TransientHandler: it copies what it keeps (the
// Switchyard hashes) out of each batch, so the subscriber lends it every
// batch from one reused Decoder.
//
// Blocks are skipped and counted by reason (switchyard_adapter_kv_skipped_
// blocks_total): another block size, a KV cache group other than 0, a tier
// the mirror does not follow (removals and clears of other tiers are
// ignored too), a medium no engine is known to write (medium_unknown), a
// LoRA id without a name (the seed would be unknown), token ids that do not
// fill the blocks, and unknown parents.
//
// # Tiers and data-parallel ranks
//
// With -kv-tiers a lower tier (host memory, disk) gets a mirror of its own
// publishing as the worker's tier stream (tiers.go); with -dp-rank the
// adapter fronts one rank of a data-parallel vLLM and registers it as a
// worker of its own (dp.go).
//
// # Exactness and repair
//
// The mirror is exact while it has seen every event since the engine's
// cache was empty: its first batch after a start or reset had sequence 0, or
// the engine sent AllBlocksCleared since. A store with an unknown parent in
// that state means its view is wrong, so it repairs by starting over: a
// Cleared event under a new random instance with ids from 1 (routers apply
// that without a dump) and a rebuild from live events. When the mirror is
// not exact (joined mid-stream, after a reset or an eviction) an unknown
// parent is expected: the chain cannot be rehashed and is skipped without
// clearing. The subscriber's Reset (continuity lost) and a failed
// subscriber run also start over under a new instance. No replay hook is
// used for repair: replay is the subscriber's business (gaps, joins).
//
// # Goroutines and concurrency
//
// Constructors start nothing. Adapter.Run owns, and waits for: the HTTP
// server, Registrar.Run (which runs its cluster.Session and probes on its
// own goroutine; the OnInfo callback that shapes the mirror runs there,
// before each registration is written), Mirror.Run (heartbeats; dump
// requests are answered on nats.go's subscription goroutine), the event
// follower (runs the enginekv subscriber once the mirror is shaped, and
// again after it fails) and LoadReporter.Run. The mirror's state is guarded
// by one mutex taken by Batch, Reset, heartbeats, dumps and Position, so
// ids never interleave and a dump's AsOfID is exactly the last id published
// before its snapshot. Every bad engine answer is counted and logged; none
// is fatal, none panics (the discovery decoders are fuzzed).
//
// # Sources read
//
// SGLang's python/sglang/srt/entrypoints/http_server.py (sgl-project/sglang
// at commit 0025436e: /health runs a one-token generation; /get_server_info
// merges server_args, scheduler_info and internal_states) for the server
// info fields. vLLM's /v1/models cards (id, parent, max_model_len), its
// CacheConfig metrics_info labels of vllm:cache_config_info, its load
// gauges and the KV events' BlockStored/BlockRemoved/AllBlocksCleared
// semantics (vllm/v1/core/block_pool.py: one BlockStored per newly cached
// block run, one BlockRemoved per evicted block, duplicates of one hash
// possible) are from vLLM's documented behaviour as of its 0.11 releases;
// the ZMQ wire decoding itself belongs to package enginekv.
package adapter
