package metrics

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/internal/clock"
)

// ErrInvalidConfig is wrapped by every Validate error in this package.
var ErrInvalidConfig = errors.New("metrics: invalid config")

// AdmissionCounts are one class's cumulative admission counters inside one
// scheduler instance. They only grow while that instance lives.
type AdmissionCounts struct {
	Received, Retried, Admitted, Cancelled uint64
	// Rejected is keyed by reason label (RejectReasons). Unknown keys are
	// summed into ReasonOther; a missing key means zero.
	Rejected map[string]uint64
}

// AdmissionSnapshot is what one scheduler instance published at one moment.
// Instance must be unique per scheduler instance (a new one after a class
// moves away and back, a config reload or an actor restart); Seq grows with
// each snapshot of that instance. The app converts scheduler snapshots into
// this type, so metrics needs no scheduler import.
type AdmissionSnapshot struct {
	Instance   uint64
	Seq        uint64
	WorkerType string
	Classes    map[string]AdmissionCounts
}

// SnapshotSource returns the current snapshot of every live scheduler
// instance it knows. It is called from Exporter.Refresh without the exporter's
// lock held, so it may block briefly (e.g. read an atomic.Pointer).
type SnapshotSource func() []AdmissionSnapshot

// ExporterConfig configures the Exporter.
type ExporterConfig struct {
	// Interval is how often Run pulls every source. Snapshots pushed with
	// Observe are exported immediately; the pull catches anything a push
	// path missed (a dropped notification, an idle class).
	Interval time.Duration
	// RetiredMemory is how many retired instance ids are remembered, so a
	// late or duplicated snapshot of a retired instance is ignored instead of
	// being counted again from zero. Oldest ids are forgotten first; memory
	// is 8 bytes per id plus map overhead.
	RetiredMemory int
}

// DefaultExporterConfig returns the defaults.
func DefaultExporterConfig() ExporterConfig {
	return ExporterConfig{Interval: 5 * time.Second, RetiredMemory: 4096}
}

// Validate reports the first bad field.
func (c ExporterConfig) Validate() error {
	if c.Interval <= 0 {
		return fmt.Errorf("%w: Interval must be positive, got %v", ErrInvalidConfig, c.Interval)
	}
	if c.RetiredMemory < 1 {
		return fmt.Errorf("%w: RetiredMemory must be at least 1, got %d", ErrInvalidConfig, c.RetiredMemory)
	}
	return nil
}

// RegisterFlags binds the config's fields to fs under prefix (e.g.
// "metrics.admission-").
func (c *ExporterConfig) RegisterFlags(fs *flag.FlagSet, prefix string) {
	fs.DurationVar(&c.Interval, prefix+"refresh-interval", c.Interval, "how often admission counters are pulled from the schedulers")
	fs.IntVar(&c.RetiredMemory, prefix+"retired-memory", c.RetiredMemory, "how many retired scheduler instance ids are remembered to ignore late snapshots")
}

// Exporter turns cumulative per-instance admission counters into Prometheus
// counters that never double count.
//
// It keeps, per (instance, worker type, class) and per series, the
// highest value already exported (the high-water mark) and adds only what a
// snapshot holds above it. Taking the maximum is idempotent, commutative and
// associative, so duplicated, reordered, stale or concurrent snapshots of one
// instance export exactly that instance's largest observed counts. Instances
// are independent: when a scheduler is replaced its successor starts from zero
// under a new id and its counts add onto the same Prometheus series, so totals
// stay monotonic and exact across ownership moves and reloads.
//
// Memory: marks per live (not yet retired) instance and class, plus cached
// counter handles per (worker type, class) label set, which the
// configuration bounds.
//
// All methods are safe for concurrent use; one mutex serialises them.
type Exporter struct {
	cfg   ExporterConfig
	adm   *Admission
	clock clock.Clock

	mu        sync.Mutex
	instances map[uint64]*instanceMarks
	retired   map[uint64]struct{}
	// retiredRing holds retired ids in retirement order; retiredNext is
	// where the next id goes, evicting the oldest once the ring is full.
	retiredRing []uint64
	retiredNext int
	handles     map[classKey]*classHandles
	sources     []SnapshotSource

	applied, duplicate, stale, ignored prometheus.Counter
	regressions                        prometheus.Counter
	instancesGauge                     prometheus.Gauge
}

