package bench

import (
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/clock"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// sharedTrace returns the path of a public trace in ../shared/traces next to
// the module root, or skips the test when the traces are not checked out.
func sharedTrace(tb testing.TB, name string) string {
	tb.Helper()
	dir, err := os.Getwd()
	if err != nil {
		tb.Fatalf("getwd: %v", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			tb.Skipf("module root (go.mod) not found above the test directory; cannot locate ../shared/traces/%s", name)
		}
		dir = parent
	}
	path := filepath.Join(dir, "..", "shared", "traces", name)
	if _, err := os.Stat(path); err != nil {
		tb.Skipf("public trace %s not present (%v); the testdata readers tests cover the format", path, err)
	}
	return path
}

// newFakeClock is the shared fake clock, read by the runner and advanced by
// the test; its Deadlines are the runner's wake-up times.
func newFakeClock() *clock.Fake {
	return clock.NewFake(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

func itoa(n int) string { return strconv.Itoa(n) }
