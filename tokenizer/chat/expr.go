package chat

import (
	"fmt"
	"strconv"
	"strings"
)

// The library is lenient where Python raises TypeError: "+" joins a string
// with a list or None, "in" and "for" treat None as empty. A template that
// hits one of these cannot render the input in any engine, and the router
// must reject it too. So expressions are re-parsed here (Jinja2's grammar,
// emitted back as source) to route "+", "in", "not in" and for-loop
// iterables through Python-faithful functions. Anything this parser does
// not understand is left as written.

const (
	addFunc    = filterPrefix + "add"
	inFunc     = filterPrefix + "in"
	iterFunc   = filterPrefix + "iter"
	powFunc    = filterPrefix + "pow"
	unsafeFunc = filterPrefix + "unsafe"
	methodFunc = filterPrefix + "method"
	concatFunc = filterPrefix + "concat"
)

// mutators are the list and dict methods Jinja2's sandbox treats as
// modifying (its _mutable_spec).
var mutators = map[string]bool{
	"append": true, "extend": true, "insert": true, "pop": true, "remove": true, "clear": true,
	"sort": true, "reverse": true, "update": true, "setdefault": true, "popitem": true,
}

// stringMethods are the str methods Switchyard implements itself.
var stringMethods = map[string]bool{"strip": true, "lstrip": true, "rstrip": true}

type exprTok struct {
	kind byte // 'n' name, 's' string, '0' number, 'o' operator
	text string
}

func lexExpr(s string) ([]exprTok, error) {
	var toks []exprTok
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case isIdentByte(c) && (c < '0' || c > '9'):
			j := i
			for j < len(s) && isIdentByte(s[j]) {
				j++
			}
			toks = append(toks, exprTok{'n', s[i:j]})
			i = j
		case c >= '0' && c <= '9':
			j := i
			for j < len(s) && (isIdentByte(s[j]) || s[j] == '.' && j+1 < len(s) && s[j+1] >= '0' && s[j+1] <= '9' ||
				(s[j] == '+' || s[j] == '-') && (s[j-1] == 'e' || s[j-1] == 'E')) {
				j++
			}
			toks = append(toks, exprTok{'0', libNumber(s[i:j])})
			i = j
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(s) && s[j] != c {
				if s[j] == '\\' {
					j++
				}
				j++
			}
			if j >= len(s) {
				return nil, fmt.Errorf("unterminated string")
			}
			toks = append(toks, exprTok{'s', s[i : j+1]})
			i = j + 1
		default:
			op := string(c)
			if i+1 < len(s) {
				switch two := s[i : i+2]; two {
				case "**", "//", "==", "!=", "<=", ">=":
					op = two
				}
			}
			if !strings.Contains("+-*/%~<>=()[]{},.:|!", op[:1]) {
				return nil, fmt.Errorf("unexpected %q", c)
			}
			toks = append(toks, exprTok{'o', op})
			i += len(op)
		}
	}
	return toks, nil
}

type exprParser struct {
	toks []exprTok
	pos  int
}

func (p *exprParser) peek() exprTok {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return exprTok{}
}

func (p *exprParser) peekIs(kind byte, text string) bool {
	t := p.peek()
	return t.kind == kind && t.text == text
}

func (p *exprParser) accept(kind byte, text string) bool {
	if p.peekIs(kind, text) {
		p.pos++
		return true
	}
	return false
}

func (p *exprParser) expect(text string) error {
	if !p.accept('o', text) {
		return fmt.Errorf("expected %q", text)
	}
	return nil
}

func (p *exprParser) done() bool { return p.pos >= len(p.toks) }

// tuple parses "a, b" as Jinja2 allows where a tuple may stand unparenthesised.
func (p *exprParser) tuple() (string, error) {
	first, err := p.expr()
	if err != nil {
		return "", err
	}
	items := []string{first}
	for p.accept('o', ",") {
		if p.done() || p.peekIs('o', ")") {
			items = append(items, "")
			break
		}
		e, err := p.expr()
		if err != nil {
			return "", err
		}
		items = append(items, e)
	}
	if len(items) == 1 {
		return first, nil
	}
	return strings.TrimSuffix(strings.Join(items, ", "), ", ") + ",", nil
}

func (p *exprParser) expr() (string, error) {
	a, err := p.or()
	if err != nil {
		return "", err
	}
	if p.accept('n', "if") {
		c, err := p.or()
		if err != nil {
			return "", err
		}
		if p.accept('n', "else") {
			b, err := p.expr()
			if err != nil {
				return "", err
			}
			return a + " if " + c + " else " + b, nil
		}
		return a + " if " + c, nil
	}
	return a, nil
}

func (p *exprParser) or() (string, error) {
	a, err := p.and()
	for err == nil && p.accept('n', "or") {
		var b string
		b, err = p.and()
		a = a + " or " + b
	}
	return a, err
}

