// Package engine is Switchyard's simulated inference engine: a
// continuous-batching scheduler with a paged KV block pool and prefix
// caching, modelled on vLLM's scheduler and block manager, with step times
// from a pluggable TimingModel.
//
// What it owns: the waiting queue (priority, then FIFO), the running set, the
// per-step token budget (decodes first, then chunked prefills), the KV block
// pool (full blocks keyed by kvindex sequence hashes, ref counts, freed blocks
// kept reusable until evicted, leaves first then least recently used),
// preemption by recompute, the KV event stream (ids from 1 per Instance) and
// the consistent dump of the cached block set.
//
// The core does no I/O and starts no goroutines. Time enters only through
// Step(now) and the injected clock.Clock, so the same code runs under wall time
// (Run) and under a simulator that calls Step in virtual time.
//
// Files, one concern each: engine.go (the Engine, its state, New), submit.go
// (Submit, Cancel, Stop and delivery), run.go (Step and the wall-clock Run
// loop), schedule.go (one step's batch: budget, admission, preemption,
// completion), kvevents.go (committing blocks and the KV event stream),
// queue.go (the waiting and running order), transfer.go (disaggregated
// serving: a decode-role request's KV pulled from a prefill engine, and the
// transfer time model) and dump.go (Dump and Stats);
// pool.go, timing.go and request.go hold the rest.
//
// Concurrency: every exported method is safe for concurrent use; one mutex
// guards all engine state. Step runs with that mutex held and, while holding
// it, calls Request.OnDelta and Config.Events. Those callbacks must not block
// and must not call back into the Engine. Stream buffers deliveries for
// consumers on other goroutines, so token delivery never blocks a step.
//
// A Config.Events that implements TokenEventSink also gets each stored
// block's token ids (what a vLLM-protocol publisher sends); the engine keeps
// them only for such a sink, so the native path pays one nil check.
package engine
