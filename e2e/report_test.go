package e2e

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

// scenarioReport is one scenario's line in the report printed after the run.
type scenarioReport struct {
	Name     string
	Sent     int
	Outcomes map[Outcome]int
	Failover string // time to settled ownership after the fault, or "-"
	Counts   string // router/worker counter deltas against the driver's
	Notes    []string
	Failed   bool
}

// collectedReports returns the reports of the scenarios that ran; the e2e
// build sets it (without the tag no scenario runs).
var collectedReports = func() []*scenarioReport { return nil }

// renderReport prints the scenarios' reports as a Markdown table plus notes.
func renderReport(rs []*scenarioReport) string {
	var b strings.Builder
	b.WriteString("| scenario | result | sent | outcomes | failover | counters |\n|---|---|---|---|---|---|\n")
	for _, r := range rs {
		res := "PASS"
		if r.Failed {
			res = "FAIL"
		}
		var oc []string
		for o, n := range r.Outcomes {
			oc = append(oc, fmt.Sprintf("%s=%d", o, n))
		}
		sort.Strings(oc)
		fmt.Fprintf(&b, "| %s | %s | %d | %s | %s | %s |\n", r.Name, res, r.Sent, strings.Join(oc, " "), r.Failover, r.Counts)
	}
	for _, r := range rs {
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s: %s\n", r.Name, n)
		}
	}
	return b.String()
}

func TestMain(m *testing.M) {
	code := m.Run()
	if rs := collectedReports(); len(rs) > 0 {
		out := "\n## e2e report\n\n" + renderReport(rs)
		fmt.Print(out)
		if path := os.Getenv("E2E_REPORT"); path != "" {
			if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
				fmt.Fprintf(os.Stderr, "write report: %v\n", err)
			}
		}
	}
	if code == 0 {
		// goleak.VerifyTestMain would call m.Run again; check the goroutines
		// of the run we already did instead.
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func TestTheReportHasOneRowPerScenarioAndListsItsNotes(t *testing.T) {
	out := renderReport([]*scenarioReport{
		{Name: "1 kill", Sent: 10, Outcomes: map[Outcome]int{OutcomeSuccess: 9, OutcomeTruncated: 1}, Failover: "4.2s", Counts: "c", Notes: []string{"killed router-1"}},
		{Name: "2 cut", Failed: true, Failover: "-"},
	})
	assert.Contains(t, out, "| 1 kill | PASS | 10 | success=9 truncated=1 | 4.2s | c |")
	assert.Contains(t, out, "| 2 cut | FAIL | 0 |  | - |  |")
	assert.Contains(t, out, "- 1 kill: killed router-1")
}
