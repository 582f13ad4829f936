package bench

import (
	"cmp"
	"slices"
	"time"
)

// SimReport is the outcome of one simulated run. Everything in it is a
// function of the configuration and the trace (no wall-clock readings), so
// its JSON is byte-identical across runs with the same seed.
type SimReport struct {
	Label  string        `json:"label"`
	Config SimConfigInfo `json:"config"`
	// Summary is the same digest the live runner produces.
	Summary Summary `json:"summary"`
	// GoodRequests succeeded and met their deadline (or had none);
	// GoodputRPS is their rate over the run's duration.
	GoodRequests int     `json:"good_requests"`
	GoodputRPS   float64 `json:"goodput_rps"`
	// SimulatedS is the virtual time from the first arrival to the last
	// event; Events counts processed events.
	SimulatedS float64 `json:"simulated_s"`
	Events     uint64  `json:"events"`
	// PeakQueued is the most requests queued in admission at once,
	// summed over every replica's Core (cluster-wide).
	PeakQueued int                `json:"peak_queued"`
	Workers    []SimWorkerReport  `json:"workers"`
	Replicas   []SimReplicaReport `json:"replicas"`
	Classes    []SimClassCounters `json:"classes"`
	// Bound is what an ideal cache of the run's pool sizes would hit on the
	// same prompts (ComputeCacheBound); the run's hit rate is read against it.
	Bound CacheBound `json:"cache_bound"`
	// Quality is the run's routing quality: reachable, achieved and
	// realised cached tokens with the reasons for each shortfall, as a
	// live router counts them (SimQuality).
	Quality SimQuality `json:"routing_quality"`
	// Tiers is the host tier's part (sim_tiers.go); absent without one.
	Tiers *SimTierReport `json:"tiers,omitempty"`
	// Sessions is how often a session's turns stayed on one worker
	// (sim_sessions.go).
	Sessions SimSessionReport `json:"sessions"`
	// SLOGood requests met the run's SLO (SimConfig.SLO), SLOGoodputRPS
	// per second of the run.
	SLOGood       int     `json:"slo_good_requests"`
	SLOGoodputRPS float64 `json:"slo_goodput_rps"`
	// PD is the disaggregated fleet's part (sim_pd.go); absent without one.
	PD *SimPDReport `json:"disaggregation,omitempty"`
	// Ingest is one replica's KV event ingest (SimConfig.MeasureIngest;
	// absent without it: CPU time is not deterministic).
	Ingest *SimIngestReport `json:"ingest,omitempty"`
	// Results holds every request's measurement (written to results.jsonl
	// on request, never into the report JSON).
	Results []Result `json:"-"`
}

// SimConfigInfo is the part of a SimConfig a report records.
type SimConfigInfo struct {
	Seed            uint64    `json:"seed"`
	Replicas        int       `json:"replicas"`
	Workers         int       `json:"workers"`
	Policy          string    `json:"policy"`
	Admission       string    `json:"admission"`
	Gossip          bool      `json:"gossip"`
	GossipDelayMs   float64   `json:"gossip_delay_ms"`
	GossipRoundMs   float64   `json:"gossip_round_ms,omitempty"`
	EventDelayMs    float64   `json:"event_delay_ms"`
	PredictTTLMs    float64   `json:"predict_ttl_ms"`
	TimeScale       float64   `json:"time_scale"`
	ArrivalSpreadMs float64   `json:"arrival_spread_ms"`
	Requests        int       `json:"requests"`
	MaxRunning      int       `json:"max_running"`
	SingleClass     bool      `json:"single_class"`
	SplitClasses    int       `json:"split_classes"`
	OverlapCredit   float64   `json:"overlap_credit"`
	PrefillScale    float64   `json:"prefill_scale"`
	Selector        string    `json:"selector"`
	TTFTScale       float64   `json:"ttft_prefill_scale"`
	TTFTInterfere   float64   `json:"ttft_interference"`
	TTFTCalWindow   int       `json:"ttft_calibration_window"`
	IgnoreDeadlines bool      `json:"ignore_deadlines"`
	DueMarginMs     float64   `json:"due_margin_ms"`
	ClassPolicy     string    `json:"class_policy"`
	QueueLimit      int       `json:"queue_limit_requests"`
	BlockSize       int       `json:"block_size"`
	KVBlocks        int       `json:"kv_blocks"`
	MaxBatchedTok   int       `json:"max_batched_tokens"`
	MaxNumSeqs      int       `json:"max_num_seqs"`
	EngineSpeedup   float64   `json:"engine_speedup"`
	EngineSpeedups  []float64 `json:"engine_speedups,omitempty"`
	HostBlocks      int       `json:"host_blocks,omitempty"`
	HostLoadMsPerTk float64   `json:"host_load_ms_per_token,omitempty"`
	DiskBlocks      int       `json:"disk_blocks,omitempty"`
	DiskLoadMsPerTk float64   `json:"disk_load_ms_per_token,omitempty"`
	TierWeights     []float64 `json:"tier_weights,omitempty"`
	SLOTTFTMs       float64   `json:"slo_ttft_ms"`
	SLOITLMs        float64   `json:"slo_itl_ms"`
	TransferGbps    float64   `json:"transfer_gbps,omitempty"`
	TransferSetupMs float64   `json:"transfer_setup_ms,omitempty"`
}

