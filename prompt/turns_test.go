package prompt

import (
	"encoding/json"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
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
					switch k := rng.IntN(10); {
					case k < 7 || len(msgs) < 3:
						msgs = append(msgs, map[string]any{"role": "user", "content": turnContent(rng)},
							map[string]any{"role": "assistant", "content": turnContent(rng)})
					case k < 8:
						msgs[1+rng.IntN(len(msgs)-1)] = map[string]any{"role": "user", "content": turnContent(rng)}
					case k < 9:
						// the same content under another role
						i := rng.IntN(len(msgs))
						msgs[i] = map[string]any{"role": []string{"user", "assistant", "tool", "developer"}[rng.IntN(4)], "content": msgs[i]["content"]}
					default:
						msgs = msgs[:len(msgs)-1]
					}
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
