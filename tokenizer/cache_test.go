package tokenizer

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// conversation is a chat history that grows, and sometimes is edited in the
// middle, between turns.
type conversation struct{ msgs [][2]string }

func (c *conversation) step(rng *rand.Rand) {
	switch k := rng.IntN(10); {
	case k < 7 || len(c.msgs) < 3:
		c.msgs = append(c.msgs, [2]string{"user", chatMessage(rng, 1+rng.IntN(40))},
			[2]string{"assistant", chatMessage(rng, 1+rng.IntN(60))})
	case k < 9:
		// edit a message in the middle of the history
		i := 1 + rng.IntN(len(c.msgs)-1)
		c.msgs[i][1] = chatMessage(rng, 1+rng.IntN(30))
	default:
		// drop the tail (a regenerated answer)
		c.msgs = c.msgs[:len(c.msgs)-1]
	}
}

func TestEncodeCachedEqualsEncodeForEveryTurnOfRandomConversations(t *testing.T) {
	m := llama3(t)
	shared := NewPrefixCache(8 << 20)
	tiny := NewPrefixCache(4 << 10) // evicts constantly
	convs, turns := 40, 12
	if raceBuild {
		convs = 10
	}
	checked := 0
	for ci := 0; ci < convs; ci++ {
		rng := rand.New(rand.NewPCG(uint64(ci), 11))
		own := NewPrefixCache(8 << 20)
		conv := &conversation{msgs: [][2]string{{"system", chatMessage(rng, 10)}}}
		for turn := 0; turn < turns; turn++ {
			conv.step(rng)
			text := llama3Chat(conv.msgs, rng.IntN(4) > 0)
			if rng.IntN(5) == 0 {
				text += " <|eot_id|>\n\n<|reserved_special_token_3|>  trailing  "
			}
			want := m.Encode(text)
			for name, c := range map[string]*PrefixCache{"own": own, "shared": shared, "tiny": tiny} {
				if got := m.EncodeCached(c, text); !slices.Equal(got, want) {
					t.Fatalf("conversation %d turn %d, %s cache: EncodeCached differs from Encode\n text %q\n got  %v\n want %v", ci, turn, name, text, got, want)
				}
				checked++
			}
		}
	}
	st := own0(shared)
	if st.Hits == 0 {
		t.Fatalf("the shared cache never reused a prefix: %+v", st)
	}
	t.Logf("%d cached encodings equal to Encode; shared cache %+v", checked, st)
}

func own0(c *PrefixCache) CacheStats { return c.Stats() }

func TestEncodeCachedReusesThePreviousTurn(t *testing.T) {
	m := llama3(t)
	c := NewPrefixCache(1 << 20)
	msgs := [][2]string{{"system", "Be brief."}, {"user", "Hi there"}}
	m.EncodeCached(c, llama3Chat(msgs, true))
	msgs = append(msgs, [2]string{"assistant", "Hello!"}, [2]string{"user", "How are you?"})
	text := llama3Chat(msgs, true)
	if got := m.EncodeCached(c, text); !slices.Equal(got, m.Encode(text)) {
		t.Fatal("second turn differs from Encode")
	}
	if st := c.Stats(); st.Hits != 1 || st.Misses != 1 {
		t.Fatalf("stats %+v; want one miss then one hit", st)
	}
}

func TestAppendingToAnEncodeCachedResultLeavesTheCacheIntact(t *testing.T) {
	m := llama3(t)
	c := NewPrefixCache(1 << 20)
	msgs := [][2]string{{"system", "Be brief."}, {"user", "Hi there"}}
	text := llama3Chat(msgs, true)
	want := m.Encode(text)
	first := m.EncodeCached(c, text) // stored in the cache, sharing its memory
	require.Equal(t, want, first)
	for range 3 {
		first = append(first, 1, 2, 3) // a caller growing its ids
	}
	msgs = append(msgs, [2]string{"assistant", "Hello!"}, [2]string{"user", "How are you?"})
	next := llama3Chat(msgs, true)
	require.Equal(t, m.Encode(next), m.EncodeCached(c, next), "the next turn reuses the first's ids unchanged")
	require.Equal(t, uint64(1), c.Stats().Hits)
}

