// Package chat renders a model's Jinja chat template the way Hugging Face
// transformers' apply_chat_template does, and with it vLLM and SGLang, so
// the router's prompt text (and so its token ids and KV prefix hashes) is
// the engine's, byte for byte.
//
// # API
//
// [Parse] or [ParseNamed] compile a template; [FromTokenizerConfig] takes a
// model directory's tokenizer_config.json and chat_template.jinja;
// [SpecialTokens] reads bos_token, eos_token and the other special tokens
// for [Input.Vars]; [ChatML] is a built-in template for models without one
// (tiktoken encodings). [Template.Render] renders an [Input]: messages,
// tools, add_generation_prompt, special tokens, extra template kwargs
// (enable_thinking, ...) and the clock of strftime_now. A template that
// calls raise_exception(msg) fails with a *[RaisedError] (errors.Is
// [ErrRaised]); any other failure wraps [ErrTemplate] and names the
// template. [DecodeJSON] decodes request JSON keeping object key order and
// int/float, as Python's json.loads does; plain map[string]any values work
// too, with their keys sorted.
//
// Templates are immutable after parsing and safe for concurrent use; Render
// keeps no state between calls and never modifies its Input.
//
// # Library
//
// The Jinja engine is github.com/ardanlabs/jinja v1.8.0 (newer versions
// need Go 1.27), chosen over github.com/nikolalohinski/gonja/v2 v2.9.1
// after rendering the 17 templates of ardanlabs' testdata over its 17
// sample requests with both, out of the box, against python3-jinja2: jinja
// matched on 200 of the 265 renderings Python completed, gonja on 112
// (gonja could not parse Kimi-K3, LFM2.5, Mistral-Medium-3.5 or gpt-oss,
// nor laguna and rnj-1, which use the generation tag; it also pulls in
// logrus and json-iterator). jinja is built for chat templates, has no
// dependencies and exposes ordered dicts, which byte-exact tojson needs.
//
// # Transformers' behaviour reproduced
//
// transformers compiles templates in ImmutableSandboxedEnvironment with
// trim_blocks, lstrip_blocks and the loopcontrols extension, replaces tojson
// with json.dumps(x, ensure_ascii=False, indent=None, separators=None,
// sort_keys=False), and adds raise_exception and strftime_now; it renders
// with messages, tools, documents=None, add_generation_prompt and the
// special tokens and kwargs. Where the library differs, this package
// corrects it through the library's own extension points: render variables
// (globals, and filters under names the library does not define) and a
// preprocessing of the source (preprocess.go) that
//   - applies Jinja2's lexer whitespace rules itself (trim_blocks,
//     lstrip_blocks, "-" and "+" markers, brackets balanced before a tag
//     ends, CRLF normalised, the final newline dropped) and hands the
//     library literal text as string expressions, because the library's own
//     trimming reaches past expressions to the wrong text;
//   - decodes string literals with Python's escapes;
//   - prints every {{ }} through Python's str() (None, floats' repr,
//     list and dict repr);
//   - renames tojson, sort (attribute=, case-insensitive), length/count
//     (code points; None is a TypeError), trim, string and join (str() of
//     None) to Python-faithful versions; range() has the sandbox's MAX_RANGE;
//   - re-parses expressions with Jinja2's grammar (expr.go) so that "+",
//     "~", "**", "in", "not in", strip/lstrip/rstrip and for-loop iterables
//     follow Python: "str" + list or None, iterating None and membership
//     in None are TypeErrors as in Python, where the library would render
//     something, and the list and dict methods the sandbox refuses
//     (append, pop, update, ...) fail the render;
//   - counts macro nesting, failing the render past 200 levels where the
//     library would overflow the Go stack (Python raises RecursionError).
//
// Before rendering, an assistant message's tool_calls[*].function.arguments
// given as a JSON string is parsed into an object (invalid JSON or a
// non-container becomes {}) and an empty tool_calls list is dropped, as
// vLLM's chat_utils._postprocess_messages does.
//
// Not reproduced (a library gap no reference template reaches): recursive
// for loops (loop(...)) are a render error. Where the library lacked a
// piece the expression rewriting adds it: a destructuring loop's condition
// ("for k, v in x if k"), the divisibleby test, exponent-form and
// underscored number literals.
//
// vLLM also rebuilds messages before rendering (content as one string or as
// typed parts, depending on the template; a fixed set of keys) and dumps
// tools through pydantic (field order, nulls). [VLLMMessages], [VLLMTools]
// and [Template.ContentFormat] reproduce that for the caller to apply; Render
// itself takes messages as apply_chat_template does.
//
// # References read
//
// transformers src/transformers/utils/chat_template_utils.py
// (_compile_jinja_template, render_jinja_template, as of 2025-2026 main);
// vLLM vllm/entrypoints/chat_utils.py (_postprocess_messages,
// _parse_chat_message_content); Jinja2 3.1 lexer and sandbox behaviour as
// observed with Debian's python3-jinja2 3.1.2. Test data is loaded from the
// module cache: github.com/ardanlabs/jinja@v1.8.0 testdata/templates and
// testdata/requests, github.com/daulet/tokenizers@v1.24.0
// test/data/meta-llama-3-8b-instruct/tokenizer_config.json.
// scripts/render_chat_template.py is the reference renderer.
package chat
