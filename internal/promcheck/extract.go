// Package promcheck checks that the PromQL queries fanout ships (alerting
// rules, a Grafana dashboard, KEDA triggers) use only metrics and labels a
// daemon exposes. It is a small extractor, not a PromQL parser: it finds
// the vector selectors (metric names and label matchers) and the label
// names of by, without, on, ignoring, group_left and group_right clauses,
// and refuses what it cannot read (functions that name labels in string
// arguments, such as label_replace). Whether a query parses is promtool's
// business (check rules): the two together check a query's syntax and its
// names.
package promcheck

import (
	"fmt"
	"slices"
	"strings"
)

// Matcher is one label matcher of a vector selector.
type Matcher struct {
	Label string
	Op    string // =, !=, =~ or !~
	Value string
}

// Selector is one vector selector: a metric name and its matchers.
type Selector struct {
	Metric   string
	Matchers []Matcher
}

// Use is what an expression refers to.
type Use struct {
	Selectors []Selector
	// Labels are the label names of grouping and matching clauses (by,
	// without, on, ignoring, group_left, group_right), in order, each once.
	Labels []string
	// Result, when not nil, holds the only labels the result's series can
	// have: the expression is one aggregation (by its by clause, or none
	// without one), or histogram_quantile of one (less le). Nil when the
	// extractor does not tell (other expressions).
	Result []string
}

// aggregations are PromQL's aggregation operators: they may be followed
// by a grouping clause before their parenthesis.
var aggregations = []string{"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
	"bottomk", "topk", "quantile", "limitk", "limit_ratio"}

// functions are PromQL's functions whose arguments name no label.
var functions = []string{"abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
	"avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time",
	"day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv",
	"double_exponential_smoothing", "exp", "floor", "histogram_avg", "histogram_count", "histogram_fraction",
	"histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum", "holt_winters", "hour",
	"idelta", "increase", "irate", "last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time",
	"min_over_time", "minute", "month", "pi", "predict_linear", "present_over_time", "quantile_over_time",
	"rad", "rate", "resets", "round", "scalar", "sgn", "sin", "sinh", "sort", "sort_desc", "sqrt",
	"stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp", "vector", "year"}

// labelFunctions name labels in string arguments, which this extractor
// does not follow: an expression using one is refused rather than checked
// in part.
var labelFunctions = []string{"label_replace", "label_join", "sort_by_label", "sort_by_label_desc"}

// Parse returns the selectors and clause labels of a PromQL expression.
// Grafana's variables ($name, ${name}, $__rate_interval) may appear where a
// value, a duration or a number would.
func Parse(expr string) (Use, error) {
	toks, err := lex(expr)
	if err != nil {
		return Use{}, err
	}
	p := &parser{toks: toks}
	if err := p.run(); err != nil {
		return Use{}, fmt.Errorf("%q: %w", expr, err)
	}
	if len(p.use.Selectors) == 0 {
		return Use{}, fmt.Errorf("%q: no metric", expr)
	}
	p.use.Result = resultLabels(toks)
	return p.use, nil
}

// closing returns the index of the parenthesis that closes the one at
// toks[i], or -1.
func closing(toks []token, i int) int {
	depth := 0
	for j := i; j < len(toks); j++ {
		if toks[j].kind != tPunct {
			continue
		}
		switch toks[j].text {
		case "(":
			depth++
		case ")":
			if depth--; depth == 0 {
				return j
			}
		}
	}
	return -1
}

// labelList returns the labels of the list "(" a, b ")" at toks[i] and the
// index after it, or false.
func labelList(toks []token, i int) ([]string, int, bool) {
	end := closing(toks, i)
	if i >= len(toks) || toks[i].text != "(" || end < 0 {
		return nil, 0, false
	}
	labels := []string{}
	for _, t := range toks[i+1 : end] {
		if t.kind == tIdent || t.kind == tString {
			labels = append(labels, t.text)
		}
	}
	return labels, end + 1, true
}

