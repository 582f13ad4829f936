package prompt

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/tokenizer"
)

// turnPieces are what the generated contents are made of: prose, the
// markers of both templates, whitespace of every kind Jinja's trim and the
// split patterns treat specially, and text that needs JSON escapes.
var turnPieces = []string{"hello", " world", "\n", "\n\n", " ", "\t", "\r\n", "<|im_start|>", "<|im_end|>", "<|im_end|>\n<|im_start|>user\n",
	"<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>", "<|endoftext|>", "<", "<|", "|>", ">\n", "/", "//\n",
	"héllo ✓ 🦊", "'s", "123", "\u00a0", "\u2028", "\u0085", `"quoted"`, `back\slash`, "x\n\n", "func f() { return 1 }"}

func turnContent(rng *rand.Rand) string {
	var b strings.Builder
	for range rng.IntN(9) {
		b.WriteString(turnPieces[rng.IntN(len(turnPieces))])
	}
	return b.String()
}

// turnModels are the models whose plain chats are encoded turn by turn:
// the built-in ChatML over o200k_base and cl100k_base, and Meta Llama 3's
// template over its tokenizer; each with its uncached twin (no prefix
// cache: render whole, encode whole, today's path without a cache).
func turnModels(t *testing.T) map[string][2]*Model {
	t.Helper()
	out := map[string][2]*Model{}
	for name, spec := range map[string]string{"o200k": "tiktoken:o200k_base", "cl100k": "tiktoken:cl100k_base", "llama3": testenv.Llama3Dir(t)} {
		cached, err := OpenSpec(spec, 8<<20)
		require.NoError(t, err)
		plain, err := OpenSpec(spec, 0)
		require.NoError(t, err)
		require.NotNil(t, cached.turns, "%s: the template renders message by message and the tokenizer splits between messages", name)
		require.Nil(t, plain.turns)
		out[name] = [2]*Model{cached, plain}
	}
	return out
}

// TestTurnByTurnTokensEqualTheWholeRendering: over random conversations —
// growing by a turn, edited in the middle, cut short, with contents that
// write the templates' markers, need JSON escapes or end in whitespace,
// roles changed under the same content,
// key orders reversed, and now and then a message the fast paths leave to
// the template (extra keys, parts, null content, tools, continue_final_
// message) — every request's tokens through the turn cache equal those of
// rendering it whole and encoding the text without a cache. It also
// requires that most requests took the turn path and that it reused
// earlier turns.
func TestTurnByTurnTokensEqualTheWholeRendering(t *testing.T) {
	convs, turns := 60, 10
	if testing.Short() {
		convs = 10
	}
	for name, pair := range turnModels(t) {
		t.Run(name, func(t *testing.T) {
			cached, plain := pair[0], pair[1]
			byTurns, checked := 0, 0
			for ci := range convs {
				rng := rand.New(rand.NewPCG(uint64(ci), 30))
				msgs := []map[string]any{{"role": "system", "content": turnContent(rng)}}
				for range turns {
					msgs = nextConversation(rng, msgs)
					body := turnBody(t, rng, msgs)
					var f Fields
					require.NoError(t, json.Unmarshal(body, &f))
					in, err := Parse(KindChat, &f)
					require.NoError(t, err)
					want, wantErr := tokenizeWith(plain, in)
					_, took := cached.turns.encode(in)
					got, err := tokenizeWith(cached, in)
					if wantErr != nil {
						require.Error(t, err, "%s", body)
						continue
					}
					require.NoError(t, err, "%s", body)
					require.True(t, slices.Equal(want.IDs.Slice(), got.IDs.Slice()), "conversation %d: turn-by-turn tokens differ\n body %s\n got  %v\n want %v", ci, body, got.IDs.Slice(), want.IDs.Slice())
					checked++
					if took {
						byTurns++
					}
				}
			}
			require.Greater(t, byTurns, checked/2, "most requests are plain chats the turn path takes")
			st := cached.turns.cache.Stats()
			require.Greater(t, st.Hits, uint64(byTurns/3), "next turns reuse the earlier turns: %+v", st)
			t.Logf("%s: %d requests, %d turn by turn, all equal to the whole rendering's tokens; cache %+v", name, checked, byTurns, st)
		})
	}
}

// nextConversation is msgs a turn later: grown by a user message and an
// answer (most often), edited in the middle, the same content under
// another role, or cut short by a message.
func nextConversation(rng *rand.Rand, msgs []map[string]any) []map[string]any {
	switch k := rng.IntN(10); {
	case k < 7 || len(msgs) < 3:
		msgs = append(msgs, map[string]any{"role": "user", "content": turnContent(rng)},
			map[string]any{"role": "assistant", "content": turnContent(rng)})
	case k < 8:
		msgs[1+rng.IntN(len(msgs)-1)] = map[string]any{"role": "user", "content": turnContent(rng)}
	case k < 9:
		i := rng.IntN(len(msgs))
		msgs[i] = map[string]any{"role": []string{"user", "assistant", "tool", "developer"}[rng.IntN(4)], "content": msgs[i]["content"]}
	default:
		msgs = msgs[:len(msgs)-1]
	}
	return msgs
}

