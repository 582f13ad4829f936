package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/prometheus/promql/parser"
	"github.com/stretchr/testify/require"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics/deployref"
	"github.com/switchyard/switchyard/tenant"
	"github.com/switchyard/switchyard/wire"
)

// The dashboards test runs the shipped deploy/ files against the real thing:
// a `switchyard up` cluster (RunUp, in process, simulated workers) under
// load, scraped by Debian's `prometheus` with deploy/prometheus/rules.yml
// loaded and the job names deploy/prometheus/prometheus.yml uses. Every
// panel query of every dashboard and every rule expression must return data
// through Prometheus' HTTP API: a panel that is empty under load is a
// failure naming the panel.
//
// What "returns data" means: at least one sample that is not NaN. A NaN is
// what Grafana draws as nothing (0/0 ratios, histogram_quantile of no
// observations), so it counts as empty. A zero is data: a rejection ratio of
// 0 is the healthy answer.
//
// Alerts: their condition is a fault (a worker down, a class without an
// owner, a high rejection ratio) and is false on a healthy cluster, so the
// alert expression itself returns nothing by design. The test parses each
// alert expression and, when it is a comparison of a query with a number
// (`X == 0`, `X > 0.1`), evaluates X: the value the threshold is applied to
// must exist, or the alert could never fire (a misspelt metric, label or job
// name makes X empty). That the thresholds fire when they should is
// deploy/prometheus/rules_test.yml's job (promtool, metrics/deploy_test.go).
// An alert expression of another shape is evaluated whole.
//
// Dashboard variables are expanded three ways. Grafana's own ($__rate_interval,
// $__interval, $__range) become windows that cover the whole test. Every
// query variable is resolved the way Grafana does, by asking Prometheus for
// the label values of its definition, and must list the values the load
// used. Then every panel runs with every variable at "All", and again with
// the model variable at each model in turn: that pass is the one that failed
// when admission series carried model="any" and the others the real name.
// Separately, every selector of every panel must filter on each variable's
// label whenever the series it selects carry that label, so a variable never
// leaves a panel unfiltered (checked against the series Prometheus holds,
// not a list kept by hand).

const (
	dashModelA = "switchyard-sim"   // the simulated workers' model (DefaultWorkerConfig)
	dashModelB = "switchyard-sim-b" // a second name the same workers serve (-served-model-names)
)

var dashClasses = []string{"interactive", "batch", "realtime"} // default_policy.yaml

