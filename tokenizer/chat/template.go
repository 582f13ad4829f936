package chat

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ardanlabs/jinja"
)

var (
	// ErrTemplate reports a template that does not parse, or a render that
	// failed for a reason other than raise_exception (an undefined method, a
	// type error, a value that cannot be passed in).
	ErrTemplate = errors.New("chat template")
	// ErrRaised reports a template that called raise_exception(msg): the
	// template rejected its input. The error is a *RaisedError carrying msg.
	ErrRaised = errors.New("chat template raised an exception")
	// ErrNoTemplate reports a tokenizer_config.json without a usable
	// chat_template (and no chat_template.jinja).
	ErrNoTemplate = errors.New("no chat template")
)

// RaisedError is what Render returns when the template calls
// raise_exception(msg). It matches ErrRaised with errors.Is.
type RaisedError struct {
	Template string
	Message  string
}

func (e *RaisedError) Error() string {
	return fmt.Sprintf("chat template %s raised: %s", e.Template, e.Message)
}

// Is makes errors.Is(err, ErrRaised) hold.
func (e *RaisedError) Is(target error) bool { return target == ErrRaised }

// Input is what transformers' apply_chat_template hands a template.
type Input struct {
	// Messages as decoded from the OpenAI request: each a map[string]any or
	// an Object (DecodeJSON's order-keeping form, needed for byte-exact
	// output where a template prints a dict). Content stays as the request
	// had it (a string or a list of parts). An assistant message's
	// tool_calls[*].function.arguments given as a JSON string is parsed into
	// an object before rendering, as vLLM does.
	Messages []any
	// Tools are the request's tool definitions; nil renders as None (no
	// tools), an empty list as an empty list, exactly as transformers.
	Tools []any
	// AddGenerationPrompt asks the template to open the assistant's turn.
	AddGenerationPrompt bool
	// Vars are the tokenizer's special tokens (bos_token, eos_token,
	// unk_token, pad_token, ...), as SpecialTokens reads them.
	Vars map[string]any
	// Kwargs are extra template variables of the request
	// (chat_template_kwargs such as enable_thinking); they win over Vars.
	Kwargs map[string]any
	// Now is strftime_now's clock; nil means time.Now. The wall-clock
	// reading is used, as Python's naive datetime.now() is.
	Now func() time.Time
}

// Template is a parsed chat template. It is immutable and safe for
// concurrent use.
type Template struct {
	name    string
	source  string
	tmpl    *jinja.Template
	toolUse *Template // tokenizer_config's "tool_use" variant, used when tools are given
}

// Parse parses a chat template's Jinja source. Its name in errors is derived
// from the source's hash; ParseNamed chooses it.
func Parse(source string) (*Template, error) {
	sum := sha256.Sum256([]byte(source))
	return ParseNamed("sha256:"+hex.EncodeToString(sum[:6]), source)
}

// ParseNamed parses a chat template and names it in errors.
func ParseNamed(name, source string) (t *Template, err error) {
	defer func() {
		if r := recover(); r != nil {
			t, err = nil, fmt.Errorf("%w %s: parse: the Jinja library panicked: %v", ErrTemplate, name, r)
		}
	}()
	pre, err := preprocess(source)
	if err != nil {
		return nil, fmt.Errorf("%w %s: parse: %w", ErrTemplate, name, err)
	}
	tmpl, err := jinja.Compile(pre)
	if err != nil {
		return nil, fmt.Errorf("%w %s: parse: %w", ErrTemplate, name, err)
	}
	return &Template{name: name, source: source, tmpl: tmpl}, nil
}

// Name is the template's name in errors.
func (t *Template) Name() string { return t.name }

// Source is the template's Jinja source as given.
func (t *Template) Source() string { return t.source }

