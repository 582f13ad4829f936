#!/usr/bin/python3
"""Reference chat-template renderer for Switchyard's differential tests.

Renders chat templates the way Hugging Face transformers' apply_chat_template
does (and therefore the way vLLM and SGLang do), using Debian's python3-jinja2.
Run it with /usr/bin/python3 (the pyenv python on PATH lacks jinja2).

stdin:  a JSON array of cases, each
          {"id": str, "template": str, "messages": [...], "tools": [...] | null,
           "add_generation_prompt": bool, "vars": {...}, "kwargs": {...},
           "now": "YYYY-MM-DDTHH:MM:SS" | null, "vllm_postprocess": bool}
stdout: a JSON array, one result per case in input order, each
          {"id": str, "ok": true, "text": str} or
          {"id": str, "ok": false, "raised": bool, "error": str}
        where raised is true when the template called raise_exception(msg)
        (error is then msg) and false for any other failure of the template.

The environment mirrors transformers' _compile_jinja_template
(src/transformers/utils/chat_template_utils.py): ImmutableSandboxedEnvironment
with trim_blocks, lstrip_blocks and the loopcontrols extension, its own tojson
filter (json.dumps with ensure_ascii=False and the indent, separators and
sort_keys arguments exposed), and the raise_exception and strftime_now globals.
Render arguments follow render_jinja_template: messages, tools, documents=None,
add_generation_prompt, then the special tokens and extra kwargs. The generation
tag extension (AssistantTracker) only matters for assistant masks, so it is
reproduced as a tag that renders its body unchanged.

vllm_postprocess applies what vLLM's chat_utils._postprocess_messages does
before rendering: an assistant message's tool_calls[*].function.arguments given
as a JSON string is parsed into an object (invalid JSON or a non-container
becomes {}), and an empty tool_calls list is dropped.
"""

import json
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment


class RaisedByTemplate(jinja2.exceptions.TemplateError):
    """What raise_exception throws, so it can be told apart from other errors."""


class GenerationTag(jinja2.ext.Extension):
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def raise_exception(message):
    raise RaisedByTemplate(message)


def make_env(now):
    def strftime_now(fmt):
        return now.strftime(fmt)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def vllm_postprocess(messages):
    for message in messages:
        if not isinstance(message, dict):
            continue
        if message.get("role") != "assistant" or "tool_calls" not in message:
            continue
        calls = message.get("tool_calls")
        if not isinstance(calls, list):
            continue
        if len(calls) == 0:
            message.pop("tool_calls", None)
            continue
        for call in calls:
            fn = call.get("function") if isinstance(call, dict) else None
            if not isinstance(fn, dict):
                continue
            args = fn.get("arguments")
            if isinstance(args, str):
                try:
                    fn["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    fn["arguments"] = {}
            elif not isinstance(args, (dict, list)):
                fn["arguments"] = {}


_compiled = {}


def compile_template(source, now):
    # Compiling is most of the cost; transformers caches it too (lru_cache).
    key = (source, now)
    if key not in _compiled:
        _compiled[key] = make_env(now).from_string(source)
    return _compiled[key]


def render(case):
    now = datetime.fromisoformat(case["now"]) if case.get("now") else datetime.now()
    messages = case.get("messages")
    if case.get("vllm_postprocess", True) and isinstance(messages, list):
        vllm_postprocess(messages)
    try:
        template = compile_template(case["template"], now)
    except jinja2.exceptions.TemplateSyntaxError as e:
        return {"ok": False, "raised": False, "error": "syntax: %s" % e}
    kwargs = {}
    kwargs.update(case.get("vars") or {})
    kwargs.update(case.get("kwargs") or {})
    for reserved in ("messages", "tools", "documents", "add_generation_prompt"):
        kwargs.pop(reserved, None)
    try:
        text = template.render(
            messages=messages,
            tools=case.get("tools"),
            documents=None,
            add_generation_prompt=bool(case.get("add_generation_prompt")),
            **kwargs,
        )
    except RaisedByTemplate as e:
        return {"ok": False, "raised": True, "error": str(e)}
    except Exception as e:  # the template rejected the input some other way
        return {"ok": False, "raised": False, "error": "%s: %s" % (type(e).__name__, e)}
    return {"ok": True, "text": text}


def main():
    cases = json.load(sys.stdin)
    out = []
    for case in cases:
        result = render(case)
        result["id"] = case.get("id")
        out.append(result)
    json.dump(out, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
