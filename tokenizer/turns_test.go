package tokenizer

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/zeebo/xxh3"
)

// turnKeys is the chain hash EncodeTurns' callers compute: keys[i] covers
// messages 0 to i, each its role and content, length-prefixed.
func turnKeys(msgs [][2]string) []uint64 {
	h := xxh3.New()
	keys := make([]uint64, len(msgs))
	var n [8]byte
	for i, msg := range msgs {
		for _, s := range msg {
			binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
			_, _ = h.Write(n[:])
			_, _ = h.WriteString(s)
		}
		keys[i] = h.Sum64()
	}
	return keys
}

// chatTemplates render a conversation turn by turn (with the text that
// precedes the first turn and the generation prompt) as chatML and
// llama3Chat render it whole.
type turnTemplate struct {
	left, right string
	turn        func(i int, msg [2]string) string
	genPrompt   string
}

var (
	chatMLTurnsTemplate = turnTemplate{left: "<|im_end|>\n", right: "<|im_start|>",
		turn:      func(_ int, m [2]string) string { return "<|im_start|>" + m[0] + "\n" + m[1] + "<|im_end|>\n" },
		genPrompt: "<|im_start|>assistant\n"}
	llama3TurnsTemplate = turnTemplate{left: "<|eot_id|>", right: "<|start_header_id|>",
		turn: func(i int, m [2]string) string {
			s := "<|start_header_id|>" + m[0] + "<|end_header_id|>\n\n" + strings.TrimSpace(m[1]) + "<|eot_id|>"
			if i == 0 {
				s = "<|begin_of_text|>" + s
			}
			return s
		},
		genPrompt: "<|start_header_id|>assistant<|end_header_id|>\n\n"}
)

func (tt turnTemplate) render(msgs [][2]string, gen bool) string {
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString(tt.turn(i, m))
	}
	if gen {
		b.WriteString(tt.genPrompt)
	}
	return b.String()
}

func (tt turnTemplate) encode(m *Model, c *PrefixCache, j Joint, msgs [][2]string, gen bool) ([]uint32, bool) {
	tail := ""
	if gen {
		tail = tt.genPrompt
	}
	return m.EncodeTurns(c, j, turnKeys(msgs), func(i int, dst []byte) []byte {
		return append(dst, tt.turn(i, msgs[i])...)
	}, tail)
}

func (tt turnTemplate) encodeIDs(m *Model, c *PrefixCache, j Joint, msgs [][2]string, gen bool) (IDs, bool) {
	tail := ""
	if gen {
		tail = tt.genPrompt
	}
	return m.EncodeTurnsIDs(c, j, turnKeys(msgs), func(i int, dst []byte) []byte {
		return append(dst, tt.turn(i, msgs[i])...)
	}, tail)
}

// chargedBytes is what c's entries and the runs they hold come to, counted
// afresh: the running count must equal it.
func chargedBytes(c *PrefixCache) int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	var n int64
	runs := map[*run]bool{}
	for el := c.lru.Front(); el != nil; el = el.Next() {
		e := el.Value.(*cacheEntry)
		n += entryBytes(len(e.keys))
		if !runs[e.run] {
			runs[e.run] = true
			n += runBytes(e.run)
		}
	}
	return n
}

