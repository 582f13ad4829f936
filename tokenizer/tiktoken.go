package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"sort"
	"strconv"
	"sync"

	"github.com/tiktoken-go/tokenizer/codec"
)

// tiktokenEncoding describes an encoding embedded in
// github.com/tiktoken-go/tokenizer: its codec (whose ranks are read back
// through the exported Decode), split pattern and special tokens, as
// written in that module's codec/*.go (v0.10.0) and in OpenAI's tiktoken.
type tiktokenEncoding struct {
	codec    func() *codec.Codec
	pattern  string
	specials map[string]uint32
}

var tiktokenEncodings = map[string]tiktokenEncoding{
	"o200k_base": {codec.NewO200kBase, patternO200K, map[string]uint32{
		"<|endoftext|>": 199999, "<|endofprompt|>": 200018,
	}},
	"cl100k_base": {codec.NewCl100kBase, patternCL100K, map[string]uint32{
		"<|endoftext|>": 100257, "<|fim_prefix|>": 100258, "<|fim_middle|>": 100259,
		"<|fim_suffix|>": 100260, "<|endofprompt|>": 100276,
	}},
	"p50k_base": {codec.NewP50kBase, patternGPT2, map[string]uint32{"<|endoftext|>": 50256}},
	"p50k_edit": {codec.NewP50kEdit, patternGPT2, map[string]uint32{
		"<|endoftext|>": 50256, "<|fim_prefix|>": 50281, "<|fim_middle|>": 50282, "<|fim_suffix|>": 50283,
	}},
	"r50k_base": {codec.NewR50kBase, patternGPT2, map[string]uint32{"<|endoftext|>": 50256}},
}

// TiktokenEncodings lists the names LoadTiktoken accepts.
func TiktokenEncodings() []string {
	names := make([]string, 0, len(tiktokenEncodings))
	for n := range tiktokenEncodings {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

var (
	tiktokenMu    sync.Mutex
	tiktokenCache = map[string]*Model{}
)

// LoadTiktoken returns the embedded tiktoken encoding name (o200k_base,
// cl100k_base, p50k_base, p50k_edit, r50k_base). Models are immutable, so
// each encoding is built once per process and shared.
func LoadTiktoken(name string) (*Model, error) {
	tiktokenMu.Lock()
	defer tiktokenMu.Unlock()
	if m, ok := tiktokenCache[name]; ok {
		return m, nil
	}
	enc, ok := tiktokenEncodings[name]
	if !ok {
		return nil, fmt.Errorf("%w: tiktoken encoding %q is not embedded (embedded: %v)", ErrUnsupported, name, TiktokenEncodings())
	}
	c := enc.codec()
	var ranks []string
	for id := 0; ; id++ {
		tok, err := c.Decode([]uint{uint(id)})
		if err != nil {
			break // ranks are dense from 0; special tokens are not in the codec's vocabulary
		}
		ranks = append(ranks, tok)
	}
	m, err := newTiktoken(ranks, enc.pattern, enc.specials)
	if err != nil {
		return nil, fmt.Errorf("tiktoken %s: %w", name, err)
	}
	m.name = "tiktoken:" + name
	tiktokenCache[name] = m
	return m, nil
}

// LoadTiktokenFile reads a .tiktoken rank file (one "base64-token rank"
// per line) with the encoding's split pattern and special tokens.
func LoadTiktokenFile(path, pattern string, specials map[string]uint32) (*Model, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tiktoken %q: %w", path, err)
	}
	ranks, err := parseTiktokenRanks(data)
	if err != nil {
		return nil, fmt.Errorf("tiktoken %q: %w", path, err)
	}
	m, err := newTiktoken(ranks, pattern, specials)
	if err != nil {
		return nil, fmt.Errorf("tiktoken %q: %w", path, err)
	}
	m.name = path
	return m, nil
}

func parseTiktokenRanks(data []byte) ([]string, error) {
	var ranks []string
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		f := bytes.Fields(sc.Bytes())
		if len(f) == 0 {
			continue
		}
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: line %d: want \"token rank\"", ErrMalformed, line)
		}
		tok, err := base64.StdEncoding.DecodeString(string(f[0]))
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrMalformed, line, err)
		}
		rank, err := strconv.ParseUint(string(f[1]), 10, 32)
		if err != nil || rank > 1<<24 {
			return nil, fmt.Errorf("%w: line %d: bad rank %q", ErrMalformed, line, f[1])
		}
		for uint64(len(ranks)) <= rank {
			ranks = append(ranks, "")
		}
		if ranks[rank] != "" {
			return nil, fmt.Errorf("%w: line %d: rank %d given twice", ErrMalformed, line, rank)
		}
		ranks[rank] = string(tok)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	return ranks, nil
}

