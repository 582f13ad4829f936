package prompt

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// Kind is the OpenAI operation whose prompt an Input carries.
type Kind uint8

// The request kinds.
const (
	// KindCompletion is /v1/completions: a prompt string, token ids, or a
	// batch of either.
	KindCompletion Kind = iota + 1
	// KindChat is /v1/chat/completions: messages rendered with the model's
	// chat template.
	KindChat
	// KindEmbedding is /v1/embeddings: input like a completion's prompt, or
	// messages like a chat.
	KindEmbedding
	// KindResponse is /v1/responses: input as a string or a list of items,
	// rendered like a chat.
	KindResponse
)

func (k Kind) String() string {
	switch k {
	case KindCompletion:
		return "completion"
	case KindChat:
		return "chat"
	case KindEmbedding:
		return "embedding"
	case KindResponse:
		return "response"
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Fields are the prompt-bearing fields of a request body, as the client sent
// them. The caller decodes the body once and hands the raw fields over.
type Fields struct {
	Prompt       json.RawMessage `json:"prompt"`
	Messages     json.RawMessage `json:"messages"`
	Input        json.RawMessage `json:"input"`
	Instructions json.RawMessage `json:"instructions"`
	Tools        json.RawMessage `json:"tools"`
	// AddGenerationPrompt is vLLM's extension (default true for chats).
	AddGenerationPrompt *bool `json:"add_generation_prompt"`
	// ContinueFinalMessage is vLLM's extension (default false).
	ContinueFinalMessage bool `json:"continue_final_message"`
	// ChatTemplateKwargs are extra template variables (vLLM's extension).
	ChatTemplateKwargs json.RawMessage `json:"chat_template_kwargs"`
	// AddSpecialTokens is vLLM's extension for text prompts (default true:
	// the tokenizer's BOS is prepended when it adds one).
	AddSpecialTokens *bool `json:"add_special_tokens"`
	// Validated is set by a caller that has validated the document the raw
	// fields were taken from, whole, as JSON (ScanObject's or
	// encoding/json's check) and as UTF-8. Parse then reads the messages'
	// structure without validating their bytes again (the body's one
	// validating pass is the caller's). Set on anything else, Parse's
	// result is unspecified (it still returns errors, not panics).
	Validated bool `json:"-"`
}

// Input is a request's prompt after parsing: the texts or token ids to
// tokenize, or the messages to render. It is immutable once parsed.
type Input struct {
	Kind Kind
	// Prompts are the text or token-id prompts of completions and
	// embeddings, one per batched prompt (at least one).
	Prompts []Prompt
	// Messages are the chat's messages (chats, responses, embeddings in
	// the chat form); empty for text prompts.
	Messages []Message
	// Tools are the request's tool definitions, each as the client sent it.
	Tools []json.RawMessage
	// AddGenerationPrompt and ContinueFinalMessage steer the template.
	AddGenerationPrompt  bool
	ContinueFinalMessage bool
	// Kwargs is chat_template_kwargs as sent (nil when absent).
	Kwargs json.RawMessage
	// AddSpecial says whether text prompts get the tokenizer's BOS.
	AddSpecial bool

	// parts are the prompt-bearing fields as sent (Fields' raw values),
	// which key hashes for the engine-tokenization cache: only requests
	// that reach an engine pay for hashing them.
	parts [6]json.RawMessage
	// rawMessages is the client's messages array (for the engine fallback
	// of chats); nil when the messages were converted (responses).
	rawMessages json.RawMessage
	rawTools    json.RawMessage
}

// IsChat reports whether the input is rendered with a chat template.
func (in *Input) IsChat() bool { return len(in.Messages) > 0 }

// Prompt is one completion prompt: text, or token ids used as they are.
type Prompt struct {
	Text string
	IDs  []uint32
	// IsIDs is set for token-id prompts.
	IsIDs bool
}

// Message is one chat message. Content is what the template sees as the
// message's content: text parts joined as vLLM joins them ("\n"), every
// non-text part replaced by a placeholder derived from its content hash.
type Message struct {
	Role    string
	Content string
	// NullContent is set when the client sent no content (an assistant
	// turn that only calls tools).
	NullContent bool
	// Parts are the content's parts as text (placeholders for non-text
	// parts) when the content was an array; nil for string content. A
	// template that iterates over content gets them as text parts.
	Parts []string
	// Raw is the client's message object (tool_calls, name, tool_call_id
	// and any other key the template may read).
	Raw json.RawMessage
	// plain is set when Raw holds role and content only; roleFirst says
	// which came first. A template then gets the message without decoding
	// Raw again, most of a long conversation's rendering cost (vLLM
	// rebuilds messages as role then content anyway).
	plain, roleFirst bool
}

// Parse validates the prompt part of a request of kind k and returns it.
// Errors are *RequestError (wrapping ErrBadRequest) naming the field. The
// Input's strings and raw values may alias f's bytes (the request body),
// which must not change while the Input is in use.
func Parse(k Kind, f *Fields) (*Input, error) {
	in := &Input{Kind: k, AddSpecial: true, AddGenerationPrompt: true, ContinueFinalMessage: f.ContinueFinalMessage}
	if f.AddSpecialTokens != nil {
		in.AddSpecial = *f.AddSpecialTokens
	}
	if f.AddGenerationPrompt != nil {
		in.AddGenerationPrompt = *f.AddGenerationPrompt
	}
	if k == KindEmbedding && f.AddGenerationPrompt == nil {
		in.AddGenerationPrompt = false // vLLM's embedding chat form defaults to false
	}
	if in.AddGenerationPrompt && in.ContinueFinalMessage {
		return nil, badField("continue_final_message", "invalid_value", "continue_final_message and add_generation_prompt cannot both be true")
	}
	if !isNull(f.ChatTemplateKwargs) {
		kw := bytes.TrimSpace(f.ChatTemplateKwargs)
		if kw[0] != '{' {
			return nil, badField("chat_template_kwargs", "invalid_type", "chat_template_kwargs must be an object")
		}
		in.Kwargs = kw
	}
	var err error
	switch k {
	case KindCompletion:
		in.Prompts, err = parsePrompts(f.Prompt, "prompt")
	case KindChat:
		err = in.parseChat(f)
	case KindEmbedding:
		if !isNull(f.Messages) {
			err = in.parseChat(f)
		} else {
			in.Prompts, err = parsePrompts(f.Input, "input")
		}
	case KindResponse:
		err = in.parseResponse(f)
	default:
		return nil, fmt.Errorf("%w: unknown kind %d", ErrBadRequest, k)
	}
	if err != nil {
		return nil, err
	}
	in.parts = [6]json.RawMessage{f.Prompt, f.Messages, f.Input, f.Instructions, f.Tools, f.ChatTemplateKwargs}
	return in, nil
}

func (in *Input) parseChat(f *Fields) error {
	if isNull(f.Messages) {
		return badField("messages", "missing_required_parameter", "you must provide messages")
	}
	if msgs, ok := scanMessages(f.Messages, f.Validated); ok {
		in.Messages = msgs
	} else if err := in.parseMessages(f.Messages); err != nil {
		return err
	}
	if err := in.parseTools(f.Tools, f.Validated); err != nil {
		return err
	}
	in.rawMessages = f.Messages
	return nil
}

// parseMessages is parseChat's path for what scanMessages does not vouch
// for: the array is split first, then every message parsed on its own, and
// anything malformed gets the error naming it.
func (in *Input) parseMessages(raw json.RawMessage) error {
	raws, ok := ScanArray(raw, nil)
	if !ok {
		raws = raws[:0]
		if err := json.Unmarshal(raw, &raws); err != nil {
			return badField("messages", "invalid_type", "messages must be an array of message objects")
		}
	}
	if len(raws) == 0 {
		return badField("messages", "invalid_value", "messages must not be empty")
	}
	in.Messages = make([]Message, len(raws))
	for i, raw := range raws {
		m, err := parseMessage(raw, i)
		if err != nil {
			return err
		}
		in.Messages[i] = m
	}
	return nil
}

// scanMessages parses a messages array in one pass over its bytes, as
// parseMessages would, when every element is a message object that
// scanMessage vouches for and the array is valid JSON and not empty; ok is
// false otherwise, and the caller takes parseMessages (which then yields
// the same messages or the error). A long chat's messages were otherwise
// walked twice: once to split the array, once per message. validated says
// that doc is part of a document already validated (Fields.Validated):
// the messages are then skimmed, not scanned again.
func scanMessages(doc []byte, validated bool) ([]Message, bool) {
	// The first messages are gathered on the stack, the rest (rare) in
	// more, and the result is allocated once at their count. (Returning a
	// slice that may be the stack's would move the stack to the heap.)
	var stack [32]Message
	var more []Message
	n := 0
	i := skipWS(doc, 0)
	if i >= len(doc) || doc[i] != '[' {
		return nil, false
	}
	i = skipWS(doc, i+1)
	var buf [4]Member
	for i < len(doc) && doc[i] == '{' {
		start := i
		var end int
		var members []Member
		var ok bool
		if validated {
			end, members, ok = skimObject(doc, i, buf[:0])
		} else {
			end, members, ok = scanObject(doc, i, 0, buf[:0], nil, nil)
		}
		if !ok {
			return nil, false
		}
		m, ok := messageOf(doc[start:end], members, validated)
		if !ok {
			return nil, false
		}
		if n < len(stack) {
			stack[n] = m
		} else {
			more = append(more, m)
		}
		n++
		i = skipWS(doc, end)
		if i >= len(doc) {
			return nil, false
		}
		if doc[i] == ']' {
			if skipWS(doc, i+1) != len(doc) {
				return nil, false
			}
			msgs := make([]Message, n)
			copy(msgs[copy(msgs, stack[:min(n, len(stack))]):], more)
			return msgs, true
		}
		if doc[i] != ',' {
			return nil, false
		}
		i = skipWS(doc, i+1)
	}
	return nil, false // not an object, or an empty array
}

// messageOf is the Message of the object raw, whose members a scan has
// just returned, when it is a message with a string role that
// parseMessage would accept with its string (or null) content as scanned.
func messageOf(raw []byte, members []Member, validated bool) (Message, bool) {
	var m Message
	var content []byte
	var seenRole, contentPlain, ok bool
	for _, mb := range members {
		switch {
		case mb.Escaped:
			return Message{}, false
		case string(mb.Key) == "role":
			if seenRole || mb.Value[0] != '"' {
				return Message{}, false
			}
			seenRole = true
			if mb.PlainString {
				m.Role = roleString(mb.Value[1 : len(mb.Value)-1])
			} else if m.Role, ok = unquote(mb.Value); !ok {
				return Message{}, false
			}
		case string(mb.Key) == "content":
			if content != nil {
				return Message{}, false
			}
			content, contentPlain = mb.Value, mb.PlainString
		case FoldsTo(mb.Key, "role"), FoldsTo(mb.Key, "content"):
			return Message{}, false
		}
	}
	if m.Role == "" {
		return Message{}, false // parseMessage names the missing role
	}
	m.Raw = raw
	if first := string(members[0].Key); len(members) == 2 && (first == "role" || first == "content") {
		m.plain, m.roleFirst = true, first == "role"
	}
	switch {
	case content == nil || string(content) == "null":
		m.NullContent = true
	case contentPlain:
		if c := content[1 : len(content)-1]; len(c) > 0 {
			m.Content = unsafe.String(&c[0], len(c))
		}
	case validated && content[0] == '"':
		// An escaped string of a validated body: its escapes are all
		// there is to decode.
		text, ok := unquoteValidated(content)
		if !ok {
			return Message{}, false
		}
		m.Content = text
	default:
		// Escaped strings and parts, decoded as parseMessage decodes them;
		// an error is left to parseMessage, which names the message.
		text, parts, err := contentParts(content, "")
		if err != nil {
			return Message{}, false
		}
		m.Content, m.Parts = text, parts
	}
	return m, true
}

// roleString is role as a string, without allocating for the usual roles.
func roleString(role []byte) string {
	switch string(role) {
	case "system":
		return "system"
	case "user":
		return "user"
	case "assistant":
		return "assistant"
	case "tool":
		return "tool"
	case "developer":
		return "developer"
	}
	return string(role)
}

// parseTools reads the tools array; validated says raw is part of a
// validated document (Fields.Validated), whose array is then skimmed
// rather than validated and copied again by encoding/json.
func (in *Input) parseTools(raw json.RawMessage, validated bool) error {
	if isNull(raw) {
		return nil
	}
	var ok bool
	if validated {
		in.Tools, ok = skimArray(raw)
	}
	if !ok {
		in.Tools = nil
		if err := json.Unmarshal(raw, &in.Tools); err != nil {
			return badField("tools", "invalid_type", "tools must be an array of tool objects")
		}
	}
	for i, t := range in.Tools {
		if t = bytes.TrimSpace(t); len(t) == 0 || t[0] != '{' {
			return badField(fmt.Sprintf("tools[%d]", i), "invalid_type", "every tool must be an object")
		}
	}
	in.rawTools = raw
	return nil
}

// wireMessage is the part of a chat message the router reads.
type wireMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
	// contentPlain is set by scanMessage when Content is a string literal
	// whose text is its bytes between the quotes.
	contentPlain bool
}

// parseMessage parses messages[index]. The parameter's name is only
// formatted for an error: formatting it for every message of a long
// conversation was a sixth of parsing it.
func parseMessage(raw json.RawMessage, index int) (Message, error) {
	param := func() string { return fmt.Sprintf("messages[%d]", index) }
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		return Message{}, badField(param(), "invalid_type", "every message must be an object")
	}
	var members [4]Member
	wm, n, first, ok := scanMessage(raw, members[:0])
	if !ok {
		if err := json.Unmarshal(raw, &wm); err != nil {
			return Message{}, badField(param(), "invalid_type", "the message does not parse: "+err.Error())
		}
		n, first = topLevelMembers(raw)
	}
	if wm.Role == "" {
		return Message{}, badField(param()+".role", "missing_required_parameter", "every message needs a role")
	}
	m := Message{Role: wm.Role, Raw: raw}
	if n == 2 && (first == "role" || first == "content") {
		m.plain, m.roleFirst = true, first == "role"
	}
	if isNull(wm.Content) {
		m.NullContent = true
		return m, nil
	}
	if wm.contentPlain {
		// The scan vouched for it: the text is the bytes between the quotes.
		if c := wm.Content[1 : len(wm.Content)-1]; len(c) > 0 {
			m.Content = unsafe.String(&c[0], len(c))
		}
		return m, nil
	}
	text, parts, err := contentParts(wm.Content, param()+".content")
	if err != nil {
		return Message{}, err
	}
	m.Content, m.Parts = text, parts
	return m, nil
}

