package adapter

import "github.com/switchyard/switchyard/enginekv"

// feedPayload hands one raw engine payload to the mirror the way the
// enginekv subscriber does for a batch in sequence. It lives alone in this
// file so that the before/after table of docs/benchmarks.md can build the
// same BenchmarkAdapterThroughput against the base commit's API.
func feedPayload(m *Mirror, seq uint64, payload []byte) error {
	b, err := enginekv.DecodeBatch(payload)
	if err != nil {
		return err
	}
	b.Topic, b.Seq = "kv", seq
	m.Batch(b)
	return nil
}