// SimWorkerReport is one engine's view of the run.
type SimWorkerReport struct {
	ID           string  `json:"id"`
	Requests     int     `json:"requests"`
	PeakActive   int     `json:"peak_active"`
	PromptTokens uint64  `json:"prompt_tokens"`
	CachedTokens uint64  `json:"cached_tokens"`
	HitRate      float64 `json:"hit_rate"`
	// HostCachedTokens of CachedTokens were loaded back from the host tier.
	HostCachedTokens uint64 `json:"host_cached_tokens,omitempty"`
	// DiskCachedTokens of CachedTokens were loaded back from the disk tier.
	DiskCachedTokens uint64  `json:"disk_cached_tokens,omitempty"`
	BusyS            float64 `json:"busy_s"`
	Steps            uint64  `json:"steps"`
	Preemptions      uint64  `json:"preemptions"`
	Evicted          uint64  `json:"blocks_evicted"`
	IndexResyncs     int     `json:"index_resyncs"`
	// TTFTScale is the first replica's calibrated TTFT scale for the
	// worker (observed over predicted grant-to-first-token time; 1 when
	// the ttft selector is off or calibration is off).
	TTFTScale float64 `json:"ttft_scale"`
}

// SimReplicaReport is one router replica's part.
type SimReplicaReport struct {
	ID         string `json:"id"`
	Admitted   uint64 `json:"admitted"`
	PeakQueued int    `json:"peak_queued"`
}

// SimClassCounters are one admission class's counters summed over replicas.
type SimClassCounters struct {
	Class     string            `json:"class"`
	Received  uint64            `json:"received"`
	Admitted  uint64            `json:"admitted"`
	Cancelled uint64            `json:"cancelled"`
	Rejected  map[string]uint64 `json:"rejected"`
}

