package app

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEnginesGroupADataParallelEnginesRanksInRankOrderAndLeaveOtherWorkersAlone(t *testing.T) {
	w := func(id, url string, rank, size int) workerDoc {
		return workerDoc{ID: id, URL: url, Engine: engineOf(id, rank, size), DPRank: rank, DPSize: size}
	}
	ws := []workerDoc{
		w("a", "http://a", 0, 0),
		w("e-dp1", "http://e", 1, 2),
		w("e-dp0", "http://e", 0, 2),
		w("odd", "http://o", 1, 2),   // a rank whose id does not follow <engine>-dp<r>
		w("x-dp0", "http://x", 0, 1), // dp size 1: not a rank, whatever its id
	}
	assert.Equal(t, []engineDoc{
		{ID: "a", URL: "http://a", Ranks: []string{"a"}},
		{ID: "e", URL: "http://e", DPSize: 2, Ranks: []string{"e-dp0", "e-dp1"}},
		{ID: "odd", URL: "http://o", DPSize: 2, Ranks: []string{"odd"}},
		{ID: "x-dp0", URL: "http://x", DPSize: 1, Ranks: []string{"x-dp0"}},
	}, groupEngines(ws))
}
