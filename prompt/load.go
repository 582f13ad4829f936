package prompt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/tokenizer/chat"
)

// The files of a Hugging Face model directory that decide tokenization.
const (
	fileTokenizer    = "tokenizer.json"
	fileConfig       = "tokenizer_config.json"
	fileChatTemplate = "chat_template.jinja"
)

// BuiltinSpec reports whether spec names a tokenizer compiled into the
// binary (tiktoken:o200k_base, tiktoken:cl100k_base), which a worker may
// advertise by name.
func BuiltinSpec(spec string) bool {
	name, ok := strings.CutPrefix(spec, "tiktoken:")
	return ok && slices.Contains(tokenizer.TiktokenEncodings(), name)
}

// OpenSpec loads a tokenizer spec: tiktoken:ENCODING (built in; chats
// render with ChatML), a Hugging Face model directory (tokenizer.json,
// tokenizer_config.json and chat_template.jinja where present), or a
// tokenizer.json file (its directory's config and template are used). A
// tokenizer.json whose model type is not supported fails here, naming it.
func OpenSpec(spec string, prefixCacheBytes int64) (*Model, error) {
	if strings.HasPrefix(spec, "tiktoken:") {
		return openBuiltin(spec, prefixCacheBytes)
	}
	dir := spec
	st, err := os.Stat(spec)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
	}
	tjPath := filepath.Join(spec, fileTokenizer)
	if !st.IsDir() {
		dir, tjPath = filepath.Dir(spec), spec
	}
	names := []string{fileTokenizer}
	tj, err := os.ReadFile(tjPath)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
	}
	files := [][]byte{tj}
	var cfg, tmpl []byte
	for _, f := range []struct {
		name string
		dst  *[]byte
	}{{fileConfig, &cfg}, {fileChatTemplate, &tmpl}} {
		b, err := os.ReadFile(filepath.Join(dir, f.name))
		switch {
		case errors.Is(err, fs.ErrNotExist):
			continue
		case err != nil:
			return nil, fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
		}
		*f.dst = b
		names, files = append(names, f.name), append(files, b)
	}
	tok, err := tokenizer.Load(tj, cfg)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
	}
	return newModel(spec, Digest(names, files), tok, cfg, tmpl, prefixCacheBytes)
}

// builtins memoizes built-in encodings per process: loading one takes
// seconds of CPU and tens of MB, and `switchyard up` runs every router and
// worker in one process. A Model is immutable and safe to share (its chat
// cache locks internally).
var builtins sync.Map // builtinKey → *builtinOnce

type builtinKey struct {
	spec  string
	bytes int64
}

type builtinOnce struct {
	once sync.Once
	m    *Model
	err  error
}

func openBuiltin(spec string, prefixCacheBytes int64) (*Model, error) {
	v, _ := builtins.LoadOrStore(builtinKey{spec, prefixCacheBytes}, &builtinOnce{})
	b := v.(*builtinOnce)
	b.once.Do(func() {
		tok, err := tokenizer.Open(spec)
		if err != nil {
			b.err = fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
			return
		}
		b.m, b.err = newModel(spec, "", tok, nil, nil, prefixCacheBytes)
	})
	return b.m, b.err
}

// OpenFiles loads tokenizer files fetched from a worker: tokenizer.json
// (required), tokenizer_config.json and chat_template.jinja when present.
func OpenFiles(files map[string][]byte, prefixCacheBytes int64) (*Model, error) {
	tj, ok := files[fileTokenizer]
	if !ok {
		return nil, fmt.Errorf("%w: the advertised files have no %s", ErrBadSpec, fileTokenizer)
	}
	tok, err := tokenizer.Load(tj, files[fileConfig])
	if err != nil {
		return nil, fmt.Errorf("%w: fetched %s: %v", ErrBadSpec, fileTokenizer, err)
	}
	return newModel("fetched", "", tok, files[fileConfig], files[fileChatTemplate], prefixCacheBytes)
}

