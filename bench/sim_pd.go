package bench

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/switchyard/switchyard/engine"
	"github.com/switchyard/switchyard/scheduler"
)

// Disaggregated prefill and decode in the simulator: an xPyD fleet of
// Fleet.Prefill prefill and Fleet.Decode decode workers behind the real
// scheduler Core, whose decider and pair selection (scheduler/disagg.go)
// place each request. A pair runs as the two legs of vLLM's protocol: the
// prefill leg (the prompt, MaxTokens 1) on the prefill worker, and when it
// ends, the decode leg on the decode worker with engine.Transfer: the
// prompt's KV arrives after the engine's transfer time (engine/transfer.go)
// and only the last prompt token is computed there. The client's first
// token is the decode leg's. The admission booking is the pair's, released
// when the decode leg ends.
//
// The decider is the Core's (scheduler/disagg.go): in a fleet without
// both-workers, a request whose uncached prefill on its best prefill worker
// is below the threshold (Core.DisaggThreshold) runs aggregated on a decode
// (else a prefill) worker the TTFT selector picks, as Dynamo's conditional
// disaggregation does with a vLLM decode engine (kv_both: a request without
// transfer parameters is prefilled locally). SimConfig.Decider off sets the
// threshold to 1: every request runs as a pair.

// SimFleet is an xPyD fleet shape; the zero value is aggregated.
type SimFleet struct{ Prefill, Decode int }

// Disaggregated reports whether the fleet has roles.
func (f SimFleet) Disaggregated() bool { return f.Prefill+f.Decode > 0 }

func (f SimFleet) String() string {
	if !f.Disaggregated() {
		return "aggregated"
	}
	return fmt.Sprintf("%dP%dD", f.Prefill, f.Decode)
}

// ParseSimFleet reads "aggregated" (or "agg") and "<x>p<y>d", e.g. 2p6d.
func ParseSimFleet(s string) (SimFleet, error) {
	t := strings.ToLower(strings.TrimSpace(s))
	if t == "aggregated" || t == "agg" {
		return SimFleet{}, nil
	}
	bad := fmt.Errorf("%w: sim fleet %q: want aggregated or <x>p<y>d, e.g. 2p6d", ErrInvalidConfig, s)
	ps, rest, ok := strings.Cut(t, "p")
	if !ok || !strings.HasSuffix(rest, "d") {
		return SimFleet{}, bad
	}
	p, err1 := strconv.Atoi(ps)
	d, err2 := strconv.Atoi(strings.TrimSuffix(rest, "d"))
	if err1 != nil || err2 != nil || p < 1 || d < 1 || p+d > maxSimNodes {
		return SimFleet{}, bad
	}
	return SimFleet{Prefill: p, Decode: d}, nil
}

// SimSLO is a per-request service objective: a request is good when it
// succeeded, its TTFT is at most TTFT and its mean inter-token latency at
// most ITL (DistServe's goodput; a one-token answer meets any ITL).
type SimSLO struct {
	TTFT time.Duration
	ITL  time.Duration
}

// DefaultSimSLO is TTFT <= 2 s and ITL <= 50 ms.
func DefaultSimSLO() SimSLO { return SimSLO{TTFT: 2 * time.Second, ITL: 50 * time.Millisecond} }

// Met reports whether r meets the objective.
func (o SimSLO) Met(r *Result) bool {
	if r.Outcome != OutcomeOK || r.TTFT > o.TTFT {
		return false
	}
	if len(r.ITL) == 0 {
		return true
	}
	var sum time.Duration
	for _, d := range r.ITL {
		sum += d
	}
	return sum/time.Duration(len(r.ITL)) <= o.ITL
}