// Render renders a chat. A template that calls raise_exception returns a
// *RaisedError (errors.Is ErrRaised); any other failure wraps ErrTemplate and
// names the template.
func (t *Template) Render(in Input) (out string, err error) {
	if in.Tools != nil && t.toolUse != nil {
		return t.toolUse.Render(in)
	}
	data, err := t.data(in)
	if err != nil {
		return "", fmt.Errorf("%w %s: render: %w", ErrTemplate, t.name, err)
	}
	defer func() {
		// The library indexes values without checking their kinds in a few
		// places (fuzzing found them); such a panic is a failed render.
		if r := recover(); r != nil {
			out, err = "", fmt.Errorf("%w %s: render: the Jinja library panicked: %v", ErrTemplate, t.name, r)
		}
	}()
	out, err = t.tmpl.RenderValues(data)
	if err != nil {
		var raised *raisedSignal
		if errors.As(err, &raised) {
			return "", &RaisedError{Template: t.name, Message: raised.msg}
		}
		return "", fmt.Errorf("%w %s: render: %w", ErrTemplate, t.name, err)
	}
	return out, nil
}

// raisedSignal travels through the library's evaluator from raise_exception
// to Render.
type raisedSignal struct{ msg string }

func (r *raisedSignal) Error() string { return r.msg }

func (t *Template) data(in Input) (map[string]jinja.Value, error) {
	data := make(map[string]jinja.Value, len(in.Vars)+len(in.Kwargs)+8)
	for _, vars := range []map[string]any{in.Vars, in.Kwargs} {
		for k, v := range vars {
			val, err := toValue(v, 0)
			if err != nil {
				return nil, fmt.Errorf("variable %s: %w", k, err)
			}
			data[k] = val
		}
	}
	msgs, err := toValue(in.Messages, 0)
	if err != nil {
		return nil, fmt.Errorf("messages: %w", err)
	}
	if in.Messages == nil {
		msgs = jinja.NewList(nil)
	}
	postprocessToolCalls(msgs)
	data["messages"] = msgs
	data["tools"] = jinja.None()
	if in.Tools != nil {
		tools, err := toValue(in.Tools, 0)
		if err != nil {
			return nil, fmt.Errorf("tools: %w", err)
		}
		data["tools"] = tools
	}
	data["documents"] = jinja.None()
	data["add_generation_prompt"] = jinja.NewBool(in.AddGenerationPrompt)
	now := in.Now
	if now == nil {
		now = time.Now
	}
	data["strftime_now"] = jinja.NewCallable("strftime_now", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		if len(args) != 1 || !args[0].IsString() {
			return jinja.Value{}, fmt.Errorf("strftime_now takes one format string")
		}
		return jinja.NewString(strftime(args[0].AsString(), now())), nil
	})
	data["raise_exception"] = jinja.NewCallable("raise_exception", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		msg := ""
		if len(args) > 0 {
			msg = pyStr(args[0])
		}
		return jinja.Value{}, &raisedSignal{msg: msg}
	})
	data[filterPrefix+"tojson"] = jinja.NewCallable("tojson", tojsonFilter)
	data[filterPrefix+"sort"] = jinja.NewCallable("sort", sortFilter)
	data[filterPrefix+"length"] = jinja.NewCallable("length", lengthFilter)
	data[filterPrefix+"count"] = jinja.NewCallable("count", lengthFilter)
	data[filterPrefix+"trim"] = jinja.NewCallable("trim", trimFilter)
	data[filterPrefix+"string"] = jinja.NewCallable("string", stringFilter)
	data["range"] = jinja.NewCallable("range", rangeGlobal)
	data[addFunc] = jinja.NewCallable("add", addOp)
	data[inFunc] = jinja.NewCallable("in", inOp)
	data[iterFunc] = jinja.NewCallable("iter", iterOp)
	data[powFunc] = jinja.NewCallable("pow", powOp)
	data[methodFunc] = jinja.NewCallable("method", methodOp)
	data[concatFunc] = jinja.NewCallable("concat", concatOp)
	data[filterPrefix+"join"] = jinja.NewCallable("join", joinFilter)
	data[unsafeFunc] = jinja.NewCallable("unsafe", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		name := ""
		if len(args) > 0 {
			name = pyStr(args[0])
		}
		return jinja.Value{}, fmt.Errorf("SecurityError: access to method %q is unsafe in the immutable sandbox", name)
	})
	depth := 0
	// enter and leave open and close a macro body; they print nothing.
	data[enterFunc] = jinja.NewCallable("enter", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		depth++
		if depth > maxRecursion {
			return jinja.Value{}, fmt.Errorf("RecursionError: macros or recursive loops nested deeper than %d", maxRecursion)
		}
		return jinja.NewString(""), nil
	})
	data[leaveFunc] = jinja.NewCallable("leave", func(args []jinja.Value, _ map[string]jinja.Value) (jinja.Value, error) {
		depth--
		return jinja.NewString(""), nil
	})
	data[printFilter] = jinja.NewCallable("print", printValue)
	return data, nil
}