// contentPart is one element of an array content.
type contentPart struct {
	Type    string `json:"type"`
	Text    string `json:"text"`
	Refusal string `json:"refusal"`
}

// flattenContent turns a string or an array of parts into the text the
// template sees. Text parts join with "\n" as vLLM's chat_utils joins them;
// a non-text part becomes Placeholder(kind, its bytes) in its place, so the
// same image shares a prefix and a different one does not. The parts
// themselves reach the engine untouched: only hashing uses placeholders.
func flattenContent(raw json.RawMessage, param string) (string, error) {
	s, _, err := contentParts(raw, param)
	return s, err
}

// contentParts is flattenContent that also returns the parts' texts (nil
// for string content).
func contentParts(raw json.RawMessage, param string) (string, []string, error) {
	raw = bytes.TrimSpace(raw)
	switch raw[0] {
	case '"':
		s, ok := unquote(raw)
		if !ok {
			return "", nil, badField(param, "invalid_type", "content is not a valid string")
		}
		return s, nil, nil
	case '[':
		var parts []json.RawMessage
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", nil, badField(param, "invalid_type", "content must be a string or an array of content parts")
		}
		texts := make([]string, len(parts))
		for j, pr := range parts {
			var p contentPart
			if err := json.Unmarshal(pr, &p); err != nil || p.Type == "" {
				return "", nil, badField(fmt.Sprintf("%s[%d]", param, j), "invalid_type", "every content part must be an object with a type")
			}
			switch p.Type {
			case "text", "input_text", "output_text":
				texts[j] = p.Text
			case "refusal":
				texts[j] = p.Refusal
			default:
				texts[j] = Placeholder(p.Type, pr)
			}
		}
		return strings.Join(texts, "\n"), texts, nil
	}
	return "", nil, badField(param, "invalid_type", "content must be a string or an array of content parts")
}

