package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/text/unicode/norm"
)

// byteRune is GPT-2's bytes_to_unicode: printable Latin-1 bytes map to
// themselves, the other bytes to U+0100 onwards in byte order.
var byteRune, runeByte = func() ([256]rune, map[rune]byte) {
	var br [256]rune
	rb := make(map[rune]byte, 256)
	n := 0
	for b := 0; b < 256; b++ {
		if '!' <= b && b <= '~' || 0xA1 <= b && b <= 0xAC || 0xAE <= b && b <= 0xFF {
			br[b] = rune(b)
		} else {
			br[b] = rune(256 + n)
			n++
		}
		rb[br[b]] = byte(b)
	}
	return br, rb
}()

// unByteLevel maps a token in byte-level form back to its bytes; ok is
// false when a character is outside the mapping (then Hugging Face's
// ByteLevel decoder uses the token's own UTF-8).
func unByteLevel(tok string) (string, bool) {
	buf := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := runeByte[r]
		if !ok {
			return tok, false
		}
		buf = append(buf, b)
	}
	return string(buf), true
}

// Open loads a tokenizer from a spec: "tiktoken:NAME" for an embedded
// tiktoken encoding, a model directory (tokenizer.json and, if present,
// tokenizer_config.json), or a path to a tokenizer.json file.
func Open(spec string) (*Model, error) {
	if name, ok := strings.CutPrefix(spec, "tiktoken:"); ok {
		return LoadTiktoken(name)
	}
	st, err := os.Stat(spec)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q: %w", spec, err)
	}
	if st.IsDir() {
		return LoadDir(spec)
	}
	return LoadFile(spec)
}

// LoadDir reads dir/tokenizer.json and, when present, dir/tokenizer_config.json.
func LoadDir(dir string) (*Model, error) {
	tj, err := os.ReadFile(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q: %w", dir, err)
	}
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("tokenizer %q: %w", dir, err)
	}
	m, err := Load(tj, cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q: %w", dir, err)
	}
	m.name = dir
	return m, nil
}

// LoadFile reads a tokenizer.json file and, when the file is named
// tokenizer.json, the tokenizer_config.json beside it if present (a file of
// another name may share its directory with other models' files).
func LoadFile(path string) (*Model, error) {
	tj, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q: %w", path, err)
	}
	var cfg []byte
	if filepath.Base(path) == "tokenizer.json" {
		cfg, err = os.ReadFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("tokenizer %q: %w", path, err)
		}
	}
	m, err := Load(tj, cfg)
	if err != nil {
		return nil, fmt.Errorf("tokenizer %q: %w", path, err)
	}
	m.name = path
	return m, nil
}

type jsonFile struct {
	AddedTokens   []jsonAdded     `json:"added_tokens"`
	Normalizer    json.RawMessage `json:"normalizer"`
	PreTokenizer  json.RawMessage `json:"pre_tokenizer"`
	PostProcessor json.RawMessage `json:"post_processor"`
	Decoder       json.RawMessage `json:"decoder"`
	Model         json.RawMessage `json:"model"`
}

type jsonAdded struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized *bool  `json:"normalized"`
	Special    bool   `json:"special"`
}

