package tokenizer

import (
	"strings"
	"testing"
)

func TestEncodeIsDeterministicAndInRange(t *testing.T) {
	text := "The quick brown fox jumps over the lazy dog, twice!  Ünïcödé too."
	a, b := Encode(text), Encode(text)
	if len(a) == 0 || len(a) != len(b) {
		t.Fatalf("Encode lengths %d and %d; want equal and non-zero", len(a), len(b))
	}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("token %d differs between runs: %d vs %d", i, a[i], b[i])
		}
		if a[i] < FirstID || a[i] >= VocabSize {
			t.Fatalf("token %d = %d outside [%d,%d)", i, a[i], FirstID, VocabSize)
		}
	}
}

func TestEqualPrefixesGiveEqualTokenPrefixes(t *testing.T) {
	shared := strings.Repeat("You are a helpful assistant. ", 20)
	a := Encode(shared + "What is the capital of France?")
	b := Encode(shared + "Write a poem about routers.")
	n := len(Encode(shared))
	for i := 0; i < n-1; i++ { // the last shared piece may merge with what follows
		if a[i] != b[i] {
			t.Fatalf("token %d differs inside the shared prefix", i)
		}
	}
}

func TestEnglishAveragesAboutFourCharactersPerToken(t *testing.T) {
	text := strings.Repeat("Routing requests to the worker that already holds their prefix saves prefill time. ", 50)
	ratio := float64(len(text)) / float64(len(Encode(text)))
	if ratio < 2.5 || ratio > 4.5 {
		t.Fatalf("chars per token = %.2f; want between 2.5 and 4.5", ratio)
	}
}

func TestCountMatchesEncode(t *testing.T) {
	for _, s := range []string{"", "a", "hello, world", "   ", "!!!", "abcdefghij klmnop"} {
		if got, want := Count(s), len(Encode(s)); got != want {
			t.Errorf("Count(%q) = %d; want %d", s, got, want)
		}
	}
}

func TestChatPromptRendersRolesInOrder(t *testing.T) {
	got := ChatPrompt([]Message{{Role: "system", Content: "be brief"}, {Role: "user", Content: "hi"}})
	want := "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
	if got != want {
		t.Fatalf("ChatPrompt = %q; want %q", got, want)
	}
}

func FuzzToyEncode(f *testing.F) {
	f.Add("hello world")
	f.Add("\x00\xff\xfe")
	f.Fuzz(func(t *testing.T, s string) {
		toks := Encode(s)
		if Count(s) != len(toks) {
			t.Fatalf("Count disagrees with Encode")
		}
		if len(s) > 0 && len(toks) == 0 {
			t.Fatalf("non-empty text gave no tokens")
		}
		for _, id := range toks {
			if id < FirstID || id >= VocabSize {
				t.Fatalf("id %d out of range", id)
			}
		}
	})
}