// Placeholder is the text that stands for a non-text content part when a
// prompt is hashed: <|switchyard:KIND:HEX16|>, KIND the modality (image,
// audio, video, file, or the part's own type) and HEX16 the xxh3-64 of the
// part's JSON bytes.
func Placeholder(partType string, part []byte) string {
	kind := partType
	switch partType {
	case "image_url", "input_image", "image", "image_pil", "image_embeds":
		kind = "image"
	case "input_audio", "audio_url", "audio":
		kind = "audio"
	case "video_url", "video":
		kind = "video"
	case "file", "input_file":
		kind = "file"
	}
	var h [8]byte
	v := xxh3.Hash(part)
	for i := range h {
		h[i] = byte(v >> (56 - 8*i))
	}
	return "<|switchyard:" + sanitizeKind(kind) + ":" + hex.EncodeToString(h[:]) + "|>"
}

func sanitizeKind(s string) string {
	if len(s) > 32 {
		s = s[:32]
	}
	return strings.Map(func(r rune) rune {
		if r == '_' || r == '-' || (r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			return r
		}
		return '_'
	}, s)
}

// parsePrompts accepts a string, an array of strings, an array of token ids
// or an array of token-id arrays (OpenAI's and vLLM's prompt forms).
func parsePrompts(raw json.RawMessage, param string) ([]Prompt, error) {
	raw = bytes.TrimSpace(raw)
	if isNull(raw) {
		return nil, badField(param, "missing_required_parameter", "you must provide a "+param)
	}
	switch raw[0] {
	case '"':
		s, err := promptString(raw, param)
		if err != nil {
			return nil, err
		}
		return []Prompt{{Text: s}}, nil
	case '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return nil, badField(param, "invalid_type", param+" must be a string, an array of strings, an array of token ids or an array of token-id arrays")
		}
		if len(items) == 0 {
			return nil, badField(param, "invalid_value", param+" must not be an empty array")
		}
		first := bytes.TrimSpace(items[0])
		switch {
		case len(first) > 0 && first[0] == '"':
			out := make([]Prompt, len(items))
			for i, it := range items {
				s, err := promptString(bytes.TrimSpace(it), fmt.Sprintf("%s[%d]", param, i))
				if err != nil {
					return nil, err
				}
				out[i] = Prompt{Text: s}
			}
			return out, nil
		case len(first) > 0 && first[0] == '[':
			out := make([]Prompt, len(items))
			for i, it := range items {
				ids, err := tokenIDs(it, fmt.Sprintf("%s[%d]", param, i))
				if err != nil {
					return nil, err
				}
				out[i] = Prompt{IDs: ids, IsIDs: true}
			}
			return out, nil
		}
		ids, err := tokenIDs(raw, param)
		if err != nil {
			return nil, err
		}
		return []Prompt{{IDs: ids, IsIDs: true}}, nil
	}
	return nil, badField(param, "invalid_type", param+" must be a string, an array of strings, an array of token ids or an array of token-id arrays")
}

