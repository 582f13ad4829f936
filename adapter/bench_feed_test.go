package adapter

import "github.com/switchyard/switchyard/enginekv"

// payloadFeeder returns a function handing one raw engine payload to the
// mirror the way the enginekv subscriber does for a batch in sequence
// (Subscriber.deliver: a Decoder reused across payloads, then
// BatchTransient). It lives alone in this file so that the before/after
// table of docs/benchmarks.md can build the same
// BenchmarkAdapterThroughput against the base commit's API (DecodeBatch,
// then Batch).
func payloadFeeder(m *Mirror) func(seq uint64, payload []byte) error {
	var dec enginekv.Decoder
	return func(seq uint64, payload []byte) error {
		b, err := dec.Decode(payload)
		if err != nil {
			return err
		}
		b.Topic, b.Seq = "kv", seq
		m.BatchTransient(b)
		return nil
	}
}