// newModel wires a loaded tokenizer with its chat template (the model's
// own, else ChatML), its BOS and its incremental chat cache.
func newModel(spec, digest string, tok *tokenizer.Model, cfg, tmpl []byte, prefixCacheBytes int64) (*Model, error) {
	ct := &chatTemplate{t: chat.ChatML(), vars: map[string]any{}}
	templateName := "ChatML"
	if cfg != nil || tmpl != nil {
		t, err := chat.FromTokenizerConfig(orEmptyObject(cfg), tmpl)
		switch {
		case errors.Is(err, chat.ErrNoTemplate):
			// A base model: clients should not send it chats, but when they
			// do, ChatML shapes the prefix the same on every router.
		case err != nil:
			return nil, fmt.Errorf("%w: %s: chat template: %v", ErrBadSpec, spec, err)
		default:
			ct.t, templateName = t, t.Name()
		}
		if cfg != nil {
			if ct.vars, err = chat.SpecialTokens(cfg); err != nil {
				return nil, fmt.Errorf("%w: %s: %v", ErrBadSpec, spec, err)
			}
		}
	}
	if ct.vars["bos_token"] == nil && tok.BOSToken() != "" {
		ct.vars["bos_token"] = tok.BOSToken()
	}
	if ct.vars["eos_token"] == nil && tok.EOSToken() != "" {
		ct.vars["eos_token"] = tok.EOSToken()
	}
	ct.openAIContent = ct.t.ContentFormat() == chat.ContentOpenAI
	ct.builtinChatML = ct.t == chat.ChatML()
	if bos, ok := ct.vars["bos_token"].(string); ok && !ct.openAIContent && ct.t.Source() == llama3Source {
		ct.llama3BOS = &bos
	}
	m := &Model{Spec: spec, Digest: digest, Encode: tok.Encode, Decode: tok.Decode, Template: ct,
		Describe: fmt.Sprintf("%d ids, template %s", tok.VocabSize(), templateName)}
	if tok.AddBOS() {
		id, ok := tok.TokenID(tok.BOSToken())
		if !ok {
			return nil, fmt.Errorf("%w: %s: adds BOS %q, which is not in its vocabulary", ErrBadSpec, spec, tok.BOSToken())
		}
		m.BOS = []uint32{id}
		m.Describe += ", adds BOS"
	}
	if prefixCacheBytes > 0 {
		cache := tokenizer.NewPrefixCache(prefixCacheBytes)
		m.EncodeChat = func(text string) []uint32 { return tok.EncodeCached(cache, text) }
		m.turns = newTurnEncoder(tok, cache, ct)
	}
	return m, nil
}

func orEmptyObject(b []byte) []byte {
	if b == nil {
		return []byte("{}")
	}
	return b
}

// chatTemplate renders an Input with a chat.Template, its messages and
// tools rebuilt as vLLM hands them to templates (chat.VLLMMessages,
// chat.VLLMTools: the keys vLLM keeps, in its order; content as a string or
// as parts by the template's content format, which vLLM detects the same
// way).
type chatTemplate struct {
	t             *chat.Template
	vars          map[string]any
	openAIContent bool
	// builtinChatML is set when t is chat.ChatML(), which plain chats
	// skip (see renderChatML).
	builtinChatML bool
	// llama3BOS is the bos_token when t is Meta Llama 3's template, which
	// plain chats skip too (see renderLlama3); nil otherwise.
	llama3BOS *string
}

func (c *chatTemplate) Render(in *Input) (string, error) {
	out, ok := c.renderChatML(in)
	if !ok {
		out, ok = c.renderLlama3(in)
	}
	if !ok {
		var err error
		if out, err = c.renderJinja(in); err != nil {
			return "", err
		}
	}
	if in.ContinueFinalMessage && len(in.Messages) > 0 {
		// As transformers does: cut the rendering right after the final
		// message's content, so the model continues it.
		final := strings.TrimSpace(in.Messages[len(in.Messages)-1].Content)
		if i := strings.LastIndex(out, final); final != "" && i >= 0 {
			out = out[:i+len(final)]
		}
	}
	return out, nil
}

// renderChatML writes what the built-in ChatML template renders for a chat
// of plain messages (role and string content only, no tools, no kwargs):
// building the template's values and running the Jinja evaluator was a
// third of a long chat's routing cost, for a template this simple.
// TestBuiltinChatMLFastPathRendersAsTheTemplate holds the two equal.
func (c *chatTemplate) renderChatML(in *Input) (string, bool) {
	if !c.builtinChatML || !plainChat(in) {
		return "", false
	}
	n := len(chatMLGeneration)
	for i := range in.Messages {
		m := &in.Messages[i]
		n += len("<|im_start|>\n<|im_end|>\n") + len(m.Role) + len(m.Content)
	}
	b := make([]byte, 0, n)
	for i := range in.Messages {
		b = appendChatMLTurn(b, &in.Messages[i])
	}
	if in.AddGenerationPrompt {
		b = append(b, chatMLGeneration...)
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), true
}

// chatMLGeneration is ChatML's generation prompt.
const chatMLGeneration = "<|im_start|>assistant\n"

// appendChatMLTurn appends message m as ChatML renders it:
// <|im_start|>role\ncontent<|im_end|>\n.
func appendChatMLTurn(b []byte, m *Message) []byte {
	b = append(b, "<|im_start|>"...)
	b = append(b, m.Role...)
	b = append(b, '\n')
	b = append(b, m.Content...)
	return append(b, "<|im_end|>\n"...)
}

// plainChat reports whether in is a chat the fast paths render: plain
// messages (role and string content only), no tools, no kwargs.
func plainChat(in *Input) bool {
	if in.Tools != nil || in.Kwargs != nil {
		return false
	}
	for i := range in.Messages {
		m := &in.Messages[i]
		if !m.plain || m.NullContent || m.Parts != nil {
			return false
		}
	}
	return true
}

// llama3Source is Meta Llama 3's chat template (Meta-Llama-3-8B-Instruct
// and -70B-Instruct), byte for byte as their tokenizer_config.json ship it.
const llama3Source = "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"