func TestEveryDashboardPanelAndRuleReturnsDataUnderLoad(t *testing.T) {
	if _, err := exec.LookPath("prometheus"); err != nil {
		t.Skip("prometheus binary not on PATH (Debian: apt-get install prometheus; .ci/run installs it): the dashboards test needs a real Prometheus")
	}
	deployDir, err := filepath.Abs(filepath.Join("..", "..", "deploy"))
	require.NoError(t, err)

	// Two tenants: one that may use every class and model, and one with a
	// quota of two requests a minute, whose later requests are rejected by
	// the class owner (429 quota_exceeded): the rejection panels need some.
	const openKey = "sk-dash-open-0123456789abcdef0123456789abcdef"
	const cappedKey = "sk-dash-capped-0123456789abcdef0123456789abcd"
	const adminKey = "sk-dash-admin-0123456789abcdef0123456789abcde" // Prometheus': /metrics shares the API listener
	keys := filepath.Join(t.TempDir(), "keys.yaml")
	require.NoError(t, os.WriteFile(keys, []byte(`tenants:
  - id: open
    keys: [`+tenant.HashKey(openKey)+`]
    classes: [interactive, batch, realtime]
  - id: capped
    keys: [`+tenant.HashKey(cappedKey)+`]
    quota: {requests_per_minute: 2}
admins:
  - id: prometheus
    keys: [`+tenant.HashKey(adminKey)+`]
`), 0o600))

	cfg := upTestConfig(t, 2, 3)
	cfg.Worker.Models = []string{dashModelB}
	cfg.Replica.Tenants.KeysFile = keys
	up := startUpRun(t, cfg)
	apis, etcdURL := readUpBanner(t, up)
	up.drain()
	t.Cleanup(func() { up.stop(t) }) // after Prometheus' cleanup (LIFO), so its last scrape finds the cluster
	workers := registeredWorkerURLs(t, etcdURL, cfg.Replica.Cluster, cfg.Workers)

	prom := testenv.StartPrometheusJobs(t, []testenv.PrometheusJob{
		{Name: "switchyard-router", Targets: apis, BearerToken: adminKey},
		{Name: "switchyard-worker", Targets: workers},
	}, []string{filepath.Join(deployDir, "prometheus", "rules.yml")}, 2*time.Second)
	// Every 2 s, not faster: the scrape timeout equals the interval, and a
	// router's /metrics under -race on two busy cores can take over 500 ms;
	// one failed scrape marks every gauge of the target stale, and the
	// panels reading them are empty until the next one.
	api := promAPI{base: prom.URL, client: &http.Client{Timeout: 10 * time.Second}}

	ctx, stopLoad := context.WithCancel(testenv.Context(t))
	var wg sync.WaitGroup
	load := newDashLoad(apis, openKey, cappedKey)
	for g := range 3 {
		wg.Go(func() { load.run(ctx, g) })
	}
	defer func() { stopLoad(); wg.Wait() }()

	rf, err := deployref.LoadRules(filepath.Join(deployDir, deployref.RulesFile))
	require.NoError(t, err)
	dashboards, err := deployref.LoadDashboards(filepath.Join(deployDir, deployref.DashboardsDir))
	require.NoError(t, err)
	checks := dashboardChecks(t, dashboards, rf)
	t.Logf("%d panel targets and %d rules to evaluate", checks.targets, len(checks.rules))

	// Poll until everything has data: counters need two scrapes for a rate,
	// and recording rules an evaluation after that.
	var failures missingList
	testenv.Eventually(t, 75*time.Second, func() bool {
		failures = checks.run(ctx, api)
		if len(failures) > 0 {
			time.Sleep(time.Second) // polling Prometheus' observable state; each round is ~300 queries
		}
		return len(failures) == 0
	}, "queries of deploy/ that return no data under load (last round):\n  %v", &failures)
	sent, failed := load.counts()
	t.Logf("load: %d requests sent, %d not 200 (the capped tenant's 429s)", sent, failed)

	// The variables must filter every panel they should.
	filterProblems := checks.unfiltered(ctx, t, api)
	require.Empty(t, filterProblems, "panels whose series carry a variable's label but do not filter on it:\n  %s",
		strings.Join(filterProblems, "\n  "))
}

// readUpBanner reads up's banner until the last line before the status: the
// replicas' API addresses and the embedded etcd URL.
func readUpBanner(t *testing.T, up *upRun) (apis []string, etcdURL string) {
	t.Helper()
	endpoint := regexp.MustCompile(`OpenAI API  http://(\S+)/v1`)
	etcd := regexp.MustCompile(`embedded etcd (\S+), NATS`)
	for up.lines.Scan() {
		line := up.lines.Text()
		if m := endpoint.FindStringSubmatch(line); m != nil {
			apis = append(apis, m[1])
		}
		if m := etcd.FindStringSubmatch(line); m != nil {
			etcdURL = m[1]
		}
		if strings.HasPrefix(line, "Ctrl-C stops") {
			break
		}
	}
	require.NotEmpty(t, apis, "up printed no API address")
	require.NotEmpty(t, etcdURL, "up printed no etcd URL")
	return apis, etcdURL
}

// registeredWorkerURLs lists the workers' URLs from their etcd registrations
// (up picks their ports and prints only the routers').
func registeredWorkerURLs(t *testing.T, etcdURL, cluster string, want int) []string {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{etcdURL}, DialTimeout: 5 * time.Second})
	require.NoError(t, err)
	defer cli.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, wire.NewKeys(cluster).Workers(), clientv3.WithPrefix())
	require.NoError(t, err)
	var urls []string
	for _, kv := range resp.Kvs {
		info, err := wire.DecodeWorkerInfo(kv.Value)
		require.NoError(t, err)
		urls = append(urls, info.URL)
	}
	require.Len(t, urls, want, "up announces itself once every worker is registered")
	return urls
}

// dashLoad is the traffic: both model names, every class, streams and plain
// completions, a long prefix shared per model (KV hits, reachable and
// achieved cache) beside unique prompts, and a capped tenant over its quota.
type dashLoad struct {
	apis              []string
	openKey, capped   string
	client            *http.Client
	mu                sync.Mutex
	sent, notOK, next int
}

