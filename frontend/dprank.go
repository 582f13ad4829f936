package frontend

import (
	"net/http"
	"strconv"
)

// HeaderDPRank pins the data-parallel rank of a vLLM engine run with
// --data-parallel-size: its API server hands the request to that rank's
// engine core instead of choosing one itself.
const HeaderDPRank = "X-data-parallel-rank"

// noteRank records w's rank when w is one rank of a data-parallel engine:
// each rank registers as a worker of its own at the engine's one URL (the
// adapter's -dp-rank), and the router's choice of worker is a choice of
// rank only if the request says which.
func (rt *routing) noteRank(w *WorkerEntry) {
	if w.DPSize <= 1 {
		return
	}
	if rt.ranks == nil {
		rt.ranks = map[string]int{}
	}
	rt.ranks[w.ID] = w.DPRank
}

// pinRank sets the rank header on req when the granted worker is a rank.
func (x *exchange) pinRank(req *http.Request, worker string) {
	if r, ok := x.ranks[worker]; ok {
		req.Header.Set(HeaderDPRank, strconv.Itoa(r))
	}
}
