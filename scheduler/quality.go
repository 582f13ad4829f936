package scheduler

import (
	"fmt"
	"slices"
	"strings"
)

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

// grantCandidates lists the decision's winner (slot idx, granted g) and the
// deepest other registered holders of r's prefix (ties by worker ID), at
// most MaxGrantCandidates in all, each with its predicted TTFT as it stands
// now (the winner's is the grant's). O(r's overlap reports) plus a
// prediction per candidate.
func (c *Core) grantCandidates(r *Request, idx int, g Grant) []GrantCandidate {
	type holder struct {
		slot   int
		tokens int
	}
	var held []holder
	r.eachOverlap(func(w string, blocks int) {
		i, ok := c.workerIdx[w]
		if !ok || i == idx || blocks <= 0 {
			return
		}
		tokens := r.cachedFromOverlap(blocks, c.workers[i].BlockSize)
		for k := range held {
			if held[k].slot == i { // a worker reported twice: its deepest counts
				held[k].tokens = max(held[k].tokens, tokens)
				return
			}
		}
		held = append(held, holder{i, tokens})
	})
	slices.SortFunc(held, func(a, b holder) int {
		if a.tokens != b.tokens {
			return b.tokens - a.tokens
		}
		return strings.Compare(c.workers[a.slot].ID, c.workers[b.slot].ID)
	})
	out := make([]GrantCandidate, 1, 1+min(len(held), MaxGrantCandidates-1))
	out[0] = GrantCandidate{Worker: g.Worker, CachedTokens: g.CachedTokens, PredictedTTFT: g.PredictedTTFT}
	for _, h := range held[:min(len(held), MaxGrantCandidates-1)] {
		out = append(out, GrantCandidate{Worker: c.workers[h.slot].ID, CachedTokens: h.tokens, PredictedTTFT: c.ttftPeek(r, h.slot)})
	}
	return out
}