func newDashLoad(apis []string, openKey, capped string) *dashLoad {
	return &dashLoad{apis: apis, openKey: openKey, capped: capped, client: &http.Client{Timeout: 30 * time.Second}}
}

func (l *dashLoad) counts() (sent, notOK int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sent, l.notOK
}

// run sends requests one after another until ctx ends (the test is done).
func (l *dashLoad) run(ctx context.Context, g int) {
	for ctx.Err() == nil {
		l.mu.Lock()
		i := l.next
		l.next++
		l.mu.Unlock()
		model := []string{dashModelA, dashModelB}[i%2]
		class := dashClasses[(i/2)%len(dashClasses)]
		key := l.openKey
		if i%7 == 6 {
			key = l.capped // its own default class; over quota after two
			class = ""
		}
		prompt := fmt.Sprintf("unique request %d of loader %d", i, g)
		if i%3 != 0 {
			prompt = strings.Repeat("a long prefix every request of "+model+" shares ", 40) + strconv.Itoa(i%5)
		}
		body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": 4, "stream": (i/2)%2 == 1})
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+l.apis[i%len(l.apis)]+"/v1/completions", strings.NewReader(string(body)))
		if err != nil {
			return
		}
		req.Header.Set("content-type", "application/json")
		req.Header.Set("authorization", "Bearer "+key)
		if class != "" {
			req.Header.Set("x-switchyard-class", class)
		}
		resp, err := l.client.Do(req)
		ok := false
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			_ = resp.Body.Close()
			ok = resp.StatusCode == http.StatusOK
		}
		if ctx.Err() != nil {
			return
		}
		l.mu.Lock()
		l.sent++
		if !ok {
			l.notOK++
		}
		l.mu.Unlock()
	}
}

// promAPI is the part of Prometheus' HTTP API the test reads.
type promAPI struct {
	base   string
	client *http.Client
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

func (p promAPI) get(ctx context.Context, path string, q url.Values, into any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.base+path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return fmt.Errorf("HTTP %d: %w", resp.StatusCode, err)
	}
	if body.Status != "success" {
		return errors.New(body.Error)
	}
	return json.Unmarshal(body.Data, into)
}

// query runs an instant query and returns its vector (a scalar as one
// sample without labels).
func (p promAPI) query(ctx context.Context, q string) ([]promSample, error) {
	var data struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get(ctx, "/api/v1/query", url.Values{"query": {q}}, &data); err != nil {
		return nil, err
	}
	switch data.ResultType {
	case "vector":
		var v []promSample
		return v, json.Unmarshal(data.Result, &v)
	case "scalar":
		var s [2]any
		if err := json.Unmarshal(data.Result, &s); err != nil {
			return nil, err
		}
		return []promSample{{Value: s}}, nil
	}
	return nil, fmt.Errorf("result type %s", data.ResultType)
}

// labelValues is what Grafana's label_values(selector, label) lists.
func (p promAPI) labelValues(ctx context.Context, selector, label string) ([]string, error) {
	var vs []string
	err := p.get(ctx, "/api/v1/label/"+label+"/values", url.Values{"match[]": {selector}}, &vs)
	return vs, err
}

// seriesLabels is the union of the label names of the series name selects.
func (p promAPI) seriesLabels(ctx context.Context, name string) (map[string]bool, error) {
	var series []map[string]string
	if err := p.get(ctx, "/api/v1/series", url.Values{"match[]": {name}}, &series); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, s := range series {
		for l := range s {
			out[l] = true
		}
	}
	return out, nil
}

// hasData reports whether some sample is a number other than NaN.
func hasData(samples []promSample) bool {
	for _, s := range samples {
		str, _ := s.Value[1].(string)
		if v, err := strconv.ParseFloat(str, 64); err == nil && !math.IsNaN(v) {
			return true
		}
	}
	return false
}

// dashVariable is a dashboard query variable: label_values(selector, label).
type dashVariable struct {
	name, selector, label string
}

type dashTarget struct {
	where, expr string // expr with the dashboard's $variables still in it
}

type dashRule struct {
	where, expr string
}

type dashChecks struct {
	vars    map[string][]dashVariable // by dashboard file
	panels  map[string][]dashTarget   // by dashboard file
	rules   []dashRule
	targets int
}

