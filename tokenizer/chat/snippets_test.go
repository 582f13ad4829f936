package chat

import (
	"errors"
	"testing"
	"time"
)

// snippets exercise one behaviour of transformers' environment each:
// whitespace control, printing, string escapes, tojson's options, the
// filters Switchyard overrides, strftime_now. Each renders against the
// same variables in Go and in python3-jinja2.
var snippets = []struct{ name, src string }{
	{"trim-marker-after-expression", "Effort: {{ x }}{%- if true %} y{% endif %}|"},
	{"lstrip-and-trim-blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc\n"},
	{"lstrip-at-template-start", "   {% if true %}x{% endif %}"},
	{"plus-markers-opt-out", "a\n  {%+ if true +%}\nb{% endif %}"},
	{"indented-expression-is-not-stripped", "a\n    {{ x }}\n  {#- c #}\nd"},
	{"comment-lstrip-and-trim", "a\n  {# note #}\nb"},
	{"raw-block", "{% raw %}{{ not evaluated }}{% endraw %}\n{%- raw -%}  x  {%- endraw %}|"},
	{"trailing-newline-dropped", "x\n"},
	{"crlf-newlines", "a\r\n{% if true %}\r\nb\r\n{% endif %}"},
	{"print-none-bool-float", "{{ none }} {{ true }} {{ 1.0 }} {{ 1234567.5 }} {{ 0.0001 }} {{ v.a }} {{ 3 / 2 }} {{ 7 // 2 }}"},
	{"print-containers", "{{ [1, 'a', none, 1.5, true] }} {{ {'k': \"it's\", 'n': {'m': []}} }} {{ ['x\\ny'] }}"},
	{"string-escapes", "{{ '\\u00e9\\x41\\t\\\\' }}|{{ \"a'b\" }}|{{ 'a\\'b' }}"},
	{"tojson-default", "{{ v | tojson }}"},
	{"tojson-indent", "{{ v | tojson(indent=2) }}"},
	{"tojson-indent-string", "{{ v | tojson(indent='\\t') }}"},
	{"tojson-separators", "{{ v | tojson(separators=(',', ':')) }}"},
	{"tojson-sort-keys", "{{ v | tojson(sort_keys=true) }}"},
	{"tojson-ensure-ascii", "{{ v | tojson(ensure_ascii=true) }}"},
	{"tojson-empty-containers-indented", "{{ {'a': [], 'b': {}} | tojson(indent=4) }}"},
	{"tojson-strings-python-does-not-escape", "{{ '<a href=\"x\">&</a> \\u2028 é \\x7f' | tojson }}"},
	{"sort-by-attribute", "{{ items | sort(attribute='type') | map(attribute='type') | join(',') }}"},
	{"sort-case-insensitive-and-reverse", "{{ ['b', 'A', 'c'] | sort | join(',') }} {{ [3, 1, 2] | sort(reverse=true) | join(',') }}"},
	{"length-counts-code-points", "{{ 'héllo😀' | length }} {{ v | length }} {{ undefined_thing | length }}"},
	{"trim-none-and-chars", "[{{ none | trim }}] [{{ 'xxhixx' | trim('x') }}] [{{ '  pad  ' | trim }}]"},
	{"string-filter", "{{ none | string }} {{ [1] | string }} {{ 1.5 | string }}"},
	{"namespace-and-loop-controls", "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}{{ ns.n }}"},
	{"string-methods", "{{ '  Hi There  '.strip().lower().split(' ') }} {{ 'abc'.startswith('a') }} {{ 'abc'.endswith('bc') }} {{ 'a-b'.replace('-', '+') }} {{ 'hello world'.title() }} {{ 'X'.upper() }} {{ 'xxa'.lstrip('x') }} {{ 'axx'.rstrip('x') }}"},
	{"dict-methods", "{% for k, val in v.items() %}{{ k }}={{ val }};{% endfor %} {{ v.get('missing', 'dflt') }} {{ v.keys() | list }}"},
	{"strftime-now", "{{ strftime_now('%d %b %Y') }} {{ strftime_now('%A %B %-d %H:%M:%S %j %y %p %I') }} {{ strftime_now('%Y-%m-%d') }}"},
	{"generation-tag", "{% generation %}gen{% endgeneration %}"},
	{"raise-exception", "{{ raise_exception('no ' ~ x) }}"},
	{"recursive-macro", "{% macro walk(v) %}{% if v is mapping %}{% for k, x in v.items() %}{{ k }}:{{ walk(x) }};{% endfor %}{% else %}{{ v }}{% endif %}{% endmacro %}{{ walk(v) }}"},
	{"unbounded-recursion-fails", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"},
	{"add-numbers-strings-lists", "{{ 1 + 2 }} {{ 1 + 2.5 }} {{ 'a' + 'b' }} {{ [1] + [2] }} {{ true + 1 }} {{ -1 + +2 }} {{ 2 ** 3 + 7 // 2 - 1 }}"},
	{"in-operator", "{{ 'a' in 'cat' }} {{ 2 in [1, 2.0] }} {{ 'k' in {'k': 1} }} {{ 'x' not in ['y'] }} {{ not 1 in v.a }} {{ 'q' in nothing }}"},
	{"string-plus-list-is-an-error", "{{ 'a' + [1] }}"},
	{"string-plus-none-is-an-error", "{{ 'a' + none }}"},
	{"for-over-none-is-an-error", "{% for x in none %}x{% endfor %}"},
	{"in-none-is-an-error", "{{ 'a' in none }}"},
	{"for-with-condition-and-else", "{% for x in [1, 2, 3] if x > 1 %}{{ x }}{% else %}empty{% endfor %}{% for x in [] %}{% else %}none{% endfor %}{% for k, val in v | items if k != 'a' %}{{ k }}{{ loop.index }}/{{ loop.length }}{% endfor %}"},
	{"conditional-and-tuple", "{{ 'y' if 1 + 1 == 2 else 'n' }} {{ (1, 2) | length }} {{ ('a' ~ 'b') if v else 'c' }}"},
	{"tests-with-arguments", "{{ 3 is divisibleby 3 }} {{ 7 is not divisibleby(2) }} {{ v.z is sameas 1 }} {{ v.z is eq 1 }} {{ v is mapping and v.a is not string }} {{ x is string }}"},
	{"list-append-is-refused", "{% set l = [1] %}{% set _ = l.append(2) %}{{ l }}"},
	{"dict-update-is-refused", "{% set d = {'a': 1} %}{{ d.update({'b': 2}) }}"},
	{"namespace-attribute-set-is-allowed", "{% set ns = namespace(items=[]) %}{% set ns.items = ns.items + [1] %}{{ ns.items }}"},
	{"number-literals", "{{ 1e5 }} {{ 2.5E-3 }} {{ 1_000 + 1 }} {{ 1e5 | int }}"},
	{"strip-methods-use-python-whitespace", "[{{ ' \\u2028\\x0b\\xa0x\\x1c\\u3000 '.rstrip() }}] [{{ '\\u2028 x \\x0c'.lstrip() }}] [{{ '\\x1fx\\u2029'.strip() }}] [{{ 'xxaxx'.strip('x') }}] [{{ '--a'.lstrip('-') }}] [{{ 'a  '.rstrip(none) }}] [{{ ' \\u2028y ' | trim }}]"},
	{"strip-on-none-fails", "{{ none.strip() }}"},
	{"tilde-and-join-print-as-str", "{{ 'a' ~ none ~ 1.0 ~ [1] ~ true }} {{ [1, none, 'x', 2.5] | join(',') }} {{ items | join('|', attribute='type') }} {{ 'abc' | join('-') }} {{ v | join }}"},
	{"undefined-prints-empty", "[{{ nothing }}] [{{ v.nothing }}]"},
}

const snippetVar = `{"z": 1, "é": "ü 😀", "a": [1, 2.5, 1.0, 1e16, 1234567.5, -0.0001, true, null, "x\"y\\z\n\u0001"], "m": {}}`

const snippetTree = `[{"name": "a", "kids": [{"name": "b", "kids": [{"name": "c", "kids": []}]}, {"name": "d"}]}, {"name": "e"}]`

// TestSnippetsRenderAsPythonJinja2 checks each behaviour in isolation,
// against python3-jinja2 in transformers' environment.
func TestSnippetsRenderAsPythonJinja2(t *testing.T) {
	v, err := DecodeJSON([]byte(snippetVar))
	if err != nil {
		t.Fatal(err)
	}
	tree := decodeList(t, snippetTree)
	items := decodeList(t, `[{"type": "text"}, {"type": "image_url"}, {"type": "audio"}]`)
	kwargs := `{"x": "max", "v": ` + snippetVar + `, "items": [{"type": "text"}, {"type": "image_url"}, {"type": "audio"}], "tree": ` + snippetTree + `}`
	cases := make([]pyCase, len(snippets))
	for i, s := range snippets {
		cases[i] = pyCase{ID: s.name, Template: s.src, Messages: []byte("[]"), Kwargs: []byte(kwargs), Now: fixedNowISO}
	}
	results := renderPython(t, cases)
	for i, s := range snippets {
		want := results[i]
		tmpl, err := ParseNamed(s.name, s.src)
		if err != nil {
			t.Errorf("%s: parse: %v", s.name, err)
			continue
		}
		got, err := tmpl.Render(Input{
			Kwargs: map[string]any{"x": "max", "v": v, "items": items, "tree": tree},
			Now:    func() time.Time { return fixedNow },
		})
		switch {
		case want.OK && err != nil:
			t.Errorf("%s: python rendered %q, Go failed: %v", s.name, want.Text, err)
		case want.OK && got != want.Text:
			t.Errorf("%s:\n  go:     %q\n  python: %q", s.name, got, want.Text)
		case !want.OK && want.Raised:
			var re *RaisedError
			if !errors.As(err, &re) || re.Message != want.Error {
				t.Errorf("%s: python raised %q, Go: %v", s.name, want.Error, err)
			}
		case !want.OK && err == nil:
			t.Errorf("%s: python failed (%s), Go rendered %q", s.name, want.Error, got)
		}
	}
}
