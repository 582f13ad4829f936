// Package deployref reads the Prometheus rules and Grafana dashboards under
// deploy/ and lists the metric names their queries select.
//
// Tests use it on both sides of the contract: metrics/ checks that every
// name is declared in metrics/names.go, and internal/app checks that every
// name is exported by a running replica. It is a package of its own, not part
// of metrics, so that the PromQL parser is never linked into the binary.
// It imports nothing of ours (a leaf, like metrics).
package deployref

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"

	"github.com/prometheus/prometheus/promql/parser"
	"gopkg.in/yaml.v3"
)

// Paths below a deploy/ directory.
const (
	RulesFile     = "prometheus/rules.yml"
	DashboardsDir = "grafana/dashboards"
)

// RuleFile is a Prometheus rule file.
type RuleFile struct {
	Groups []RuleGroup `yaml:"groups"`
}

// RuleGroup is one group of a rule file.
type RuleGroup struct {
	Name  string `yaml:"name"`
	Rules []Rule `yaml:"rules"`
}

// Rule is a recording rule (Record set) or an alert (Alert set).
type Rule struct {
	Record string `yaml:"record"`
	Alert  string `yaml:"alert"`
	Expr   string `yaml:"expr"`
}

// LoadRules reads and decodes the rule file at path.
func LoadRules(path string) (RuleFile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return RuleFile{}, err
	}
	var rf RuleFile
	if err := yaml.Unmarshal(b, &rf); err != nil {
		return RuleFile{}, fmt.Errorf("%s: %w", path, err)
	}
	return rf, nil
}

// Panel is the part of a Grafana panel the tests read.
type Panel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource map[string]string  `json:"datasource"`
	GridPos    struct{ W, X int } `json:"gridPos"`
	Targets    []map[string]any   `json:"targets"`
	Panels     []Panel            `json:"panels"`
}

// Variable is a dashboard template variable.
type Variable struct {
	Name       string            `json:"name"`
	Definition string            `json:"definition"`
	Datasource map[string]string `json:"datasource"`
}

// Dashboard is the part of a Grafana dashboard the tests read.
type Dashboard struct {
	UID        string  `json:"uid"`
	Title      string  `json:"title"`
	Panels     []Panel `json:"panels"`
	Templating struct {
		List []Variable `json:"list"`
	} `json:"templating"`
}

// LoadDashboards reads every *.json dashboard in dir, keyed by file name.
func LoadDashboards(dir string) (map[string]Dashboard, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no dashboards in %s", dir)
	}
	out := make(map[string]Dashboard, len(files))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		var d Dashboard
		if err := json.Unmarshal(b, &d); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		out[filepath.Base(f)] = d
	}
	return out, nil
}

// FlattenPanels returns ps and every panel nested in them (collapsed rows),
// depth first.
func FlattenPanels(ps []Panel) []Panel {
	var out []Panel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, FlattenPanels(p.Panels)...)
	}
	return out
}

// grafanaVars replaces dashboard template variables with values that keep
// the query valid PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${model}", "x", "$model", "x", "${class}", "x", "$class", "x",
)

// ExpandGrafanaVars replaces the template variables the dashboards use with
// placeholder values, so the query parses as PromQL.
func ExpandGrafanaVars(q string) string { return grafanaVars.Replace(q) }

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]\w*\)$`)

// LabelValuesSelector returns the selector of a label_values(selector,
// label) variable definition, and false for any other form.
func LabelValuesSelector(definition string) (string, bool) {
	m := labelValuesRE.FindStringSubmatch(definition)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// Selector is one vector selector of a query: the metric name and the label
// names its matchers test.
type Selector struct {
	Name   string
	Labels []string
}

// QuerySelectors parses q and returns every vector selector in it.
func QuerySelectors(q string) ([]Selector, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		return nil, err
	}
	var out []Selector
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		s := Selector{Name: vs.Name}
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				s.Name = m.Value
				continue
			}
			s.Labels = append(s.Labels, m.Name)
		}
		out = append(out, s)
		return nil
	})
	return out, nil
}

// QueryNames parses q and returns the metric name of every selector in it.
func QueryNames(q string) ([]string, error) {
	sels, err := QuerySelectors(q)
	if err != nil {
		return nil, err
	}
	names := make([]string, len(sels))
	for i, s := range sels {
		names[i] = s.Name
	}
	return names, nil
}

// Query is one PromQL expression of the deploy configuration.
type Query struct {
	// Where names its origin: "rules.yml group/rule", or "file panel N
	// "title"", or "file variable name".
	Where string
	// Expr is the expression, Grafana variables expanded.
	Expr string
}

// Queries returns every PromQL expression of deployDir's rule file and
// dashboards (rule expressions, panel targets, label_values variables), and
// the names the recording rules define, which later queries may select.
func Queries(deployDir string) ([]Query, map[string]bool, error) {
	rf, err := LoadRules(filepath.Join(deployDir, RulesFile))
	if err != nil {
		return nil, nil, err
	}
	var qs []Query
	recorded := map[string]bool{}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			qs = append(qs, Query{Where: "rules.yml " + g.Name + "/" + r.Record + r.Alert, Expr: r.Expr})
			if r.Record != "" {
				recorded[r.Record] = true
			}
		}
	}
	ds, err := LoadDashboards(filepath.Join(deployDir, DashboardsDir))
	if err != nil {
		return nil, nil, err
	}
	files := make([]string, 0, len(ds))
	for f := range ds {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, f := range files {
		d := ds[f]
		for _, p := range FlattenPanels(d.Panels) {
			for _, tg := range p.Targets {
				expr, _ := tg["expr"].(string)
				qs = append(qs, Query{Where: fmt.Sprintf("%s panel %d %q", f, p.ID, p.Title), Expr: ExpandGrafanaVars(expr)})
			}
		}
		for _, v := range d.Templating.List {
			sel, ok := LabelValuesSelector(v.Definition)
			if !ok {
				return nil, nil, fmt.Errorf("%s variable %s: expected label_values(selector, label), got %q", f, v.Name, v.Definition)
			}
			qs = append(qs, Query{Where: f + " variable " + v.Name, Expr: ExpandGrafanaVars(sel)})
		}
	}
	return qs, recorded, nil
}
