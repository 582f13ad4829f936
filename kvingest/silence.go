package kvingest

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/switchyard/switchyard/kvindex"
)

// A dead event path: an engine that registers as publishing KV events but
// whose blocks never reach the index (every chain skipped as
// unknown_parent, a publisher on the wrong port, a dropped subscription)
// leaves routing on predictions alone, and nothing else on the router says
// so. Silence compares, per worker, the prompt blocks the router saw it
// compute with the blocks its events stored in the index, over a sliding
// window: a worker that computed at least SilentBlocks while not one block
// was stored is silent.

// SilenceSample is one worker's cumulative figures at one instant.
type SilenceSample struct {
	Worker string
	// ServedBlocks is the full prompt blocks the worker computed for this
	// router's requests (frontend.Server.WorkerServedBlocks).
	ServedBlocks uint64
	Events       kvindex.EventCounts
}

// SilentState is a worker's event path as Silence judges it.
type SilentState struct {
	Silent bool
	Since  time.Time // when the window that showed it silent began
	Why    string
}

// Silence flags workers whose KV events never reach the index. Observe
// feeds it; State and Silent read it.
type Silence struct {
	window time.Duration
	blocks uint64

	mu      sync.Mutex
	workers map[string]*silenceTrack
}

type silenceTrack struct {
	samples []silencePoint // oldest first, spanning a little over the window
	state   SilentState
}

type silencePoint struct {
	at time.Time
	SilenceSample
}

// NewSilence returns a Silence judging over window, flagging a worker that
// computed at least blocks prompt blocks in it; it registers the gauge of
// silent workers on reg (nil: not exported).
func NewSilence(window time.Duration, blocks int, reg prometheus.Registerer) *Silence {
	s := &Silence{window: window, blocks: uint64(max(blocks, 1)), workers: map[string]*silenceTrack{}}
	newSilenceMetrics(reg, s)
	return s
}

// Observe records every sampled worker's figures at now and forgets the
// workers not sampled (gone, or no longer publishing events).
func (s *Silence) Observe(now time.Time, samples []SilenceSample) {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := make(map[string]bool, len(samples))
	for _, smp := range samples {
		seen[smp.Worker] = true
		t := s.workers[smp.Worker]
		if t == nil {
			t = &silenceTrack{}
			s.workers[smp.Worker] = t
		}
		t.observe(now, smp, s.window, s.blocks)
	}
	for w := range s.workers {
		if !seen[w] {
			delete(s.workers, w)
		}
	}
}

func (t *silenceTrack) observe(now time.Time, smp SilenceSample, window time.Duration, threshold uint64) {
	if n := len(t.samples); n > 0 {
		last := t.samples[n-1]
		// Counters that went back: the worker's index state or this
		// router's counts started again; so does the window.
		if smp.ServedBlocks < last.ServedBlocks || smp.Events.Stored < last.Events.Stored || smp.Events.Batches < last.Events.Batches {
			t.samples = t.samples[:0]
		}
	}
	t.samples = append(t.samples, silencePoint{now, smp})
	// Keep the newest sample at least window old as the window's start.
	drop := 0
	for drop+1 < len(t.samples) && now.Sub(t.samples[drop+1].at) >= window {
		drop++
	}
	t.samples = t.samples[drop:]
	first := t.samples[0]
	n := len(t.samples)
	if now.Sub(first.at) < window || n < 3 {
		t.state = SilentState{}
		return
	}
	// Served blocks are counted up to the previous sample: blocks computed
	// in the last moments may still be on their way as events.
	served := t.samples[n-2].ServedBlocks - first.ServedBlocks
	stored := smp.Events.Stored - first.Events.Stored
	// A publisher that samples (adapter -kv-sample N) sends about one
	// stored block in N: judging it on N times the blocks keeps the chance
	// that none of them was sampled negligible ((1-1/N)^(N·threshold) is
	// below e^-threshold).
	if s := smp.Events.Sample; s > 1 {
		threshold *= uint64(s)
	}
	if stored > 0 || served < threshold {
		t.state = SilentState{}
		return
	}
	since := first.at
	if t.state.Silent {
		since = t.state.Since // silent since the first window that showed it
	}
	why := fmt.Sprintf("computed %d prompt blocks in %v and no KV event batch arrived", served, window)
	if batches := smp.Events.Batches - first.Events.Batches; batches > 0 {
		why = fmt.Sprintf("computed %d prompt blocks in %v; %d KV event batches arrived and stored no block", served, window, batches)
		if resets := smp.Events.Resets - first.Events.Resets; resets > 0 {
			why += fmt.Sprintf(" (%d resets, the last for %s)", resets, smp.Events.LastReset)
		}
	}
	t.state = SilentState{Silent: true, Since: since, Why: why}
}

// State returns worker's state (not silent when unknown).
func (s *Silence) State(worker string) SilentState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if t := s.workers[worker]; t != nil {
		return t.state
	}
	return SilentState{}
}

// Silent returns the silent workers, sorted.
func (s *Silence) Silent() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for w, t := range s.workers {
		if t.state.Silent {
			out = append(out, w)
		}
	}
	sort.Strings(out)
	return out
}