// postprocessToolCalls does to the (already copied) messages what vLLM's
// chat_utils._postprocess_messages does before rendering: an assistant
// message's tool_calls[*].function.arguments that is a JSON string becomes
// the decoded value (an empty dict when it is not valid JSON), any other
// non-container becomes an empty dict, and an empty tool_calls list is
// dropped so the template takes its plain assistant path.
func postprocessToolCalls(msgs jinja.Value) {
	if !msgs.IsList() {
		return
	}
	for _, m := range msgs.AsList().Items {
		if !m.IsDict() {
			continue
		}
		d := m.AsDict()
		role, _ := d.Get("role")
		if !role.IsString() || role.AsString() != "assistant" {
			continue
		}
		calls, ok := d.Get("tool_calls")
		if !ok || !calls.IsList() {
			continue
		}
		if calls.AsList().Len() == 0 {
			deleteKey(d, "tool_calls")
			continue
		}
		for _, c := range calls.AsList().Items {
			if !c.IsDict() {
				continue
			}
			fn, ok := c.AsDict().Get("function")
			if !ok || !fn.IsDict() {
				continue
			}
			args, _ := fn.AsDict().Get("arguments")
			switch {
			case args.IsString():
				parsed := jinja.NewDict()
				if v, err := DecodeJSON([]byte(args.AsString())); err == nil {
					if pv, err := toValue(v, 0); err == nil {
						parsed = pv
					}
				}
				fn.AsDict().Set("arguments", parsed)
			case args.IsDict() || args.IsList():
			default:
				fn.AsDict().Set("arguments", jinja.NewDict())
			}
		}
	}
}

func deleteKey(d *jinja.Dict, key string) {
	if _, ok := d.Data[key]; !ok {
		return
	}
	delete(d.Data, key)
	keys := d.Keys[:0:0]
	for _, k := range d.Keys {
		if k != key {
			keys = append(keys, k)
		}
	}
	d.Keys = keys
}