// SimPDReport is a run's disaggregation part (absent for an aggregated
// fleet).
type SimPDReport struct {
	Fleet   string `json:"fleet"`
	Decider bool   `json:"decider"`
	// Threshold is the Core's uncached-prefill threshold in tokens.
	Threshold int `json:"threshold_tokens"`
	// Pairs ran prefill then decode; Bypassed ran aggregated on a decode
	// or prefill worker: the Core's decider found the prefill short, or
	// (Overflowed, a part of Bypassed) no prefill worker was free
	// (prefill_busy).
	Pairs      int `json:"pairs"`
	Bypassed   int `json:"bypassed"`
	Overflowed int `json:"overflowed"`
	// Transfers and TransferredTokens are the decode engines' landed pulls.
	Transfers         uint64 `json:"transfers"`
	TransferredTokens uint64 `json:"transferred_tokens"`
	// PrefillBusyS and DecodeBusyS sum the engines' step time per role.
	PrefillBusyS float64 `json:"prefill_busy_s"`
	DecodeBusyS  float64 `json:"decode_busy_s"`
}

// simPair is a disaggregated request's state.
type simPair struct {
	prefill int // worker
	cached  int // prompt tokens the prefill engine had cached
}

// simPD is the simulation's disaggregation state.
type simPD struct {
	pairs, bypassed, overflowed int
}

// roleOf is worker i's role in cfg's fleet.
func (c SimConfig) roleOf(i int) string {
	switch {
	case !c.Fleet.Disaggregated():
		return ""
	case i < c.Fleet.Prefill:
		return scheduler.RolePrefill
	}
	return scheduler.RoleDecode
}

// disaggModel is the router's transfer model, the engines' own: setup and
// per-token time of engine.Config.TransferTime.
func disaggModel(ec engine.Config, base scheduler.DisaggConfig) scheduler.DisaggConfig {
	base.TransferSetupMs = ec.TransferSetupMs
	per := ec.TransferTime(1<<20) - ec.TransferTime(1)
	base.TransferMsPerToken = float64(per) / float64(time.Millisecond) / float64(1<<20-1)
	return base
}

// settlePair runs a disaggregated grant: its prefill leg on the prefill
// worker, then (prefilled) its decode leg on the decode worker.
func (s *simulation) settlePair(i int, q *simRequest, g scheduler.Grant, p int, rep *simReplica) {
	d, ok := s.widx[g.Decode.Worker]
	if !ok {
		rep.core.Finish(g.Booking)
		s.reject(q, fmt.Errorf("grant names unknown decode worker %q", g.Decode.Worker))
		return
	}
	q.worker, q.booking = d, g.Booking
	q.res.Worker = g.Decode.Worker
	s.sessionGranted(q, p)
	s.markDirty(q.admit, p)
	s.markDirty(q.admit, d)
	dk := &s.workers[d]
	dk.active++
	dk.peak = max(dk.peak, dk.active)
	dk.reqs++
	s.pd.pairs++
	s.predict(q, g.Worker, p)
	q.pair = &simPair{prefill: p}
	pk := &s.workers[p]
	pk.active++
	pk.peak = max(pk.peak, pk.active)
	pk.reqs++
	s.submitLeg(i, q, p, &engine.Request{MaxTokens: 1, OnDelta: func(dl engine.Delta) { s.prefillDelta(i, dl) }})
}

// submitLeg submits one leg of request i (prompt, id and priority filled
// in) to worker w; a refusal ends the request as the worker's 400.
func (s *simulation) submitLeg(i int, q *simRequest, w int, r *engine.Request) {
	s.tokens = q.tr.AppendTokens(s.tokens[:0], s.cfg.Vocab)
	r.ID, r.Prompt, r.Priority = "r"+strconv.Itoa(i), s.tokens, q.tr.Priority
	wk := &s.workers[w]
	if _, err := wk.eng.Submit(r); err != nil {
		s.workers[q.worker].active--
		if q.pair != nil && w == q.pair.prefill {
			wk.active--
		}
		rep := &s.replicas[q.admit]
		rep.core.Finish(q.booking)
		s.markDirty(q.admit, w)
		s.markDirty(q.admit, q.worker)
		q.res.Outcome, q.res.HTTPStatus, q.res.ErrorCode, q.res.Error = OutcomeHTTPError, 400, "engine_rejected", err.Error()
		s.finishRequest(q)
		return
	}
	if !wk.busy {
		s.ensureStep(w, s.clock.now)
	}
}