// TestTurnByTurnBlockHashesEqualHashingTheWholeRendering: over the random
// conversations of TestTurnByTurnTokensEqualTheWholeRendering, with longer
// contents so that turns span blocks, every request's SequenceHashes at
// several block sizes (one id, sizes that do not divide the turns, a block
// that straddles the cached history and the generation prompt) and two
// seeds equal kvindex.SequenceHashes of the whole rendering's ids — through
// a cache that keeps the conversations and one that evicts constantly —
// and most next turns found their history's hashes remembered.
func TestTurnByTurnBlockHashesEqualHashingTheWholeRendering(t *testing.T) {
	convs, turns := 40, 10
	if testing.Short() {
		convs = 8
	}
	sizes := []int{1, 3, 16, 32}
	seeds := []uint64{kvindex.BaseSeed, kvindex.ModelSeed("m")}
	for name, pair := range turnModels(t) {
		spec := pair[1].Spec
		tiny, err := OpenSpec(spec, 8<<10)
		require.NoError(t, err)
		for cname, cached := range map[string]*Model{"kept": pair[0], "evicting": tiny} {
			t.Run(name+"/"+cname, func(t *testing.T) {
				plain := pair[1]
				checked, remembered, nextTurns := 0, 0, 0
				for ci := range convs {
					rng := rand.New(rand.NewPCG(uint64(ci), 32))
					long := func() string { return turnContent(rng) + strings.Repeat(" word", rng.IntN(60)) + turnContent(rng) }
					msgs := []map[string]any{{"role": "system", "content": long()}}
					for range turns {
						msgs = nextConversation(rng, msgs)
						for _, m := range msgs[max(len(msgs)-2, 1):] {
							if c, ok := m["content"].(string); ok && len(c) < 40 {
								m["content"] = c + long()
							}
						}
						body := turnBody(t, rng, msgs)
						var f Fields
						require.NoError(t, json.Unmarshal(body, &f))
						in, err := Parse(KindChat, &f)
						require.NoError(t, err)
						want, wantErr := tokenizeWith(plain, in)
						got, err := tokenizeWith(cached, in)
						if wantErr != nil {
							require.Error(t, err, "%s", body)
							continue
						}
						require.NoError(t, err, "%s", body)
						ids := want.IDs.Slice()
						require.Equal(t, ids, got.IDs.Slice(), "conversation %d: ids\n body %s", ci, body)
						require.Equal(t, len(ids), got.IDs.Len())
						if plainChat(in) && !in.ContinueFinalMessage && len(got.IDs.Head) >= 32 { // the turn path
							nextTurns++
							if got.IDs.Memo(tokenizer.MemoKey{Block: 16, Seed: seeds[1]}) != nil {
								remembered++
							}
						}
						for _, k := range rng.Perm(len(sizes) * len(seeds)) {
							bs, seed := sizes[k%len(sizes)], seeds[k/len(sizes)]
							require.Equal(t, kvindex.SequenceHashes(ids, bs, seed), got.SequenceHashes(bs, seed),
								"conversation %d, block size %d, seed %d: hashes\n body %s", ci, bs, seed, body)
							checked++
						}
					}
				}
				if cname == "kept" {
					require.Greater(t, remembered, nextTurns/2, "next turns find their history's hashes beside its ids")
				}
				t.Logf("%d hash sequences equal to hashing the whole rendering's ids; %d of %d requests found hashes remembered", checked, remembered, nextTurns)
			})
		}
	}
}

// TestNextTurnsOfOnePrefixAtOnceHashAsTheirOwnIDs: goroutines sending
// different next turns of one cached conversation at once, each hashing at
// its own block sizes, get their own ids and hashes: none sees another's
// new turn in the history they share, nor its hashes (run with -race).
func TestNextTurnsOfOnePrefixAtOnceHashAsTheirOwnIDs(t *testing.T) {
	pair := turnModels(t)["o200k"]
	history := []map[string]string{{"role": "system", "content": strings.Repeat("shared system prompt ", 40)}}
	for i := range 6 {
		history = append(history, map[string]string{"role": "user", "content": strings.Repeat("question ", 10+i)},
			map[string]string{"role": "assistant", "content": strings.Repeat("answer ", 20+i)})
	}
	parse := func(msgs []map[string]string) *Input {
		raw, err := json.Marshal(msgs)
		require.NoError(t, err)
		in, err := Parse(KindChat, &Fields{Messages: raw})
		require.NoError(t, err)
		return in
	}
	first, err := tokenizeWith(pair[0], parse(history))
	require.NoError(t, err)
	first.SequenceHashes(16, 1)
	for round := range 20 {
		var wg sync.WaitGroup
		start := make(chan struct{})
		for g := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewPCG(uint64(round), uint64(g)))
				msgs := slices.Clone(history)
				for range 1 + rng.IntN(3) {
					msgs = append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("goroutine %d %s", g, turnContent(rng))})
				}
				in := parse(msgs)
				want, _ := tokenizeWith(pair[1], in)
				<-start
				got, _ := tokenizeWith(pair[0], in)
				for _, bs := range []int{16, 1 + g} {
					if h := got.SequenceHashes(bs, 1); !slices.Equal(h, kvindex.SequenceHashes(want.IDs.Slice(), bs, 1)) {
						t.Errorf("round %d goroutine %d block size %d: hashes differ", round, g, bs)
					}
				}
				if !slices.Equal(want.IDs.Slice(), got.IDs.Slice()) {
					t.Errorf("round %d goroutine %d: ids differ", round, g)
				}
			}()
		}
		close(start)
		wg.Wait()
	}
}

