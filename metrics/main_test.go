package metrics

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/ from the current output")

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// requireGolden compares the named metric families gathered from reg with
// testdata/<file>. With -update it rewrites the file first; review the diff.
func requireGolden(t *testing.T, reg prometheus.Gatherer, file string, names ...string) {
	t.Helper()
	path := filepath.Join("testdata", file)
	if *update {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		var buf bytes.Buffer
		enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
		for _, mf := range mfs {
			if slices.Contains(names, mf.GetName()) {
				require.NoError(t, enc.Encode(mf))
			}
		}
		require.NoError(t, os.WriteFile(path, buf.Bytes(), 0o644))
	}
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	require.NoError(t, testutil.GatherAndCompare(reg, f, names...))
}