func TestPrefixCacheStaysWithinItsByteBound(t *testing.T) {
	m := llama3(t)
	c := NewPrefixCache(16 << 10)
	rng := rand.New(rand.NewPCG(3, 3))
	conv := &conversation{msgs: [][2]string{{"system", "x"}}}
	for i := 0; i < 50; i++ {
		conv.step(rng)
		m.EncodeCached(c, llama3Chat(conv.msgs, true))
		if st := c.Stats(); st.Bytes > 16<<10 {
			t.Fatalf("cache holds %d bytes; bound is %d", st.Bytes, 16<<10)
		}
	}
}

func TestPrefixCacheIsSafeForConcurrentUse(t *testing.T) {
	m := llama3(t)
	c := NewPrefixCache(1 << 20)
	var wg sync.WaitGroup
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 5))
			conv := &conversation{msgs: [][2]string{{"system", "shared system prompt"}}}
			for i := 0; i < 8; i++ {
				conv.step(rng)
				text := llama3Chat(conv.msgs, true)
				if !slices.Equal(m.EncodeCached(c, text), m.Encode(text)) {
					t.Errorf("goroutine %d turn %d differs", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// chatML renders a conversation as the built-in ChatML template does.
func chatML(msgs [][2]string, generationPrompt bool) string {
	var b strings.Builder
	for _, m := range msgs {
		b.WriteString("<|im_start|>" + m[0] + "\n" + m[1] + "<|im_end|>\n")
	}
	if generationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

// hostileTurnText is message content that tries to straddle a turn cut:
// it writes the cut's own text, ends in whitespace runs, newlines, slashes
// or a lone "<", or starts with a marker.
var hostileTurnText = []string{
	"\n<|im_start|>", "<|im_end|>\n<|im_start|>user\n", "\n", "\n\n", "  ", " ", "\t", "\r\n", "\r", "/", "//\n", "\n/",
	"<", "<|", "<|im_start|", "\n<|im_start", "x\n\n", " \n ", "\u00a0\n", "\n\u00a0", "\u2028", "\u0085", "'s", "'S\n",
	"😀\n", "é\n", "123\n", "...\n", "<|im_start|>", "<|endoftext|>", "<|eot_id|>\n", ">\n", "|>\n", "\n>",
}

func hostileMessage(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(4) {
		b.WriteString(hostileTurnText[rng.IntN(len(hostileTurnText))])
	}
	if rng.IntN(2) == 0 {
		b.WriteString(chatMessage(rng, 1+rng.IntN(30)))
	}
	for range rng.IntN(4) {
		b.WriteString(hostileTurnText[rng.IntN(len(hostileTurnText))])
	}
	return b.String()
}

// TestEncodeCachedEqualsEncodeAcrossChatMLTurns: for models whose encoding
// splits between "\n" and "<|im_start|>" (chatMLTurns), every turn of
// generated ChatML conversations — growing, edited in the middle, cut
// short, with contents that write the markers themselves or end in
// whitespace, newlines, slashes or "<" — encodes through the cache exactly
// as Encode does, and the cache reuses earlier turns.
func TestEncodeCachedEqualsEncodeAcrossChatMLTurns(t *testing.T) {
	models := map[string]*Model{"llama3": llama3(t)}
	for _, name := range []string{"o200k_base", "cl100k_base"} {
		m, err := LoadTiktoken(name)
		if err != nil {
			t.Fatal(err)
		}
		models[name] = m
	}
	convs, turns := 150, 12
	if raceBuild {
		convs = 15
	}
	for name, m := range models {
		t.Run(name, func(t *testing.T) {
			if !m.chatMLTurns() {
				t.Fatalf("%s should split at ChatML turns", name)
			}
			shared := NewPrefixCache(8 << 20)
			tiny := NewPrefixCache(4 << 10) // evicts constantly
			checked := 0
			for ci := 0; ci < convs; ci++ {
				rng := rand.New(rand.NewPCG(uint64(ci), 14))
				own := NewPrefixCache(8 << 20)
				conv := &conversation{msgs: [][2]string{{"system", hostileMessage(rng)}}}
				for turn := 0; turn < turns; turn++ {
					conv.step(rng)
					if rng.IntN(2) == 0 {
						conv.msgs[len(conv.msgs)-1][1] = hostileMessage(rng)
					}
					text := chatML(conv.msgs, rng.IntN(4) > 0)
					if rng.IntN(6) == 0 {
						text += hostileMessage(rng) // a tail no template writes
					}
					want := m.Encode(text)
					for cname, c := range map[string]*PrefixCache{"own": own, "shared": shared, "tiny": tiny} {
						if got := m.EncodeCached(c, text); !slices.Equal(got, want) {
							t.Fatalf("conversation %d turn %d, %s cache: EncodeCached differs from Encode\n text %q\n got  %v\n want %v", ci, turn, cname, text, got, want)
						}
						checked++
					}
				}
			}
			st := shared.Stats()
			if st.Hits < uint64(convs*turns/2) {
				t.Fatalf("the shared cache reused too few prefixes: %+v", st)
			}
			t.Logf("%s: %d cached encodings equal to Encode; shared cache %+v", name, checked, st)
		})
	}
}

// TestGPT2PatternGetsNoChatMLTurnCuts: the GPT-2 pattern does not split
// between "\n" and "<" for every text (a newline run before "<" splits
// differently than at the end of a text), so its models must not cut there.
func TestGPT2PatternGetsNoChatMLTurnCuts(t *testing.T) {
	m, err := LoadTiktoken("r50k_base")
	if err != nil {
		t.Fatal(err)
	}
	if m.chatMLTurns() {
		t.Fatal("r50k_base (GPT-2's pattern) must not split at ChatML turns")
	}
	a, b := "<|im_start|>user\nx\n\n", "<|im_start|>assistant\n"
	if slices.Equal(append(m.Encode(a), m.Encode(b)...), m.Encode(a+b)) {
		t.Fatal("expected GPT-2's pattern to encode across the turn differently; the guard's reason is gone")
	}
}

// TestShortKeyIsThePieceZeroPadded: the word cache's key of a piece of up
// to 16 bytes is its bytes, zero-padded, read as two little-endian words,
// whatever its length.
func TestShortKeyIsThePieceZeroPadded(t *testing.T) {
	src := "abcdefghijklmnopq\x00\xff\x80 Z"
	for start := 0; start < 4; start++ {
		for n := 1; n <= 16 && start+n <= len(src); n++ {
			w := src[start : start+n]
			var buf [16]byte
			copy(buf[:], w)
			k0, k1 := shortKey(w)
			if k0 != binary.LittleEndian.Uint64(buf[:8]) || k1 != binary.LittleEndian.Uint64(buf[8:]) {
				t.Fatalf("shortKey(%q) = %#x, %#x", w, k0, k1)
			}
		}
	}
}

// TestWordCacheIsRightAcrossModelsAndGenerations: one scratch encoding for
// two models in turn clears its word cache at every switch, hundreds of
// times (past the generation counter's wrap); every encoding equals one
// without the word cache.
func TestWordCacheIsRightAcrossModelsAndGenerations(t *testing.T) {
	o200k, err := LoadTiktoken("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	models := []*Model{llama3(t), o200k}
	texts := append(corpus(300, 5), asciiCorpus(300, 5)...)
	sc := new(scratch)
	for i := range 700 {
		m, text := models[i%2], texts[i%len(texts)]+texts[(i*7)%len(texts)]
		got := m.appendEncode(nil, text, sc)
		want := m.appendEncode(nil, text, &scratch{noWordCache: true})
		if !slices.Equal(got, want) {
			t.Fatalf("encoding %d (%s) with the word cache differs\n text %q\n got  %v\n want %v", i, m.Name(), text, got, want)
		}
	}
	if sc.gen >= 200 || sc.gen == 0 {
		t.Fatalf("generation %d: the counter should have wrapped once", sc.gen)
	}
}

// A put whose prefixes are partly held already stores only the others, and
// the byte count must charge only those: it counted every key given, while
// eviction gave back only the keys an entry held, so the count crept up
// (and with it could pass the bound over an empty cache, where eviction
// finds nothing to remove).
func TestPrefixCacheChargesOnlyTheKeysAnEntryHolds(t *testing.T) {
	c := NewPrefixCache(1 << 20)
	k1, k2 := cacheKey{hash: 1, n: 1}, cacheKey{hash: 2, n: 2}
	c.put([]cacheKey{k1}, []int{1}, make([]uint32, 1))
	c.put([]cacheKey{k1, k2}, []int{1, 2}, make([]uint32, 2)) // k1 is held: only k2 is stored
	want := int64(1*4+entryOverhead+1*keyOverhead) + int64(2*4+entryOverhead+1*keyOverhead)
	require.Equal(t, want, c.Stats().Bytes)
	require.Equal(t, 2, c.Stats().Entries)
}
