package bench

import (
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/scheduler"
)

// The host tier in the simulator: every engine keeps -sim-host-blocks of
// GPU-evicted blocks in host memory (engine/host.go), and with
// -sim-disk-blocks the blocks the host tier evicts on disk below it
// (engine/disk.go), and publishes each as its tier stream; each replica's index holds that stream beside the
// worker's, and the KV-aware policy hands the scheduler both depths, priced
// by the TTFT selector's tier costs (-sim-ttft-host-gbps,
// -sim-ttft-cpu-weight, ...).

// tierOverlap folds an index match into the scheduler's overlap, as a
// router replica does.
func tierOverlap(m kvindex.Match) scheduler.Overlap {
	w, t := kvindex.SplitTier(m.Worker)
	return scheduler.Overlap{Worker: w, Blocks: m.Blocks, Tier: scheduler.Tier(t)}
}

// SimTierReport is the host tier's part of a run: where cached prompt
// tokens came from, and the time to first token of the requests by the
// tier their prefix was served from.
type SimTierReport struct {
	PromptTokens uint64 `json:"prompt_tokens"`
	// GPUHitRate, HostHitRate and DiskHitRate split the run's hit rate:
	// prompt tokens reused from the GPU cache, loaded back from host
	// memory and loaded back from disk (0 without a disk tier).
	GPUHitRate  float64 `json:"gpu_hit_rate"`
	HostHitRate float64 `json:"host_hit_rate"`
	DiskHitRate float64 `json:"disk_hit_rate"`
	// TTFTDisk: requests with any prompt token loaded from the disk tier;
	// TTFTHost: the others with any loaded from the host tier; TTFTGPU:
	// the other requests with a cached prefix; TTFTMiss: none cached (ms).
	TTFTDisk Stats `json:"ttft_disk_ms"`
	TTFTHost Stats `json:"ttft_host_ms"`
	TTFTGPU  Stats `json:"ttft_gpu_ms"`
	TTFTMiss Stats `json:"ttft_miss_ms"`
	// IndexResyncs counts host tier streams a replica's index asked to
	// resync (0 expected: the tier's stream is complete and in order).
	IndexResyncs int `json:"index_resyncs"`
}

// tierReport is the run's SimTierReport, nil without a host tier.
func (s *simulation) tierReport(results []Result) *SimTierReport {
	if s.cfg.Engine.HostBlocks == 0 {
		return nil
	}
	rep := &SimTierReport{IndexResyncs: s.tierResyncs}
	var cached, host, disk uint64
	var td, th, tg, tm []float64
	for i := range s.reqs {
		q := &s.reqs[i]
		r := &results[i]
		if r.Outcome != OutcomeOK {
			continue
		}
		rep.PromptTokens += uint64(r.PromptTokens)
		cached += uint64(r.CachedTokens)
		host += uint64(q.host)
		disk += uint64(q.disk)
		ms := float64(r.TTFT) / 1e6
		switch {
		case q.disk > 0:
			td = append(td, ms)
		case q.host > 0:
			th = append(th, ms)
		case r.CachedTokens > 0:
			tg = append(tg, ms)
		default:
			tm = append(tm, ms)
		}
	}
	if rep.PromptTokens > 0 {
		rep.GPUHitRate = float64(cached-host-disk) / float64(rep.PromptTokens)
		rep.HostHitRate = float64(host) / float64(rep.PromptTokens)
		rep.DiskHitRate = float64(disk) / float64(rep.PromptTokens)
	}
	rep.TTFTDisk = StatsOf(td)
	rep.TTFTHost, rep.TTFTGPU, rep.TTFTMiss = StatsOf(th), StatsOf(tg), StatsOf(tm)
	return rep
}

func hostLoad(cfg SimConfig) float64 {
	if cfg.Engine.HostBlocks == 0 {
		return 0
	}
	return cfg.Engine.HostLoadMsPerToken
}

func diskLoad(cfg SimConfig) float64 {
	if cfg.Engine.DiskBlocks == 0 {
		return 0
	}
	return cfg.Engine.DiskLoadMsPerToken
}

// tierWeights records constant tier weights when a run prices by them.
func tierWeights(cfg SimConfig) []float64 {
	w := cfg.Scheduler.TTFT.Tiers.Weights
	if w[scheduler.TierCPU] == 0 && w[scheduler.TierDisk] == 0 {
		return nil
	}
	return []float64{w[scheduler.TierCPU], w[scheduler.TierDisk]}
}
