package app

import (
	"fmt"
	"net/http"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/metrics/deployref"
)

// neededSeries is what one metric name must show on /metrics for the deploy
// configuration to read it: the name, the label names its selectors match
// on, and where it is read (for the failure message).
type neededSeries struct {
	labels map[string]bool
	where  []string
}

// deployNeeds collects every metric name the rules and dashboards select,
// except recording rules and Prometheus' own `up`. Labels Prometheus adds
// at scrape time (job, instance) are not required of the exporter.
func deployNeeds(t *testing.T) map[string]*neededSeries {
	t.Helper()
	qs, recorded, err := deployref.Queries(filepath.Join("..", "..", "deploy"))
	require.NoError(t, err)
	require.NotEmpty(t, qs)
	need := map[string]*neededSeries{}
	for _, q := range qs {
		sels, err := deployref.QuerySelectors(q.Expr)
		require.NoError(t, err, "%s: %s", q.Where, q.Expr)
		for _, s := range sels {
			if recorded[s.Name] || s.Name == "up" {
				continue
			}
			n := need[s.Name]
			if n == nil {
				n = &neededSeries{labels: map[string]bool{}}
				need[s.Name] = n
			}
			n.where = append(n.where, q.Where)
			for _, l := range s.Labels {
				if l != "job" && l != "instance" {
					n.labels[l] = true
				}
			}
		}
	}
	return need
}

// scrape reads one /metrics endpoint over HTTP and parses the text format.
func scrape(url string) (map[string]*dto.MetricFamily, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(resp.Body)
}

// exported reports whether name, as a query selects it, is on one of the
// scraped endpoints with every label in labels on some series. A histogram
// family x answers for x_bucket, x_sum and x_count (the bucket's le is part
// of the histogram, not a label).
func exported(scrapes []map[string]*dto.MetricFamily, name string, labels map[string]bool) bool {
	family, hist := name, false
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, s); ok {
			family, hist = base, true
		}
	}
	for _, fams := range scrapes {
		for _, fn := range []string{name, family} {
			mf := fams[fn]
			if mf == nil || (fn != name && (!hist || mf.GetType() != dto.MetricType_HISTOGRAM)) {
				continue
			}
			for _, m := range mf.GetMetric() {
				have := map[string]bool{}
				for _, lp := range m.GetLabel() {
					have[lp.GetName()] = true
				}
				all := true
				for l := range labels {
					all = all && have[l]
				}
				if all {
					return true
				}
			}
		}
	}
	return false
}

// missingList prints itself when formatted, so a timeout message shows the
// last poll's list.
type missingList []string

func (m *missingList) String() string { return strings.Join(*m, "\n  ") }

// TestEveryMetricTheDeployConfigReadsIsExported is the ground truth behind
// deploy/prometheus/rules.yml and the Grafana dashboards: a real cluster
// (embedded etcd and NATS, two router replicas, two simulated workers)
// serves some traffic, including a class handoff, streams and a repeated
// prompt, and then every metric name a rule or dashboard query selects
// must be on some replica's or worker's /metrics, with the labels the
// query matches on. A rule reading a series nobody exports can never fire.
func TestEveryMetricTheDeployConfigReadsIsExported(t *testing.T) {
	need := deployNeeds(t)

	c := newTestCluster(t, 2)
	r1 := c.startReplica("r1")
	c.waitOwned(defaultClasses, "r1")
	require.EqualValues(t, 6, sendLoad(t, []*runningReplica{r1}, 6), "every request on one replica succeeds")

	// A second replica joins: r1 hands it the classes rendezvous hashing
	// places there (ownership losses with reason handoff on r1).
	r2 := c.startReplica("r2")
	c.waitPlaced(defaultClasses, "r1", "r2")
	require.NotEmpty(t, r2.status.Owned(), "the joining replica took over a class, so a handoff happened")
	replicas := []*runningReplica{r1, r2}
	require.EqualValues(t, 12, sendLoad(t, replicas, 12), "every request on two replicas succeeds")

	ctx := testenv.Context(t)
	for _, r := range replicas {
		cl := r.client()
		// A stream: time to first token and inter-token latency.
		stream := cl.Completions.NewStreaming(ctx, openai.CompletionNewParams{
			Model:         openai.CompletionNewParamsModel(testModel),
			Prompt:        openai.CompletionNewParamsPromptUnion{OfString: openai.String("stream a few tokens via " + r.status.ID)},
			MaxTokens:     openai.Int(4),
			StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
		})
		for stream.Next() {
		}
		require.NoError(t, stream.Err(), "stream via %s", r.status.ID)
		// The same long prompt twice: the second is predicted (and found)
		// in a worker's prefix cache.
		prompt := strings.Repeat("the same long shared prefix "+r.status.ID+" ", 60)
		for range 2 {
			_, err := cl.Completions.New(ctx, openai.CompletionNewParams{
				Model:     openai.CompletionNewParamsModel(testModel),
				Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String(prompt)},
				MaxTokens: openai.Int(2),
			}, option.WithHeader("x-switchyard-class", "interactive"))
			require.NoError(t, err, "repeated prompt via %s", r.status.ID)
		}
	}

	var urls []string
	for _, r := range replicas {
		urls = append(urls, "http://"+r.status.HTTPAddr+"/metrics")
	}
	for _, w := range c.workers {
		urls = append(urls, w.url+"/metrics")
	}
	names := make([]string, 0, len(need))
	for n := range need {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("%d metric names read by deploy/: %s", len(names), strings.Join(names, " "))

	// Gauges and the admission counters reach /metrics on the replicas'
	// publish ticks, so poll until everything is there.
	var missing missingList
	testenv.Eventually(t, 20*time.Second, func() bool {
		scrapes := make([]map[string]*dto.MetricFamily, 0, len(urls))
		for _, u := range urls {
			fams, err := scrape(u)
			require.NoError(t, err, "scrape %s", u)
			scrapes = append(scrapes, fams)
		}
		missing = missing[:0]
		for _, n := range names {
			if !exported(scrapes, n, need[n].labels) {
				labels := make([]string, 0, len(need[n].labels))
				for l := range need[n].labels {
					labels = append(labels, l)
				}
				slices.Sort(labels)
				missing = append(missing, fmt.Sprintf("%s%v, read by %s", n, labels, strings.Join(slices.Compact(need[n].where), "; ")))
			}
		}
		return len(missing) == 0
	}, "metrics read by deploy/ but exported by no replica or worker (name[labels], readers):\n  %v", &missing)
}
