package scheduler

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestAGrantCarriesTheWorkersCalibratedTTFTPrediction(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), nil, classCfg("c", PolicyFCFS))
	m := DefaultTTFTModel()
	pred := m.prefillTime(4096, 0, 0)
	h.enqueue(req("a", "c", 4096))
	g := h.granted("a")
	require.InDelta(t, pred, float64(g.PredictedTTFT)/float64(time.Millisecond), 1e-3,
		"before any mark: the reference model's prediction")
	h.core.Finish(g.Booking)

	markFirstTokens(t, h, 200, 2, rand.New(rand.NewPCG(5, 5)))
	h.enqueue(req("b", "c", 4096))
	g = h.granted("b")
	want := float64(h.core.TTFTOverhead("w0"))/float64(time.Millisecond) + h.core.TTFTScale("w0")*pred
	require.InDelta(t, want, float64(g.PredictedTTFT)/float64(time.Millisecond), 1e-3,
		"after marks: the worker's overhead plus its scale times the prediction")
	require.Greater(t, g.PredictedTTFT, time.Duration(1.5*pred*float64(time.Millisecond)), "a worker twice as slow is predicted slower")
}

func TestAGrantOfTheBlocksSelectorCarriesNoTTFTPrediction(t *testing.T) {
	h := ttftHarness(t, workers(1, 0), func(c *Config) { c.Selector = SelectorBlocks }, classCfg("c", PolicyFCFS))
	h.enqueue(req("a", "c", 4096))
	require.Zero(t, h.granted("a").PredictedTTFT)
}