// resultLabels returns Use.Result of the tokens of an expression.
func resultLabels(toks []token) []string {
	if len(toks) < 3 || toks[0].kind != tIdent {
		return nil
	}
	is := func(i int, text string) bool { return i < len(toks) && toks[i].text == text }
	if toks[0].text == "histogram_quantile" && is(1, "(") && closing(toks, 1) == len(toks)-1 {
		depth := 0
		for i := 2; i < len(toks)-1; i++ {
			switch {
			case toks[i].text == "(":
				depth++
			case toks[i].text == ")":
				depth--
			case toks[i].text == "," && depth == 0:
				inner := resultLabels(toks[i+1 : len(toks)-1])
				if inner == nil {
					return nil
				}
				return slices.DeleteFunc(inner, func(l string) bool { return l == "le" })
			}
		}
		return nil
	}
	if !slices.Contains(aggregations, toks[0].text) {
		return nil
	}
	switch {
	case is(1, "by"): // agg by (labels) (expr)
		labels, next, ok := labelList(toks, 2)
		if ok && is(next, "(") && closing(toks, next) == len(toks)-1 {
			return labels
		}
	case is(1, "("): // agg (expr) [by (labels)]
		end := closing(toks, 1)
		if end == len(toks)-1 {
			return []string{}
		}
		if end > 0 && is(end+1, "by") {
			if labels, next, ok := labelList(toks, end+2); ok && next == len(toks) {
				return labels
			}
		}
	}
	return nil
}

type tokKind int

const (
	tIdent  tokKind = iota // a name: metric, label, keyword, function
	tNumber                // a number or a duration
	tString                // a quoted string, unquoted
	tVar                   // a Grafana variable
	tPunct                 // ( ) { } [ ] , : @ and operators
)

type token struct {
	kind tokKind
	text string
}

func isNameStart(c byte) bool { return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }
func isNameChar(c byte) bool  { return isNameStart(c) || c >= '0' && c <= '9' || c == ':' }

// lex splits expr into tokens.
func lex(expr string) ([]token, error) {
	var out []token
	for i := 0; i < len(expr); {
		c := expr[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case c == '#': // a comment, to the end of the line
			for i < len(expr) && expr[i] != '\n' {
				i++
			}
		case c == '"' || c == '\'' || c == '`':
			j := i + 1
			var b strings.Builder
			for ; j < len(expr) && expr[j] != c; j++ {
				if expr[j] == '\\' && c != '`' && j+1 < len(expr) {
					j++
				}
				b.WriteByte(expr[j])
			}
			if j == len(expr) {
				return nil, fmt.Errorf("%q: unterminated string at %d", expr, i)
			}
			out = append(out, token{tString, b.String()})
			i = j + 1
		case c == '$':
			j := i + 1
			if j < len(expr) && expr[j] == '{' {
				k := strings.IndexByte(expr[j:], '}')
				if k < 0 {
					return nil, fmt.Errorf("%q: unterminated ${ at %d", expr, i)
				}
				j += k + 1
			} else {
				for j < len(expr) && isNameChar(expr[j]) {
					j++
				}
			}
			out = append(out, token{tVar, expr[i:j]})
			i = j
		case isNameStart(c):
			j := i
			for j < len(expr) && isNameChar(expr[j]) {
				j++
			}
			out = append(out, token{tIdent, expr[i:j]})
			i = j
		case c >= '0' && c <= '9' || c == '.' && i+1 < len(expr) && expr[i+1] >= '0' && expr[i+1] <= '9':
			j := i
			for j < len(expr) && (isNameChar(expr[j]) && expr[j] != ':' || expr[j] == '.' ||
				(expr[j] == '+' || expr[j] == '-') && (expr[j-1] == 'e' || expr[j-1] == 'E') && !strings.ContainsAny(expr[i:j], "xX")) {
				j++
			}
			out = append(out, token{tNumber, expr[i:j]})
			i = j
		default:
			op := string(c)
			if i+1 < len(expr) {
				if two := expr[i : i+2]; slices.Contains([]string{"==", "!=", "<=", ">=", "=~", "!~"}, two) {
					op = two
				}
			}
			if !strings.Contains("(){}[],:@+-*/%^=!<>", op[:1]) || op == "!" {
				return nil, fmt.Errorf("%q: unexpected %q at %d", expr, op, i)
			}
			out = append(out, token{tPunct, op})
			i += len(op)
		}
	}
	return out, nil
}

type parser struct {
	toks []token
	i    int
	use  Use
}

func (p *parser) peek(k int) token {
	if p.i+k < len(p.toks) {
		return p.toks[p.i+k]
	}
	return token{kind: tPunct, text: ""}
}

func (p *parser) is(k int, kind tokKind, text string) bool {
	t := p.peek(k)
	return t.kind == kind && t.text == text
}