func (p *exprParser) and() (string, error) {
	a, err := p.not()
	for err == nil && p.accept('n', "and") {
		var b string
		b, err = p.not()
		a = a + " and " + b
	}
	return a, err
}

func (p *exprParser) not() (string, error) {
	if p.accept('n', "not") {
		a, err := p.not()
		return "not " + a, err
	}
	return p.compare()
}

func (p *exprParser) compare() (string, error) {
	a, err := p.math1()
	if err != nil {
		return "", err
	}
	for {
		t := p.peek()
		switch {
		case t.kind == 'o' && (t.text == "==" || t.text == "!=" || t.text == "<" || t.text == ">" || t.text == "<=" || t.text == ">="):
			p.pos++
			b, err := p.math1()
			if err != nil {
				return "", err
			}
			a = a + " " + t.text + " " + b
		case t.kind == 'n' && t.text == "in":
			p.pos++
			b, err := p.math1()
			if err != nil {
				return "", err
			}
			a = inFunc + "(" + a + ", " + b + ")"
		case t.kind == 'n' && t.text == "not" && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == 'n' && p.toks[p.pos+1].text == "in":
			p.pos += 2
			b, err := p.math1()
			if err != nil {
				return "", err
			}
			a = "(not " + inFunc + "(" + a + ", " + b + "))"
		default:
			return a, nil
		}
	}
}

func (p *exprParser) math1() (string, error) {
	a, err := p.concat()
	if err != nil {
		return "", err
	}
	for {
		switch {
		case p.accept('o', "+"):
			b, err := p.concat()
			if err != nil {
				return "", err
			}
			a = addFunc + "(" + a + ", " + b + ")"
		case p.accept('o', "-"):
			b, err := p.concat()
			if err != nil {
				return "", err
			}
			a = a + " - " + b
		default:
			return a, nil
		}
	}
}

func (p *exprParser) concat() (string, error) {
	a, err := p.math2()
	for err == nil && p.accept('o', "~") {
		var b string
		b, err = p.math2()
		a = concatFunc + "(" + a + ", " + b + ")"
	}
	return a, err
}

func (p *exprParser) math2() (string, error) {
	a, err := p.pow()
	for err == nil {
		t := p.peek()
		if t.kind != 'o' || t.text != "*" && t.text != "/" && t.text != "//" && t.text != "%" {
			break
		}
		p.pos++
		var b string
		b, err = p.pow()
		a = a + " " + t.text + " " + b
	}
	return a, err
}

func (p *exprParser) pow() (string, error) {
	a, err := p.unary()
	for err == nil && p.accept('o', "**") {
		var b string
		b, err = p.unary()
		a = powFunc + "(" + a + ", " + b + ")"
	}
	return a, err
}

func (p *exprParser) unary() (string, error) {
	if p.accept('o', "-") {
		a, err := p.unary()
		return "-" + a, err
	}
	if p.accept('o', "+") {
		a, err := p.unary()
		return "+" + a, err
	}
	a, err := p.primary()
	if err != nil {
		return "", err
	}
	if a, err = p.postfix(a); err != nil {
		return "", err
	}
	return p.filters(a)
}

func (p *exprParser) primary() (string, error) {
	t := p.peek()
	switch t.kind {
	case 'n', '0':
		p.pos++
		return t.text, nil
	case 's':
		p.pos++
		s := t.text
		for p.peek().kind == 's' { // adjacent literals concatenate
			s += " " + p.peek().text
			p.pos++
		}
		return s, nil
	case 'o':
		switch t.text {
		case "(":
			p.pos++
			if p.accept('o', ")") {
				return "()", nil
			}
			e, err := p.tuple()
			if err != nil {
				return "", err
			}
			return "(" + e + ")", p.expect(")")
		case "[":
			p.pos++
			items, err := p.list("]")
			return "[" + items + "]", err
		case "{":
			p.pos++
			var parts []string
			for !p.accept('o', "}") {
				k, err := p.expr()
				if err != nil {
					return "", err
				}
				if err := p.expect(":"); err != nil {
					return "", err
				}
				v, err := p.expr()
				if err != nil {
					return "", err
				}
				parts = append(parts, k+": "+v)
				if !p.accept('o', ",") {
					if err := p.expect("}"); err != nil {
						return "", err
					}
					break
				}
			}
			return "{" + strings.Join(parts, ", ") + " }", nil
		}
	}
	return "", fmt.Errorf("unexpected %q", t.text)
}

// list parses comma-separated expressions up to closer (consumed).
func (p *exprParser) list(closer string) (string, error) {
	var items []string
	for !p.accept('o', closer) {
		e, err := p.expr()
		if err != nil {
			return "", err
		}
		items = append(items, e)
		if !p.accept('o', ",") {
			if err := p.expect(closer); err != nil {
				return "", err
			}
			break
		}
	}
	return strings.Join(items, ", "), nil
}