type classKey struct{ workerType, class string }

// classHandles caches the counter children of one label set, shared by every
// instance that reports that class, so the hot path does no label lookups.
type classHandles struct {
	received, retried, admitted, cancelled prometheus.Counter
	rejected                               [numReasons]prometheus.Counter
}

type instanceMarks struct {
	maxSeq  uint64
	classes map[classKey]*classMarks
}

// classMarks are the high-water marks of one class in one instance. The
// layout mirrors classHandles: marks[i] pairs with counter i.
type classMarks struct {
	h                                      *classHandles
	received, retried, admitted, cancelled uint64
	rejected                               [numReasons]uint64
}

// NewExporter builds an exporter that writes into adm's counters and
// registers its own health metrics on reg. Run's periodic pulls wait on
// clk's tickers (nil: wall time); tests fire them by hand. It starts
// nothing; call Run for periodic pulls.
func NewExporter(cfg ExporterConfig, adm *Admission, reg prometheus.Registerer, clk clock.Clock) (*Exporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if adm == nil {
		return nil, fmt.Errorf("%w: Admission metrics are required", ErrInvalidConfig)
	}
	if clk == nil {
		clk = clock.Real{}
	}
	f := promauto.With(reg)
	snaps := f.NewCounterVec(prometheus.CounterOpts{
		Name: NameExporterSnapshots,
		Help: "Admission snapshots observed, by result: applied (newest seq), duplicate (same seq as the newest), stale (older seq; still merged), ignored (instance already retired).",
	}, []string{LabelResult})
	return &Exporter{
		cfg:         cfg,
		adm:         adm,
		clock:       clk,
		instances:   make(map[uint64]*instanceMarks),
		retired:     make(map[uint64]struct{}, cfg.RetiredMemory),
		retiredRing: make([]uint64, 0, cfg.RetiredMemory),
		handles:     make(map[classKey]*classHandles),
		applied:     snaps.WithLabelValues("applied"),
		duplicate:   snaps.WithLabelValues("duplicate"),
		stale:       snaps.WithLabelValues("stale"),
		ignored:     snaps.WithLabelValues("ignored"),
		regressions: f.NewCounter(prometheus.CounterOpts{
			Name: NameExporterCounterRegression,
			Help: "Series whose value went down in a newer snapshot of the same instance (a producer bug; the decrease is not exported).",
		}),
		instancesGauge: f.NewGauge(prometheus.GaugeOpts{
			Name: NameExporterInstances,
			Help: "Scheduler instances whose high-water marks are held.",
		}),
	}, nil
}

// AddSource registers a source that Refresh (and so Run) pulls.
func (e *Exporter) AddSource(src SnapshotSource) {
	e.mu.Lock()
	e.sources = append(e.sources, src)
	e.mu.Unlock()
}

// Observe merges one snapshot. It does not retain snap or its maps.
func (e *Exporter) Observe(snap AdmissionSnapshot) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, gone := e.retired[snap.Instance]; gone {
		e.ignored.Inc()
		return
	}
	inst, ok := e.instances[snap.Instance]
	newer := !ok || snap.Seq > inst.maxSeq
	if !ok {
		inst = &instanceMarks{classes: make(map[classKey]*classMarks, len(snap.Classes))}
		e.instances[snap.Instance] = inst
		e.instancesGauge.Set(float64(len(e.instances)))
	}
	// Older snapshots are still merged: a stale one may be the only one
	// carrying a class that newer snapshots of this instance no longer list.
	switch {
	case newer:
		inst.maxSeq = snap.Seq
		e.applied.Inc()
	case snap.Seq == inst.maxSeq:
		e.duplicate.Inc()
	default:
		e.stale.Inc()
	}
	for class, counts := range snap.Classes {
		key := classKey{snap.WorkerType, class}
		m, ok := inst.classes[key]
		if !ok {
			m = &classMarks{h: e.handlesFor(key)}
			inst.classes[key] = m
		}
		e.advance(m, counts, newer)
	}
}