// TestANextTurnWritesItsIDsAfterTheCachedOnesInPlace: a conversation's next
// turn gets its history's cached ids uncopied, its new turn written in the
// cached array's spare room; a second next turn of the same history (a
// retry with another message, another user after a shared system prompt)
// finds that room taken and gets the history uncopied and its turn as the
// tail, stored nowhere; when that conversation goes on, its history is
// copied once into an array of its own, which its next turns extend. No
// result sees another's ids.
func TestANextTurnWritesItsIDsAfterTheCachedOnesInPlace(t *testing.T) {
	m, err := LoadTiktoken("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	tt := chatMLTurnsTemplate
	j, _ := m.Joint(tt.left, tt.right)
	c := NewPrefixCache(8 << 20)
	history := [][2]string{{"system", strings.Repeat("You are helpful. ", 50)}, {"user", "hi"}, {"assistant", "hello"}}
	first, ok := tt.encodeIDs(m, c, j, history, true)
	if !ok || len(first.Tail) == 0 {
		t.Fatalf("the history encodes with its generation prompt as the tail: %v %+v", ok, first)
	}
	next := append(history[:len(history):len(history)], [2]string{"user", "and then?"})
	other := append(history[:len(history):len(history)], [2]string{"user", "something else entirely"})
	a, _ := tt.encodeIDs(m, c, j, next, true)
	b, _ := tt.encodeIDs(m, c, j, other, true)
	if &a.Head[0] != &first.Head[0] {
		t.Fatal("the next turn copied its history's ids: they should be the cached array's")
	}
	if len(a.Head) <= len(first.Head) || &b.Head[0] != &first.Head[0] || len(b.Head) != len(first.Head) {
		t.Fatalf("the first next turn extends the array (%d ids after %d), the second shares the history (%d ids) uncopied", len(a.Head), len(first.Head), len(b.Head))
	}
	onward := append(other[:len(other):len(other)], [2]string{"assistant", "sure"}, [2]string{"user", "go on"})
	d, _ := tt.encodeIDs(m, c, j, onward, true)
	further := append(onward[:len(onward):len(onward)], [2]string{"assistant", "done"}, [2]string{"user", "thanks"})
	e, _ := tt.encodeIDs(m, c, j, further, true)
	if &d.Head[0] == &first.Head[0] || &e.Head[0] != &d.Head[0] {
		t.Fatal("the other conversation's history is copied once, then extended in place")
	}
	for _, x := range []struct {
		ids  IDs
		msgs [][2]string
	}{{first, history}, {a, next}, {b, other}, {d, onward}, {e, further}} {
		if want := m.Encode(tt.render(x.msgs, true)); !slices.Equal(x.ids.Slice(), want) {
			t.Fatalf("%q: ids differ from Encode\n got  %v\n want %v", x.msgs[len(x.msgs)-1][1], x.ids.Slice(), want)
		}
	}
	again, _ := tt.encodeIDs(m, c, j, next, false)
	if &again.Head[0] != &first.Head[0] || again.Len() != len(a.Head) || len(again.Tail) != 0 {
		t.Fatal("the cached next turn is served from the array it extended, uncopied")
	}
}

// TestNextTurnsOfOneCachedPrefixAtOnceGetTheirOwnIDs: goroutines that
// extend the same cached history with different turns at the same moment
// each get exactly Encode of their own text — one of them writes in the
// cached array's room, the others copy — and later calls read back what
// each stored (run with -race).
func TestNextTurnsOfOneCachedPrefixAtOnceGetTheirOwnIDs(t *testing.T) {
	m, err := LoadTiktoken("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	tt := chatMLTurnsTemplate
	j, _ := m.Joint(tt.left, tt.right)
	c := NewPrefixCache(8 << 20)
	history := [][2]string{{"system", strings.Repeat("shared system prompt ", 30)}}
	for round := range 30 {
		if _, ok := tt.encodeIDs(m, c, j, history, true); !ok {
			t.Fatal("the history encodes")
		}
		convs := make([][][2]string, 4)
		for g := range convs {
			convs[g] = append(history[:len(history):len(history)], [2]string{"user", fmt.Sprintf("round %d, goroutine %d: %s", round, g, strings.Repeat("x ", g*7))})
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g, conv := range convs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				want := m.Encode(tt.render(conv, true))
				<-start
				got, ok := tt.encodeIDs(m, c, j, conv, true)
				if !ok || !slices.Equal(got.Slice(), want) {
					t.Errorf("round %d goroutine %d: ids differ from Encode", round, g)
				}
				got.Remember(MemoKey{Block: 4, Seed: 1}, make([]uint64, got.Len()/4))
			}()
		}
		close(start)
		wg.Wait()
		for g, conv := range convs {
			if got, _ := tt.encodeIDs(m, c, j, conv, true); !slices.Equal(got.Slice(), m.Encode(tt.render(conv, true))) {
				t.Fatalf("round %d conversation %d: the stored ids differ from Encode", round, g)
			}
		}
		history = append(convs[round%len(convs)], [2]string{"assistant", "ok"})
	}
	if got, want := c.Stats().Bytes, chargedBytes(c); got != want {
		t.Fatalf("the cache charges %d bytes; its entries and runs come to %d", got, want)
	}
}

// TestEncodeTurnsEqualsEncodeOverRandomConversations: ChatML over o200k
// and cl100k and Llama 3's template over its own tokenizer, every turn of
// generated conversations — growing, edited in the middle, cut short, with
// contents that write the markers themselves or end in whitespace,
// newlines, slashes or "<" — encodes turn by turn exactly as Encode
// encodes the whole text, and the cache reuses earlier turns.
func TestEncodeTurnsEqualsEncodeOverRandomConversations(t *testing.T) {
	type tc struct {
		m  *Model
		tt turnTemplate
	}
	cases := map[string]tc{"llama3": {llama3(t), llama3TurnsTemplate}}
	for _, name := range []string{"o200k_base", "cl100k_base"} {
		m, err := LoadTiktoken(name)
		if err != nil {
			t.Fatal(err)
		}
		cases[name] = tc{m, chatMLTurnsTemplate}
	}
	cases["llama3/chatml"] = tc{cases["llama3"].m, chatMLTurnsTemplate}
	convs, turns := 150, 12
	if raceBuild {
		convs = 15
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			j, ok := c.m.Joint(c.tt.left, c.tt.right)
			if !ok {
				t.Fatalf("%s should split at %q|%q", name, c.tt.left, c.tt.right)
			}
			shared := NewPrefixCache(8 << 20)
			tiny := NewPrefixCache(4 << 10) // evicts constantly
			checked := 0
			for ci := 0; ci < convs; ci++ {
				rng := rand.New(rand.NewPCG(uint64(ci), 30))
				own := NewPrefixCache(8 << 20)
				conv := &conversation{msgs: [][2]string{{"system", hostileMessage(rng)}}}
				for turn := 0; turn < turns; turn++ {
					conv.step(rng)
					if rng.IntN(2) == 0 {
						conv.msgs[len(conv.msgs)-1][1] = hostileMessage(rng)
					}
					if rng.IntN(4) == 0 {
						conv.msgs[rng.IntN(len(conv.msgs))][0] = []string{"user", "tool", "x y", "<", "\n"}[rng.IntN(5)]
					}
					gen := rng.IntN(4) > 0
					want := c.m.Encode(c.tt.render(conv.msgs, gen))
					for cname, pc := range map[string]*PrefixCache{"own": own, "shared": shared, "tiny": tiny} {
						got, ok := c.tt.encode(c.m, pc, j, conv.msgs, gen)
						if x, _ := c.tt.encodeIDs(c.m, pc, j, conv.msgs, gen); x.Len() > 0 {
							x.Remember(MemoKey{Block: 16, Seed: 1}, make([]uint64, x.Len()/16)) // charged to the cache too
						}
						if !ok || !slices.Equal(got, want) {
							t.Fatalf("conversation %d turn %d, %s cache (ok %v): EncodeTurns differs from Encode\n text %q\n got  %v\n want %v",
								ci, turn, cname, ok, c.tt.render(conv.msgs, gen), got, want)
						}
						checked++
					}
				}
			}
			for cname, pc := range map[string]*PrefixCache{"shared": shared, "tiny": tiny} {
				if got, want := pc.Stats().Bytes, chargedBytes(pc); got != want || got > pc.maxBytes {
					t.Fatalf("%s cache charges %d bytes; its entries and runs come to %d, the bound is %d", cname, got, want, pc.maxBytes)
				}
			}
			if st := shared.Stats(); st.Hits < uint64(convs*turns/2) {
				t.Fatalf("the shared cache reused too few prefixes: %+v", st)
			}
			t.Logf("%s: %d turn-by-turn encodings equal to Encode; shared cache %+v", name, checked, shared.Stats())
		})
	}
}

