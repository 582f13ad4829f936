package frontend

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"maps"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap/zaptest"

	"github.com/switchyard/switchyard/metrics"
)

// routeConstants returns the values of the Route* constants of
// metrics/names.go, the label values docs/metrics.md and dashboards rely on.
func routeConstants(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), filepath.Join("..", "metrics", "names.go"), nil, 0)
	require.NoError(t, err)
	var out []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		for i, id := range vs.Names {
			if !strings.HasPrefix(id.Name, "Route") || i >= len(vs.Values) {
				continue
			}
			lit, ok := vs.Values[i].(*ast.BasicLit)
			require.True(t, ok && lit.Kind == token.STRING, "%s is not a string literal", id.Name)
			v, err := strconv.Unquote(lit.Value)
			require.NoError(t, err)
			out = append(out, v)
		}
		return false
	})
	require.NotEmpty(t, out, "metrics/names.go declares no Route* constants")
	return out
}

// Every route label the frontend exports is a metrics.Route* constant, each
// served path has its own, and every constant is the label of some path: a
// stale or unused constant fails here. /metrics itself is not counted.
func TestEveryRouteConstantIsTheLabelOfAServedPath(t *testing.T) {
	reg := prometheus.NewRegistry()
	s, err := New(DefaultConfig(), Deps{Admitter: admitNever(t), Workers: staticWorkers{}, MetricsHandler: metrics.Handler(reg)},
		zaptest.NewLogger(t), reg)
	require.NoError(t, err)
	base := startServer(t, s)

	cases := []struct {
		method, path, route string
		status              int
	}{
		{http.MethodPost, "/v1/chat/completions", metrics.RouteChatCompletions, http.StatusBadRequest},
		{http.MethodPost, "/v1/completions", metrics.RouteCompletions, http.StatusBadRequest},
		{http.MethodPost, "/v1/embeddings", metrics.RouteEmbeddings, http.StatusBadRequest},
		{http.MethodPost, "/v1/responses", metrics.RouteResponses, http.StatusBadRequest},
		{http.MethodPost, "/v1/messages", metrics.RouteMessages, http.StatusBadRequest},
		{http.MethodPost, "/v1/messages/count_tokens", metrics.RouteMessagesCountTokens, http.StatusBadRequest},
		{http.MethodGet, "/v1/models", metrics.RouteModels, http.StatusOK},
		{http.MethodGet, "/healthz", metrics.RouteHealthz, http.StatusOK},
		{http.MethodGet, "/readyz", metrics.RouteReadyz, http.StatusOK},
		{http.MethodGet, "/debug/cluster", metrics.RouteDebugCluster, http.StatusNotFound},
		{http.MethodGet, "/wp-admin.php", metrics.RouteOther, http.StatusNotFound},
		{http.MethodGet, "/metrics", "", http.StatusOK},
	}
	want := map[string]string{} // route → "code"
	for _, c := range cases {
		req, err := http.NewRequest(c.method, base+c.path, strings.NewReader("{}"))
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		require.Equal(t, c.status, resp.StatusCode, "%s %s", c.method, c.path)
		if c.route != "" {
			want[c.route] = strconv.Itoa(c.status)
		}
	}

	got := map[string]string{}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != metrics.NameHTTPResponses {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			require.Equal(t, 1.0, m.GetCounter().GetValue(), "%v", labels)
			got[labels[metrics.LabelRoute]] = labels[metrics.LabelCode]
		}
	}
	require.Equal(t, want, got, "each path counts under its own route label; /metrics is not counted")
	require.ElementsMatch(t, routeConstants(t), slices.Collect(maps.Keys(want)), "metrics/names.go declares exactly the route labels the frontend exports")
}