func promptString(raw json.RawMessage, param string) (string, error) {
	if len(raw) == 0 || raw[0] != '"' {
		return "", badField(param, "invalid_type", "every prompt of a batch must be a string")
	}
	s, ok := unquote(raw)
	if !ok {
		return "", badField(param, "invalid_type", param+" is not a valid string")
	}
	return s, nil
}

func tokenIDs(raw json.RawMessage, param string) ([]uint32, error) {
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badField(param, "invalid_type", param+" must be an array of token ids")
	}
	if len(items) == 0 {
		return nil, badField(param, "invalid_value", param+" must not be an empty array")
	}
	ids := make([]uint32, len(items))
	for i, it := range items {
		v, err := strconv.ParseInt(string(bytes.TrimSpace(it)), 10, 64)
		if err != nil || v < 0 || v > math.MaxUint32 {
			return nil, badField(fmt.Sprintf("%s[%d]", param, i), "invalid_value", "not a token id (a non-negative integer below 2^32)")
		}
		ids[i] = uint32(v)
	}
	return ids, nil
}

// responseItem is the part of a /v1/responses input item the router reads.
type responseItem struct {
	Type      string          `json:"type"`
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	CallID    string          `json:"call_id"`
	Name      string          `json:"name"`
	Arguments string          `json:"arguments"`
	Output    json.RawMessage `json:"output"`
}

