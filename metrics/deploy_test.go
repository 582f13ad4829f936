package metrics

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

// These tests keep deploy/prometheus and deploy/grafana honest: every query
// parses and names only metrics this package registers (or recording rules,
// or Prometheus' own `up`).

var (
	promDir    = filepath.Join("..", "deploy", "prometheus")
	grafanaDir = filepath.Join("..", "deploy", "grafana")
)

// touchEveryVec creates one child of every *Vec field of group (a pointer to
// one of the collector group structs) so the registry gathers it. It finds
// the label count by trying arities, so new fields need no test change.
func touchEveryVec(t *testing.T, group any) {
	t.Helper()
	v := reflect.ValueOf(group).Elem()
	for i := range v.NumField() {
		m := v.Field(i).MethodByName("GetMetricWithLabelValues")
		if !m.IsValid() {
			continue
		}
		ok := false
		for arity := 1; arity <= 8 && !ok; arity++ {
			vals := make([]string, arity)
			for j := range vals {
				vals[j] = "x"
			}
			out := m.CallSlice([]reflect.Value{reflect.ValueOf(vals)})
			ok = out[1].IsNil()
		}
		require.True(t, ok, "could not create a child of %s.%s", v.Type().Name(), v.Type().Field(i).Name)
	}
}

// registeredNames gathers a registry with every collector of this package
// instantiated and returns the queryable series names (histograms expand to
// their _bucket, _sum and _count series).
func registeredNames(t *testing.T) map[string]bool {
	t.Helper()
	reg := NewRegistry()
	adm := NewAdmission(reg)
	groups := []any{adm, NewRouter(reg), NewIndex(reg), NewCluster(reg), NewGossip(reg)}
	_, err := NewExporter(DefaultExporterConfig(), adm, reg, nil)
	require.NoError(t, err)
	for _, g := range groups {
		touchEveryVec(t, g)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	names := map[string]bool{"up": true}
	for _, mf := range mfs {
		n := mf.GetName()
		names[n] = true
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				names[n+s] = true
			}
		}
	}
	return names
}

type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

func loadRules(t *testing.T) ruleFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(promDir, "rules.yml"))
	require.NoError(t, err)
	var rf ruleFile
	require.NoError(t, yaml.Unmarshal(b, &rf))
	require.NotEmpty(t, rf.Groups)
	return rf
}

// queriedNames parses q and returns every metric name it selects.
func queriedNames(q string) ([]string, error) {
	expr, err := parser.NewParser(parser.Options{}).ParseExpr(q)
	if err != nil {
		return nil, err
	}
	var names []string
	parser.Inspect(expr, func(n parser.Node, _ []parser.Node) error {
		vs, ok := n.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		name := vs.Name
		for _, m := range vs.LabelMatchers {
			if m.Name == "__name__" {
				name = m.Value
			}
		}
		names = append(names, name)
		return nil
	})
	return names, nil
}

func requireKnownNames(t *testing.T, where, q string, known map[string]bool) []string {
	t.Helper()
	names, err := queriedNames(q)
	require.NoError(t, err, "%s: query does not parse:\n%s", where, q)
	require.NotEmpty(t, names, "%s: query selects no metric:\n%s", where, q)
	for _, n := range names {
		require.True(t, known[n], "%s: %q is neither registered by metrics/ nor a recording rule:\n%s", where, n, q)
	}
	return names
}

func TestEveryRuleParsesAndNamesOnlyRegisteredMetrics(t *testing.T) {
	known := registeredNames(t)
	rf := loadRules(t)
	// Recording rules may use earlier recording rules (same or earlier group).
	alerts := 0
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			where := g.Name + "/" + r.Record + r.Alert
			requireKnownNames(t, where, r.Expr, known)
			if r.Record != "" {
				require.True(t, strings.HasPrefix(r.Record, "switchyard:"), "%s: recording rules are named switchyard:...", where)
				known[r.Record] = true
			} else {
				alerts++
			}
		}
	}
	require.GreaterOrEqual(t, alerts, 5, "no owner, degraded, rejection ratio, event lag and replica down alerts")
}

// grafanaVars replaces dashboard template variables with values that keep
// the query valid PromQL.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "5m", "$__interval", "1m", "$__range", "1h",
	"${model}", "x", "$model", "x", "${class}", "x", "$class", "x",
)

type grafanaPanel struct {
	ID         int                `json:"id"`
	Type       string             `json:"type"`
	Title      string             `json:"title"`
	Datasource map[string]string  `json:"datasource"`
	GridPos    struct{ W, X int } `json:"gridPos"`
	Targets    []map[string]any   `json:"targets"`
	Panels     []grafanaPanel     `json:"panels"`
}

type grafanaDashboard struct {
	UID        string         `json:"uid"`
	Title      string         `json:"title"`
	Panels     []grafanaPanel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string            `json:"name"`
			Definition string            `json:"definition"`
			Datasource map[string]string `json:"datasource"`
		} `json:"list"`
	} `json:"templating"`
}

func loadDashboards(t *testing.T) map[string]grafanaDashboard {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(grafanaDir, "dashboards", "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no dashboards in deploy/grafana/dashboards")
	out := map[string]grafanaDashboard{}
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		var d grafanaDashboard
		require.NoError(t, json.Unmarshal(b, &d), f)
		out[filepath.Base(f)] = d
	}
	return out
}

func flattenPanels(ps []grafanaPanel) []grafanaPanel {
	var out []grafanaPanel
	for _, p := range ps {
		out = append(out, p)
		out = append(out, flattenPanels(p.Panels)...)
	}
	return out
}

var labelValuesRE = regexp.MustCompile(`^label_values\((.+),\s*[a-zA-Z_]\w*\)$`)

