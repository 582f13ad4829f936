package prompt

import (
	"fmt"
	"strings"
)

// Path says how a request's prompt was tokenized; it labels
// switchyard_router_tokenize_total.
type Path uint8

// The tokenization paths, best first.
const (
	// PathLocal: a tokenizer loaded from the router's own configuration
	// (a flag, the policy file) or built into the binary.
	PathLocal Path = iota + 1
	// PathFetched: tokenizer files fetched from a worker's adapter.
	PathFetched
	// PathEngine: one of the model's engines tokenized it (vLLM /tokenize).
	PathEngine
	// PathApproximate: pseudo-tokens of the rendered text; equal prefixes
	// share blocks, but no engine's KV events will ever match them, so the
	// request routes by predictions and load only.
	PathApproximate
)

func (p Path) String() string {
	switch p {
	case PathLocal:
		return "local"
	case PathFetched:
		return "fetched"
	case PathEngine:
		return "engine"
	case PathApproximate:
		return "approximate"
	}
	return fmt.Sprintf("path(%d)", uint8(p))
}

// Template renders a chat Input into the text the model sees.
type Template interface {
	Render(in *Input) (string, error)
}

// Model is one loaded tokenizer with its chat template: what a model name
// resolves to on the local and fetched paths. It is immutable and safe for
// concurrent use (its incremental cache locks internally).
type Model struct {
	// Spec is where it came from ("tiktoken:o200k_base", a directory, or
	// "fetched:<url>" for advertised files).
	Spec string
	// Digest is the hex SHA-256 of its files in wire.TokenizerSource's
	// form (empty for built-in encodings).
	Digest string
	// Encode tokenizes text without adding special tokens; special-token
	// text in it is recognised.
	Encode func(text string) []uint32
	// EncodeChat tokenizes a rendered chat, reusing the ids of a previous
	// rendering's prefix; nil means Encode.
	EncodeChat func(text string) []uint32
	// Decode turns ids back into text (generated tokens of the simulated
	// engine); nil when unknown.
	Decode func(ids []uint32) string
	// BOS is prepended to text prompts that ask for special tokens (the
	// tokenizer's add_bos_token); nil when it adds none.
	BOS []uint32
	// Template renders chats.
	Template Template
	// Describe is a one-line summary for /debug/cluster.
	Describe string

	// turns encodes plain chats turn by turn when the template and the
	// tokenizer allow it (see turnEncoder); nil otherwise.
	turns *turnEncoder
}

func (m *Model) encodeChat(text string) []uint32 {
	if m.EncodeChat != nil {
		return m.EncodeChat(text)
	}
	return m.Encode(text)
}

// PlainChat is the ChatML-shaped text the approximate path hashes (and the
// template of a Model that brings none): every message as
// <|im_start|>role\ncontent<|im_end|>\n, tool calls and tool definitions as
// their JSON, then the generation prompt. It needs no template engine, so
// requests for a model with no tokenizer still hash their conversation
// structure.
type PlainChat struct{}

func (PlainChat) Render(in *Input) (string, error) {
	var b strings.Builder
	if len(in.Tools) > 0 {
		b.WriteString("<|im_start|>tools\n")
		for _, t := range in.Tools {
			b.Write(t)
			b.WriteByte('\n')
		}
		b.WriteString("<|im_end|>\n")
	}
	for _, m := range in.Messages {
		b.WriteString("<|im_start|>")
		b.WriteString(m.Role)
		b.WriteByte('\n')
		b.WriteString(m.Content)
		if m.NullContent || m.Role == "tool" {
			// The calls (or the call id answered) shape the prefix too.
			b.Write(m.Raw)
		}
		b.WriteString("<|im_end|>\n")
	}
	if in.AddGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String(), nil
}