// parseResponse turns /v1/responses input (a string, or a list of items)
// and instructions into chat messages. Message items keep their role and
// content; function_call items become assistant tool calls and
// function_call_output items tool messages, as vLLM's Responses API
// converts them before rendering; other items (reasoning, ...) become a
// placeholder so they still shape the prefix.
func (in *Input) parseResponse(f *Fields) error {
	if !isNull(f.Instructions) {
		s, err := promptString(bytes.TrimSpace(f.Instructions), "instructions")
		if err != nil {
			return err
		}
		in.Messages = append(in.Messages, synthMessage("system", s, nil))
	}
	raw := bytes.TrimSpace(f.Input)
	switch {
	case isNull(raw):
		return badField("input", "missing_required_parameter", "you must provide an input")
	case raw[0] == '"':
		s, err := promptString(raw, "input")
		if err != nil {
			return err
		}
		in.Messages = append(in.Messages, synthMessage("user", s, nil))
	case raw[0] == '[':
		var items []json.RawMessage
		if err := json.Unmarshal(raw, &items); err != nil {
			return badField("input", "invalid_type", "input must be a string or an array of input items")
		}
		if len(items) == 0 {
			return badField("input", "invalid_value", "input must not be empty")
		}
		for i, itRaw := range items {
			param := fmt.Sprintf("input[%d]", i)
			var it responseItem
			if err := json.Unmarshal(itRaw, &it); err != nil {
				return badField(param, "invalid_type", "every input item must be an object")
			}
			switch {
			case it.Type == "function_call":
				call := map[string]any{"id": it.CallID, "type": "function",
					"function": map[string]any{"name": it.Name, "arguments": it.Arguments}}
				in.Messages = append(in.Messages, synthMessage("assistant", "", []any{call}))
			case it.Type == "function_call_output":
				out := ""
				if !isNull(it.Output) {
					var err error
					if out, err = flattenContent(it.Output, param+".output"); err != nil {
						return err
					}
				}
				m := synthMessage("tool", out, nil)
				m.Raw = mustJSON(map[string]any{"role": "tool", "content": out, "tool_call_id": it.CallID})
				in.Messages = append(in.Messages, m)
			case it.Type == "message" || (it.Type == "" && it.Role != ""):
				if it.Role == "" {
					return badField(param+".role", "missing_required_parameter", "every message item needs a role")
				}
				text := ""
				if !isNull(it.Content) {
					var err error
					if text, err = flattenContent(it.Content, param+".content"); err != nil {
						return err
					}
				}
				in.Messages = append(in.Messages, synthMessage(it.Role, text, nil))
			case it.Type != "":
				in.Messages = append(in.Messages, synthMessage("user", Placeholder(it.Type, itRaw), nil))
			default:
				return badField(param+".type", "missing_required_parameter", "every input item needs a type or a role")
			}
		}
	default:
		return badField("input", "invalid_type", "input must be a string or an array of input items")
	}
	return in.parseTools(responseTools(f.Tools), false)
}