// args parses a call's arguments after "(": expressions, name=expr, *a, **k.
func (p *exprParser) args() (string, error) {
	var items []string
	for !p.accept('o', ")") {
		prefix := ""
		switch {
		case p.accept('o', "**"):
			prefix = "**"
		case p.accept('o', "*"):
			prefix = "*"
		case p.peek().kind == 'n' && p.pos+1 < len(p.toks) && p.toks[p.pos+1].kind == 'o' && p.toks[p.pos+1].text == "=":
			prefix = p.peek().text + "="
			p.pos += 2
		}
		e, err := p.expr()
		if err != nil {
			return "", err
		}
		items = append(items, prefix+e)
		if !p.accept('o', ",") {
			if err := p.expect(")"); err != nil {
				return "", err
			}
			break
		}
	}
	return strings.Join(items, ", "), nil
}

func (p *exprParser) postfix(a string) (string, error) {
	for {
		switch {
		case p.accept('o', "."):
			t := p.peek()
			if t.kind != 'n' && t.kind != '0' {
				return "", fmt.Errorf("expected a name after '.'")
			}
			p.pos++
			if mutators[t.text] && p.peekIs('o', "(") {
				// ImmutableSandboxedEnvironment refuses methods that modify
				// a list or dict; on any other value Python finds no such
				// method. Either way the call fails.
				a = unsafeFunc + "('" + t.text + "')"
				continue
			}
			if stringMethods[t.text] && p.peekIs('o', "(") {
				// Python strips all Unicode whitespace; the library's
				// lstrip/rstrip only " \t\n\r". The method is looked up here
				// and the call that follows applies it.
				a = methodFunc + "(" + a + ", '" + t.text + "')"
				continue
			}
			a += "." + t.text
		case p.accept('o', "["):
			var parts []string
			for {
				if p.peekIs('o', ":") || p.peekIs('o', "]") {
					parts = append(parts, "")
				} else {
					e, err := p.expr()
					if err != nil {
						return "", err
					}
					parts = append(parts, e)
				}
				if !p.accept('o', ":") {
					break
				}
			}
			if err := p.expect("]"); err != nil {
				return "", err
			}
			a += "[" + strings.Join(parts, ":") + "]"
		case p.accept('o', "("):
			args, err := p.args()
			if err != nil {
				return "", err
			}
			a += "(" + args + ")"
		default:
			return a, nil
		}
	}
}

func (p *exprParser) filters(a string) (string, error) {
	for {
		switch {
		case p.accept('o', "|"):
			t := p.peek()
			if t.kind != 'n' {
				return "", fmt.Errorf("expected a filter name")
			}
			p.pos++
			a += " | " + t.text
			for p.accept('o', ".") { // dotted filter names
				a += "." + p.peek().text
				p.pos++
			}
			if p.accept('o', "(") {
				args, err := p.args()
				if err != nil {
					return "", err
				}
				a += "(" + args + ")"
			}
		case p.accept('n', "is"):
			a += " is"
			if p.accept('n', "not") {
				a += " not"
			}
			t := p.peek()
			if t.kind != 'n' {
				return "", fmt.Errorf("expected a test name")
			}
			p.pos++
			a += " " + t.text
			for p.accept('o', ".") {
				a += "." + p.peek().text
				p.pos++
			}
			n := p.peek()
			testName := t.text
			switch {
			case testName == "divisibleby" && (p.peekIs('o', "(") || n.kind == '0' || n.kind == 'n'):
				// The library lacks this test: x is divisibleby n is x % n == 0.
				var arg string
				var err error
				if p.accept('o', "(") {
					arg, err = p.args()
				} else {
					arg, err = p.primary()
				}
				if err != nil {
					return "", err
				}
				neg := strings.HasSuffix(a, " is not divisibleby")
				base := strings.TrimSuffix(strings.TrimSuffix(a, " is not divisibleby"), " is divisibleby")
				a = "((" + base + ") % (" + arg + ") == 0)"
				if neg {
					a = "(not " + a + ")"
				}
			case p.accept('o', "("):
				args, err := p.args()
				if err != nil {
					return "", err
				}
				a += "(" + args + ")"
			case n.kind == 's' || n.kind == '0' || n.kind == 'o' && (n.text == "[" || n.text == "{") ||
				n.kind == 'n' && n.text != "else" && n.text != "or" && n.text != "and" && n.text != "if" && n.text != "in" && n.text != "not" && n.text != "is":
				arg, err := p.primary()
				if err != nil {
					return "", err
				}
				if arg, err = p.postfix(arg); err != nil {
					return "", err
				}
				a += "(" + arg + ")" // the library reads only the parenthesised form
			}
		default:
			return a, nil
		}
	}
}

