package chat

import (
	"regexp"
	"sort"
	"strings"
)

// ContentFormat is how vLLM hands message content to a template, chosen
// per template (vLLM's --chat-template-content-format auto).
type ContentFormat int

const (
	// ContentString: content is one string, its text parts joined by "\n".
	ContentString ContentFormat = iota + 1
	// ContentOpenAI: content is a list of parts, {"type": "text", "text": s}
	// for text and {"type": "image"} (audio, video) for media.
	ContentOpenAI
)

func (f ContentFormat) String() string {
	switch f {
	case ContentString:
		return "string"
	case ContentOpenAI:
		return "openai"
	}
	return "unknown"
}

var (
	forTag = regexp.MustCompile(`^\s*for\s+([A-Za-z_]\w*)\s+in\s+(.+?)(?:\s+if\s+.*|\s+recursive\s*)?$`)
	setTag = regexp.MustCompile(`^\s*set\s+([A-Za-z_]\w*)\s*=\s*(.+?)\s*$`)
	// A variable or a slice of it, possibly filtered: messages, messages[1:],
	// messages | selectattr(...).
	varOrSlice = regexp.MustCompile(`^([A-Za-z_]\w*)\s*(?:\[[^\]]*:[^\]]*\])?\s*(?:\|.*)?$`)
	// An item's content, possibly sliced or filtered: m['content'],
	// m["content"], m.content.
	contentOf = regexp.MustCompile(`^([A-Za-z_]\w*)\s*(?:\[\s*['"]content['"]\s*\]|\.content\b)\s*(?:\[[^\]]*:[^\]]*\])?\s*(?:\|.*)?$`)
)

// ContentFormat detects the content format as vLLM's
// chat_utils._detect_content_format does on the template's syntax tree,
// here on its block tags: "openai" when the template loops over the content
// of a message, where a message is the target of a loop over messages (or
// over a variable set from messages, a slice of it, or a filter of it),
// "string" otherwise. vLLM detects on the template it resolved for the
// request; for a tokenizer_config with a "tool_use" variant this answers
// "openai" when either variant loops over content.
func (t *Template) ContentFormat() ContentFormat {
	if t.toolUse != nil && t.toolUse.ContentFormat() == ContentOpenAI {
		return ContentOpenAI
	}
	return DetectContentFormat(t.source)
}

// DetectContentFormat is ContentFormat for a template source.
func DetectContentFormat(source string) ContentFormat {
	var fors [][2]string
	msgsVars := map[string]bool{"messages": true}
	for _, body := range blockBodies(source) {
		if m := setTag.FindStringSubmatch(body); m != nil {
			if b := varOrSlice.FindStringSubmatch(m[2]); b != nil && msgsVars[b[1]] {
				msgsVars[m[1]] = true
			}
		}
		if m := forTag.FindStringSubmatch(body); m != nil {
			fors = append(fors, [2]string{m[1], strings.TrimSpace(m[2])})
		}
	}
	msgVars := map[string]bool{}
	for _, f := range fors {
		if b := varOrSlice.FindStringSubmatch(f[1]); b != nil && msgsVars[b[1]] {
			msgVars[f[0]] = true
		}
	}
	for _, f := range fors {
		if c := contentOf.FindStringSubmatch(f[1]); c != nil && msgVars[c[1]] {
			return ContentOpenAI
		}
	}
	return ContentString
}

// blockBodies returns the inside of every {% %} tag, markers removed.
func blockBodies(src string) []string {
	var out []string
	pos := 0
	for {
		open, kind := nextTag(src, pos)
		if open < 0 {
			return out
		}
		start := open + 2
		if start < len(src) && (src[start] == '-' || src[start] == '+') {
			start++
		}
		body, _, end, err := scanTagEnd(src, start, kind)
		if err != nil {
			return out
		}
		if kind == tagBlock {
			out = append(out, body)
		}
		pos = end
	}
}

// VLLMMessages rebuilds an OpenAI request's messages the way vLLM's
// chat_utils.parse_chat_messages does before rendering, for a template of
// the given content format:
//   - content: a string becomes one text part; null none. For
//     ContentString the text parts (text, input_text, output_text,
//     refusal, thinking) are joined with "\n" and media parts are dropped,
//     for ContentOpenAI they stay parts, {"type": "text", "text": ...} and
//     {"type": "image"|"audio"|"video"} for media (vLLM renders media
//     placeholders of the model's processor into string content, which a
//     router cannot know: such prompts differ by those placeholders);
//   - each message keeps only role, content and, by role, tool_calls,
//     reasoning (also as reasoning_content) for assistants, tool_call_id for
//     tools (whose list content becomes its texts joined by "\n" when all
//     parts are text), name, task, and tools for developers, in that order;
//   - tool-call arguments are then parsed as Render always does.
//
// Messages that are not objects are passed through unchanged.
func VLLMMessages(messages []any, format ContentFormat) []any {
	out := make([]any, len(messages))
	for i, m := range messages {
		obj, ok := asObject(m)
		if !ok {
			out[i] = m
			continue
		}
		role, _ := obj.Get("role")
		roleStr, _ := role.(string)
		content, _ := obj.Get("content")
		msg := Object{{Key: "role", Value: role}, {Key: "content", Value: vllmContent(content, format)}}
		switch roleStr {
		case "assistant":
			if tc, ok := obj.Get("tool_calls"); ok && tc != nil {
				msg = append(msg, Member{Key: "tool_calls", Value: tc})
			}
			if r, ok := obj.Get("reasoning"); ok && r != nil {
				msg = append(msg, Member{Key: "reasoning", Value: r}, Member{Key: "reasoning_content", Value: r})
			}
		case "tool":
			if id, ok := obj.Get("tool_call_id"); ok {
				msg = append(msg, Member{Key: "tool_call_id", Value: id})
			}
			if parts, ok := msg[1].Value.([]any); ok {
				msg[1].Value = toolTextContent(parts)
			}
		}
		if n, ok := obj.Get("name"); ok {
			if _, isStr := n.(string); isStr {
				msg = append(msg, Member{Key: "name", Value: n})
			}
		}
		if tk, ok := obj.Get("task"); ok {
			if _, isStr := tk.(string); isStr {
				msg = append(msg, Member{Key: "task", Value: tk})
			}
		}
		if roleStr == "developer" {
			tools, _ := obj.Get("tools")
			msg = append(msg, Member{Key: "tools", Value: tools})
		}
		out[i] = msg
	}
	return out
}

