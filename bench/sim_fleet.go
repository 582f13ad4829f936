package bench

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"time"
)

// A fleet-scale workload for the simulator. §1's load is the Mooncake
// conversation trace compressed 6× over 8 workers; stretching the one trace
// over 10,000 workers (7,500× compressed) gives every worker about one
// request in half a simulated second: a cold start, not a fleet in steady
// state. FleetTrace instead replays K copies of the trace as K independent
// user populations: copy k's hash ids live in their own namespace (copies
// share no block), its arrivals are compressed so that the K copies together
// carry the fleet's load, and it is rotated in time by k/K of its span so
// that the copies' bursts and conversation starts do not line up.

// fleetNamespaceBits leaves the trace's own hash ids 40 bits (the published
// traces' ids are below 2^20) and the copy number the 24 above them.
const fleetNamespaceBits = 40

// MaxFleetCopies bounds FleetTrace's copies (the copy number's bits).
const MaxFleetCopies = 1 << (64 - fleetNamespaceBits)

// FleetTimeScale is the compression of each of copies copies of a trace
// that gives workers engines §1's load per engine (6× per 8 workers for
// the one trace).
func FleetTimeScale(workers, copies int) float64 {
	return 6 * float64(workers) / (8 * float64(copies))
}

// FleetTrace returns copies copies of the Mooncake requests reqs (in
// arrival order, with HashIDs), each compressed by timeScale and rotated by
// k/copies of the compressed span, merged in arrival order (ties: copy,
// then trace order) and renumbered from 0. Arrivals are already scaled:
// simulate the result with TimeScale 1. Copy k's block ids are id + k·2^40,
// its sessions "<session>@k", so copies share no prefix and no session.
// A request whose rotation wraps past the span moves to the copy's start:
// each copy has one seam where a conversation's later turns may come first.
func FleetTrace(reqs []TraceRequest, copies int, timeScale float64) ([]TraceRequest, error) {
	switch {
	case copies < 1 || copies > MaxFleetCopies:
		return nil, fmt.Errorf("%w: fleet copies %d outside [1, %d]", ErrInvalidConfig, copies, MaxFleetCopies)
	case !(timeScale > 0) || math.IsInf(timeScale, 0):
		return nil, fmt.Errorf("%w: fleet time scale %v must be positive and finite", ErrInvalidConfig, timeScale)
	case len(reqs) == 0:
		return nil, nil
	}
	var span time.Duration
	for i := range reqs {
		r := &reqs[i]
		if len(r.HashIDs) == 0 || len(r.HashIDs) != len(r.Segments) {
			return nil, fmt.Errorf("%w: fleet: request %d has %d hash ids for %d segments (a Mooncake trace is needed)",
				ErrInvalidConfig, r.Index, len(r.HashIDs), len(r.Segments))
		}
		for _, id := range r.HashIDs {
			if id >= 1<<fleetNamespaceBits {
				return nil, fmt.Errorf("%w: fleet: request %d hash id %d needs more than %d bits", ErrInvalidConfig, r.Index, id, fleetNamespaceBits)
			}
		}
		span = max(span, r.Arrival)
	}
	scaled := time.Duration(float64(span) / timeScale)
	// The period of a rotation is the scaled span plus one mean gap, so
	// the last request of a copy does not land on its first.
	period := scaled + scaled/time.Duration(len(reqs))
	if period <= 0 {
		period = 1
	}
	type key struct {
		at        time.Duration
		copy, idx int
	}
	keys := make([]key, 0, copies*len(reqs))
	for k := range copies {
		shift := time.Duration(float64(period) * float64(k) / float64(copies))
		for i := range reqs {
			at := time.Duration(float64(reqs[i].Arrival)/timeScale) + shift
			if at >= period {
				at -= period
			}
			keys = append(keys, key{at: at, copy: k, idx: i})
		}
	}
	sort.Slice(keys, func(a, b int) bool {
		x, y := keys[a], keys[b]
		if x.at != y.at {
			return x.at < y.at
		}
		if x.copy != y.copy {
			return x.copy < y.copy
		}
		return x.idx < y.idx
	})
	out := make([]TraceRequest, len(keys))
	for n, kk := range keys {
		out[n] = fleetCopy(&reqs[kk.idx], kk.copy, n, kk.at)
	}
	return out, nil
}

// fleetCopy is request r as copy k's request number n at arrival at.
func fleetCopy(r *TraceRequest, k, n int, at time.Duration) TraceRequest {
	c := *r
	c.Index, c.Arrival = n, at
	if k == 0 {
		return c // copy 0 keeps the trace's ids and tokens
	}
	ns := uint64(k) << fleetNamespaceBits
	c.HashIDs = make([]uint64, len(r.HashIDs))
	c.Segments = make([]Segment, len(r.Segments))
	for j, id := range r.HashIDs {
		c.HashIDs[j] = id + ns
		c.Segments[j] = Segment{Seed: MooncakeBlockSeed(id + ns), Len: r.Segments[j].Len}
	}
	if r.Session != "" {
		c.Session = r.Session + "@" + strconv.Itoa(k)
	}
	return c
}
