package metrics

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"

	"github.com/switchyard/switchyard/metrics/deployref"
)

// These tests keep deploy/prometheus and deploy/grafana consistent with
// names.go: every query parses and names only metrics declared there (or
// recording rules, or Prometheus' own `up`). That a running replica really
// exports every one of them is internal/app's TestEveryMetricTheDeployConfigReadsIsExported.

var (
	deployDir  = filepath.Join("..", "deploy")
	promDir    = filepath.Join(deployDir, "prometheus")
	grafanaDir = filepath.Join(deployDir, "grafana")
)

// declaredNames returns the values of the Name* constants of names.go, and
// for each the _bucket, _sum and _count series a histogram of that name
// would have (the names alone do not say which are histograms; the running
// replica test checks the types).
func declaredNames(t *testing.T) map[string]bool {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "names.go", nil, 0)
	require.NoError(t, err)
	names := map[string]bool{"up": true}
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, spec := range gd.Specs {
			vs := spec.(*ast.ValueSpec)
			for i, id := range vs.Names {
				lit, ok := vs.Values[i].(*ast.BasicLit)
				if !strings.HasPrefix(id.Name, "Name") || id.Name == "Namespace" || !ok || lit.Kind != token.STRING {
					continue
				}
				v, err := strconv.Unquote(lit.Value)
				require.NoError(t, err)
				require.True(t, strings.HasPrefix(v, Namespace+"_"), "%s = %q lacks the namespace", id.Name, v)
				require.False(t, names[v], "%s = %q is declared twice", id.Name, v)
				names[v] = true
				for _, s := range []string{"_bucket", "_sum", "_count"} {
					names[v+s] = true
				}
			}
		}
	}
	require.Greater(t, len(names), 50, "names.go parsed to too few constants")
	return names
}

func TestEveryCollectorOfThisPackageIsNamedByAConstant(t *testing.T) {
	declared := declaredNames(t)
	reg := NewRegistry()
	adm := NewAdmission(reg)
	_, err := NewExporter(DefaultExporterConfig(), adm, reg, nil)
	require.NoError(t, err)
	for _, g := range []any{adm, NewRouter(reg)} {
		touchEveryVec(t, g)
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		n := mf.GetName()
		if strings.HasPrefix(n, "go_") || strings.HasPrefix(n, "process_") {
			continue
		}
		require.True(t, declared[n], "%s is registered but not declared in names.go", n)
	}
}

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

func loadRules(t *testing.T) deployref.RuleFile {
	t.Helper()
	rf, err := deployref.LoadRules(filepath.Join(deployDir, deployref.RulesFile))
	require.NoError(t, err)
	require.NotEmpty(t, rf.Groups)
	return rf
}

func loadDashboards(t *testing.T) map[string]deployref.Dashboard {
	t.Helper()
	ds, err := deployref.LoadDashboards(filepath.Join(deployDir, deployref.DashboardsDir))
	require.NoError(t, err)
	return ds
}

func requireKnownNames(t *testing.T, where, q string, known map[string]bool) []string {
	t.Helper()
	names, err := deployref.QueryNames(q)
	require.NoError(t, err, "%s: query does not parse:\n%s", where, q)
	require.NotEmpty(t, names, "%s: query selects no metric:\n%s", where, q)
	for _, n := range names {
		require.True(t, known[n], "%s: %q is neither declared in names.go nor a recording rule:\n%s", where, n, q)
	}
	return names
}

func TestEveryRuleParsesAndNamesOnlyDeclaredMetrics(t *testing.T) {
	known := declaredNames(t)
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

func TestEveryDashboardQueryParsesAndNamesOnlyDeclaredMetrics(t *testing.T) {
	known := declaredNames(t)
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
		for _, p := range deployref.FlattenPanels(d.Panels) {
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
				for _, n := range requireKnownNames(t, where, deployref.ExpandGrafanaVars(expr), known) {
					charted[n] = true
				}
			}
		}
		for _, v := range d.Templating.List {
			sel, ok := deployref.LabelValuesSelector(v.Definition)
			require.True(t, ok, "%s variable %s: expected label_values(selector, label)", file, v.Name)
			requireKnownNames(t, file+" variable "+v.Name, deployref.ExpandGrafanaVars(sel), known)
		}
		if file != "switchyard.json" {
			continue
		}
		// The overview must chart what operators ask about first: admissions,
		// rejections, queue depth and wait, TTFT, ITL and per-worker load.
		for _, want := range []string{
			NameAdmissionAdmitted, NameAdmissionRejected, NameQueueDepth, NameQueueWait + "_bucket",
			NameTTFT + "_bucket", NameITL + "_bucket", NameWorkerActiveRequests,
			NameCachedTokens, NamePredictedCachedTokens,
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
		for _, p := range deployref.FlattenPanels(d.Panels) {
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
