// Package tokenizer owns tokenization for Switchyard: the router hashes
// prompts into KV block hashes, and those hashes are only right when its
// token ids are the engine's, id for id. So this package loads each model's
// own tokenizer and reproduces Hugging Face tokenizers' (and tiktoken's)
// ids exactly.
//
// # Tokenizers
//
// A *Model is loaded by Open from a spec: a Hugging Face model directory
// (LoadDir reads tokenizer.json and, when present, tokenizer_config.json),
// a tokenizer.json path (LoadFile; a tokenizer_config.json beside it is read
// too), or "tiktoken:NAME" (LoadTiktoken). Load takes the bytes of both
// files; LoadTiktokenFile reads a .tiktoken rank file with a split pattern
// and special tokens (TiktokenSpecialsFromConfig reads those from a
// tokenizer_config.json's added_tokens_decoder).
//
// Supported in tokenizer.json:
//   - model BPE, byte-level (GPT-2, Llama 3, Qwen 2/2.5/3, DeepSeek-V3,
//     Cohere) or SentencePiece-style (Llama 2, Mistral v0.1: byte_fallback
//     <0xNN> tokens, unk_token, fuse_unk); merges written as "a b" strings
//     or [a, b] pairs; ignore_merges (a pre-token that is itself in the
//     vocabulary is emitted whole, as Llama 3 sets).
//   - normalizers NFC, NFD, NFKC, NFKD, Replace (String or Regex), Prepend,
//     Sequence.
//   - pre-tokenizers Split (String or Regex pattern; Isolated, Removed,
//     MergedWithPrevious, MergedWithNext, Contiguous; invert), ByteLevel
//     (add_prefix_space, use_regex; it must be the last step), Metaspace
//     (replacement, prepend_scheme always/first/never or the older
//     add_prefix_space, split), Digits, Sequence.
//   - added_tokens, matched in the raw text before normalization
//     (normalized: false) or in each normalized segment (normalized: true),
//     leftmost-longest, honouring single_word, lstrip and rstrip as Hugging
//     Face's AddedVocabulary does; the text between them is tokenized on
//     its own.
//   - post-processors TemplateProcessing, RobertaProcessing,
//     BertProcessing, ByteLevel and Sequence, read only for the tokens a
//     single sequence gets around it (EncodeWithSpecialTokens, AddBOS).
//     tokenizer_config.json's add_bos_token / add_eos_token override them
//     when present, and its bos_token, eos_token, unk_token and pad_token
//     (strings or {"content": ...}) are reported by SpecialTokens.
//
// Anything else (WordPiece, Unigram and WordLevel models, BERT
// normalizers, other pre-tokenizers, BPE dropout or subword prefixes) fails
// at load with an error wrapping ErrUnsupported that names it; malformed
// JSON or inconsistent content wraps ErrMalformed.
//
// Encode(text) equals Hugging Face's tokenizer.encode(text,
// add_special_tokens=False): special tokens written in the text are
// recognised, as is HF's default. EncodeWithSpecialTokens adds what the
// post-processor adds (what vLLM sends for a completions prompt). Decode
// maps ids back to bytes; unlike HF it keeps invalid UTF-8 as bytes rather
// than U+FFFD, so Decode(Encode(s)) == s for byte-level models.
//
// tiktoken encodings (o200k_base, cl100k_base, p50k_base, p50k_edit,
// r50k_base) come from github.com/tiktoken-go/tokenizer v0.10.0's embedded
// ranks, read through its exported codec Decode; they run on the same BPE
// core, with merges derived from ranks (every split of a token into two
// tokens merges at the token's rank), which is tiktoken's algorithm.
//
// # How the ids are made to match
//
// Byte-level vocabularies are mapped back to raw bytes at load, so BPE
// works on the text's bytes without building the printable GPT-2 form.
// Merges apply lowest rank first, leftmost on ties, by scanning for short
// words and with a heap over a linked list for long ones. Split patterns
// that appear in real files (cl100k/Llama 3, Qwen 2, o200k, GPT-2) run as
// hand-written splitters; TestHandSplittersEqualRegexp2 proves them equal to
// github.com/dlclark/regexp2 (v1.12.0), which runs every other pattern
// (Rust-style class intersections [A&&[^B]] are rewritten to regexp2's
// class subtraction). Unicode classes come from Go's unicode tables;
// Hugging Face uses Oniguruma's, so characters assigned in a Unicode
// version one has and the other lacks may split differently.
//
// # Incremental tokenization
//
// PrefixCache (bounded bytes, LRU) and (*Model).EncodeCached reuse the ids
// of the longest cached prefix of a text that ends where the encoding
// provably splits: just after an occurrence of a raw-matched added token,
// and, for models whose pre-tokenization is only the cl100k (Llama 3), Qwen
// 2 or o200k split, between a "\n" and a following "<|im_start|>" (ChatML's
// turn boundary; the argument is written at chatMLTurns). Prefixes are keyed
// by model, length and xxh3 hash; the prefixes one call stores share one
// copy of its ids. The result always equals Encode
// (TestEncodeCachedEqualsEncode...).
//
// (*Model).EncodeTurnsIDs encodes a chat turn by turn through the same
// cache, keyed by the caller's chain hash of the messages, and returns the
// ids in two parts (IDs): the cached history, uncopied and read only, then
// what is new. The turns of one conversation share one growing array (a
// run): the request that extends a run's last stored turn writes its new
// ids in the array's room, a fork of one new turn after a history another
// request extended shares the history and stores nothing, and any other
// request copies its history once into a new run. Beside each run, IDs.Memo
// and IDs.Remember keep per-block values (the router's block sequence
// hashes) for each block size and seed, so that a next turn computes only
// the blocks past the cached ones; they are charged to the cache's bytes.
//
// The splitters decide ASCII text on a byte class table and decode runes
// only where a non-ASCII byte could change a piece; the word cache of each
// pooled scratch (recent pieces and their ids, direct-mapped, no pointers)
// saves BPE for repeated words.
//
// # The toy tokenizer
//
// The package-level Encode, AppendEncode, Count, Piece, ChatPrompt and the
// Default type (toy.go) are the legacy deterministic stand-in: FNV hashes
// of short pieces with a made-up chat template, kept until callers move to
// a real Model. It has no vocabulary and matches no engine.
//
// # References read
//
// Formats and semantics were learned from Hugging Face tokenizers' sources
// (added_vocabulary.rs, pre-tokenizers, BPE model), OpenAI tiktoken and
// tiktoken-go/tokenizer v0.10.0's codec package (patterns and special
// tokens of the embedded encodings), and pkoukk/tiktoken-go v0.1.8. Tests
// read real files from Go module zips in the module cache, never copied
// here: github.com/daulet/tokenizers v1.24.0's test/data
// (Meta-Llama-3-8B-Instruct.json with its tokenizer_config.json and
// tiktoken.model, cohere-tokenizer.json, Kimi-K2's tiktoken.model, the
// WordPiece BERT/MiniLM/LaBSE files) and the expected ids of its
// tokenizer_test.go; pkoukk/tiktoken-go v0.1.8 is the independent BPE the
// differential tests compare against.
//
// # Concurrency
//
// A loaded Model is immutable and safe for concurrent use; LoadTiktoken
// builds each embedded encoding once per process and shares it. A
// PrefixCache is safe for concurrent use (one mutex, which also guards the
// runs' written length, references and memos; ids below a run's written
// length are never written again, so results read them unlocked). Nothing
// here starts goroutines.
package tokenizer
