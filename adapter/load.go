package adapter

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/wire"
)

// LoadConfig configures a LoadReporter.
type LoadConfig struct {
	Worker  string
	Cluster string
	// Interval is the scrape (and report) period.
	Interval time.Duration
	// Timeout bounds one scrape.
	Timeout time.Duration
	// Flavor names the metrics read; 0 tries vLLM's names, then SGLang's
	// (a generic OpenAI server whose -metrics-url may export either).
	Flavor Flavor
}

// Validate names the first bad field.
func (c LoadConfig) Validate() error {
	switch {
	case !wire.ValidName(c.Worker):
		return fmt.Errorf("%w: load Worker %q", ErrInvalidConfig, c.Worker)
	case !wire.ValidName(c.Cluster):
		return fmt.Errorf("%w: load Cluster %q", ErrInvalidConfig, c.Cluster)
	case c.Interval <= 0:
		return fmt.Errorf("%w: load Interval %v must be positive", ErrInvalidConfig, c.Interval)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: load Timeout %v must be positive", ErrInvalidConfig, c.Timeout)
	case c.Flavor != 0 && c.Flavor != FlavorVLLM && c.Flavor != FlavorSGLang:
		return fmt.Errorf("%w: load Flavor %v", ErrInvalidConfig, c.Flavor)
	}
	return nil
}

// LoadReporter scrapes the engine's Prometheus endpoint and publishes
// wire.LoadReport on the worker's load subject. A failed or unusable
// scrape is counted and skipped; it never stops the reporter.
type LoadReporter struct {
	cfg      LoadConfig
	eng      *engineClient
	nc       *nats.Conn
	subject  string
	position func() (instance, lastID uint64)
	total    func() int // KV blocks of the registration; 0 until known
	log      *zap.Logger
	scrapes  *prometheus.CounterVec
	reports  *prometheus.CounterVec
	seq      uint64
}

// newLoadReporter builds a reporter. position gives the instance and last
// event id to report (the mirror's, so routers can check their index);
// total the registered pool size.
func newLoadReporter(cfg LoadConfig, eng *engineClient, nc *nats.Conn, position func() (uint64, uint64), total func() int,
	log *zap.Logger, reg prometheus.Registerer) (*LoadReporter, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := promauto.With(reg)
	return &LoadReporter{
		cfg: cfg, eng: eng, nc: nc, subject: wire.NewSubjects(cfg.Cluster).Load(cfg.Worker),
		position: position, total: total, log: log.Named("load"),
		scrapes: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_load_scrapes_total",
			Help: "Scrapes of the engine's metrics, by result (ok, failed, malformed)."}, []string{"result"}),
		reports: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_adapter_load_reports_total",
			Help: "Load reports published, by result (ok, error)."}, []string{"result"}),
	}, nil
}

// Run scrapes and reports every Interval until ctx ends; it returns nil.
func (l *LoadReporter) Run(ctx context.Context) error {
	tick := time.NewTicker(l.cfg.Interval)
	defer tick.Stop()
	for {
		l.once(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func (l *LoadReporter) once(ctx context.Context) {
	total := l.total()
	if total <= 0 {
		return // not registered yet: nothing to report against
	}
	sctx, cancel := context.WithTimeout(ctx, l.cfg.Timeout)
	text, err := l.eng.Scrape(sctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		l.scrapes.WithLabelValues("failed").Inc()
		l.log.Debug("scrape engine metrics", zap.Error(err))
		return
	}
	var load Load
	if l.cfg.Flavor != 0 {
		load, err = ParseLoadMetrics(text, l.cfg.Flavor)
	} else if load, err = ParseLoadMetrics(text, FlavorVLLM); err != nil {
		load, err = ParseLoadMetrics(text, FlavorSGLang)
	}
	if err != nil {
		l.scrapes.WithLabelValues("malformed").Inc()
		l.log.Debug("engine metrics unusable", zap.Error(err))
		return
	}
	l.scrapes.WithLabelValues("ok").Inc()
	instance, lastID := l.position()
	l.seq++
	r := &wire.LoadReport{Worker: l.cfg.Worker, Instance: instance, Seq: l.seq,
		Running: load.Running, Waiting: load.Waiting, KVUsage: load.KVUsage, PrefixHitRate: load.PrefixHitRate,
		KVBlocksUsed: int(math.Round(load.KVUsage * float64(total))), KVBlocksTotal: total,
		LastEventID: lastID, TimeUnixNano: time.Now().UnixNano()}
	if err := l.nc.Publish(l.subject, wire.EncodeLoadReport(r)); err != nil {
		l.reports.WithLabelValues("error").Inc()
		return
	}
	l.reports.WithLabelValues("ok").Inc()
}
