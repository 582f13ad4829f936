// Package bench owns Switchyard's benchmark tooling: trace readers (Mooncake
// JSONL, Azure LLM inference CSV, a seedable synthetic generator), the live
// open-loop load generator that replays a trace against any OpenAI-compatible
// endpoint, result files, summaries (Markdown and JSON) and plots (PNG).
// `switchyard bench` is Main; the deterministic simulator (--sim) plugs in
// through the SimMode hook from bench/sim*.go.
//
// Traces carry no text. A request's prompt is described by segments (seed,
// length), and token ids are synthesized from the seeds on demand, so equal
// seeds mean equal tokens (and therefore equal KV blocks at the engine) while
// a 12k-request trace never holds its ~150M tokens in memory at once.
//
// Typical use (the coordinator wires Main as `switchyard bench`):
//
//	switchyard bench --trace mooncake --file ../shared/traces/conversation_trace.jsonl \
//	    --target http://127.0.0.1:8080,http://127.0.0.1:8081 --speedup 10 --out out/kv
//	switchyard bench --trace synthetic --synthetic-turns 4 --synthetic-classes chat:3:1:2s,batch:1 ...
//
// Every request ends in exactly one Result with one Outcome; results stream to
// results.jsonl as they complete, so an interrupted run keeps what it
// measured.
//
// Concurrency: readers, generators and summaries are single-goroutine values
// (not safe for concurrent use). Runner.Run owns every goroutine it starts
// (one dispatcher loop on the caller's goroutine, one goroutine per request in
// flight, bounded by Concurrency, and an optional progress printer) and
// returns only after all of them have exited. The result sink is called from
// one goroutine at a time.
package bench
