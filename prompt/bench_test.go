package prompt

import (
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
)

// chat4k is the body of the replica benchmark's chat (frontend's
// chatBody): a system prompt and alternating turns of varied English and
// code, about tokens o200k tokens, its messages' JSON only.
func chat4k(b testing.TB, m *Model, tokens int) []map[string]string {
	sentences := []string{
		"Routers admit requests per class and pick the worker whose cache holds the longest prefix.",
		"If a worker is busy, the scheduler weighs the cached blocks against its queued prefill tokens.",
		"func (c *Core) Admit(r *Request) (Grant, error) { return c.pick(r) } // the hot path",
		"Deadlines order the queue; a request past its due time is rejected with 429 exactly once.",
		"The quick brown fox jumps over the lazy dog, twice, while 1234 tokens stream back at 25 ms each.",
	}
	var msgs []map[string]string
	var text strings.Builder
	for i := 0; len(m.Encode(text.String())) < tokens; i++ {
		var turn strings.Builder
		for j := range 6 {
			turn.WriteString(sentences[(i*7+j*3)%len(sentences)])
			turn.WriteString(" (")
			turn.WriteString(strconv.Itoa(i*10 + j))
			turn.WriteString(") ")
		}
		role := []string{"system", "user", "assistant"}[min(i, 1+(i+1)%2)]
		msgs = append(msgs, map[string]string{"role": role, "content": turn.String()})
		text.WriteString(turn.String())
	}
	return msgs
}

// nextTurnBodies are 256 request bodies of the 4k chat, each with a final
// user message of its own (the next turn of one conversation, as the
// replica benchmark's clients send it). With lines, the chat's sentences
// are on lines of their own, as frontend's BenchmarkReplicaThroughputLines
// has them: every message holds escaped newlines, as real ones do.
func nextTurnBodies(b testing.TB, m *Model, lines bool) [][]byte {
	msgs := chat4k(b, m, 4096)
	if lines {
		for _, msg := range msgs {
			msg["content"] = strings.ReplaceAll(msg["content"], ") ", ")\n")
		}
	}
	bodies := make([][]byte, 256)
	for i := range bodies {
		turn := append(msgs[:len(msgs):len(msgs)], map[string]string{"role": "user", "content": "And in turn " + strconv.Itoa(i) + ", which worker holds the prefix?"})
		raw, err := json.Marshal(map[string]any{"model": "m", "stream": true, "max_tokens": 20, "messages": turn})
		require.NoError(b, err)
		bodies[i] = raw
	}
	return bodies
}

// bodyFields splits a body into Fields as the frontend's decode does: one
// validating scan whose member values alias the body, which marks them
// validated.
func bodyFields(b testing.TB, body []byte) *Fields {
	members, ok := ScanObject(body, nil)
	require.True(b, ok)
	f := &Fields{Validated: utf8.Valid(body)}
	for _, mb := range members {
		if string(mb.Key) == "messages" {
			f.Messages = mb.Value
		}
	}
	return f
}

// BenchmarkChatNextTurn is the router's prompt work on the replica
// benchmark's request, the 4k-token chat's next turn with o200k_base
// (ChatML): Parse of the body's fields, then Tokenize (render and the
// cached encode). cpu-ns/op is the process CPU per request.
func BenchmarkChatNextTurn(b *testing.B) { benchChatNextTurn(b, false) }

// BenchmarkChatNextTurnLines is BenchmarkChatNextTurn on the chat with
// escaped newlines in every message.
func BenchmarkChatNextTurnLines(b *testing.B) { benchChatNextTurn(b, true) }

func benchChatNextTurn(b *testing.B, lines bool) {
	cfg := DefaultConfig()
	cfg.Tokenizers = map[string]string{"m": "tiktoken:o200k_base"}
	reg, err := NewRegistry(cfg, Deps{}, zap.NewNop(), nil)
	require.NoError(b, err)
	m, _ := reg.Model("m")
	bodies := nextTurnBodies(b, m, lines)
	fields := make([]*Fields, len(bodies))
	for i, body := range bodies {
		fields[i] = bodyFields(b, body)
	}
	ctx := context.Background()
	tokenize := func(f *Fields) int {
		in, err := Parse(KindChat, f)
		if err != nil {
			b.Fatal(err)
		}
		res, err := reg.Tokenize(ctx, "m", in, nil)
		if err != nil {
			b.Fatal(err)
		}
		return res.IDs.Len()
	}
	tokenize(fields[0]) // the conversation's history is cached
	b.Run("parse+tokenize", func(b *testing.B) {
		b.SetBytes(int64(len(bodies[0])))
		b.ReportAllocs()
		c0, i := cpuNow(), 0
		for b.Loop() {
			tokenize(fields[i%len(fields)])
			i++
		}
		b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
	})
	b.Run("parse", func(b *testing.B) {
		b.ReportAllocs()
		c0, i := cpuNow(), 0
		for b.Loop() {
			if _, err := Parse(KindChat, fields[i%len(fields)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
	})
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