// TiktokenSpecialsFromConfig reads the special tokens of a tiktoken model
// from its tokenizer_config.json (added_tokens_decoder: id → {content}).
func TiktokenSpecialsFromConfig(configJSON []byte) (map[string]uint32, error) {
	var c struct {
		Decoder map[string]struct {
			Content string `json:"content"`
		} `json:"added_tokens_decoder"`
	}
	if err := json.Unmarshal(configJSON, &c); err != nil {
		return nil, malformed("tokenizer_config.json", err)
	}
	out := make(map[string]uint32, len(c.Decoder))
	for k, v := range c.Decoder {
		id, err := strconv.ParseUint(k, 10, 32)
		if err != nil {
			return nil, malformed("tokenizer_config.json added_tokens_decoder", err)
		}
		out[v.Content] = uint32(id)
	}
	return out, nil
}

// newTiktoken builds a byte-level Model from tiktoken ranks (token i has
// rank i). tiktoken merges the adjacent pair whose concatenation has the
// lowest rank; the equivalent merge table holds, for every token and every
// way to cut it into two tokens, the pair → (the token's rank, its id). A
// piece that is itself a token is emitted whole (ignore_merges).
func newTiktoken(ranks []string, pattern string, specials map[string]uint32) (*Model, error) {
	m := &Model{ignoreMerges: true, byteLevel: true, specials: map[string]string{}}
	n := len(ranks)
	for _, id := range specials {
		n = max(n, int(id)+1)
	}
	if n > 1<<24 {
		return nil, fmt.Errorf("%w: vocabulary of %d tokens", ErrMalformed, n)
	}
	m.vocabSize = n
	m.tokens = newStrList(n)
	m.vocab = newStrMap(len(ranks) + len(specials))
	m.raw = newStrMap(len(ranks))
	for id, tok := range ranks {
		if tok == "" {
			continue
		}
		m.vocab.set(tok, uint32(id))
		m.raw.set(tok, uint32(id))
		m.tokens.set(uint32(id), tok)
	}
	for b := 0; b < 256; b++ {
		m.byteID[b], m.byteOK[b] = m.raw.get(string([]byte{byte(b)}))
	}
	m.merges = make(map[uint64]uint64, 2*len(ranks))
	for id, tok := range ranks {
		for k := 1; k < len(tok); k++ {
			a, okA := m.raw.get(tok[:k])
			b, okB := m.raw.get(tok[k:])
			if okA && okB {
				m.merges[uint64(a)<<32|uint64(b)] = uint64(id)<<32 | uint64(id)
			}
		}
	}
	added := make([]addedToken, 0, len(specials))
	for content, id := range specials {
		added = append(added, addedToken{id: id, content: content, special: true})
		m.vocab.set(content, id)
		m.tokens.set(id, content)
	}
	m.decoded = m.tokens // a tiktoken token is its bytes
	// Deterministic trie order regardless of map iteration.
	sort.Slice(added, func(i, j int) bool { return added[i].id < added[j].id })
	m.setAdded(added)
	if h := handSplitterFor(pattern); h != nil {
		m.fast = h
	} else {
		re, err := compileSplitRegex(pattern)
		if err != nil {
			return nil, fmt.Errorf("%w: split pattern %q does not compile: %v", ErrUnsupported, pattern, err)
		}
		m.pre = []preTokenizer{&splitPre{re: re, behavior: behaviorIsolated}}
	}
	return m, nil
}
