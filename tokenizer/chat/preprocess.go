package chat

import (
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The library applies whitespace control by looking for the nearest text
// segment on either side of a tag, skipping over expressions: in
// "Effort: {{ x }}{%- endif %}" the "-" strips the space after "Effort:",
// which Jinja2 keeps, and lstrip_blocks reaches past expressions the same
// way. Its string literals know fewer escapes than Python's, and a few of its
// built-in filters and its printing of values differ from Jinja2's.
//
// So Parse hands the library a template with Jinja2's lexing already done:
// preprocess applies transformers' whitespace rules (trim_blocks,
// lstrip_blocks, the "-" and "+" markers, the dropped final newline) to the
// source itself, turns every piece of literal text into a string-literal
// expression (leaving the library no text segment to trim), drops comments,
// unwraps raw blocks, rewrites string literals to escapes the library reads
// as Python would, routes every {{ }} through Python's str() and renames the
// filters that must behave as in transformers to private ones the render
// defines (the library's extension point for filters: a name it does not
// know is looked up among the render's variables).

const filterPrefix = "__switchyard_"

// overriddenFilters are library built-ins whose behaviour differs from
// transformers' environment.
var overriddenFilters = map[string]bool{
	"tojson": true,
	"sort":   true,
	"length": true,
	"count":  true,
	"trim":   true,
	"string": true,
	"join":   true,
}

const printFilter = filterPrefix + "print"

// The library recurses on the Go stack for each macro call, and a Go stack
// overflow kills the process. Python stops such a template with
// RecursionError; here every macro body counts its depth and the render
// fails past maxRecursion. (The library has no recursive for loops: loop()
// is not callable, a render error.)
const (
	enterFunc = filterPrefix + "enter"
	leaveFunc = filterPrefix + "leave"
	enterCall = "{{ " + enterFunc + "() }}"
	leaveCall = "{{ " + leaveFunc + "() }}"
)

const maxRecursion = 200

// firstWord is a block tag's keyword.
func firstWord(body string) string {
	body = strings.TrimLeft(body, " \t\n")
	e := 0
	for e < len(body) && isIdentByte(body[e]) {
		e++
	}
	return body[:e]
}

type tagKind int

const (
	tagExpr tagKind = iota + 1
	tagBlock
	tagComment
)

// preprocess rewrites a Jinja2 template source as described above.
func preprocess(src string) (string, error) {
	src = strings.ReplaceAll(src, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n") // keep_trailing_newline=False
	var out strings.Builder
	out.Grow(len(src) + len(src)/4)
	pos := 0
	for pos <= len(src) {
		open, kind := nextTag(src, pos)
		if open < 0 {
			emitText(&out, src[pos:])
			break
		}
		left := byte(0)
		bodyStart := open + 2
		if bodyStart < len(src) && (src[bodyStart] == '-' || src[bodyStart] == '+') {
			left = src[bodyStart]
			bodyStart++
		}
		body, right, end, err := scanTagEnd(src, bodyStart, kind)
		if err != nil {
			return "", err
		}
		text := applyLeft(src[pos:open], left, kind, pos == 0 || src[pos-1] == '\n')
		emitText(&out, text)

		if kind == tagBlock && strings.TrimSpace(body) == "raw" {
			// {% raw %} has no trim_blocks newline of its own; its content
			// is text up to {% endraw %}, which lexes like any block tag.
			if right == '-' {
				end = skipSpace(src, end)
			}
			eOpen, eLeft, eRight, eEnd, ok := findEndRaw(src, end)
			if !ok {
				return "", fmt.Errorf("missing end of raw directive")
			}
			emitText(&out, applyLeft(src[end:eOpen], eLeft, tagBlock, end == 0 || src[end-1] == '\n'))
			pos = applyRight(src, eEnd, eRight, tagBlock)
			continue
		}

		switch kind {
		case tagExpr:
			nb, err := rewriteBody(body)
			if err != nil {
				return "", err
			}
			nb = rewriteExpr(nb)
			out.WriteString("{{ (")
			out.WriteString(nb)
			out.WriteString(") | ")
			out.WriteString(printFilter)
			out.WriteString(" }}")
		case tagBlock:
			nb, err := rewriteBody(body)
			if err != nil {
				return "", err
			}
			nb, after := rewriteStatement(nb)
			kw := firstWord(body)
			if kw == "endmacro" {
				out.WriteString(leaveCall)
			}
			out.WriteString("{%")
			out.WriteString(nb)
			out.WriteString("%}")
			out.WriteString(after)
			if kw == "macro" {
				out.WriteString(enterCall)
			}
		}
		pos = applyRight(src, end, right, kind)
		if pos >= len(src) {
			break
		}
	}
	return out.String(), nil
}

// nextTag finds the first tag opener at or after pos.
func nextTag(src string, pos int) (int, tagKind) {
	for i := pos; i+1 < len(src); i++ {
		if src[i] != '{' {
			continue
		}
		switch src[i+1] {
		case '{':
			return i, tagExpr
		case '%':
			return i, tagBlock
		case '#':
			return i, tagComment
		}
	}
	return -1, 0
}

// scanTagEnd finds the end of the tag whose body starts at from. Strings
// inside expressions and blocks may hold the closer; comments end at the
// first "#}".
func scanTagEnd(src string, from int, kind tagKind) (body string, right byte, end int, err error) {
	closer := map[tagKind]string{tagExpr: "}}", tagBlock: "%}", tagComment: "#}"}[kind]
	var quote byte
	depth := 0 // Jinja2 ends a tag only where its brackets balance
	for j := from; j < len(src); j++ {
		c := src[j]
		if quote != 0 {
			switch c {
			case '\\':
				j++
			case quote:
				quote = 0
			}
			continue
		}
		if kind != tagComment {
			switch c {
			case '\'', '"':
				quote = c
				continue
			case '(', '[', '{':
				depth++
				continue
			case ')', ']', '}':
				if depth > 0 {
					depth--
					continue
				}
			}
		}
		if depth == 0 && strings.HasPrefix(src[j:], closer) {
			body = src[from:j]
			if n := len(body); n > 0 && (body[n-1] == '-' || body[n-1] == '+') {
				right = body[n-1]
				body = body[:n-1]
			}
			return body, right, j + 2, nil
		}
	}
	what := map[tagKind]string{tagExpr: "variable", tagBlock: "block", tagComment: "comment"}[kind]
	return "", 0, 0, fmt.Errorf("unexpected end of template: missing end of %s tag", what)
}

// applyLeft is Jinja2's lexer on the text before a tag: "-" strips all
// trailing whitespace; otherwise lstrip_blocks strips the indentation of a
// block or comment tag that starts its line ("+" opts out).
func applyLeft(text string, left byte, kind tagKind, lineStarting bool) string {
	if left == '-' {
		return strings.TrimRightFunc(text, pyIsSpace)
	}
	if left == '+' || kind == tagExpr {
		return text
	}
	lpos := strings.LastIndexByte(text, '\n') + 1
	if lpos > 0 || lineStarting {
		rest := text[lpos:]
		if rest != "" && strings.TrimLeftFunc(rest, pyIsSpace) == "" {
			return text[:lpos]
		}
	}
	return text
}

// applyRight returns where the next text starts after a tag ending at end:
// "-" eats all whitespace, trim_blocks one newline after a block or comment
// ("+" opts out).
func applyRight(src string, end int, right byte, kind tagKind) int {
	switch {
	case right == '-':
		return skipSpace(src, end)
	case right == '+' || kind == tagExpr:
		return end
	case end < len(src) && src[end] == '\n':
		return end + 1
	}
	return end
}

func skipSpace(src string, i int) int {
	for i < len(src) {
		r, n := utf8.DecodeRuneInString(src[i:])
		if !pyIsSpace(r) {
			break
		}
		i += n
	}
	return i
}

// findEndRaw finds the {% endraw %} after a raw block's content.
func findEndRaw(src string, from int) (open int, left, right byte, end int, ok bool) {
	for i := from; i+1 < len(src); i++ {
		if src[i] != '{' || src[i+1] != '%' {
			continue
		}
		j := i + 2
		var l byte
		if j < len(src) && (src[j] == '-' || src[j] == '+') {
			l = src[j]
			j++
		}
		k := strings.Index(src[j:], "%}")
		if k < 0 {
			return 0, 0, 0, 0, false
		}
		body := src[j : j+k]
		var r byte
		if n := len(body); n > 0 && (body[n-1] == '-' || body[n-1] == '+') {
			r = body[n-1]
			body = body[:n-1]
		}
		if strings.TrimSpace(body) == "endraw" {
			return i, l, r, j + k + 2, true
		}
	}
	return 0, 0, 0, 0, false
}

func emitText(out *strings.Builder, text string) {
	if text == "" {
		return
	}
	out.WriteString("{{ '")
	writeLibString(out, text)
	out.WriteString("' }}")
}

// writeLibString escapes s for a single-quoted string literal as the
// library reads it (it knows \\ and \' among others, and takes every other
// byte as is).
func writeLibString(out *strings.Builder, s string) {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			out.WriteString(`\\`)
		case '\'':
			out.WriteString(`\'`)
		default:
			out.WriteByte(s[i])
		}
	}
}