func TestEveryDashboardQueryParsesAndNamesOnlyRegisteredMetrics(t *testing.T) {
	known := registeredNames(t)
	for _, g := range loadRules(t).Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				known[r.Record] = true
			}
		}
	}
	for file, d := range loadDashboards(t) {
		charted := map[string]bool{}
		ids := map[int]bool{}
		for _, p := range flattenPanels(d.Panels) {
			where := fmt.Sprintf("%s panel %d %q", file, p.ID, p.Title)
			require.False(t, ids[p.ID], "%s: duplicate panel id", where)
			ids[p.ID] = true
			require.LessOrEqual(t, p.GridPos.X+p.GridPos.W, 24, "%s: panel overflows the 24-column grid", where)
			if p.Type == "row" {
				continue
			}
			require.NotEmpty(t, p.Targets, "%s: panel has no query", where)
			for _, tg := range p.Targets {
				expr, _ := tg["expr"].(string)
				require.NotEmpty(t, expr, "%s: target without expr", where)
				for _, n := range requireKnownNames(t, where, grafanaVars.Replace(expr), known) {
					charted[n] = true
				}
			}
		}
		for _, v := range d.Templating.List {
			m := labelValuesRE.FindStringSubmatch(v.Definition)
			require.NotNil(t, m, "%s variable %s: expected label_values(selector, label)", file, v.Name)
			requireKnownNames(t, file+" variable "+v.Name, grafanaVars.Replace(m[1]), known)
		}
		if file != "switchyard.json" {
			continue
		}
		// The overview must chart what operators ask about first (issue 8).
		for _, want := range []string{
			NameAdmissionAdmitted, NameAdmissionRejected, NameQueueDepth, NameQueueWait + "_bucket",
			NameTTFT + "_bucket", NameITL + "_bucket", NameWorkerActiveRequests,
			"switchyard:kv_hit_ratio:ratio5m", "switchyard:predicted_kv_hit_ratio:ratio5m",
			"switchyard:class_owners:sum", NameClusterClassesOwned, NameGossipMembers, NameGossipHealthScore,
		} {
			require.True(t, charted[want], "%s charts no panel of %s", file, want)
		}
	}
}

func TestDashboardsUseTheProvisionedDatasource(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(grafanaDir, "provisioning", "datasources", "prometheus.yml"))
	require.NoError(t, err)
	var ds struct {
		Datasources []struct {
			UID  string `yaml:"uid"`
			Type string `yaml:"type"`
			URL  string `yaml:"url"`
		} `yaml:"datasources"`
	}
	require.NoError(t, yaml.Unmarshal(b, &ds))
	require.Len(t, ds.Datasources, 1)
	uid := ds.Datasources[0].UID
	require.Equal(t, "prometheus", ds.Datasources[0].Type)

	b, err = os.ReadFile(filepath.Join(grafanaDir, "provisioning", "dashboards", "switchyard.yml"))
	require.NoError(t, err)
	var prov struct {
		Providers []struct {
			Type    string `yaml:"type"`
			Options struct {
				Path string `yaml:"path"`
			} `yaml:"options"`
		} `yaml:"providers"`
	}
	require.NoError(t, yaml.Unmarshal(b, &prov))
	require.Len(t, prov.Providers, 1)
	require.Equal(t, "file", prov.Providers[0].Type)
	require.NotEmpty(t, prov.Providers[0].Options.Path)

	for file, d := range loadDashboards(t) {
		require.NotEmpty(t, d.UID, "%s: a fixed uid keeps links stable across re-provisioning", file)
		for _, p := range flattenPanels(d.Panels) {
			if p.Type == "row" {
				continue
			}
			require.Equal(t, uid, p.Datasource["uid"], "%s panel %q", file, p.Title)
		}
		for _, v := range d.Templating.List {
			require.Equal(t, uid, v.Datasource["uid"], "%s variable %s", file, v.Name)
		}
	}
}

func TestPrometheusConfigScrapesTheComposeDeployment(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(promDir, "prometheus.yml"))
	require.NoError(t, err)
	var cfg struct {
		RuleFiles     []string `yaml:"rule_files"`
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	require.NoError(t, yaml.Unmarshal(b, &cfg))
	require.Contains(t, cfg.RuleFiles, "rules.yml")
	targets := map[string][]string{}
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			targets[sc.JobName] = append(targets[sc.JobName], st.Targets...)
		}
	}
	// rules.yml's down alerts select these job names.
	require.ElementsMatch(t, []string{"router-1:8080", "router-2:8080", "router-3:8080"}, targets["switchyard-router"])
	var workers []string
	for i := 1; i <= 8; i++ {
		workers = append(workers, fmt.Sprintf("worker-%d:9000", i))
	}
	require.ElementsMatch(t, workers, targets["switchyard-worker"])
}

func TestPromtoolAcceptsTheConfigRulesAndRuleTests(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not on PATH (Debian: apt-get install prometheus); CI installs it and runs this test")
	}
	for _, args := range [][]string{
		{"check", "config", "prometheus.yml"},
		{"check", "rules", "rules.yml"},
		{"test", "rules", "rules_test.yml"},
	} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = promDir
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "promtool %s:\n%s", strings.Join(args, " "), out)
	}
}

func TestQueriedNamesFindsEverySelector(t *testing.T) {
	names, err := queriedNames(`sum(rate(a_total[5m])) / on() group_left {__name__="b"} + c`)
	require.NoError(t, err)
	slices.Sort(names)
	require.Equal(t, []string{"a_total", "b", "c"}, names)

	_, err = queriedNames(`sum(rate(a_total[5m])`)
	require.Error(t, err, "an unbalanced query must not pass as parsed")
}