// renderLlama3 writes what llama3Source renders for a chat of plain
// messages (role and string content, no tools, no kwargs): bos_token, then
// every message as a header, its content trimmed as Jinja's trim does, and
// <|eot_id|>; the generation prompt's header last. Like renderChatML it
// saves the Jinja evaluator, two fifths of a long chat's routing CPU.
// TestLlama3FastPathRendersAsTheTemplate holds the two equal.
func (c *chatTemplate) renderLlama3(in *Input) (string, bool) {
	if c.llama3BOS == nil || !plainChat(in) {
		return "", false
	}
	n := len(*c.llama3BOS) + len(llama3Generation)
	for i := range in.Messages {
		m := &in.Messages[i]
		n += len(llama3Header) + len(m.Role) + len(llama3HeaderEnd) + len(m.Content) + len(llama3EOT)
	}
	b := make([]byte, 0, n)
	for i := range in.Messages {
		b = c.appendLlama3Turn(b, i, &in.Messages[i])
	}
	if in.AddGenerationPrompt {
		b = append(b, llama3Generation...)
	}
	return unsafe.String(unsafe.SliceData(b), len(b)), true
}

// Llama 3's markers, and its generation prompt.
const (
	llama3Header     = "<|start_header_id|>"
	llama3HeaderEnd  = "<|end_header_id|>\n\n"
	llama3EOT        = "<|eot_id|>"
	llama3Generation = llama3Header + "assistant" + llama3HeaderEnd
)

// appendLlama3Turn appends message i as llama3Source renders it: the
// bos_token before the first, a header, the content trimmed as Jinja's
// trim does, and <|eot_id|>.
func (c *chatTemplate) appendLlama3Turn(b []byte, i int, m *Message) []byte {
	if i == 0 {
		b = append(b, *c.llama3BOS...)
	}
	b = append(b, llama3Header...)
	b = append(b, m.Role...)
	b = append(b, llama3HeaderEnd...)
	b = append(b, chat.Trim(m.Content)...)
	return append(b, llama3EOT...)
}

func (c *chatTemplate) renderJinja(in *Input) (string, error) {
	msgs := make([]any, len(in.Messages))
	for i := range in.Messages {
		v, err := c.message(&in.Messages[i])
		if err != nil {
			return "", fmt.Errorf("messages[%d]: %w", i, err)
		}
		msgs[i] = v
	}
	format := chat.ContentString
	if c.openAIContent {
		format = chat.ContentOpenAI
	}
	msgs = chat.VLLMMessages(msgs, format)
	var tools []any
	if in.Tools != nil {
		tools = make([]any, len(in.Tools))
		for i, t := range in.Tools {
			v, err := chat.DecodeJSON(t)
			if err != nil {
				return "", fmt.Errorf("tools[%d]: %w", i, err)
			}
			tools[i] = v
		}
		tools = chat.VLLMTools(tools)
	}
	var kwargs map[string]any
	if in.Kwargs != nil {
		v, err := chat.DecodeJSON(in.Kwargs)
		if err != nil {
			return "", fmt.Errorf("chat_template_kwargs: %w", err)
		}
		obj, _ := v.(chat.Object)
		kwargs = make(map[string]any, len(obj))
		for _, m := range obj {
			kwargs[m.Key] = m.Value
		}
	}
	return c.t.Render(chat.Input{Messages: msgs, Tools: tools, AddGenerationPrompt: in.AddGenerationPrompt, Vars: c.vars, Kwargs: kwargs})
}

// message is one message as the template sees it: the client's object in
// its key order, with content replaced by the text the router hashes (a
// string, or text parts for templates that iterate over content).
func (c *chatTemplate) message(m *Message) (chat.Object, error) {
	var obj chat.Object
	switch {
	case m.plain && m.roleFirst:
		obj = chat.Object{{Key: "role", Value: m.Role}, {Key: "content"}}
	case m.plain:
		obj = chat.Object{{Key: "content"}, {Key: "role", Value: m.Role}}
	default:
		v, err := chat.DecodeJSON(m.Raw)
		if err != nil {
			return nil, err
		}
		var ok bool
		if obj, ok = v.(chat.Object); !ok {
			return nil, errors.New("not an object")
		}
	}
	// Non-text parts are already placeholders in m.Content / m.Parts, so
	// the content handed on is text only; VLLMMessages shapes it (and a
	// null one) for the content format.
	var content any = m.Content
	switch {
	case m.NullContent:
		content = nil
	case c.openAIContent:
		texts := m.Parts
		if texts == nil {
			texts = []string{m.Content}
		}
		parts := make([]any, len(texts))
		for i, t := range texts {
			parts[i] = chat.Object{{Key: "type", Value: "text"}, {Key: "text", Value: t}}
		}
		content = parts
	}
	for i := range obj {
		if obj[i].Key == "content" {
			obj[i].Value = content
			return obj, nil
		}
	}
	return append(obj, chat.Member{Key: "content", Value: content}), nil
}