// responseTools converts the Responses API's flat function tools
// ({"type":"function","name",...}) to the chat form templates read
// ({"type":"function","function":{...}}); other tools (web search, ...) are
// the engine's business and do not enter the template.
func responseTools(raw json.RawMessage) json.RawMessage {
	if isNull(raw) {
		return nil
	}
	var tools []map[string]json.RawMessage
	if json.Unmarshal(raw, &tools) != nil {
		return raw // parseTools reports the error
	}
	var out []map[string]any
	for _, t := range tools {
		var typ string
		_ = json.Unmarshal(t["type"], &typ)
		if typ != "function" {
			continue
		}
		if _, nested := t["function"]; nested {
			out = append(out, map[string]any{"type": "function", "function": t["function"]})
			continue
		}
		fn := map[string]any{}
		for _, k := range []string{"name", "description", "parameters", "strict"} {
			if v, ok := t[k]; ok {
				fn[k] = v
			}
		}
		out = append(out, map[string]any{"type": "function", "function": fn})
	}
	if len(out) == 0 {
		return nil
	}
	return mustJSON(out)
}

// synthMessage is a message the router made up from another form; its Raw
// is what a chat client would have sent.
func synthMessage(role, content string, toolCalls []any) Message {
	obj := map[string]any{"role": role, "content": content}
	if toolCalls != nil {
		obj["content"] = nil
		obj["tool_calls"] = toolCalls
	}
	return Message{Role: role, Content: content, NullContent: toolCalls != nil, Raw: mustJSON(obj)}
}