// TestJointRefusesWhatItCannotProve: GPT-2's pattern does not split
// between "\n" and "<"; a joint at no added token's end proves nothing; an
// added token that can match across the joint, or one that lstrip lets take
// the newline before it, moves the split — and each of those really
// encodes across the joint differently, so a joint granted there would be
// wrong.
func TestJointRefusesWhatItCannotProve(t *testing.T) {
	r50k, err := LoadTiktoken("r50k_base")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := r50k.Joint("<|im_end|>\n", "<|im_start|>"); ok {
		t.Fatal("r50k_base (GPT-2's pattern) must not split at ChatML turns")
	}
	o200k, err := LoadTiktoken("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := o200k.Joint("<|eot_id|>", "<|start_header_id|>"); ok {
		t.Fatal("o200k_base has no <|eot_id|> token: nothing splits there")
	}
	if _, ok := o200k.Joint("<|im_end|>\n", " <|im_start|>"); ok {
		t.Fatal("a right side starting with whitespace must be refused")
	}
	for _, tok := range []addedToken{
		{id: 300000, content: "\n<|im"},                     // matches across the joint
		{id: 300001, content: "<|im_start|>", lstrip: true}, // takes the newline before it
	} {
		m := withRawToken(o200k, tok)
		if _, ok := m.Joint("<|im_end|>\n", "<|im_start|>"); ok {
			t.Fatalf("token %+v: the joint must be refused", tok)
		}
		a, b := "<|im_start|>user\nhi<|im_end|>\n", "<|im_start|>assistant\n"
		whole := m.Encode(a + b)
		sc := scratchPool.Get().(*scratch)
		split := m.appendEncodeFrom(m.Encode(a), b, false, sc)
		scratchPool.Put(sc)
		if slices.Equal(whole, split) {
			t.Fatalf("token %+v: expected the text to encode across the joint differently; the guard's reason is gone", tok)
		}
	}
	llama := llama3(t)
	if _, ok := llama.Joint("<|eot_id|>", "<|start_header_id|>"); !ok {
		t.Fatal("Llama 3 splits after <|eot_id|>")
	}
	if _, ok := withRawToken(llama, addedToken{id: 300002, content: "x<|eot_id|>"}).Joint("<|eot_id|>", "<|start_header_id|>"); ok {
		t.Fatal("a token that can match across <|eot_id|>'s start must be refused")
	}
}