type jsonModel struct {
	Type                    string          `json:"type"`
	Vocab                   json.RawMessage `json:"vocab"`
	Merges                  json.RawMessage `json:"merges"`
	Dropout                 *float64        `json:"dropout"`
	UnkToken                *string         `json:"unk_token"`
	ContinuingSubwordPrefix *string         `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string         `json:"end_of_word_suffix"`
	FuseUnk                 bool            `json:"fuse_unk"`
	ByteFallback            bool            `json:"byte_fallback"`
	IgnoreMerges            bool            `json:"ignore_merges"`
}

// jsonPattern is a Split or Replace pattern: {"String": s} or {"Regex": r}.
type jsonPattern struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

// jsonComponent holds the fields of every normalizer, pre-tokenizer,
// post-processor and decoder this package reads; Type selects which apply.
type jsonComponent struct {
	Type string `json:"type"`

	Normalizers   []json.RawMessage `json:"normalizers"`
	Pretokenizers []json.RawMessage `json:"pretokenizers"`
	Processors    []json.RawMessage `json:"processors"`
	Decoders      []json.RawMessage `json:"decoders"`

	Pattern *jsonPattern `json:"pattern"`
	Content string       `json:"content"`
	Prepend string       `json:"prepend"`

	Behavior         string `json:"behavior"`
	Invert           bool   `json:"invert"`
	AddPrefixSpace   *bool  `json:"add_prefix_space"`
	UseRegex         *bool  `json:"use_regex"`
	Replacement      string `json:"replacement"`
	PrependScheme    string `json:"prepend_scheme"`
	Split            *bool  `json:"split"`
	IndividualDigits bool   `json:"individual_digits"`

	Single        []json.RawMessage          `json:"single"`
	SpecialTokens map[string]jsonSpecialToks `json:"special_tokens"`
	Cls           []json.RawMessage          `json:"cls"`

	Start int `json:"start"`
	Stop  int `json:"stop"`
}

type jsonSpecialToks struct {
	IDs []uint32 `json:"ids"`
}

func malformed(what string, err error) error {
	return fmt.Errorf("%w: %s: %w", ErrMalformed, what, err)
}

func unsupported(format string, args ...any) error {
	return fmt.Errorf("%w: tokenizer.json: %s", ErrUnsupported, fmt.Sprintf(format, args...))
}

// isNull reports an absent or null JSON value.
func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// Load builds a tokenizer from the bytes of a tokenizer.json and,
// optionally (nil), a tokenizer_config.json.
func Load(tokenizerJSON, tokenizerConfigJSON []byte) (*Model, error) {
	var f jsonFile
	if err := json.Unmarshal(tokenizerJSON, &f); err != nil {
		return nil, malformed("tokenizer.json", err)
	}
	if isNull(f.Model) {
		return nil, malformed("tokenizer.json", errors.New("no model"))
	}
	var jm jsonModel
	if err := json.Unmarshal(f.Model, &jm); err != nil {
		return nil, malformed("tokenizer.json model", err)
	}
	if jm.Type == "" {
		jm.Type = inferModelType(f.Model, jm)
	}
	if jm.Type != "BPE" {
		return nil, unsupported("model type %q is not supported (supported: BPE)", jm.Type)
	}
	switch {
	case jm.Dropout != nil && *jm.Dropout > 0:
		return nil, unsupported("BPE dropout %v is not supported", *jm.Dropout)
	case jm.ContinuingSubwordPrefix != nil && *jm.ContinuingSubwordPrefix != "":
		return nil, unsupported("BPE continuing_subword_prefix is not supported")
	case jm.EndOfWordSuffix != nil && *jm.EndOfWordSuffix != "":
		return nil, unsupported("BPE end_of_word_suffix is not supported")
	}

	m := &Model{name: "tokenizer.json", ignoreMerges: jm.IgnoreMerges, byteFallback: jm.ByteFallback, fuseUnk: jm.FuseUnk}
	// Unmarshal fills a non-nil map: sizing it up front saves the rehashing
	// of a growing 128k-entry map, the largest part of the load time.
	modelVocab := make(map[string]uint32, bytes.Count(jm.Vocab, []byte(`":`)))
	if !fastVocab(jm.Vocab, modelVocab) {
		clear(modelVocab)
		if err := json.Unmarshal(jm.Vocab, &modelVocab); err != nil {
			return nil, malformed("tokenizer.json model.vocab", err)
		}
	}
	if len(modelVocab) == 0 {
		return nil, malformed("tokenizer.json model.vocab", errors.New("empty vocabulary"))
	}

	var err error
	if m.norm, err = parseNormalizer(f.Normalizer); err != nil {
		return nil, err
	}
	if err = m.parsePreTokenizer(f.PreTokenizer); err != nil {
		return nil, err
	}
	if !m.byteLevel && normalizerIsByteLevel(f.Normalizer) {
		m.byteLevel = true
	}

	maxID := uint32(0)
	for _, id := range modelVocab {
		maxID = max(maxID, id)
	}
	for _, a := range f.AddedTokens {
		maxID = max(maxID, a.ID)
	}
	if maxID > 1<<24 {
		return nil, malformed("tokenizer.json", fmt.Errorf("token id %d out of range", maxID))
	}
	m.vocabSize = int(maxID) + 1
	m.tokens = newStrList(m.vocabSize)
	m.decoded = newStrList(m.vocabSize)
	m.vocab = newStrMap(len(modelVocab) + len(f.AddedTokens))
	m.raw = newStrMap(len(modelVocab))
	for tok, id := range modelVocab {
		m.vocab.set(tok, id)
		m.tokens.set(id, tok)
		if m.byteLevel {
			b, ok := unByteLevel(tok)
			m.decoded.set(id, b)
			if ok {
				m.raw.set(b, id)
			}
		} else {
			m.decoded.set(id, tok)
			m.raw.set(tok, id)
		}
	}
	if m.byteLevel {
		for b := 0; b < 256; b++ {
			m.byteID[b], m.byteOK[b] = modelVocab[string(byteRune[b])]
		}
	}
	if m.byteFallback {
		for b := 0; b < 256; b++ {
			m.fallbackID[b], m.fallbackOK[b] = modelVocab[fmt.Sprintf("<0x%02X>", b)]
		}
	}
	if jm.UnkToken != nil {
		m.unkID, m.hasUnk = modelVocab[*jm.UnkToken]
	}
	if err := m.parseMerges(jm.Merges, modelVocab); err != nil {
		return nil, err
	}

	added := make([]addedToken, 0, len(f.AddedTokens))
	for _, a := range f.AddedTokens {
		normalized := !a.Special
		if a.Normalized != nil {
			normalized = *a.Normalized
		}
		added = append(added, addedToken{id: a.ID, content: a.Content, singleWord: a.SingleWord,
			lstrip: a.Lstrip, rstrip: a.Rstrip, normalized: normalized, special: a.Special})
		m.vocab.set(a.Content, a.ID)
		m.tokens.set(a.ID, a.Content)
		if m.byteLevel {
			b, _ := unByteLevel(a.Content)
			m.decoded.set(a.ID, b)
		} else {
			m.decoded.set(a.ID, a.Content)
		}
	}
	m.setAdded(added)

	if err := m.parsePostProcessor(f.PostProcessor); err != nil {
		return nil, err
	}
	for _, id := range append(slices.Clone(m.prefix), m.suffix...) {
		if int(id) >= m.vocabSize {
			return nil, malformed("tokenizer.json post_processor", fmt.Errorf("special token id %d outside the vocabulary", id))
		}
	}
	if !m.byteLevel {
		m.dec = parseDecoder(f.Decoder)
	}
	if err := m.applyConfig(tokenizerConfigJSON); err != nil {
		return nil, err
	}
	return m, nil
}

