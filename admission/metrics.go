package admission

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the remote-admission collectors of one replica.
type Metrics struct {
	// DegradedByClass, when set, also counts degraded admissions per class
	// (metrics.Admission.DegradedAdmissions, labelled by class).
	DegradedByClass *prometheus.CounterVec

	remoteSeconds     *prometheus.HistogramVec
	retries           *prometheus.CounterVec
	staleGrants       prometheus.Counter
	degraded          prometheus.Gauge
	degradedAdmits    prometheus.Counter
	decodeErrors      *prometheus.CounterVec
	adopted           prometheus.Counter
	rehomed           prometheus.Counter
	entryRejected     *prometheus.CounterVec
	inflightBookings  prometheus.Gauge
	renewalsPublished prometheus.Counter
}

// NewMetrics registers the collectors with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		remoteSeconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_admission_remote_seconds",
			Help:    "Time from sending an admit request to a remote owner to its reply, by result.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}, []string{"result"}),
		retries: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_admission_entry_retries_total",
			Help: "Admission attempts an entry replica repeated, by cause (no_owner, ownership_moved, owner_changed, stale_grant, nats_error).",
		}, []string{"cause"}),
		staleGrants: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_admission_stale_grants_total",
			Help: "Grants ignored because their epoch was older than the newest known for the class (fencing).",
		}),
		degraded: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_admission_degraded",
			Help: "1 while NATS is unreachable and this replica admits every class locally.",
		}),
		degradedAdmits: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_admission_degraded_admissions_total",
			Help: "Requests of classes owned elsewhere that this replica admitted locally in degraded mode.",
		}),
		decodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_admission_decode_errors_total",
			Help: "Malformed admission messages received, by message.",
		}, []string{"message"}),
		adopted: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_admission_adopted_bookings_total",
			Help: "In-flight bookings this replica adopted as a class's new owner.",
		}),
		rehomed: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_admission_rehomed_bookings_total",
			Help: "In-flight bookings this entry replica moved to a class's new owner.",
		}),
		entryRejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_admission_entry_rejected_total",
			Help: "Requests the entry replica gave up on before any owner answered, by reason.",
		}, []string{"reason"}),
		inflightBookings: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_admission_inflight_bookings",
			Help: "Granted requests this entry replica is streaming.",
		}),
		renewalsPublished: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_admission_renewals_total",
			Help: "Renewal marks sent for in-flight bookings.",
		}),
	}
	return m
}