// rewriteExpr rewrites a whole expression, or returns it unchanged when it
// does not parse as one.
func rewriteExpr(src string) string {
	toks, err := lexExpr(src)
	if err != nil || len(toks) == 0 {
		return src
	}
	p := &exprParser{toks: toks}
	out, err := p.tuple()
	if err != nil || !p.done() {
		return src
	}
	return out
}

// rewriteStatement rewrites the expressions of if, elif, set and for tags.
// after is template source to place right after the tag.
func rewriteStatement(body string) (out, after string) {
	kw := firstWord(body)
	rest := strings.TrimLeft(body, " \t\n")[len(kw):]
	switch kw {
	case "if", "elif":
		return " " + kw + " " + rewriteExpr(rest) + " ", ""
	case "set":
		i := topLevelAssign(rest)
		if i < 0 {
			return body, ""
		}
		return " set" + rest[:i+1] + " " + rewriteExpr(rest[i+1:]) + " ", ""
	case "for":
		toks, err := lexExpr(rest)
		if err != nil {
			return body, ""
		}
		in := -1
		for i, t := range toks {
			if t.kind == 'n' && t.text == "in" {
				in = i
				break
			}
		}
		if in < 1 {
			return body, ""
		}
		var target []string
		for _, t := range toks[:in] {
			target = append(target, t.text)
		}
		// Jinja2 parses the iterable without a conditional: a trailing "if"
		// filters the loop.
		p := &exprParser{toks: toks[in+1:]}
		iter, err := p.or()
		for err == nil && p.accept('o', ",") {
			var more string
			more, err = p.or()
			iter += ", " + more
		}
		if err != nil {
			return body, ""
		}
		names := targetNames(toks[:in])
		if p.peekIs('n', "if") && len(names) > 1 {
			// The library evaluates a loop condition with only the whole
			// item bound, so "for k, v in x if k" cannot see k and v: loop
			// over the item, give the condition item[0], item[1], ..., and
			// unpack at the top of the body.
			subst := map[string]string{}
			for i, n := range names {
				subst[n] = loopItem + "[" + strconv.Itoa(i) + "]"
			}
			rest := p.toks[p.pos:]
			for i, t := range rest {
				if r, ok := subst[t.text]; ok && t.kind == 'n' && (i == 0 || rest[i-1].text != ".") {
					rest[i] = exprTok{'n', r}
				}
			}
			target = []string{loopItem}
			for i, n := range names {
				after += "{% set " + n + " = " + loopItem + "[" + strconv.Itoa(i) + "] %}"
			}
		}
		out = " for " + strings.Join(target, " ") + " in " + iterFunc + "(" + iter + ")"
		if p.accept('n', "if") {
			cond, err := p.expr()
			if err != nil {
				return body, ""
			}
			out += " if " + cond
		}
		if p.accept('n', "recursive") {
			out += " recursive"
		}
		if !p.done() {
			return body, ""
		}
		return out + " ", after
	}
	return body, ""
}

const loopItem = filterPrefix + "item"

// targetNames are the names of a for loop's target ("k", "v" of "k, v"),
// or nil when it is not a plain list of names.
func targetNames(toks []exprTok) []string {
	var names []string
	for i, t := range toks {
		switch {
		case i%2 == 0 && t.kind == 'n':
			names = append(names, t.text)
		case i%2 == 1 && t.kind == 'o' && t.text == ",":
		default:
			return nil
		}
	}
	return names
}

// topLevelAssign finds the "=" of "set target = value" outside brackets
// and strings, or -1 (a block set).
func topLevelAssign(s string) int {
	depth := 0
	var quote byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if quote != 0 {
			switch c {
			case '\\':
				i++
			case quote:
				quote = 0
			}
			continue
		}
		switch c {
		case '\'', '"':
			quote = c
		case '(', '[', '{':
			depth++
		case ')', ']', '}':
			depth--
		case '=':
			if depth == 0 && (i+1 >= len(s) || s[i+1] != '=') && (i == 0 || !strings.ContainsRune("=!<>", rune(s[i-1]))) {
				return i
			}
		}
	}
	return -1
}

// libNumber writes a number literal in a form the library reads: without
// underscores, and an exponent-form float (1e5, which the library does not
// lex) as a positional one, as Python would value it.
func libNumber(lit string) string {
	lit = strings.ReplaceAll(lit, "_", "")
	if !strings.ContainsAny(lit, "eE") || strings.HasPrefix(lit, "0x") || strings.HasPrefix(lit, "0X") {
		return lit
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil {
		return lit
	}
	out := strconv.FormatFloat(f, 'f', -1, 64)
	if !strings.Contains(out, ".") {
		out += ".0"
	}
	return out
}
