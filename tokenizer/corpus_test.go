package tokenizer

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// fragments are the pieces generated strings are made of: words of many
// scripts, contractions in mixed case, digits, whitespace runs (with \r\n
// and trailing spaces), code, emoji sequences, Unicode categories the split
// patterns treat specially (Lt, Lm, Lo, marks, Nl, No), and strings that
// look like, or are, special tokens.
var fragments = []string{
	"the", "The", "THE", "quick", "brown", "fox", "jumps", "over", "lazy", "dog", "Hello", "world",
	"don't", "DON'T", "it's", "It'S", "we'll", "WE'LL", "they're", "THEY'RE", "I've", "I'VE", "I'm", "I'M",
	"she'd", "SHE'D", "'s", "'S", "'t", "'re", "'ve", "'m", "'ll", "'d", "'", "''", "'x", "’s", "'ſ",
	"Straße", "über", "Ärger", "café", "naïve", "résumé", "Ωμέγα", "ελληνικά", "Привет", "мир", "ПРИВЕТ",
	"مرحبا", "بالعالم", "שלום", "नमस्ते", "हिन्दी", "ภาษาไทย", "你好", "世界", "中文字符", "こんにちは", "カタカナ", "漢字",
	"안녕하세요", "한국어", "Ǆ", "ǅungla", "ʰello", "ªb", "Ⅻ", "½", "²", "٣٤٥", "𝟘𝟙", "ﬁ", "İstanbul", "K",
	"\u0301", "e\u0301", "a\u0308\u0304", "\u200d", "\u200c", "\ufeff", "\ufffd", "\u00ad", "\u2060",
	"😀", "👍🏽", "👨‍👩‍👧‍👦", "🇯🇵", "❤️", "🔥🔥", "✅", "™", "©", "→", "…", "—", "–", "«", "»", "“quoted”",
	"0", "7", "42", "123", "1234", "12345678901234", "3.14159", "1,000,000", "2024-01-01", "0x1F", "1e-9", "10%", "$5",
	" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ", " \n ", "  \n\n  ",
	"\u00a0", "\u3000", "\u2028", "\u2029", "\u0085", "\u2003", "\v", "\f", " \t\n",
	"func main() {", "}", "{", "()", "x := y + 1;", "if (a<b) {", "return nil, err", "//", "/* c */", "#include <stdio.h>",
	"<div class=\"x\">", "</div>", "=>", "::", "...", "!!!", "???", "\\n", "\\", "/usr/bin/env", "https://example.com/a?b=c",
	"a/b/c", "//x", "/", "// comment\n", "```go\n", "```", "snake_case", "camelCase", "PascalCase", "SCREAMING_CASE",
	"<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_5|>",
	"<|endoftext|>", "<|fim_prefix|>", "<|endofprompt|>", "<|im_start|>", "<|im_end|>",
	"<|eot_id", "<|", "|>", "<|eot_id|", "<<|eot_id|>>", "<s>", "</s>", "[INST]", "<unk>",
}

// runeRanges are code point ranges for random runes.
var runeRanges = [][2]rune{
	{0x20, 0x7e}, {0x20, 0x7e}, {0x09, 0x0d}, {0xa0, 0x17f}, {0x180, 0x24f}, {0x250, 0x2ff}, {0x300, 0x36f},
	{0x370, 0x3ff}, {0x400, 0x4ff}, {0x590, 0x5ff}, {0x600, 0x6ff}, {0x900, 0x97f}, {0xe00, 0xe7f},
	{0x1100, 0x11ff}, {0x1e00, 0x1eff}, {0x2000, 0x206f}, {0x2070, 0x218f}, {0x2190, 0x23ff}, {0x2460, 0x24ff},
	{0x3000, 0x30ff}, {0x4e00, 0x4fff}, {0xac00, 0xad00}, {0xfe00, 0xfe0f}, {0xff00, 0xffef}, {0x1d400, 0x1d7ff},
	{0x1f300, 0x1faff}, {0x10000, 0x1007f}, {0xe0000, 0xe007f},
}

// corpus returns n deterministic strings of valid UTF-8.
func corpus(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	out := make([]string, n)
	var b strings.Builder
	for i := range out {
		b.Reset()
		parts := 1 + rng.IntN(14)
		for p := 0; p < parts; p++ {
			switch k := rng.IntN(20); {
			case k < 12:
				b.WriteString(fragments[rng.IntN(len(fragments))])
			case k < 15:
				b.WriteString([]string{" ", " ", "  ", "\n", "\t", "\r\n", ""}[rng.IntN(7)])
			case k < 19:
				for r := rng.IntN(6) + 1; r > 0; r-- {
					rg := runeRanges[rng.IntN(len(runeRanges))]
					b.WriteRune(rg[0] + rune(rng.IntN(int(rg[1]-rg[0]+1))))
				}
			default:
				// long runs: repeated punctuation, digits, spaces, letters
				b.WriteString(strings.Repeat([]string{"-", "=", "9", " ", "a", "\n", "é", "\u0301", "😀"}[rng.IntN(9)], 2+rng.IntN(40)))
			}
		}
		out[i] = strings.ToValidUTF8(b.String(), "\ufffd")
	}
	return out
}

func logCorpus(t *testing.T, what string, n, diffs int) {
	t.Helper()
	mode := "non-race build"
	if raceBuild {
		mode = "race build (smaller corpus)"
	}
	t.Logf("%s: %d differences over %d generated strings (%s)", what, diffs, n, mode)
}

// asciiCorpus returns n deterministic strings made mostly of ASCII: runs
// of letters in both cases, digits, spaces, tabs, newlines, symbols and
// apostrophes, with a non-ASCII rune now and then where the splitters'
// ASCII fast paths must hand over to the general matcher.
func asciiCorpus(n int, seed uint64) []string {
	rng := rand.New(rand.NewPCG(seed, 0xa5c11))
	classes := []string{"abcxyz", "ABCXYZ", "0123456789", "  \t", "\n\r", "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~", "'", "sStTdDmMlLrReEvV"}
	nonASCII := []string{"é", "É", "\u0301", "\u00a0", "\u2028", "—", "😀", "٣", "Ⅻ", "ǅ", "ʰ", "中", "\u0085"}
	out := make([]string, n)
	var b strings.Builder
	for i := range out {
		b.Reset()
		for range 1 + rng.IntN(24) {
			if rng.IntN(12) == 0 {
				b.WriteString(nonASCII[rng.IntN(len(nonASCII))])
				continue
			}
			cl := classes[rng.IntN(len(classes))]
			for range 1 + rng.IntN(4) {
				b.WriteByte(cl[rng.IntN(len(cl))])
			}
		}
		out[i] = b.String()
	}
	return out
}
