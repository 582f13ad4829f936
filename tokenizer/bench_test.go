package tokenizer

import (
	"math/rand/v2"
	"path/filepath"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/switchyard/switchyard/internal/testenv"
)

const regexp2Mod = "github.com/dlclark/regexp2@v1.12.0"

// benchText is ~16 kB of English and code: regexp2's README (prose with
// code samples) followed by its regexp.go, read from the module cache.
func benchText(b *testing.B) string {
	dir := testenv.ModuleDir(b, regexp2Mod)
	readme, err := readFile(filepath.Join(dir, "README.md"))
	if err != nil {
		b.Fatal(err)
	}
	code, err := readFile(filepath.Join(dir, "regexp.go"))
	if err != nil {
		b.Fatal(err)
	}
	s := string(readme) + "\n\n" + string(code)
	n := 16 << 10
	for n < len(s) && !utf8.RuneStart(s[n]) {
		n++
	}
	return s[:min(n, len(s))]
}

func BenchmarkEncode(b *testing.B) {
	m := llama3(b)
	text := benchText(b)
	ranks, specials := llama3Ranks(m)
	ref := pkoukkEncoder(b, ranks, specials, llama3Pattern)
	cold := new(scratch)
	impls := []struct {
		name   string
		encode func(string) []uint32
	}{
		{"switchyard", m.Encode},
		// Each call with an empty word cache: the cost of text whose words
		// the encoding goroutine has not seen before.
		{"switchyard-coldcache", func(s string) []uint32 {
			cold.resetWords(m)
			return m.appendEncode(nil, s, cold)
		}},
		{"switchyard-nowordcache", func(s string) []uint32 { return m.appendEncode(nil, s, &scratch{noWordCache: true}) }},
		{"tiktoken-go", ref},
	}
	for _, impl := range impls {
		b.Run("impl="+impl.name, func(b *testing.B) {
			n := len(impl.encode(text))
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				impl.encode(text)
			}
			b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// llama3Chat renders a conversation the way Llama 3's chat template does.
func llama3Chat(msgs [][2]string, generationPrompt bool) string {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	for _, m := range msgs {
		b.WriteString("<|start_header_id|>" + m[0] + "<|end_header_id|>\n\n" + strings.TrimSpace(m[1]) + "<|eot_id|>")
	}
	if generationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String()
}

// chatMessage makes a message of about words words from the corpus
// fragments, so turns hold prose, code, digits and other scripts.
func chatMessage(rng *rand.Rand, words int) string {
	var b strings.Builder
	for i := 0; i < words; i++ {
		b.WriteString(fragments[rng.IntN(len(fragments))])
		b.WriteString([]string{" ", " ", " ", "\n", ", ", ". "}[rng.IntN(6)])
	}
	return b.String()
}

func BenchmarkIncrementalChat(b *testing.B) {
	m := llama3(b)
	rng := rand.New(rand.NewPCG(7, 7))
	msgs := [][2]string{{"system", "You are a helpful assistant."}}
	for len(msgs) < 60 { // 30 turns: user and assistant
		msgs = append(msgs, [2]string{"user", chatMessage(rng, 185)}, [2]string{"assistant", chatMessage(rng, 185)})
	}
	prev := llama3Chat(msgs[:len(msgs)-2], true)
	next := llama3Chat(msgs, true)
	tokens := len(m.Encode(next))
	b.Logf("conversation: 30 turns, %d tokens, %d bytes", tokens, len(next))
	b.Run("full", func(b *testing.B) {
		b.SetBytes(int64(len(next)))
		for i := 0; i < b.N; i++ {
			m.Encode(next)
		}
		b.ReportMetric(float64(tokens), "tokens/op")
	})
	b.Run("cached", func(b *testing.B) {
		b.SetBytes(int64(len(next)))
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			c := NewPrefixCache(64 << 20)
			m.EncodeCached(c, prev) // the previous turn warmed the cache
			b.StartTimer()
			if got := m.EncodeCached(c, next); len(got) != tokens {
				b.Fatalf("cached encode has %d tokens; want %d", len(got), tokens)
			}
		}
		b.ReportMetric(float64(tokens), "tokens/op")
	})
}