// setAdded builds the two added-token matchers: tokens with normalized
// false match the raw text, the others the normalized segments.
func (m *Model) setAdded(added []addedToken) {
	var raw, normd []addedToken
	for _, a := range added {
		if a.normalized {
			normd = append(normd, a)
		} else {
			raw = append(raw, a)
		}
	}
	m.rawAdded = newMatcher(raw, func(a addedToken) string { return a.content })
	m.normAdded = newMatcher(normd, func(a addedToken) string {
		if m.norm != nil {
			return m.norm.normalize(a.content)
		}
		return a.content
	})
}

func (m *Model) parseMerges(raw json.RawMessage, vocab map[string]uint32) error {
	if isNull(raw) {
		m.merges = map[uint64]uint64{}
		return nil
	}
	lines, pairs, ok := fastMerges(raw)
	if !ok {
		lines, pairs = nil, nil
		if err := json.Unmarshal(raw, &lines); err != nil {
			lines = nil
			if err := json.Unmarshal(raw, &pairs); err != nil {
				return malformed("tokenizer.json model.merges", err)
			}
		}
	}
	if lines != nil {
		pairs = make([][2]string, len(lines))
		for i, l := range lines {
			a, b, found := strings.Cut(l, " ")
			if !found || strings.Contains(b, " ") {
				return malformed("tokenizer.json model.merges", fmt.Errorf("merge %d %q is not two tokens", i, l))
			}
			pairs[i] = [2]string{a, b}
		}
	}
	m.merges = make(map[uint64]uint64, len(pairs))
	var buf []byte
	for rank, p := range pairs {
		a, okA := vocab[p[0]]
		b, okB := vocab[p[1]]
		buf = append(append(buf[:0], p[0]...), p[1]...)
		ab, okAB := vocab[string(buf)]
		if !okA || !okB || !okAB {
			return malformed("tokenizer.json model.merges", fmt.Errorf("merge %d (%q, %q) uses a token outside the vocabulary", rank, p[0], p[1]))
		}
		m.merges[uint64(a)<<32|uint64(b)] = uint64(rank)<<32 | uint64(ab)
	}
	return nil
}

