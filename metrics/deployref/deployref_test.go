package deployref

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestQueryNamesFindsEverySelector(t *testing.T) {
	names, err := QueryNames(`sum(rate(a_total[5m])) / on() group_left {__name__="b"} + c`)
	require.NoError(t, err)
	slices.Sort(names)
	require.Equal(t, []string{"a_total", "b", "c"}, names)

	_, err = QueryNames(`sum(rate(a_total[5m])`)
	require.Error(t, err, "an unbalanced query must not pass as parsed")
}

func TestQuerySelectorsReportTheLabelsEachSelectorMatches(t *testing.T) {
	sels, err := QuerySelectors(`sum by (x) (rate(a_total{class=~"x",model="m"}[5m])) / {__name__="b",kind!=""}`)
	require.NoError(t, err)
	require.Equal(t, []Selector{{Name: "a_total", Labels: []string{"class", "model"}}, {Name: "b", Labels: []string{"kind"}}}, sels)
}

func TestGrafanaVariablesExpandToValidPromQL(t *testing.T) {
	q := ExpandGrafanaVars(`rate(a_total{class=~"$class",model=~"${model}"}[$__rate_interval])`)
	require.Equal(t, `rate(a_total{class=~"x",model=~"x"}[5m])`, q)
	_, err := QueryNames(q)
	require.NoError(t, err)

	sel, ok := LabelValuesSelector(`label_values(a_total{model=~"$model"}, class)`)
	require.True(t, ok)
	require.Equal(t, `a_total{model=~"$model"}`, sel)
	_, ok = LabelValuesSelector(`query_result(a_total)`)
	require.False(t, ok, "only label_values variables are understood")
}

func TestQueriesCoverTheRulesAndEveryDashboard(t *testing.T) {
	qs, recorded, err := Queries(filepath.Join("..", "..", "deploy"))
	require.NoError(t, err)
	require.True(t, recorded["switchyard:class_owners:sum"], "recording rules are reported")
	var fromRules, fromDashboards int
	for _, q := range qs {
		_, err := QueryNames(q.Expr)
		require.NoError(t, err, "%s: %s", q.Where, q.Expr)
		if strings.HasPrefix(q.Where, "rules.yml ") {
			fromRules++
		} else {
			fromDashboards++
		}
	}
	require.NotZero(t, fromRules)
	require.NotZero(t, fromDashboards)
}
