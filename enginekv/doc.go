// Package enginekv is the KV event protocol real engines speak: vLLM's and
// SGLang's KV cache events over ZeroMQ. It owns decoding their msgpack
// payloads in every layout found in the wild, a Subscriber that follows one
// engine's stream in order (replaying gaps, reporting resets), and a
// Publisher that speaks the same protocol for the simulated engine
// (`switchyard worker --protocol vllm`). It knows nothing of Switchyard's
// block keys: the adapter rehashes token ids.
//
// # The protocol, as read
//
// Sources read (with the search tool's file index; facts only, no code
// copied):
//   - vllm-project/vllm vllm/distributed/kv_events.py at b4e69e0a (2025,
//     v0.9 era), at 0181ea31, and a later vLLM main snapshot (the one with
//     typed ExtraKey, event_version, locality and ownership fields); a
//     deepinfra/vllm fork of the same file (array_like events with
//     data_parallel_rank, medium, lora_name, extra_keys, group_idx).
//   - sgl-project/sglang python/sglang/srt/disaggregation/kv_events.py at
//     006d053f, and a later snapshot (medium, BlockStoredWithMetadata,
//     attn_dp_rank); hash_str_to_int64 in sglang/srt/mem_cache.
//   - vLLM's PrometheusStatLogger.log_metrics_info (cache_config_info
//     labels: every CacheConfig field as str(), plus "engine").
//
// Framing (every version): the PUB socket sends [topic, seq, payload], seq
// an 8-byte big-endian counter from 0 per process (itertools.count), topic
// "" by default. A two-frame [seq, payload] is tolerated though no version
// sends it. The replay ROUTER (optional, vLLM and SGLang alike) takes
// [identity, "", start seq u64 BE] (exactly three frames, so a DEALER must
// send the empty delimiter itself) and answers, for every buffered batch
// with seq >= start, [identity, "", seq, payload] (vLLM before replies
// carried the topic, SGLang) or [identity, "", topic, seq, payload] (later
// vLLM main), then an end marker with seq -1 (all 0xFF) and an empty
// payload ([.., "", "", END, ""] in the topic form). The buffer holds the
// last buffer_steps batches (default 10,000); PUB high-water mark 100,000.
//
// Payload (msgspec, always tag=True, so the tag is the class name):
//   - b4e69e0a and SGLang 006d053f: array_like batch [ts, events] and events
//     ["BlockStored", block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id], ["BlockRemoved", block_hashes],
//     ["AllBlocksCleared"]. LayoutArray.
//   - the deepinfra fork (array_like everything, omit_defaults):
//     [ts, events, data_parallel_rank], BlockStored adds medium, lora_name,
//     then defaults extra_keys, group_idx (dropped when trailing and
//     default); BlockRemoved adds medium, group_idx. LayoutArray.
//   - later SGLang: [ts, events, attn_dp_rank], BlockStored adds medium
//     (always written: no omit_defaults) and, in BlockStoredWithMetadata,
//     a trailing metadata map {"cache_salt": ...}; BlockRemoved adds
//     medium ("GPU", "CPU_PINNED", "DISK", "EXTERNAL"). Hashes are signed
//     int64 (the first 16 hex digits of a SHA-256, two's complement).
//     LayoutArray.
//   - vLLM 0181ea31: EventBatch without array_like, so the batch itself is
//     a map {"ts", "events", "data_parallel_rank"}, and map events with a
//     "type" key. LayoutMapEnvelope.
//   - later vLLM main (and, per a third party's fixture, v0.28.0): array
//     batch [ts, events, data_parallel_rank] with map events {"type":
//     "BlockStored", block_hashes, parent_block_hash, token_ids,
//     block_size, lora_id, medium, lora_name, and optionally extra_keys,
//     group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window,
//     event_version, locality, ownership}. LayoutMap.
//
// vLLM's hashes are ints (the low 64 bits, with integer block hashes on)
// or bytes (the digest); both, and SGLang's signed ints, are normalised to
// uint64 (bytes: the last 8, big-endian). They are random per vLLM process
// unless PYTHONHASHSEED is set: never route on them.
//
// DecodeBatch reads any of these: fields by position or by key in any
// order, unknown fields and trailing elements skipped, unknown event types
// counted in Batch.Unknown, a value of another type where a later engine
// reuses a position (SGLang's metadata where vLLM has lora_name) skipped.
// Everything else is an error wrapping ErrMalformed; lengths are checked
// against the bytes left before anything is allocated. It is a hand-written
// cursor over the msgpack bytes (see decode.go for why and the benchmark
// ratio against msgpack/v5's generic decoding); EncodeBatch writes with
// msgpack/v5. A Decoder decodes the same way into memory it reuses from one
// payload to the next (the batch is valid until the next Decode); it is
// fuzzed against DecodeBatch and, for what both accept, against
// msgpack/v5's generic decoding of the same bytes
// (FuzzDecoderAgreesWithGenericMsgpack).
//
// A Handler that is also a TransientHandler (it keeps nothing of a batch
// past the call; the adapter's mirror is one) is lent each batch from the
// Subscriber's Decoder through BatchTransient, so following an engine
// allocates nothing per batch; any other Handler gets its own Batch.
//
// # Sequence rules of the Subscriber
//
// Batches reach the Handler in sequence order without gaps or duplicates
// between Resets. A gap replays from the last delivered seq + 1 when a
// replay endpoint is configured (live batches arriving meanwhile are
// buffered and de-duplicated), otherwise it is a Reset(ResetGap). A first
// batch other than seq 0 replays from 0 (a mid-stream join) or is a
// Reset(ResetJoinedMidStream). A live seq lower than the last one is a
// restart. After a reconnect the engine may have restarted, so with a
// replay endpoint the subscriber asks at once, without waiting for a live
// batch, for everything from one batch before the expected seq, and
// compares that batch's bytes with the one delivered (vLLM's replay
// buffer keeps the sent bytes, and a new process stamps new timestamps):
// the same engine answers with it (and with what it published while we
// were away), a restarted one with nothing or other bytes, which is a
// Reset(ResetRestart) and a replay from 0. A restarted engine that has no
// work publishes nothing, so waiting for its first batch could leave the
// lost cache in the routers' index for as long as KV-aware routing sends
// it nothing. Without a replay endpoint the next live batch tells, and a
// restarted engine that reached exactly the expected seq while
// disconnected cannot be told apart. A payload that
// does not decode is a lost batch (counted, then a Reset(ResetGap)).
// Corrupt frames are counted by reason (NameFrames) and logged at most once
// per LogInterval per reason at warn level.
//
// # Concurrency
//
// Constructors start nothing. Subscriber.Run owns a reader goroutine (the
// SUB socket, redialled by the reader itself whenever the connection
// breaks) and at most one replay goroutine (a DEALER per replay); all state
// and every Handler call live on Run's goroutine, and Run returns only
// after both have exited. Publisher.Publish may be called from any
// goroutine and never blocks (the simulated engine calls it under its
// lock): it only queues, dropping and counting beyond MaxQueue.
// Publisher.Run numbers, encodes and sends on its goroutine and owns the
// replay goroutine; Run returns after it. Batches queued when Run's ctx
// ends are still sent.
//
// zmq4 v0.17.0 leaks a goroutine per PUB socket (its Close never stops the
// socket's writer); closePubWriter stops it (zmq4fix.go).
package enginekv
