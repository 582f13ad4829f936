package scheduler

import "fmt"

// Shortfall is why a routing decision's achieved cache hit (the chosen
// worker's cached prompt tokens) fell below the reachable one (the most any
// registered worker held). The zero value, ShortfallNone, means it did not.
type Shortfall int

// Shortfall reasons. String gives the metric label.
const (
	ShortfallNone Shortfall = iota
	// ShortfallLoad: the worker holding the deepest prefix was eligible and
	// below its cap, but its cost (queued prefill, decode blocks) or a busy
	// threshold of the class made another worker cheaper.
	ShortfallLoad
	// ShortfallCap: the worker holding the deepest prefix was at its
	// MaxRunning cap (local and remote bookings).
	ShortfallCap
	// ShortfallPinned: the request was pinned to another worker.
	ShortfallPinned
	// ShortfallAllowed: the worker holding the deepest prefix was outside
	// the request's allowed set (a client constraint, the model's workers,
	// or workers that already failed this request).
	ShortfallAllowed
)

// Shortfalls lists the reasons other than ShortfallNone, for metrics.
var Shortfalls = []Shortfall{ShortfallLoad, ShortfallCap, ShortfallPinned, ShortfallAllowed}

// String returns the snake_case label ("" for ShortfallNone).
func (s Shortfall) String() string {
	switch s {
	case ShortfallNone:
		return ""
	case ShortfallLoad:
		return "load"
	case ShortfallCap:
		return "cap"
	case ShortfallPinned:
		return "pinned"
	case ShortfallAllowed:
		return "allowed"
	}
	return fmt.Sprintf("shortfall(%d)", int(s))
}

// ParseShortfall is the inverse of String; unknown labels are an error.
func ParseShortfall(label string) (Shortfall, error) {
	if label == "" {
		return ShortfallNone, nil
	}
	for _, s := range Shortfalls {
		if s.String() == label {
			return s, nil
		}
	}
	return ShortfallNone, fmt.Errorf("%w: unknown shortfall %q", ErrInvalidConfig, label)
}

// routingQuality returns what r could have had cached (the deepest overlap
// of any registered worker, in tokens) and, when the chosen worker holds
// less (achieved), why the deepest holder was not chosen. It runs once per
// grant, off the selection loop: O(r's overlap reports).
func (c *Core) routingQuality(r *Request, achieved int) (int, Shortfall) {
	reachable, best := achieved, -1
	r.eachOverlap(func(w string, blocks int) {
		i, ok := c.workerIdx[w]
		if !ok {
			return
		}
		if t := r.cachedFromOverlap(blocks, c.workers[i].BlockSize); t > reachable {
			reachable, best = t, i
		}
	})
	if best < 0 {
		return achieved, ShortfallNone
	}
	s := &c.workers[best]
	switch {
	case r.Pinned != "":
		return reachable, ShortfallPinned
	case !r.Allows(s.ID):
		return reachable, ShortfallAllowed
	case s.maxRunning > 0 && s.projectLoad().ActiveRequests >= int(s.maxRunning):
		return reachable, ShortfallCap
	}
	return reachable, ShortfallLoad
}

// grantCandidates sets g's candidates: the decision's winner (slot idx)
// and the deepest other registered holders of r's prefix (ties by worker
// ID), at most MaxGrantCandidates in all, each with its predicted TTFT as
// it stands now (the winner's is the grant's). O(r's overlap reports) plus
// a prediction per candidate; it allocates nothing.
func (c *Core) grantCandidates(r *Request, idx int, g *Grant) {
	type holder struct {
		slot, tokens int
	}
	const others = MaxGrantCandidates - 1
	var top [others]holder
	n := 0
	better := func(a, b holder) bool {
		if a.tokens != b.tokens {
			return a.tokens > b.tokens
		}
		return c.workers[a.slot].ID < c.workers[b.slot].ID
	}
	r.eachOverlap(func(w string, blocks int) {
		i, ok := c.workerIdx[w]
		if !ok || i == idx || blocks <= 0 {
			return
		}
		h := holder{i, r.cachedFromOverlap(blocks, c.workers[i].BlockSize)}
		at := -1
		for k := range n {
			if top[k].slot == i { // a worker reported twice: its deepest counts
				if h.tokens <= top[k].tokens {
					return
				}
				at = k
				break
			}
		}
		if at < 0 {
			if n < others {
				at, n = n, n+1
			} else if better(h, top[n-1]) {
				at = n - 1
			} else {
				return
			}
		}
		top[at] = h
		for ; at > 0 && better(top[at], top[at-1]); at-- {
			top[at], top[at-1] = top[at-1], top[at]
		}
	})
	g.Candidates[0] = GrantCandidate{Worker: g.Worker, CachedTokens: g.CachedTokens, PredictedTTFT: g.PredictedTTFT}
	for k := range n {
		g.Candidates[k+1] = GrantCandidate{Worker: c.workers[top[k].slot].ID, CachedTokens: top[k].tokens, PredictedTTFT: c.ttftPeek(r, top[k].slot)}
	}
	g.NumCandidates = n + 1
}