func asObject(v any) (Object, bool) {
	switch x := v.(type) {
	case Object:
		return x, true
	case map[string]any:
		keys := make([]string, 0, len(x))
		for k := range x {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		o := make(Object, 0, len(x))
		for _, k := range keys {
			o = append(o, Member{Key: k, Value: x[k]})
		}
		return o, true
	}
	return nil, false
}

var textPartTypes = map[string]bool{"text": true, "input_text": true, "output_text": true, "refusal": true, "thinking": true}

var mediaPartTypes = map[string]string{
	"image_url": "image", "input_image": "image", "image_pil": "image", "image_embeds": "image",
	"audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio",
	"video_url": "video",
}

func vllmContent(content any, format ContentFormat) any {
	var parts []any
	switch c := content.(type) {
	case nil:
	case string:
		parts = []any{Object{{Key: "type", Value: "text"}, {Key: "text", Value: c}}}
	case []any:
		parts = c
	default:
		return content
	}
	var texts []string
	var wrapped []any
	for _, p := range parts {
		if s, ok := p.(string); ok {
			texts = append(texts, s)
			wrapped = append(wrapped, Object{{Key: "type", Value: "text"}, {Key: "text", Value: s}})
			continue
		}
		obj, ok := asObject(p)
		if !ok {
			continue
		}
		typ, _ := obj.Get("type")
		ts, _ := typ.(string)
		switch {
		case textPartTypes[ts]:
			key := "text"
			if ts == "refusal" || ts == "thinking" {
				key = ts
			}
			tv, _ := obj.Get(key)
			s, ok := tv.(string)
			if !ok {
				continue
			}
			texts = append(texts, s)
			wrapped = append(wrapped, Object{{Key: "type", Value: "text"}, {Key: "text", Value: s}})
		case mediaPartTypes[ts] != "":
			wrapped = append(wrapped, Object{{Key: "type", Value: mediaPartTypes[ts]}})
		}
	}
	if format == ContentOpenAI {
		if wrapped == nil {
			wrapped = []any{}
		}
		return wrapped
	}
	return strings.Join(texts, "\n")
}

func toolTextContent(parts []any) any {
	var texts []string
	for _, p := range parts {
		obj, ok := asObject(p)
		if !ok {
			continue
		}
		typ, _ := obj.Get("type")
		if typ != "text" {
			return parts
		}
		tv, _ := obj.Get("text")
		s, _ := tv.(string)
		texts = append(texts, s)
	}
	return strings.Join(texts, "\n")
}

// VLLMTools rebuilds a request's tools the way vLLM hands them to the
// template, as pydantic's model_dump of its ChatCompletionToolsParam:
// "type" then "function", whose fields come in the model's order, name,
// description and parameters (null when absent), followed by any other
// fields in request order (the models allow extra fields). vLLM versions
// whose FunctionDefinition declares "strict" also emit "strict": null when
// it is absent; this follows the versions without it. Tools that are not
// objects, or whose function is not an object, pass through unchanged.
func VLLMTools(tools []any) []any {
	if tools == nil {
		return nil
	}
	out := make([]any, len(tools))
	for i, t := range tools {
		obj, ok := asObject(t)
		if !ok {
			out[i] = t
			continue
		}
		fnv, _ := obj.Get("function")
		fn, ok := asObject(fnv)
		if !ok {
			out[i] = t
			continue
		}
		typ, ok := obj.Get("type")
		if !ok {
			typ = "function"
		}
		nf := Object{}
		for _, k := range []string{"name", "description", "parameters"} {
			v, _ := fn.Get(k)
			nf = append(nf, Member{Key: k, Value: v})
		}
		nf = appendExtra(nf, fn, "name", "description", "parameters")
		nt := Object{{Key: "type", Value: typ}, {Key: "function", Value: nf}}
		out[i] = appendExtra(nt, obj, "type", "function")
	}
	return out
}

// appendExtra appends o's members other than known, in o's order (sorted
// when o came from a Go map).
func appendExtra(dst, o Object, known ...string) Object {
	extra := Object{}
	for _, m := range o {
		isKnown := false
		for _, k := range known {
			isKnown = isKnown || m.Key == k
		}
		if !isKnown {
			extra = append(extra, m)
		}
	}
	return append(dst, extra...)
}
