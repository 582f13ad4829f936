package prompt

import (
	"context"
	"encoding/json"
	"runtime"
	"strconv"
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

// BenchmarkChatGrowingConversations is the router's prompt work (parse,
// tokenize, hashes at 16 tokens per block) on true next turns: 16
// conversations of the 4k chat, each with a system prompt of its own,
// take turns, each request adding an answer and a question to its
// conversation's previous one (up to 64 turns each: run it 1024x, one
// pass). Each request's history is the previous request's prompt, cached.
func BenchmarkChatGrowingConversations(b *testing.B) {
	cfg := DefaultConfig()
	cfg.Tokenizers = map[string]string{"m": "tiktoken:o200k_base"}
	reg, err := NewRegistry(cfg, Deps{}, zap.NewNop(), nil)
	require.NoError(b, err)
	m, _ := reg.Model("m")
	base := chat4k(b, m, 4096)
	const convs, turns = 16, 64
	fields := make([]*Fields, 0, convs*turns)
	msgs := make([][]map[string]string, convs)
	for c := range msgs {
		msgs[c] = append([]map[string]string{{"role": "system", "content": "Conversation " + strconv.Itoa(c) + ". " + base[0]["content"]}}, base[1:]...)
	}
	ctx := context.Background()
	seed := kvindex.ModelSeed("m")
	for c := range msgs { // each conversation's history is cached, and hashed once
		raw, err := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs[c]})
		require.NoError(b, err)
		in, err := Parse(KindChat, bodyFields(b, raw))
		require.NoError(b, err)
		res, err := reg.Tokenize(ctx, "m", in, nil)
		require.NoError(b, err)
		hashResult(res, 16, seed)
	}
	for t := range turns {
		for c := range msgs {
			msgs[c] = append(msgs[c], map[string]string{"role": "assistant", "content": "Worker " + strconv.Itoa(t) + " holds it; the index says so after " + strconv.Itoa(t*c) + " events."},
				map[string]string{"role": "user", "content": "And in turn " + strconv.Itoa(t) + ", which worker holds the prefix?"})
			raw, err := json.Marshal(map[string]any{"model": "m", "stream": true, "messages": msgs[c]})
			require.NoError(b, err)
			fields = append(fields, bodyFields(b, raw))
		}
	}
	runtime.GC() // the setup's garbage is not the loop's
	b.ReportAllocs()
	c0, i := cpuNow(), 0
	for b.Loop() {
		in, err := Parse(KindChat, fields[i%len(fields)])
		if err != nil {
			b.Fatal(err)
		}
		res, err := reg.Tokenize(ctx, "m", in, nil)
		if err != nil {
			b.Fatal(err)
		}
		hashResult(res, 16, seed)
		i++
	}
	b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
}
