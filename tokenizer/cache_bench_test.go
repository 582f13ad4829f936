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
