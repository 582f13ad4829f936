package bench

import (
	"image/png"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// requirePNG decodes the file and checks it is a real, non-empty image.
func requirePNG(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	require.NoError(t, err)
	defer f.Close()
	img, err := png.Decode(f)
	require.NoError(t, err, path)
	b := img.Bounds()
	assert.Greater(t, b.Dx(), 100, path)
	assert.Greater(t, b.Dy(), 100, path)
}

func TestPlotsAreWrittenAsDecodablePNGs(t *testing.T) {
	dir := t.TempDir()
	a := knownResults()
	for i := range a {
		a[i].Worker = []string{"w1", "w2"}[i%2]
	}
	b := knownResults()[:3]
	for i := range b {
		b[i].TTFT *= 2
	}
	runs := []RunResults{{Label: "kv-aware", Results: a}, {Label: "round-robin", Results: b}}

	require.NoError(t, PlotTTFTCDF(filepath.Join(dir, "cdf.png"), runs))
	require.NoError(t, PlotThroughput(filepath.Join(dir, "tput.png"), runs, 0))
	require.NoError(t, PlotThroughput(filepath.Join(dir, "tput-bucket.png"), runs, 500*time.Millisecond))
	require.NoError(t, PlotWorkerLoad(filepath.Join(dir, "workers.png"), a))
	require.NoError(t, PlotHitRateVsReplicas(filepath.Join(dir, "hit.png"), []HitRatePoint{
		{Series: "kv-aware", Replicas: 1, HitRate: 0.9}, {Series: "kv-aware", Replicas: 3, HitRate: 0.88},
		{Series: "approximate", Replicas: 3, HitRate: 0.7}, {Series: "approximate", Replicas: 1, HitRate: 0.9},
	}))
	for _, name := range []string{"cdf.png", "tput.png", "tput-bucket.png", "workers.png", "hit.png"} {
		requirePNG(t, filepath.Join(dir, name))
	}
}

func TestPlotsWithoutDataSayNothingToPlot(t *testing.T) {
	dir := t.TempDir()
	failed := []Result{{Index: 0, Outcome: OutcomeTimeout}}
	assert.ErrorIs(t, PlotTTFTCDF(filepath.Join(dir, "a.png"), []RunResults{{Label: "x", Results: failed}}), ErrNoPlotData)
	assert.ErrorIs(t, PlotThroughput(filepath.Join(dir, "b.png"), nil, 0), ErrNoPlotData)
	assert.ErrorIs(t, PlotWorkerLoad(filepath.Join(dir, "c.png"), nil), ErrNoPlotData)
	assert.ErrorIs(t, PlotHitRateVsReplicas(filepath.Join(dir, "d.png"), nil), ErrNoPlotData)
	_, err := os.Stat(filepath.Join(dir, "a.png"))
	assert.True(t, os.IsNotExist(err), "no empty file is left behind")
}

func TestWorkerLoadCountsNamedWorkersOrElseTargets(t *testing.T) {
	named := []Result{{Worker: "w1", Target: "http://r1"}, {Worker: "w1", Target: "http://r2"},
		{Worker: "w2", Target: "http://r2"}, {Target: "http://r1", Outcome: OutcomeHTTPError}}
	counts, title := workerLoad(named)
	assert.Equal(t, map[string]int{"w1": 2, "w2": 1}, counts)
	assert.Equal(t, "Requests per worker (1 more without a worker)", title)

	direct := []Result{{Target: "http://127.0.0.1:9001"}, {Target: "http://127.0.0.1:9002"}, {Target: "http://127.0.0.1:9001"}}
	counts, title = workerLoad(direct)
	assert.Equal(t, map[string]int{"127.0.0.1:9001": 2, "127.0.0.1:9002": 1}, counts)
	assert.Equal(t, "Requests per target", title)
}