// advance exports what counts holds above m's marks.
func (e *Exporter) advance(m *classMarks, c AdmissionCounts, newer bool) {
	e.raise(&m.received, c.Received, m.h.received, newer)
	e.raise(&m.retried, c.Retried, m.h.retried, newer)
	e.raise(&m.admitted, c.Admitted, m.h.admitted, newer)
	e.raise(&m.cancelled, c.Cancelled, m.h.cancelled, newer)
	var rej [numReasons]uint64
	for reason, v := range c.Rejected {
		rej[reasonIndex(reason)] += v
	}
	for i := range rej {
		e.raise(&m.rejected[i], rej[i], m.h.rejected[i], newer)
	}
}

func (e *Exporter) raise(mark *uint64, v uint64, c prometheus.Counter, newer bool) {
	switch {
	case v > *mark:
		c.Add(float64(v - *mark))
		*mark = v
	case v < *mark && newer:
		e.regressions.Inc()
	}
}

func (e *Exporter) handlesFor(k classKey) *classHandles {
	if h, ok := e.handles[k]; ok {
		return h
	}
	a := e.adm
	a.InitClass(k.workerType, k.class)
	h := &classHandles{
		received:  a.Received.WithLabelValues(k.workerType, k.class),
		retried:   a.Retried.WithLabelValues(k.workerType, k.class),
		admitted:  a.Admitted.WithLabelValues(k.workerType, k.class),
		cancelled: a.Cancelled.WithLabelValues(k.workerType, k.class),
	}
	for i, r := range rejectReasons {
		h.rejected[i] = a.Rejected.WithLabelValues(k.workerType, k.class, r)
	}
	e.handles[k] = h
	return h
}

// Retire forgets an instance's marks, so memory stays bounded as schedulers
// are replaced. Call it only once every count of the instance has been
// observed: its final snapshot, and for a class it stopped listing earlier,
// the last snapshot that listed it (simplest: schedulers keep listing classes
// that moved away until they end). Counts not yet observed are lost. Later
// snapshots of the instance are ignored (counted as "ignored") for as long as
// its id stays among the RetiredMemory most recent retirements.
func (e *Exporter) Retire(instance uint64) {
	e.mu.Lock()
	defer e.mu.Unlock()
	delete(e.instances, instance)
	e.instancesGauge.Set(float64(len(e.instances)))
	if _, dup := e.retired[instance]; dup {
		return
	}
	if len(e.retiredRing) < e.cfg.RetiredMemory {
		e.retiredRing = append(e.retiredRing, instance)
	} else {
		delete(e.retired, e.retiredRing[e.retiredNext])
		e.retiredRing[e.retiredNext] = instance
		e.retiredNext = (e.retiredNext + 1) % len(e.retiredRing)
	}
	e.retired[instance] = struct{}{}
}

// Refresh pulls every registered source once and observes what they return.
func (e *Exporter) Refresh() {
	e.mu.Lock()
	srcs := append([]SnapshotSource(nil), e.sources...)
	e.mu.Unlock()
	for _, src := range srcs {
		for _, s := range src() {
			e.Observe(s)
		}
	}
}

// Run pulls every source each Interval until ctx ends, then returns nil. It
// starts no goroutines.
func (e *Exporter) Run(ctx context.Context) error {
	t := e.clock.NewTicker(e.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
			e.Refresh()
		}
	}
}