// inferModelType names the model of a file written before the type tag,
// from the fields each model type has, as Hugging Face's untagged
// deserialization does.
func inferModelType(raw json.RawMessage, jm jsonModel) string {
	var fields map[string]json.RawMessage
	_ = json.Unmarshal(raw, &fields)
	switch v := bytes.TrimSpace(jm.Vocab); {
	case !isNull(jm.Merges):
		return "BPE"
	case fields["max_input_chars_per_word"] != nil || fields["continuing_subword_prefix"] != nil:
		return "WordPiece"
	case len(v) > 0 && v[0] == '[':
		return "Unigram"
	case len(v) > 0:
		return "WordLevel"
	}
	return "unknown"
}

func parseComponent(raw json.RawMessage, what string) (*jsonComponent, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c jsonComponent
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, malformed("tokenizer.json "+what, err)
	}
	return &c, nil
}

func normalizerIsByteLevel(raw json.RawMessage) bool {
	c, err := parseComponent(raw, "normalizer")
	return err == nil && c != nil && c.Type == "ByteLevel"
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	c, err := parseComponent(raw, "normalizer")
	if err != nil || c == nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "ByteLevel":
		return nil, nil // the byte mapping is implicit; see byteLevelPre
	case "Prepend":
		return prependNorm{c.Prepend}, nil
	case "Replace":
		if c.Pattern == nil {
			return nil, malformed("tokenizer.json normalizer", errors.New("a Replace has no pattern"))
		}
		if c.Pattern.Regex != nil {
			re, err := compileSplitRegex(*c.Pattern.Regex)
			if err != nil {
				return nil, malformed("tokenizer.json normalizer Replace", err)
			}
			return replaceNorm{re: re, content: c.Content}, nil
		}
		if c.Pattern.String == nil {
			return nil, malformed("tokenizer.json normalizer", errors.New("a Replace pattern is neither String nor Regex"))
		}
		return replaceNorm{literal: *c.Pattern.String, content: c.Content}, nil
	case "Sequence":
		var seq sequenceNorm
		for _, r := range c.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	}
	return nil, unsupported("normalizer %q is not supported (supported: NFC, NFD, NFKC, NFKD, Prepend, Replace, Sequence)", c.Type)
}

func (m *Model) parsePreTokenizer(raw json.RawMessage) error {
	c, err := parseComponent(raw, "pre_tokenizer")
	if err != nil || c == nil {
		return err
	}
	steps, err := m.preSteps(c)
	if err != nil {
		return err
	}
	// ByteLevel must come last: a step after it would see the printable
	// byte-level form of the text, which this package never builds.
	for i, st := range steps {
		if _, ok := st.(byteLevelPre); ok && i != len(steps)-1 {
			return unsupported("pre_tokenizer: ByteLevel followed by another pre-tokenizer is not supported")
		}
	}
	if n := len(steps); n > 0 {
		if bl, ok := steps[n-1].(byteLevelPre); ok && !bl.addPrefixSpace && !bl.useRegex {
			steps = steps[:n-1] // a no-op apart from the implicit byte mapping
		}
	}
	m.pre = steps
	if len(steps) == 1 {
		switch st := steps[0].(type) {
		case *splitPre:
			if st.hand != nil && st.behavior == behaviorIsolated && !st.invert {
				m.fast = st.hand
			}
		case byteLevelPre:
			if st.useRegex && !st.addPrefixSpace {
				m.fast = gpt2Splitter{}
			}
		}
	}
	return nil
}