func (p *parser) label(name string) {
	if !slices.Contains(p.use.Labels, name) {
		p.use.Labels = append(p.use.Labels, name)
	}
}

func (p *parser) run() error {
	for p.i < len(p.toks) {
		t := p.toks[p.i]
		switch {
		case t.kind == tPunct && t.text == "[":
			// A range or a subquery's range and step: durations only.
			end := p.i
			for end < len(p.toks) && !(p.toks[end].kind == tPunct && p.toks[end].text == "]") {
				end++
			}
			if end == len(p.toks) {
				return fmt.Errorf("unterminated [")
			}
			p.i = end + 1
		case t.kind == tPunct && t.text == "{":
			sel, err := p.selector("")
			if err != nil {
				return err
			}
			if sel.Metric == "" {
				return fmt.Errorf("a selector without a metric name (use name{...} or {__name__=\"name\"})")
			}
			p.use.Selectors = append(p.use.Selectors, sel)
		case t.kind == tIdent:
			if err := p.ident(t.text); err != nil {
				return err
			}
		default:
			p.i++
		}
	}
	return nil
}

// ident handles a name at p.i.
func (p *parser) ident(name string) error {
	lower := strings.ToLower(name)
	switch {
	case slices.Contains([]string{"by", "without", "on", "ignoring", "group_left", "group_right"}, lower):
		p.i++
		if !p.is(0, tPunct, "(") {
			if lower == "group_left" || lower == "group_right" {
				return nil // without extra labels
			}
			return fmt.Errorf("%s without a label list", name)
		}
		p.i++
		for !p.is(0, tPunct, ")") {
			t := p.peek(0)
			switch {
			case t.kind == tIdent || t.kind == tString:
				p.label(t.text)
			case t.kind == tPunct && t.text == ",":
			default:
				return fmt.Errorf("%s (...): unexpected %q", name, t.text)
			}
			p.i++
		}
		p.i++
		return nil
	case slices.Contains([]string{"and", "or", "unless", "bool", "offset", "atan2", "inf", "nan", "start", "end"}, lower):
		p.i++ // operators, modifiers and @'s start() and end()
		return nil
	case slices.Contains(labelFunctions, name) && p.is(1, tPunct, "("):
		return fmt.Errorf("%s names labels in string arguments, which this checker does not follow", name)
	case name == "count_values" && (p.is(1, tPunct, "(") || p.is(1, tIdent, "by") || p.is(1, tIdent, "without")):
		return fmt.Errorf("count_values names its output label in a string argument, which this checker does not follow")
	case slices.Contains(aggregations, name) && (p.is(1, tPunct, "(") || p.is(1, tIdent, "by") || p.is(1, tIdent, "without")):
		p.i++
		return nil
	case p.is(1, tPunct, "("):
		if !slices.Contains(functions, name) {
			return fmt.Errorf("unknown function %s", name)
		}
		p.i++
		return nil
	}
	p.i++
	if p.is(0, tPunct, "{") {
		sel, err := p.selector(name)
		if err != nil {
			return err
		}
		p.use.Selectors = append(p.use.Selectors, sel)
		return nil
	}
	p.use.Selectors = append(p.use.Selectors, Selector{Metric: name})
	return nil
}

// selector reads the matchers at p.i ("{" ... "}") of a selector of metric
// (empty: the name comes from a __name__ matcher).
func (p *parser) selector(metric string) (Selector, error) {
	sel := Selector{Metric: metric}
	p.i++ // {
	for !p.is(0, tPunct, "}") {
		if p.is(0, tPunct, ",") {
			p.i++
			continue
		}
		l, op, v := p.peek(0), p.peek(1), p.peek(2)
		if l.kind != tIdent && l.kind != tString || op.kind != tPunct || !slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) ||
			v.kind != tString {
			return Selector{}, fmt.Errorf("selector %s: want label op \"value\" at %q %q %q", metric, l.text, op.text, v.text)
		}
		p.i += 3
		if l.text == "__name__" {
			if op.text != "=" || sel.Metric != "" {
				return Selector{}, fmt.Errorf("selector %s: only one __name__=\"...\" is followed", metric)
			}
			sel.Metric = v.text
			continue
		}
		sel.Matchers = append(sel.Matchers, Matcher{Label: l.text, Op: op.text, Value: v.text})
	}
	p.i++ // }
	return sel, nil
}