// rewriteBody rewrites the inside of an expression or block tag: string
// literals re-escaped (after decoding them as Python does) and overridden
// filters renamed. Everything else is left as written.
func rewriteBody(body string) (string, error) {
	var out strings.Builder
	out.Grow(len(body) + 16)
	for j := 0; j < len(body); j++ {
		c := body[j]
		switch c {
		case '\'', '"':
			k := j + 1
			for k < len(body) && body[k] != c {
				if body[k] == '\\' {
					k++
				}
				k++
			}
			if k >= len(body) {
				return "", fmt.Errorf("unterminated string literal")
			}
			out.WriteByte('\'')
			writeLibString(&out, decodePyEscapes(body[j+1:k]))
			out.WriteByte('\'')
			j = k
		case '|':
			out.WriteByte('|')
			k := j + 1
			for k < len(body) && (body[k] == ' ' || body[k] == '\t' || body[k] == '\n') {
				k++
			}
			e := k
			for e < len(body) && isIdentByte(body[e]) {
				e++
			}
			if overriddenFilters[body[k:e]] {
				out.WriteString(body[j+1 : k])
				out.WriteString(filterPrefix)
				out.WriteString(body[k:e])
				j = e - 1
			}
		case '}', '%':
			// Keep "}}" and "%}" inside the tag from reading as its end: the
			// library does not balance brackets as Jinja2 does.
			out.WriteByte(c)
			if j+1 < len(body) && body[j+1] == '}' {
				out.WriteByte(' ')
			}
		default:
			out.WriteByte(c)
		}
	}
	return out.String(), nil
}

func isIdentByte(c byte) bool {
	return c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

// decodePyEscapes decodes a Jinja2 string literal's body as its lexer does
// (Python's unicode-escape codec): \n \t \r \a \b \f \v \\ \' \" \<newline>,
// octal \ooo, \xhh, \uXXXX, \UXXXXXXXX; an unknown escape keeps its
// backslash.
func decodePyEscapes(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			continue
		}
		i++
		switch e := s[i]; e {
		case '\n':
		case '\\', '\'', '"':
			b.WriteByte(e)
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'a':
			b.WriteByte('\a')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		case '0', '1', '2', '3', '4', '5', '6', '7':
			k := i
			for k < len(s) && k < i+3 && s[k] >= '0' && s[k] <= '7' {
				k++
			}
			v, _ := strconv.ParseUint(s[i:k], 8, 32)
			b.WriteRune(rune(v))
			i = k - 1
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n < len(s)+0 && i+1+n <= len(s) {
				if v, err := strconv.ParseUint(s[i+1:i+1+n], 16, 32); err == nil && v <= unicode.MaxRune {
					b.WriteRune(rune(v))
					i += n
					continue
				}
			}
			b.WriteByte('\\')
			b.WriteByte(e)
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String()
}