// withRawToken is m with one more raw-matched added token.
func withRawToken(m *Model, tok addedToken) *Model {
	c := *m
	c.rawAdded = newMatcher(append(slices.Clone(m.rawTokens()), tok), func(a addedToken) string { return a.content })
	return &c
}

// TestEncodeTurnsRefusesTurnsThatMissTheJoint: a rendered turn that does not
// end in the joint's left string, or start with its right one, makes
// EncodeTurns refuse rather than encode at a place the joint did not prove.
func TestEncodeTurnsRefusesTurnsThatMissTheJoint(t *testing.T) {
	m, err := LoadTiktoken("o200k_base")
	if err != nil {
		t.Fatal(err)
	}
	j, ok := m.Joint("<|im_end|>\n", "<|im_start|>")
	if !ok {
		t.Fatal("o200k splits at ChatML turns")
	}
	c := NewPrefixCache(1 << 20)
	for _, turns := range [][]string{{"<|im_start|>a\nx<|im_end|>"}, {"<|im_start|>a\nx<|im_end|>\n", "b<|im_end|>\n"}} {
		keys := make([]uint64, len(turns))
		for i := range keys {
			keys[i] = uint64(i + 1)
		}
		if _, ok := m.EncodeTurns(c, j, keys, func(i int, dst []byte) []byte { return append(dst, turns[i]...) }, ""); ok {
			t.Fatalf("turns %q: EncodeTurns must refuse", turns)
		}
	}
	if _, ok := m.EncodeTurns(c, j, []uint64{9}, func(_ int, dst []byte) []byte { return append(dst, "<|im_start|>a\n<|im_end|>\n"...) }, "x"); ok {
		t.Fatal("a tail that does not start with the right string must be refused")
	}
}