// prefillDelta records the prefill leg's end (inside Engine.Step: only
// records; step submits the decode leg).
func (s *simulation) prefillDelta(i int, d engine.Delta) {
	if d.Finish == 0 {
		return
	}
	q := &s.reqs[i]
	q.pair.cached = d.CachedTokens
	s.marks = append(s.marks, simMark{req: i, prefilled: true, failed: d.Finish != engine.FinishLength})
}

// prefilled starts request i's decode leg once its prefill leg ended.
func (s *simulation) prefilled(m simMark) {
	q := &s.reqs[m.req]
	s.workers[q.pair.prefill].active--
	s.markDirty(q.admit, q.pair.prefill)
	if m.failed {
		s.workers[q.worker].active--
		s.replicas[q.admit].core.Finish(q.booking)
		s.markDirty(q.admit, q.worker)
		q.res.Outcome, q.res.ErrorCode = OutcomeStreamError, "prefill_failed"
		s.finishRequest(q)
		s.afterCore(q.admit)
		return
	}
	i := m.req
	s.submitLeg(i, q, q.worker, &engine.Request{MaxTokens: q.tr.OutputLength,
		Transfer: &engine.Transfer{Tokens: q.tr.InputLength, Modeled: true},
		OnDelta:  func(dl engine.Delta) { s.delta(i, dl) }})
	s.afterCore(q.admit)
}

// pdReport is the run's disaggregation part.
func (s *simulation) pdReport() *SimPDReport {
	if !s.cfg.Fleet.Disaggregated() {
		return nil
	}
	r := &SimPDReport{Fleet: s.cfg.Fleet.String(), Decider: s.cfg.Decider, Pairs: s.pd.pairs, Bypassed: s.pd.bypassed, Overflowed: s.pd.overflowed,
		Threshold: s.replicas[0].core.DisaggThreshold(s.cfg.DefaultClass)}
	for i := range s.workers {
		st := s.workers[i].eng.Stats()
		r.Transfers += st.Transfers
		r.TransferredTokens += st.TransferredTokens
		if s.cfg.roleOf(i) == scheduler.RolePrefill {
			r.PrefillBusyS += st.BusyTime.Seconds()
		} else {
			r.DecodeBusyS += st.BusyTime.Seconds()
		}
	}
	return r
}

// writeSimPDMarkdown writes the disaggregation table when the sweep has an
// xPyD fleet: latency, throughput and goodput under the SLO per run.
func writeSimPDMarkdown(b *strings.Builder, runs []simRun) {
	any := false
	for _, r := range runs {
		any = any || r.cfg.Fleet.Disaggregated()
	}
	if !any {
		return
	}
	slo := runs[0].cfg.SLO
	fmt.Fprintf(b, "\nDisaggregation (goodput: requests with TTFT <= %v and mean ITL <= %v per second):\n\n", slo.TTFT, slo.ITL)
	b.WriteString("| run | fleet | decider | threshold (tok) | pairs | bypassed | of which prefill busy | TTFT p50 (ms) | TTFT p99 (ms) | ITL mean (ms) | ITL p99 (ms) | req/s | out tok/s | SLO met | goodput (req/s) |\n")
	b.WriteString("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range runs {
		s, rep := r.report.Summary, r.report
		dec, th, pairs, byp, over := "–", "–", "–", "–", "–"
		if pd := rep.PD; pd != nil {
			dec = map[bool]string{true: "on", false: "off"}[pd.Decider]
			th, pairs, byp = strconv.Itoa(pd.Threshold), strconv.Itoa(pd.Pairs), strconv.Itoa(pd.Bypassed)
			over = strconv.Itoa(pd.Overflowed)
		}
		met := 0.0
		if n := len(rep.Results); n > 0 {
			met = 100 * float64(rep.SLOGood) / float64(n)
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f | %.1f | %.1f | %.2f | %.0f | %.1f%% | %.2f |\n",
			mdEscape(rep.Label), r.cfg.Fleet, dec, th, pairs, byp, over, s.TTFT.P50, s.TTFT.P99, s.ITL.Mean, s.ITL.P99,
			s.RequestRate, s.OutputTokenRate, met, rep.SLOGoodputRPS)
	}
}
