package prompt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/kvindex"
)

// BenchmarkChatNextTurnHashes is the router's prompt work on the replica
// benchmark's request up to its block hashes: BenchmarkChatNextTurn's
// parse and tokenize, then the sequence hashes at 16 tokens per block
// (parse+tokenize+hash); and the hashing alone, of one next turn's ids
// (hash). cpu-ns/op is the process CPU per request.
func BenchmarkChatNextTurnHashes(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Tokenizers = map[string]string{"m": "tiktoken:o200k_base"}
	reg, err := NewRegistry(cfg, Deps{}, zap.NewNop(), nil)
	require.NoError(b, err)
	m, _ := reg.Model("m")
	bodies := nextTurnBodies(b, m, false)
	fields := make([]*Fields, len(bodies))
	for i, body := range bodies {
		fields[i] = bodyFields(b, body)
	}
	ctx := context.Background()
	seed := kvindex.ModelSeed("m")
	tokenize := func(f *Fields) Result {
		in, err := Parse(KindChat, f)
		if err != nil {
			b.Fatal(err)
		}
		res, err := reg.Tokenize(ctx, "m", in, nil)
		if err != nil {
			b.Fatal(err)
		}
		return res
	}
	hashResult(tokenize(fields[0]), 16, seed) // the conversation's history is cached, and hashed once
	b.Run("parse+tokenize+hash", func(b *testing.B) {
		b.ReportAllocs()
		c0, i := cpuNow(), 0
		for b.Loop() {
			hashResult(tokenize(fields[i%len(fields)]), 16, seed)
			i++
		}
		b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("hash", func(b *testing.B) {
		res := tokenize(fields[1])
		b.ReportAllocs()
		c0 := cpuNow()
		for b.Loop() {
			hashResult(res, 16, seed)
		}
		b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
	})
}
