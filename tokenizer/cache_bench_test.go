package tokenizer

import (
	"math/rand/v2"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// BenchmarkEncodeCachedNextTurn is a conversation's next turn in steady
// state: the 30-turn history of BenchmarkIncrementalChat is cached, and
// every iteration sends it with a final user message not seen before (as
// the replica benchmark's clients do). cpu-ns/op is the process CPU time
// per encode, which a machine shared with other work inflates less than
// wall time.
func BenchmarkEncodeCachedNextTurn(b *testing.B) {
	m := llama3(b)
	rng := rand.New(rand.NewPCG(7, 7))
	msgs := [][2]string{{"system", "You are a helpful assistant."}}
	for len(msgs) < 60 {
		msgs = append(msgs, [2]string{"user", chatMessage(rng, 185)}, [2]string{"assistant", chatMessage(rng, 185)})
	}
	c := NewPrefixCache(64 << 20)
	m.EncodeCached(c, llama3Chat(msgs, true))
	texts := make([]string, 256)
	for i := range texts {
		texts[i] = llama3Chat(append(msgs[:len(msgs):len(msgs)], [2]string{"user", "And in turn " + strconv.Itoa(i) + ", which worker holds the prefix?"}), true)
	}
	b.SetBytes(int64(len(texts[0])))
	b.ReportAllocs()
	c0 := cpuNow()
	i := 0
	for b.Loop() {
		m.EncodeCached(c, texts[i%len(texts)])
		i++
	}
	b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
}

func cpuNow() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkEncodeTurnsNextTurn is BenchmarkEncodeCachedNextTurn's
// conversation through EncodeTurns at Llama 3's joint: only the new final
// message is rendered, and the history is neither scanned nor hashed (the
// caller's chain keys are made outside the loop here; the prompt package
// hashes the messages' bytes, BenchmarkChatNextTurn there).
func BenchmarkEncodeTurnsNextTurn(b *testing.B) {
	benchEncodeTurnsNextTurn(b, func(m *Model, c *PrefixCache, j Joint, keys []uint64, turn func(int, []byte) []byte, tail string) {
		m.EncodeTurns(c, j, keys, turn, tail)
	})
}

// BenchmarkEncodeTurnsIDsNextTurn is BenchmarkEncodeTurnsNextTurn through
// EncodeTurnsIDs, as the prompt package calls it: the cached history is
// the result's Head, uncopied, and the generation prompt its Tail
// (EncodeTurns gathers the two into one slice).
func BenchmarkEncodeTurnsIDsNextTurn(b *testing.B) {
	benchEncodeTurnsNextTurn(b, func(m *Model, c *PrefixCache, j Joint, keys []uint64, turn func(int, []byte) []byte, tail string) {
		m.EncodeTurnsIDs(c, j, keys, turn, tail)
	})
}

func benchEncodeTurnsNextTurn(b *testing.B, encode func(m *Model, c *PrefixCache, j Joint, keys []uint64, turn func(int, []byte) []byte, tail string)) {
	m := llama3(b)
	j, ok := m.Joint(llama3TurnsTemplate.left, llama3TurnsTemplate.right)
	if !ok {
		b.Fatal("Llama 3 splits after <|eot_id|>")
	}
	rng := rand.New(rand.NewPCG(7, 7))
	msgs := [][2]string{{"system", "You are a helpful assistant."}}
	for len(msgs) < 60 {
		msgs = append(msgs, [2]string{"user", chatMessage(rng, 185)}, [2]string{"assistant", chatMessage(rng, 185)})
	}
	c := NewPrefixCache(64 << 20)
	llama3TurnsTemplate.encode(m, c, j, msgs, true)
	convs := make([][][2]string, 256)
	keys := make([][]uint64, len(convs))
	for i := range convs {
		convs[i] = append(msgs[:len(msgs):len(msgs)], [2]string{"user", "And in turn " + strconv.Itoa(i) + ", which worker holds the prefix?"})
		keys[i] = turnKeys(convs[i])
	}
	b.SetBytes(int64(len(llama3Chat(convs[0], true))))
	b.ReportAllocs()
	c0 := cpuNow()
	i := 0
	for b.Loop() {
		conv := convs[i%len(convs)]
		encode(m, c, j, keys[i%len(keys)], func(k int, dst []byte) []byte {
			return append(dst, llama3TurnsTemplate.turn(k, conv[k])...)
		}, llama3TurnsTemplate.genPrompt)
		i++
	}
	b.ReportMetric(float64(cpuNow()-c0)/float64(b.N), "cpu-ns/op")
}