// turnBody is a chat request of msgs, sometimes with a message or a field
// that the fast paths leave to the template, and JSON written with its
// keys in either order and escapes where encoding/json writes them.
func turnBody(t *testing.T, rng *rand.Rand, msgs []map[string]any) []byte {
	t.Helper()
	var b strings.Builder
	b.WriteString(`{"messages":[`)
	for i, m := range msgs {
		if i > 0 {
			b.WriteByte(',')
		}
		role, _ := json.Marshal(m["role"])
		content, _ := json.Marshal(m["content"])
		switch rng.IntN(100) {
		case 0:
			content = []byte(`[{"type":"text","text":` + string(content) + `}]`)
		case 1:
			content = []byte("null")
		case 2:
			role = append(role, `,"name":"n"`...)
		}
		if rng.IntN(3) == 0 {
			b.WriteString(`{"content":` + string(content) + `,"role":` + string(role) + `}`)
		} else {
			b.WriteString(`{"role":` + string(role) + `, "content":` + string(content) + `}`)
		}
	}
	b.WriteString(`]`)
	switch rng.IntN(12) {
	case 0:
		b.WriteString(`,"add_generation_prompt":false`)
	case 1:
		b.WriteString(`,"add_generation_prompt":false,"continue_final_message":true`)
	case 2:
		b.WriteString(`,"tools":[{"type":"function","function":{"name":"f"}}]`)
	}
	b.WriteString(`}`)
	return []byte(b.String())
}

// TestTurnCacheIsSafeForConcurrentUse: conversations sharing their system
// prompt, encoded from several goroutines at once through one model, get
// the whole rendering's tokens (run with -race).
func TestTurnCacheIsSafeForConcurrentUse(t *testing.T) {
	pair := turnModels(t)["o200k"]
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(g), 31))
			msgs := []map[string]string{{"role": "system", "content": "shared system prompt"}}
			for range 20 {
				msgs = append(msgs, map[string]string{"role": "user", "content": turnContent(rng)})
				raw, err := json.Marshal(msgs)
				if err != nil {
					t.Error(err)
					return
				}
				in, err := Parse(KindChat, &Fields{Messages: raw})
				if err != nil {
					t.Error(err)
					return
				}
				want, _ := tokenizeWith(pair[1], in)
				got, _ := tokenizeWith(pair[0], in)
				if !slices.Equal(want.IDs.Slice(), got.IDs.Slice()) {
					t.Errorf("goroutine %d: tokens differ for %s", g, raw)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// FuzzTurnByTurnTokensEqualTheWholeRendering: a conversation cut from the
// fuzzer's text (messages split at "\x00", roles at "\x01") is encoded
// message by message after its first half was, through the cache of
// ChatML over o200k_base, and must equal the whole rendering's tokens.
func FuzzTurnByTurnTokensEqualTheWholeRendering(f *testing.F) {
	for _, s := range []string{"hi\x00there", "a\n\x00<|im_start|>\x00\n<|im_end|>\n", "user\x01x \x00\x01\n\n\x00<|endoftext|>", "é\x00\u2028<\x00"} {
		f.Add(s, true)
	}
	cached, err := OpenSpec("tiktoken:o200k_base", 1<<20)
	require.NoError(f, err)
	plain, err := OpenSpec("tiktoken:o200k_base", 0)
	require.NoError(f, err)
	f.Fuzz(func(t *testing.T, text string, gen bool) {
		var msgs []map[string]string
		for _, part := range strings.Split(text, "\x00") {
			role, content, ok := strings.Cut(part, "\x01")
			if !ok {
				role, content = []string{"user", "assistant"}[len(msgs)%2], part
			}
			if role == "" {
				role = "user"
			}
			msgs = append(msgs, map[string]string{"role": role, "content": content})
		}
		for _, n := range []int{(len(msgs) + 1) / 2, len(msgs)} {
			raw, err := json.Marshal(map[string]any{"messages": msgs[:n], "add_generation_prompt": gen})
			require.NoError(t, err)
			var fl Fields
			require.NoError(t, json.Unmarshal(raw, &fl))
			in, err := Parse(KindChat, &fl)
			if err != nil {
				return // invalid UTF-8 roles and the like: not this test's subject
			}
			want, wantErr := tokenizeWith(plain, in)
			got, err := tokenizeWith(cached, in)
			require.Equal(t, wantErr == nil, err == nil)
			require.Equal(t, want.IDs.Slice(), got.IDs.Slice(), "%s", raw)
		}
	})
}