func (m *Model) preSteps(c *jsonComponent) ([]preTokenizer, error) {
	switch c.Type {
	case "Sequence":
		var out []preTokenizer
		for _, r := range c.Pretokenizers {
			sub, err := parseComponent(r, "pre_tokenizer")
			if err != nil {
				return nil, err
			}
			if sub == nil {
				continue
			}
			steps, err := m.preSteps(sub)
			if err != nil {
				return nil, err
			}
			out = append(out, steps...)
		}
		return out, nil
	case "ByteLevel":
		m.byteLevel = true
		bl := byteLevelPre{useRegex: true}
		if c.AddPrefixSpace != nil {
			bl.addPrefixSpace = *c.AddPrefixSpace
		}
		if c.UseRegex != nil {
			bl.useRegex = *c.UseRegex
		}
		return []preTokenizer{bl}, nil
	case "Split":
		sp := &splitPre{invert: c.Invert}
		switch c.Behavior {
		case "Isolated":
			sp.behavior = behaviorIsolated
		case "Removed":
			sp.behavior = behaviorRemoved
		case "MergedWithPrevious":
			sp.behavior = behaviorMergedWithPrevious
		case "MergedWithNext":
			sp.behavior = behaviorMergedWithNext
		case "Contiguous":
			sp.behavior = behaviorContiguous
		default:
			return nil, unsupported("pre_tokenizer Split behavior %q is not supported", c.Behavior)
		}
		switch {
		case c.Pattern == nil:
			return nil, malformed("tokenizer.json pre_tokenizer", errors.New("a Split has no pattern"))
		case c.Pattern.Regex != nil:
			if h := handSplitterFor(*c.Pattern.Regex); h != nil {
				sp.hand = h
			} else {
				re, err := compileSplitRegex(*c.Pattern.Regex)
				if err != nil {
					return nil, unsupported("pre_tokenizer Split regex %q does not compile: %v", *c.Pattern.Regex, err)
				}
				sp.re = re
			}
		case c.Pattern.String != nil:
			sp.literal = *c.Pattern.String
		default:
			return nil, malformed("tokenizer.json pre_tokenizer", errors.New("a Split pattern is neither String nor Regex"))
		}
		return []preTokenizer{sp}, nil
	case "Metaspace":
		ms := metaspacePre{replacement: c.Replacement, scheme: prependAlways, split: true}
		if ms.replacement == "" {
			ms.replacement = "▁"
		}
		if c.Split != nil {
			ms.split = *c.Split
		}
		switch c.PrependScheme {
		case "", "always":
			if c.PrependScheme == "" && c.AddPrefixSpace != nil && !*c.AddPrefixSpace {
				ms.scheme = prependNever
			}
		case "first":
			ms.scheme = prependFirst
		case "never":
			ms.scheme = prependNever
		default:
			return nil, unsupported("pre_tokenizer Metaspace prepend_scheme %q is not supported", c.PrependScheme)
		}
		return []preTokenizer{metaspaceStep{ms}}, nil
	case "Digits":
		return []preTokenizer{digitsPre{individual: c.IndividualDigits}}, nil
	}
	return nil, unsupported("pre_tokenizer %q is not supported (supported: ByteLevel, Split, Metaspace, Digits, Sequence)", c.Type)
}

