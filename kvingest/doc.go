// Package kvingest feeds a router's KV index (kvindex) from NATS: it
// subscribes to every worker's KV event subject (wire.Subjects.KVAll),
// decodes and applies the batches, repairs the workers the index reset by
// fetching their dumps (chunked request-reply on kvdump.<worker>), and
// sweeps expired predicted entries. It is the index's I/O adapter, so that
// kvindex itself stays free of the network like the scheduler.
//
// # Concurrency
//
// Subscriber.Run owns every goroutine of the ingest (reader, apply shards,
// repair loop, sweep loop) and returns only after all of them exited. A
// worker's batches always go to the same apply goroutine, so they are
// applied in arrival order. NewSubscriber starts nothing.
package kvingest