func mustJSON(v any) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil { // only maps, slices and strings of our own
		panic(fmt.Sprintf("prompt: marshal own value: %v", err))
	}
	return b
}

// key hashes everything that decides the prompt's token ids except the
// model, which the cache key adds.
func (in *Input) key() uint64 {
	h := xxh3.New()
	var hdr [4]byte
	hdr[0] = byte(in.Kind)
	if in.AddGenerationPrompt {
		hdr[1] = 1
	}
	if in.ContinueFinalMessage {
		hdr[2] = 1
	}
	if in.AddSpecial {
		hdr[3] = 1
	}
	_, _ = h.Write(hdr[:])
	for _, part := range in.parts {
		var n [1]byte
		_, _ = h.Write(part)
		_, _ = h.Write(n[:])
	}
	return h.Sum64()
}

func isNull(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || bytes.Equal(raw, []byte("null"))
}

// topLevelMembers counts the members of a JSON object that json.Unmarshal
// accepted and returns its first key when that key needs no unescaping. It
// is one pass over the bytes: strings are skipped, commas at depth one
// separate members.
func topLevelMembers(obj []byte) (int, string) {
	depth, n := 0, 0
	first := ""
	for i := 0; i < len(obj); i++ {
		switch c := obj[i]; c {
		case '"':
			j := i + 1
			for j < len(obj) && obj[j] != '"' {
				if obj[j] == '\\' {
					j++
				}
				j++
			}
			if depth == 1 && n == 0 && first == "" {
				first = string(obj[i+1 : min(j, len(obj))])
				n = 1
			}
			i = j
		case '{', '[':
			depth++
		case '}', ']':
			depth--
		case ',':
			if depth == 1 {
				n++
			}
		}
	}
	return n, first
}