// FromTokenizerConfig loads a model's chat template as transformers does: a
// chat_template.jinja file wins when present (pass its bytes, or nil), else
// tokenizer_config.json's chat_template, a string or a list of
// {name, template}. From a list the "default" template is used, and the
// "tool_use" one instead whenever Input.Tools is non-nil and it exists.
func FromTokenizerConfig(configJSON []byte, chatTemplateJinja []byte) (*Template, error) {
	if chatTemplateJinja != nil {
		return ParseNamed("chat_template.jinja", string(chatTemplateJinja))
	}
	var cfg struct {
		ChatTemplate json.RawMessage `json:"chat_template"`
	}
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrTemplate, err)
	}
	if len(cfg.ChatTemplate) == 0 || string(cfg.ChatTemplate) == "null" {
		return nil, fmt.Errorf("%w in tokenizer_config.json", ErrNoTemplate)
	}
	var single string
	if err := json.Unmarshal(cfg.ChatTemplate, &single); err == nil {
		return ParseNamed("tokenizer_config.json chat_template", single)
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(cfg.ChatTemplate, &named); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json chat_template is neither a string nor a list of {name, template}: %w", ErrTemplate, err)
	}
	sources := map[string]string{}
	for _, n := range named {
		sources[n.Name] = n.Template
	}
	def, ok := sources["default"]
	if !ok {
		return nil, fmt.Errorf("%w: tokenizer_config.json has %d named chat templates and none is \"default\"", ErrNoTemplate, len(named))
	}
	t, err := ParseNamed("tokenizer_config.json chat_template[default]", def)
	if err != nil {
		return nil, err
	}
	if tu, ok := sources["tool_use"]; ok {
		if t.toolUse, err = ParseNamed("tokenizer_config.json chat_template[tool_use]", tu); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// SpecialTokens reads the special tokens of a tokenizer_config.json the way
// transformers' special_tokens_map exposes them to templates: bos_token,
// eos_token, unk_token, sep_token, pad_token, cls_token, mask_token (each a
// string or an AddedToken object whose content is used) and
// additional_special_tokens. Absent tokens are left out (a template sees
// them undefined), null ones too.
func SpecialTokens(configJSON []byte) (map[string]any, error) {
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(configJSON, &cfg); err != nil {
		return nil, fmt.Errorf("%w: tokenizer_config.json: %w", ErrTemplate, err)
	}
	out := map[string]any{}
	for _, k := range []string{"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"} {
		raw, ok := cfg[k]
		if !ok {
			continue
		}
		if tok, ok := tokenContent(raw); ok {
			out[k] = tok
		}
	}
	if raw, ok := cfg["additional_special_tokens"]; ok {
		var list []json.RawMessage
		if err := json.Unmarshal(raw, &list); err == nil && len(list) > 0 {
			toks := make([]any, 0, len(list))
			for _, r := range list {
				if tok, ok := tokenContent(r); ok {
					toks = append(toks, tok)
				}
			}
			out["additional_special_tokens"] = toks
		}
	}
	return out, nil
}

// tokenContent reads a token given as a string or an AddedToken object;
// null and empty tokens are absent, as transformers' special_tokens_map
// keeps only set ones.
func tokenContent(raw json.RawMessage) (string, bool) {
	var s *string
	if err := json.Unmarshal(raw, &s); err == nil {
		return deref(s), s != nil && *s != ""
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if err := json.Unmarshal(raw, &obj); err == nil && obj.Content != nil && *obj.Content != "" {
		return *obj.Content, true
	}
	return "", false
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// chatMLSource is the ChatML layout (Qwen's, and transformers' old default
// template) for models that ship no template, such as tiktoken encodings.
// A content given as a list of parts contributes its text parts, in order.
const chatMLSource = `{%- for message in messages -%}
{{- '<|im_start|>' + message['role'] + '\n' -}}
{%- if message['content'] is string -%}
{{- message['content'] -}}
{%- elif message['content'] is iterable -%}
{%- for part in message['content'] -%}
{%- if part['type'] == 'text' -%}{{- part['text'] -}}{%- endif -%}
{%- endfor -%}
{%- endif -%}
{{- '<|im_end|>\n' -}}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n' -}}
{%- endif -%}`

var chatML = func() *Template {
	t, err := ParseNamed("builtin ChatML", chatMLSource)
	if err != nil {
		panic(err)
	}
	return t
}()

// ChatML returns the built-in ChatML template:
//
//	<|im_start|>{role}\n{content}<|im_end|>\n ... [<|im_start|>assistant\n]
//
// for models without a chat template of their own (tiktoken encodings).
func ChatML() *Template { return chatML }

// ChatMLSource is the Jinja source of ChatML, for documentation and for
// rendering it elsewhere.
func ChatMLSource() string { return chatMLSource }