func (s *simulation) report() *SimReport {
	cfg := s.cfg
	results := make([]Result, len(s.reqs))
	var lastEnd time.Duration
	for i := range s.reqs {
		results[i] = s.reqs[i].res
		lastEnd = max(lastEnd, results[i].Sent+results[i].E2E)
	}
	sum := Summarize(cfg.Label, results)
	rep := &SimReport{
		Label: cfg.Label,
		Config: SimConfigInfo{
			Seed: cfg.Seed, Replicas: cfg.Replicas, Workers: cfg.Workers, Policy: cfg.Policy.String(),
			Admission: cfg.Admission.String(), Gossip: cfg.Gossip, GossipDelayMs: ms(cfg.GossipDelay), GossipRoundMs: ms(cfg.GossipRound),
			EventDelayMs: ms(cfg.EventDelay), PredictTTLMs: ms(cfg.PredictTTL), TimeScale: cfg.TimeScale,
			ArrivalSpreadMs: ms(cfg.ArrivalSpread),
			Requests:        len(s.reqs), MaxRunning: cfg.maxRunning(), SingleClass: cfg.SingleClass,
			SplitClasses: cfg.SplitClasses, OverlapCredit: cfg.Scheduler.OverlapCredit, PrefillScale: cfg.Scheduler.PrefillScale,
			Selector: cfg.Scheduler.Selector.String(), TTFTScale: cfg.Scheduler.TTFT.PrefillScale,
			TTFTInterfere: cfg.Scheduler.TTFT.Interference, TTFTCalWindow: cfg.Scheduler.TTFT.CalibrationWindow,
			IgnoreDeadlines: cfg.IgnoreDeadlines, DueMarginMs: ms(cfg.DueMargin), ClassPolicy: cfg.Class.Policy.String(),
			QueueLimit: cfg.Class.Limits.Requests, BlockSize: cfg.Engine.BlockSize, KVBlocks: cfg.Engine.NumBlocks,
			MaxBatchedTok: cfg.Engine.MaxNumBatchedTokens, MaxNumSeqs: cfg.Engine.MaxNumSeqs, EngineSpeedup: cfg.Engine.Speedup,
			EngineSpeedups: cfg.EngineSpeedups,
			HostBlocks:     cfg.Engine.HostBlocks, HostLoadMsPerTk: hostLoad(cfg),
			DiskBlocks: cfg.Engine.DiskBlocks, DiskLoadMsPerTk: diskLoad(cfg), TierWeights: tierWeights(cfg),
			SLOTTFTMs: ms(cfg.SLO.TTFT), SLOITLMs: ms(cfg.SLO.ITL),
		},
		Summary:    sum,
		Events:     s.nEvents,
		PeakQueued: s.peakQ,
		Tiers:      s.tierReport(results),
		Quality:    s.quality.withRates(),
		Sessions:   s.sessions.final(),
		Results:    results,
	}
	if len(s.reqs) > 0 {
		// Up to the last request's end: stray timers (booking expiry wake-ups
		// of bookings long finished) do not count.
		rep.SimulatedS = (lastEnd - time.Duration(s.reqs[0].arrival)).Seconds()
	}
	for i := range results {
		r := &results[i]
		if r.Outcome == OutcomeOK && !r.DeadlineMissed {
			rep.GoodRequests++
		}
		if cfg.SLO.Met(r) {
			rep.SLOGood++
		}
	}
	if sum.DurationS > 0 {
		rep.GoodputRPS = float64(rep.GoodRequests) / sum.DurationS
		rep.SLOGoodputRPS = float64(rep.SLOGood) / sum.DurationS
	}
	rep.PD = s.pdReport()
	if cfg.MeasureIngest {
		rep.Ingest = s.ingest.report(len(s.replicas), rep.SimulatedS)
	}
	if rep.PD != nil {
		rep.Config.TransferGbps, rep.Config.TransferSetupMs = cfg.Engine.TransferGbps, cfg.Engine.TransferSetupMs
	}
	for i := range s.workers {
		w := &s.workers[i]
		st := w.eng.Stats()
		rep.Workers = append(rep.Workers, SimWorkerReport{
			ID: w.id, Requests: w.reqs, PeakActive: w.peak, PromptTokens: st.PromptTokens,
			CachedTokens: st.CachedTokens, HitRate: st.PrefixHitRate, BusyS: st.BusyTime.Seconds(), HostCachedTokens: st.HostCachedTokens,
			DiskCachedTokens: st.DiskCachedTokens,
			Steps:            st.Steps, Preemptions: st.Preemptions, Evicted: st.BlocksEvicted, IndexResyncs: w.resyncs,
			TTFTScale: s.replicas[0].core.TTFTScale(w.id),
		})
	}
	classIdx := map[string]int{}
	for r := range s.replicas {
		x := &s.replicas[r]
		rep.Replicas = append(rep.Replicas, SimReplicaReport{ID: x.id, Admitted: x.admits, PeakQueued: x.peakQ})
		snap := x.core.Snapshot()
		for _, name := range sortedKeys(snap.Classes) {
			cs := snap.Classes[name]
			i, ok := classIdx[name]
			if !ok {
				i = len(rep.Classes)
				classIdx[name] = i
				rep.Classes = append(rep.Classes, SimClassCounters{Class: name, Rejected: map[string]uint64{}})
			}
			c := &rep.Classes[i]
			c.Received += cs.Counters.Received
			c.Admitted += cs.Counters.Admitted
			c.Cancelled += cs.Counters.Cancelled
			for reason, n := range cs.Counters.Rejected {
				if n > 0 {
					c.Rejected[reason.String()] += n
				}
			}
		}
	}
	slices.SortFunc(rep.Classes, func(a, b SimClassCounters) int { return cmp.Compare(a.Class, b.Class) })
	return rep
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
