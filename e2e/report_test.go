package e2e

import (
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"

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

var (
	reportMu sync.Mutex
	reports  []*scenarioReport
)

func addReport(r *scenarioReport) {
	reportMu.Lock()
	defer reportMu.Unlock()
	reports = append(reports, r)
}

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
	if len(reports) > 0 {
		out := "\n## e2e report\n\n" + renderReport(reports)
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