var labelValuesDef = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_]\w*)\)$`)

// dashboardChecks lists what the test evaluates: every panel target, every
// variable and every rule (alerts reduced to the value they compare).
func dashboardChecks(t *testing.T, dashboards map[string]deployref.Dashboard, rf deployref.RuleFile) dashChecks {
	t.Helper()
	c := dashChecks{vars: map[string][]dashVariable{}, panels: map[string][]dashTarget{}}
	for file, d := range dashboards {
		for _, v := range d.Templating.List {
			m := labelValuesDef.FindStringSubmatch(v.Definition)
			require.NotNil(t, m, "%s variable %s: expected label_values(selector, label)", file, v.Name)
			c.vars[file] = append(c.vars[file], dashVariable{name: v.Name, selector: m[1], label: m[2]})
		}
		for _, p := range deployref.FlattenPanels(d.Panels) {
			for i, tg := range p.Targets {
				expr, _ := tg["expr"].(string)
				if expr == "" {
					continue
				}
				c.panels[file] = append(c.panels[file], dashTarget{where: fmt.Sprintf("%s panel %d %q target %d", file, p.ID, p.Title, i+1), expr: expr})
				c.targets++
			}
		}
	}
	for _, g := range rf.Groups {
		for _, r := range g.Rules {
			if r.Record != "" {
				c.rules = append(c.rules, dashRule{where: "rules.yml record " + r.Record, expr: r.Expr},
					// The recorded series: Prometheus evaluated the rule.
					dashRule{where: "rules.yml recorded series " + r.Record, expr: r.Record})
				continue
			}
			c.rules = append(c.rules, dashRule{where: "rules.yml alert " + r.Alert, expr: alertValue(t, r.Alert, r.Expr)})
		}
	}
	require.NotEmpty(t, c.targets, "no panel targets in deploy/grafana/dashboards")
	return c
}

// alertValue returns what an alert's threshold compares: for `X op N` or
// `N op X` with a comparison op, X; otherwise the whole expression.
func alertValue(t *testing.T, alert, expr string) string {
	t.Helper()
	e, err := parser.NewParser(parser.Options{}).ParseExpr(expr)
	require.NoError(t, err, "alert %s", alert)
	for {
		p, ok := e.(*parser.ParenExpr)
		if !ok {
			break
		}
		e = p.Expr
	}
	b, ok := e.(*parser.BinaryExpr)
	if !ok || !b.Op.IsComparisonOperator() {
		return expr
	}
	if _, num := b.RHS.(*parser.NumberLiteral); num {
		return b.LHS.String()
	}
	if _, num := b.LHS.(*parser.NumberLiteral); num {
		return b.RHS.String()
	}
	return expr
}

// grafanaWindows stand in for Grafana's interval variables: windows longer
// than the test, so every rate sees all of its load.
var grafanaWindows = strings.NewReplacer("$__rate_interval", "5m", "$__interval", "15s", "$__range", "5m")

// expand replaces grafana's windows and each variable by its regex value.
func expand(expr string, values map[string]string) string {
	expr = grafanaWindows.Replace(expr)
	names := make([]string, 0, len(values))
	for n := range values {
		names = append(names, n)
	}
	sort.Slice(names, func(i, j int) bool { return len(names[i]) > len(names[j]) }) // $class before $c
	for _, n := range names {
		expr = strings.ReplaceAll(expr, "${"+n+"}", values[n])
		expr = strings.ReplaceAll(expr, "$"+n, values[n])
	}
	return expr
}

// run evaluates everything once and returns what returned no data.
func (c dashChecks) run(ctx context.Context, api promAPI) missingList {
	var out missingList
	for _, r := range c.rules {
		got, err := api.query(ctx, r.expr)
		switch {
		case err != nil:
			out = append(out, fmt.Sprintf("%s: %v: %s", r.where, err, r.expr))
		case !hasData(got):
			out = append(out, fmt.Sprintf("%s: no data: %s", r.where, r.expr))
		}
	}
	files := make([]string, 0, len(c.panels))
	for f := range c.panels {
		files = append(files, f)
	}
	sort.Strings(files)
	for _, file := range files {
		// Resolve the variables in order, each against the ones before at All.
		all := map[string]string{}
		options := map[string][]string{}
		for _, v := range c.vars[file] {
			vals, err := api.labelValues(ctx, expand(v.selector, all), v.label)
			if err != nil || len(vals) == 0 {
				out = append(out, fmt.Sprintf("%s variable %s lists nothing (%v): %s", file, v.name, err, v.selector))
			}
			options[v.name] = vals
			all[v.name] = ".*" // the dashboards' allValue
		}
		out = append(out, variableCoverage(file, options)...)
		passes := []map[string]string{all}
		for _, m := range options["model"] {
			one := cloneValues(all)
			one["model"] = regexp.QuoteMeta(m)
			passes = append(passes, one)
		}
		for _, values := range passes {
			for _, tg := range c.panels[file] {
				q := expand(tg.expr, values)
				got, err := api.query(ctx, q)
				switch {
				case err != nil:
					out = append(out, fmt.Sprintf("%s (%s): %v: %s", tg.where, describe(values), err, q))
				case !hasData(got):
					out = append(out, fmt.Sprintf("%s (%s): no data: %s", tg.where, describe(values), q))
				}
			}
		}
	}
	if len(out) > 0 {
		// Say whether a scrape failed: that empties every gauge of its target.
		if up, err := api.query(ctx, "up"); err == nil {
			for _, u := range up {
				out = append(out, fmt.Sprintf("(scrape health) up{job=%q,instance=%q} = %v", u.Metric["job"], u.Metric["instance"], u.Value[1]))
			}
		}
	}
	return out
}

// variableCoverage fails a model variable that does not list exactly the
// models the load used, and a class variable missing a class it used.
func variableCoverage(file string, options map[string][]string) []string {
	var out []string
	if got, ok := options["model"]; ok {
		want := []string{dashModelA, dashModelB}
		if g := slices.Sorted(slices.Values(got)); !slices.Equal(g, want) {
			out = append(out, fmt.Sprintf("%s variable model lists %v, want the request models %v", file, g, want))
		}
	}
	if got, ok := options["class"]; ok {
		for _, c := range dashClasses {
			if !slices.Contains(got, c) {
				out = append(out, fmt.Sprintf("%s variable class lists %v, missing %s", file, got, c))
			}
		}
	}
	return out
}

func cloneValues(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func describe(values map[string]string) string {
	var parts []string
	for k, v := range values {
		if v != ".*" {
			parts = append(parts, k+"="+v)
		}
	}
	if len(parts) == 0 {
		return "all variables at All"
	}
	sort.Strings(parts)
	return strings.Join(parts, ", ")
}

// varSentinel marks where a variable was in an expression, so the parsed
// matchers show which label each variable filters.
func varSentinel(name string) string { return "__dashboard_variable_" + name + "__" }

// unfiltered lists the panel selectors whose series (as Prometheus holds
// them) carry a variable's label while the selector does not match that
// label against the variable.
func (c dashChecks) unfiltered(ctx context.Context, t *testing.T, api promAPI) []string {
	t.Helper()
	labelsOf := map[string]map[string]bool{}
	var out []string
	for file, targets := range c.panels {
		sentinels := map[string]string{}
		for _, v := range c.vars[file] {
			sentinels[v.name] = varSentinel(v.name)
		}
		for _, tg := range targets {
			e, err := parser.NewParser(parser.Options{}).ParseExpr(expand(tg.expr, sentinels))
			require.NoError(t, err, "%s: %s", tg.where, tg.expr)
			parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
				vs, ok := n.(*parser.VectorSelector)
				if !ok {
					return nil
				}
				have, ok := labelsOf[vs.Name]
				if !ok {
					have, err = api.seriesLabels(ctx, vs.Name)
					require.NoError(t, err, "series of %s", vs.Name)
					labelsOf[vs.Name] = have
				}
				for _, v := range c.vars[file] {
					if !have[v.label] {
						continue
					}
					filtered := false
					for _, m := range vs.LabelMatchers {
						filtered = filtered || (m.Name == v.label && strings.Contains(m.Value, varSentinel(v.name)))
					}
					if !filtered {
						out = append(out, fmt.Sprintf("%s: %s has label %s but the selector does not filter on $%s", tg.where, vs.Name, v.label, v.name))
					}
				}
				return nil
			})
		}
	}
	sort.Strings(out)
	return out
}
