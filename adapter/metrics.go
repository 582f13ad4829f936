package adapter

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// skipReason says why an event's blocks are not mirrored.
type skipReason uint8

// skipNone is "mirror it"; the reasons start at one.
const (
	skipNone skipReason = iota
	skipBlockSize
	skipGroup
	skipMedium
	skipMalformed
	skipLoRAUnnamed
	skipUnknownParent
	skipUnconfigured
	numSkipReasons
)

func (r skipReason) String() string {
	switch r {
	case skipBlockSize:
		return "block_size"
	case skipGroup:
		return "kv_group"
	case skipMedium:
		return "medium"
	case skipMalformed:
		return "malformed"
	case skipLoRAUnnamed:
		return "lora_without_name"
	case skipUnknownParent:
		return "unknown_parent"
	case skipUnconfigured:
		return "unconfigured"
	}
	return fmt.Sprintf("skip_reason(%d)", uint8(r))
}

// repairReason says why the mirror started over under a new instance.
type repairReason uint8

const (
	repairEngineReset repairReason = iota + 1
	repairUnknownParent
	repairReconfigured
	repairSubscriber
	numRepairReasons
)

func (r repairReason) String() string {
	switch r {
	case repairEngineReset:
		return "engine_stream_reset"
	case repairUnknownParent:
		return "unknown_parent"
	case repairReconfigured:
		return "reconfigured"
	case repairSubscriber:
		return "subscriber_restart"
	}
	return fmt.Sprintf("repair_reason(%d)", uint8(r))
}

const (
	resultOK = iota
	resultError
)

const (
	dumpOK = iota
	dumpMalformed
	dumpError
)

type mirrorMetrics struct {
	batches         [2]prometheus.Counter
	heartbeats      [2]prometheus.Counter
	stored, removed prometheus.Counter
	skipped         [numSkipReasons]prometheus.Counter
	skippedRemovals [numSkipReasons]prometheus.Counter
	unknownRemoved  prometheus.Counter
	unknownEvents   prometheus.Counter
	conflicts       prometheus.Counter
	evictions       prometheus.Counter
	engineCleared   prometheus.Counter
	zeroParents     prometheus.Counter
	repairs         [numRepairReasons]prometheus.Counter
	engineResets    *prometheus.CounterVec
	dumps           [3]prometheus.Counter
	mirrored        prometheus.Gauge
	entries         prometheus.Gauge
	exact           prometheus.Gauge
}

func newMirrorMetrics(reg prometheus.Registerer) *mirrorMetrics {
	f := promauto.With(reg)
	m := &mirrorMetrics{}
	batches := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_batches_total",
		Help: "KV event batches published to routers, by result (ok, error)."}, []string{"result"})
	m.batches = [2]prometheus.Counter{batches.WithLabelValues("ok"), batches.WithLabelValues("error")}
	hb := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_heartbeats_total",
		Help: "Empty KV batches (heartbeats) published, by result (ok, error)."}, []string{"result"})
	m.heartbeats = [2]prometheus.Counter{hb.WithLabelValues("ok"), hb.WithLabelValues("error")}
	blocks := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_blocks_total",
		Help: "Blocks published to routers, by kind (stored, removed)."}, []string{"kind"})
	m.stored, m.removed = blocks.WithLabelValues("stored"), blocks.WithLabelValues("removed")
	skipped := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_skipped_blocks_total",
		Help: "Stored blocks the mirror did not publish, by reason (block_size, kv_group, medium, malformed, lora_without_name, unknown_parent, unconfigured)."}, []string{"reason"})
	skippedRm := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_skipped_removals_total",
		Help: "Removed blocks (and clears) ignored because they concern another tier or KV group, by reason (medium, kv_group)."}, []string{"reason"})
	for r := skipBlockSize; r < numSkipReasons; r++ {
		m.skipped[r] = skipped.WithLabelValues(r.String())
	}
	m.skippedRemovals[skipMedium] = skippedRm.WithLabelValues(skipMedium.String())
	m.skippedRemovals[skipGroup] = skippedRm.WithLabelValues(skipGroup.String())
	m.unknownRemoved = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_unknown_removals_total",
		Help: "Removed engine blocks the mirror did not know (stored before its start, skipped or evicted)."})
	m.unknownEvents = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_unknown_events_total",
		Help: "Engine events of a kind the adapter does not know, ignored."})
	m.conflicts = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_engine_hash_conflicts_total",
		Help: "Stores of an engine hash already mapped to another Switchyard hash (the first mapping stays)."})
	m.evictions = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_evictions_total",
		Help: "Engine hashes forgotten because the map reached its bound (-max-mirror-entries); each is removed on routers."})
	m.engineCleared = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_engine_cleared_total",
		Help: "AllBlocksCleared events from the engine."})
	m.zeroParents = f.NewCounter(prometheus.CounterOpts{Name: "switchyard_adapter_kv_zero_parent_blocks_total",
		Help: "Stored blocks whose parent hash was 0, read as a chain start (a publisher that writes 0 for no parent)."})
	repairs := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_repairs_total",
		Help: "Times the mirror started over under a new instance (routers see Cleared), by reason (engine_stream_reset, unknown_parent, reconfigured, subscriber_restart)."}, []string{"reason"})
	for r := repairEngineReset; r < numRepairReasons; r++ {
		m.repairs[r] = repairs.WithLabelValues(r.String())
	}
	m.engineResets = f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_stream_resets_total",
		Help: "Continuity losses reported by the engine event subscriber, by its reason."}, []string{"reason"})
	dumps := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_kv_dumps_total",
		Help: "KV dump requests answered, by result (ok, malformed, error)."}, []string{"result"})
	m.dumps = [3]prometheus.Counter{dumps.WithLabelValues("ok"), dumps.WithLabelValues("malformed"), dumps.WithLabelValues("error")}
	m.mirrored = f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_adapter_kv_mirrored_blocks",
		Help: "Distinct Switchyard block hashes the mirror holds (what routers index for this worker)."})
	m.entries = f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_adapter_kv_engine_entries",
		Help: "Engine block hashes in the mirror's bounded map."})
	m.exact = f.NewGauge(prometheus.GaugeOpts{Name: "switchyard_adapter_kv_mirror_exact",
		Help: "1 while the mirror knows every block the engine holds (stream followed from an empty cache), else 0."})
	return m
}
