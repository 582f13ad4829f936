package frontend

import (
	"sync"
	"time"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// Routing quality: per decision, the reachable, achieved and realised cached
// prompt tokens (docs/metrics.md, "Routing quality"). The grant brings the
// first two and the shortfall reason from the class owner; the engine's
// usage brings the third. This file counts them (metrics.Routing) and keeps
// the last decisions for the operators' page.

// ExactIndex is optionally implemented by Deps.Index: the prefix depth, in
// blocks, that worker holds according to the engine's own KV events alone
// (no predictions). It tells an eviction (the events said the worker held
// the blocks) from a wrong prediction (only the router's guess did).
type ExactIndex interface {
	ExactOverlap(worker string, seqHashes []uint64) int
}

// DecisionLogSize is how many recent decisions a replica keeps for the
// operators' page.
const DecisionLogSize = 64

// Candidate is one worker's cached prefix of a decision's prompt and the
// class owner's predicted TTFT there (grant to first token, calibrated; 0
// when the owner sent none: a selector without a TTFT model, or an older
// owner).
type Candidate struct {
	Worker          string  `json:"worker"`
	CachedTokens    int     `json:"cached_tokens"`
	PredictedTTFTMs float64 `json:"predicted_ttft_ms"`
}

// WorkerCached compares, for one worker, the cached prompt tokens the
// router predicted when it chose the worker with those the engine then
// reported, over the decisions whose response reported cached tokens.
type WorkerCached struct {
	Reports         uint64 `json:"reports"`
	PredictedTokens uint64 `json:"predicted_tokens"`
	ReportedTokens  uint64 `json:"reported_tokens"`
}

// Decision is one routing decision and its outcome, as the page shows it.
type Decision struct {
	At           time.Time   `json:"at"`
	RequestID    string      `json:"request_id"`
	Model        string      `json:"model"`
	Class        string      `json:"class"`
	Attempt      int         `json:"attempt"`
	PromptTokens int         `json:"prompt_tokens"`
	Candidates   []Candidate `json:"candidates"` // deepest first, at most 4
	Worker       string      `json:"worker"`
	QueueWaitMs  float64     `json:"queue_wait_ms"`
	// PredictedTTFTMs is the owner's calibrated prediction of grant to
	// first token on Worker (0: its selector has no TTFT model).
	PredictedTTFTMs float64 `json:"predicted_ttft_ms"`
	ReachableTokens int     `json:"reachable_tokens"`
	AchievedTokens  int     `json:"achieved_tokens"`
	Shortfall       string  `json:"shortfall,omitempty"`
	// RealisedTokens is nil when the engine reported no cached tokens.
	RealisedTokens *int   `json:"realised_tokens"`
	Loss           string `json:"loss,omitempty"`
	// TTFTMs is ingress to the first token (the response's first event,
	// or the whole answer without streaming); 0 when none came.
	TTFTMs    float64 `json:"ttft_ms"`
	LatencyMs float64 `json:"latency_ms"` // ingress to the usage (end of the response)
}

// QualityTotals are a replica's cumulative routing-quality figures (the
// same numbers as metrics.Routing, summed over models and classes).
type QualityTotals struct {
	Decisions       uint64            `json:"decisions"`
	KVOptimal       uint64            `json:"kv_optimal"`
	ReachableTokens uint64            `json:"reachable_tokens"`
	AchievedTokens  uint64            `json:"achieved_tokens"`
	RealisedTokens  uint64            `json:"realised_tokens"`
	RealisedReports uint64            `json:"realised_reports"`
	MissedTokens    map[string]uint64 `json:"missed_tokens"` // by shortfall reason
	LostTokens      map[string]uint64 `json:"lost_tokens"`   // by loss reason
	Shortfalls      map[string]uint64 `json:"shortfalls"`
}

// qualityLog is the recent decisions ring and the totals; its mutex is
// held only to copy a few words.
type qualityLog struct {
	mu       sync.Mutex
	ring     []Decision
	next     int
	totals   QualityTotals
	byWorker map[string]WorkerCached
	// served is, per worker, the full prompt blocks it had to compute
	// (WorkerServedBlocks).
	served map[string]uint64
}

// pending is the decision of the attempt in flight, completed by its usage.
type pending struct {
	d         Decision
	exact     int // tokens the engine's events said the worker held
	blockSize int
}

// decided counts a grant's reachable and achieved figures and keeps the
// decision on x until its usage arrives.
func (x *exchange) decided(req *scheduler.Request, g scheduler.Grant, blockSize int) {
	s, model, class := x.s, x.p.model, x.class
	reach := max(g.ReachableTokens, g.CachedTokens)
	d := Decision{
		At: x.s.now(), RequestID: x.rid, Model: model, Class: class, Attempt: req.Attempt,
		PromptTokens: req.PromptTokens, Worker: g.Worker, QueueWaitMs: float64(g.QueueWait) / float64(time.Millisecond),
		ReachableTokens: reach, AchievedTokens: g.CachedTokens, Candidates: grantCandidates(req, g, blockSize),
		PredictedTTFTMs: ms(g.PredictedTTFT),
	}
	missed := reach - g.CachedTokens
	if missed > 0 {
		d.Shortfall = g.Shortfall.String()
		if d.Shortfall == "" { // an owner that sends figures without a reason
			d.Shortfall = scheduler.ShortfallLoad.String()
		}
	}
	p := &pending{d: d, blockSize: max(blockSize, 1)}
	if hashes := req.HashesFor(blockSize); len(hashes) > 0 {
		if ex, ok := s.deps.Index.(ExactIndex); ok {
			p.exact = min(req.PromptTokens, ex.ExactOverlap(g.Worker, hashes)*p.blockSize)
		}
	}
	x.dec = p

	m := s.m.Routing
	m.Init(model, class)
	m.Decisions.WithLabelValues(model, class).Inc()
	m.ReachableTokens.WithLabelValues(model, class).Add(float64(reach))
	m.AchievedTokens.WithLabelValues(model, class).Add(float64(g.CachedTokens))
	if missed > 0 {
		m.MissedTokens.WithLabelValues(model, class, d.Shortfall).Add(float64(missed))
		m.Shortfalls.WithLabelValues(model, class, d.Shortfall).Inc()
	} else {
		m.KVOptimal.WithLabelValues(model, class).Inc()
	}
	s.quality.mu.Lock()
	t := &s.quality.totals
	t.Decisions++
	t.ReachableTokens += uint64(reach)
	t.AchievedTokens += uint64(g.CachedTokens)
	if missed > 0 {
		t.MissedTokens = addTo(t.MissedTokens, d.Shortfall, uint64(missed))
		t.Shortfalls = addTo(t.Shortfalls, d.Shortfall, 1)
	} else {
		t.KVOptimal++
	}
	s.quality.mu.Unlock()
}

// recordRealised completes x's decision with the engine's usage: the
// realised figure and, when it falls a block or more below the achieved
// one, why. An engine always recomputes at least the prompt's last token,
// so a shortfall under one block is not a loss.
func (x *exchange) recordRealised(u *usage) {
	p := x.dec
	if p == nil {
		return
	}
	x.dec = nil
	d := p.d
	d.LatencyMs = float64(x.s.now().Sub(x.ingress)) / float64(time.Millisecond)
	realised, reported := u.cachedTokens()
	m, model, class := x.s.m.Routing, d.Model, d.Class
	lost := 0
	if reported {
		d.RealisedTokens = &realised
		m.RealisedTokens.WithLabelValues(model, class).Add(float64(realised))
		m.RealisedReports.WithLabelValues(model, class).Inc()
		if lost = d.AchievedTokens - realised; lost >= p.blockSize {
			d.Loss = metrics.LossMispredicted
			if realised < p.exact {
				d.Loss = metrics.LossEvicted
			}
			m.LostTokens.WithLabelValues(model, class, d.Loss).Add(float64(lost))
			m.Shortfalls.WithLabelValues(model, class, d.Loss).Inc()
		}
	}
	q := &x.s.quality
	q.mu.Lock()
	// Without usage the engine may have failed before computing anything.
	if n := computedBlocks(d, p.blockSize); u != nil && n > 0 {
		if q.served == nil {
			q.served = map[string]uint64{}
		}
		q.served[d.Worker] += uint64(n)
	}
	if reported {
		q.totals.RealisedTokens += uint64(realised)
		q.totals.RealisedReports++
		if q.byWorker == nil {
			q.byWorker = map[string]WorkerCached{}
		}
		wc := q.byWorker[d.Worker]
		wc.Reports++
		wc.PredictedTokens += uint64(d.AchievedTokens)
		wc.ReportedTokens += uint64(realised)
		q.byWorker[d.Worker] = wc
		if d.Loss != "" {
			q.totals.LostTokens = addTo(q.totals.LostTokens, d.Loss, uint64(lost))
			q.totals.Shortfalls = addTo(q.totals.Shortfalls, d.Loss, 1)
		}
	}
	if len(q.ring) < DecisionLogSize {
		q.ring = append(q.ring, d)
	} else {
		q.ring[q.next] = d
	}
	q.next = (q.next + 1) % DecisionLogSize
	q.mu.Unlock()
}

// computedBlocks is how many full prompt blocks the engine computed for d
// and so must have announced as stored KV events: the prompt's blocks less
// the cached ones (as the engine reported them, else as the router
// predicted them, which only errs towards fewer).
func computedBlocks(d Decision, blockSize int) int {
	if blockSize <= 0 {
		return 0
	}
	cached := d.AchievedTokens
	if d.RealisedTokens != nil {
		cached = *d.RealisedTokens
	}
	return d.PromptTokens/blockSize - cached/blockSize
}

// cachedTokens is the usage's cached prompt tokens and whether it reports
// any figure at all (an engine without prefix caching reports none).
func (u *usage) cachedTokens() (int, bool) {
	if u == nil {
		return 0, false
	}
	switch {
	case u.PromptTokensDetails != nil:
		return u.PromptTokensDetails.CachedTokens, true
	case u.InputTokensDetails != nil:
		return u.InputTokensDetails.CachedTokens, true
	}
	return 0, false
}

// Decisions returns the recent routing decisions, newest first.
func (s *Server) Decisions() []Decision {
	q := &s.quality
	q.mu.Lock()
	defer q.mu.Unlock()
	n := len(q.ring) // next is n until the ring is full
	out := make([]Decision, 0, n)
	for i := range n {
		out = append(out, q.ring[(q.next-1-i+2*n)%n])
	}
	return out
}

// QualityTotals returns the replica's cumulative routing-quality figures.
func (s *Server) QualityTotals() QualityTotals {
	q := &s.quality
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.totals
	t.MissedTokens, t.LostTokens, t.Shortfalls = copyCounts(t.MissedTokens), copyCounts(t.LostTokens), copyCounts(t.Shortfalls)
	return t
}

// firstToken notes when the attempt's first token reached the router, for
// its decision's outcome.
func (x *exchange) firstToken(at time.Time) {
	if p := x.dec; p != nil && p.d.TTFTMs == 0 {
		p.d.TTFTMs = ms(at.Sub(x.ingress))
	}
}

// WorkerCached returns worker's predicted and reported cached tokens over
// the decisions this replica made for it (zero for a worker it never
// routed to).
func (s *Server) WorkerCached(worker string) WorkerCached {
	q := &s.quality
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.byWorker[worker]
}

// WorkerServedBlocks returns the full prompt blocks worker computed for the
// requests this replica routed to it and that completed: blocks an engine
// publishing KV events announces as stored.
func (s *Server) WorkerServedBlocks(worker string) uint64 {
	q := &s.quality
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.served[worker]
}

// grantCandidates is the decision's candidates as the class owner weighed
// them (the winner first, with predicted TTFTs); from an owner that sent
// none, the request's deepest overlaps and the winner.
func grantCandidates(req *scheduler.Request, g scheduler.Grant, blockSize int) []Candidate {
	if cands := g.CandidateList(); len(cands) > 0 {
		out := make([]Candidate, 0, len(cands))
		for _, c := range cands {
			out = append(out, Candidate{Worker: c.Worker, CachedTokens: c.CachedTokens, PredictedTTFTMs: ms(c.PredictedTTFT)})
		}
		return out
	}
	out := candidates(req, blockSize)
	for _, c := range out {
		if c.Worker == g.Worker {
			return out
		}
	}
	return append(out, Candidate{Worker: g.Worker, CachedTokens: g.CachedTokens, PredictedTTFTMs: ms(g.PredictedTTFT)})
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// candidates is the request's deepest overlaps, in tokens, deepest first.
func candidates(req *scheduler.Request, blockSize int) []Candidate {
	const keep = 4
	var out []Candidate
	for _, o := range req.Overlaps {
		if o.Tier != scheduler.TierGPU {
			continue // a lower tier's copy is no GPU cache
		}
		tokens := min(req.PromptTokens, min(o.Blocks, len(req.BlockHashes))*blockSize)
		i := len(out)
		for i > 0 && out[i-1].CachedTokens < tokens {
			i--
		}
		if i >= keep {
			continue
		}
		out = append(out, Candidate{})
		copy(out[i+1:], out[i:])
		out[i] = Candidate{Worker: o.Worker, CachedTokens: tokens}
		if len(out) > keep {
			out = out[:keep]
		}
	}
	return out
}

func addTo(m map[string]uint64, k string, n uint64) map[string]uint64 {
	if m == nil {
		m = map[string]uint64{}
	}
	m[k] += n
	return m
}

func copyCounts(m map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}