// parsePostProcessor reads which special tokens a single sequence gets.
func (m *Model) parsePostProcessor(raw json.RawMessage) error {
	c, err := parseComponent(raw, "post_processor")
	if err != nil || c == nil {
		return err
	}
	switch c.Type {
	case "Sequence":
		for _, r := range c.Processors {
			if err := m.parsePostProcessor(r); err != nil {
				return err
			}
		}
	case "TemplateProcessing":
		seen := false
		for _, item := range c.Single {
			var it struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *json.RawMessage `json:"Sequence"`
			}
			if err := json.Unmarshal(item, &it); err != nil {
				return malformed("tokenizer.json post_processor", err)
			}
			if it.Sequence != nil {
				seen = true
				continue
			}
			if it.SpecialToken == nil {
				continue
			}
			ids := c.SpecialTokens[it.SpecialToken.ID].IDs
			if len(ids) == 0 {
				if id, ok := m.vocab.get(it.SpecialToken.ID); ok {
					ids = []uint32{id}
				}
			}
			if seen {
				m.suffix = append(m.suffix, ids...)
			} else {
				m.prefix = append(m.prefix, ids...)
			}
		}
	case "RobertaProcessing", "BertProcessing":
		var rp struct {
			Cls [2]json.RawMessage `json:"cls"`
			Sep [2]json.RawMessage `json:"sep"`
		}
		if err := json.Unmarshal(raw, &rp); err != nil {
			return malformed("tokenizer.json post_processor", err)
		}
		var cls, sep uint32
		if json.Unmarshal(rp.Cls[1], &cls) == nil && json.Unmarshal(rp.Sep[1], &sep) == nil {
			m.prefix, m.suffix = []uint32{cls}, []uint32{sep}
		}
	}
	return nil
}

// parseDecoder reads the decoder of a SentencePiece-style model. Decoding
// only serves display, so an unknown decoder falls back to concatenation
// rather than failing the load.
func parseDecoder(raw json.RawMessage) decoder {
	c, err := parseComponent(raw, "decoder")
	if err != nil || c == nil {
		return nil
	}
	steps := decodeSteps(c)
	if len(steps) == 0 {
		return nil
	}
	return chainDecoder(steps)
}

func decodeSteps(c *jsonComponent) []decodeStep {
	switch c.Type {
	case "Sequence":
		var out []decodeStep
		for _, r := range c.Decoders {
			if sub, err := parseComponent(r, "decoder"); err == nil && sub != nil {
				out = append(out, decodeSteps(sub)...)
			}
		}
		return out
	case "Replace":
		if c.Pattern != nil && c.Pattern.String != nil {
			return []decodeStep{replaceDec{*c.Pattern.String, c.Content}}
		}
	case "ByteFallback":
		return []decodeStep{byteFallbackDec{}}
	case "Fuse":
		return []decodeStep{fuseDec{}}
	case "Strip":
		return []decodeStep{stripDec{content: c.Content, start: c.Start, stop: c.Stop}}
	case "Metaspace":
		rep := c.Replacement
		if rep == "" {
			rep = "▁"
		}
		strip := c.PrependScheme != "never"
		if c.PrependScheme == "" && c.AddPrefixSpace != nil {
			strip = *c.AddPrefixSpace
		}
		return []decodeStep{metaspaceDec{replacement: rep, stripFirst: strip}}
	}
	return nil
}

// configToken reads a special token of tokenizer_config.json, written as a
// string or as {"content": ...}.
func configToken(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, s != ""
	}
	var o struct {
		Content string `json:"content"`
	}
	if json.Unmarshal(raw, &o) == nil && o.Content != "" {
		return o.Content, true
	}
	return "", false
}

func (m *Model) applyConfig(cfg []byte) error {
	m.specials = map[string]string{}
	var c map[string]json.RawMessage
	if len(bytes.TrimSpace(cfg)) > 0 {
		if err := json.Unmarshal(cfg, &c); err != nil {
			return malformed("tokenizer_config.json", err)
		}
	}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "pad_token"} {
		if v, ok := configToken(c[k]); ok {
			m.specials[k] = v
		}
	}
	m.bosToken, m.eosToken = m.specials["bos_token"], m.specials["eos_token"]
	if m.bosToken == "" && len(m.prefix) > 0 {
		m.bosToken = m.tokens.get(m.prefix[0])
	}
	var flag bool
	if raw, ok := c["add_bos_token"]; ok && json.Unmarshal(raw, &flag) == nil {
		m.prefix = nil
		if id, ok := m.vocab.get(m.bosToken); flag && ok {
			m.prefix = []uint32{id}
		}
	}
	if raw, ok := c["add_eos_token"]; ok && json.Unmarshal(raw, &flag) == nil {
		m.suffix = nil
		if id, ok := m.vocab.get(m.eosToken); flag && ok {
			m.suffix = []uint32{id}
		}
	}
	m.addBOS = len(m.prefix) > 0
	return nil
}
