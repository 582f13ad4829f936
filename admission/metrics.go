package admission

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/switchyard/switchyard/metrics"
)

// Metrics are the remote-admission collectors of one replica.
type Metrics struct {
	// DegradedByClass, when set, also counts degraded admissions per class
	// (metrics.Admission.DegradedAdmissions, labelled by class).
	DegradedByClass *prometheus.CounterVec

	remoteSeconds   *prometheus.HistogramVec
	retries         *prometheus.CounterVec
	staleGrants     prometheus.Counter
	degraded        prometheus.Gauge
	degradedAdmits  prometheus.Counter
	etcdDegraded    prometheus.Gauge
	decodeErrors    *prometheus.CounterVec
	staleLifeMarks  prometheus.Counter
	cancelledGrants prometheus.Counter
	// statusProbes and statusAnswers: the entry's probes of silent
	// attempts by result, the owner's answers by status (status.go).
	statusProbes      *prometheus.CounterVec
	statusAnswers     *prometheus.CounterVec
	adopted           prometheus.Counter
	rehomed           prometheus.Counter
	entryRejected     *prometheus.CounterVec
	inflightBookings  prometheus.Gauge
	renewalsPublished prometheus.Counter
	// ownerUnreachableAdmits and unreachableOwners: classes admitted
	// locally because their registered owner answered "no responders".
	ownerUnreachableAdmits *prometheus.CounterVec
	unreachableOwners      prometheus.Gauge
	heldForAdoption        prometheus.Counter
	// adoptHolds counts the new owners' adoption holds by how they ended
	// (complete: every live entry reported its re-home round; bound).
	adoptHolds *prometheus.CounterVec
	// degradedQuotaAdmits and degradedQuotaRejects: degraded admissions
	// by quota policy, and their rejections by policy and reason.
	degradedQuotaAdmits  *prometheus.CounterVec
	degradedQuotaRejects *prometheus.CounterVec
	bucketSyncErrors     *prometheus.CounterVec
	// capacity leasing of tenant quotas (quota.go, quotaowner.go)
	quotaAcquires *prometheus.CounterVec
	// quotaFast and quotaSlow are quotaAcquires' series, bound once: the
	// fast path runs for every leased request, and a label lookup would
	// cost it a hash and a lock each time.
	quotaFast, quotaSlow prometheus.Counter
	quotaLeaseRequests   *prometheus.CounterVec
	quotaGrants          *prometheus.CounterVec
	quotaRecalls         *prometheus.CounterVec
	quotaFallbacks       *prometheus.CounterVec
}

// NewMetrics registers the collectors with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	m := &Metrics{
		remoteSeconds: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metrics.NameAdmissionRemoteSeconds,
			Help:    "Time from sending an admit request to a remote owner to its reply, by result.",
			Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
		}, []string{metrics.LabelResult}),
		retries: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionEntryRetries,
			Help: "Admission attempts an entry replica repeated, by cause (no_owner, ownership_moved, owner_changed, stale_grant, nats_error, reply_timeout, connection_lost, status_unknown, status_unreachable).",
		}, []string{"cause"}),
		staleGrants: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionStaleGrants,
			Help: "Grants ignored because their epoch was older than the newest known for the class (fencing).",
		}),
		degraded: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameAdmissionDegraded,
			Help: "1 while NATS is unreachable and this replica admits every class locally.",
		}),
		degradedAdmits: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionDegradedAdmissions,
			Help: "Requests of classes owned elsewhere (or by nobody reachable) that this replica admitted locally in a degraded mode (NATS or etcd unreachable).",
		}),
		etcdDegraded: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameAdmissionEtcdDegraded,
			Help: "1 while this replica's etcd session is unhealthy and requests that find no owner are admitted locally after a bound.",
		}),
		decodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionDecodeErrors,
			Help: "Malformed admission messages received, by message.",
		}, []string{"message"}),
		staleLifeMarks: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionStaleLifeMarks,
			Help: "Lifecycle marks dropped because they name another instance of this owner (its previous life).",
		}),
		cancelledGrants: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionCancelledGrants,
			Help: "Grants withdrawn (rolled back, counted cancelled) because the entry's cancel of the attempt had arrived before its admit request.",
		}),
		statusProbes: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionStatusProbes,
			Help: "Status probes this entry replica sent about admit requests with no answer after the status bound, by result (queued, granted, unknown, no_responders, timeout, error).",
		}, []string{metrics.LabelResult}),
		statusAnswers: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionStatusAnswers,
			Help: "Status probes this replica answered as the owner an attempt was sent to, by status (queued, granted, unknown).",
		}, []string{"status"}),
		adopted: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionAdoptedBookings,
			Help: "In-flight bookings this replica adopted as a class's new owner.",
		}),
		rehomed: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionRehomedBookings,
			Help: "In-flight bookings this entry replica moved to a class's new owner.",
		}),
		entryRejected: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionEntryRejected,
			Help: "Requests the entry replica gave up on before any owner answered, by reason.",
		}, []string{metrics.LabelReason}),
		inflightBookings: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameAdmissionInflightBookings,
			Help: "Granted requests this entry replica is streaming.",
		}),
		renewalsPublished: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionRenewals,
			Help: "Renewal marks sent for in-flight bookings.",
		}),
		ownerUnreachableAdmits: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionOwnerUnreachableAdmissions,
			Help: "Requests this entry replica admitted locally because their class's registered owner answered NATS \"no responders\" for longer than the bound, by class.",
		}, []string{metrics.LabelClass}),
		unreachableOwners: f.NewGauge(prometheus.GaugeOpts{
			Name: metrics.NameAdmissionUnreachableOwners,
			Help: "Classes whose registered owner has answered NATS \"no responders\" for longer than the bound (admitted locally meanwhile).",
		}),
		heldForAdoption: f.NewCounter(prometheus.CounterOpts{
			Name: metrics.NameAdmissionHeldForAdoption,
			Help: "Tenant requests with a concurrency quota this replica held, as a class's new owner, until the entries' bookings were adopted.",
		}),
		adoptHolds: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionAdoptHolds,
			Help: "Adoption holds of classes this replica acquired, by how they ended: complete (every live entry replica reported its re-home round for the class and epoch) or bound (the hold's bound passed first).",
		}, []string{"end"}),
		degradedQuotaAdmits: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionDegradedQuotaAdmissions,
			Help: "Requests this replica admitted locally in a degraded mode, by the degraded quota policy in force (split, whole, closed).",
		}, []string{"policy"}),
		degradedQuotaRejects: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionDegradedQuotaRejections,
			Help: "Degraded local admissions rejected by a tenant quota, a class queue limit or the closed policy, by the degraded quota policy in force and reason.",
		}, []string{"policy", metrics.LabelReason}),
		bucketSyncErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionBucketSyncErrors,
			Help: "Failed saves and loads of the tenant bucket levels that travel with a class, by op (save, load).",
		}, []string{"op"}),
		quotaAcquires: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionQuotaAcquires,
			Help: "Tenant quota checks of requests this replica admits as a class owner, by path (fast: the local lease had room; slow: a lease round trip to the tenant's quota owner).",
		}, []string{"path"}),
		quotaLeaseRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionQuotaLeaseRequests,
			Help: "Lease round trips this replica made to tenants' quota owners as a holder, by result (granted, denied, held, not_owner, error, report).",
		}, []string{metrics.LabelResult}),
		quotaGrants: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionQuotaGrants,
			Help: "Lease requests this replica answered as a tenant's quota owner, by result (granted, denied, held, not_owner, report).",
		}, []string{metrics.LabelResult}),
		quotaRecalls: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionQuotaRecalls,
			Help: "Idle leases this replica recalled from holders as a tenant's quota owner before refusing, by result (returned, busy, error).",
		}, []string{metrics.LabelResult}),
		quotaFallbacks: f.NewCounterVec(prometheus.CounterOpts{
			Name: metrics.NameAdmissionQuotaFallbacks,
			Help: "Requests admitted against this class owner's own per-owner quota because the tenant's quota owner could not be asked, by cause (unreachable, no_owner).",
		}, []string{"cause"}),
	}
	m.quotaFast = m.quotaAcquires.WithLabelValues("fast")
	m.quotaSlow = m.quotaAcquires.WithLabelValues("slow")
	return m
}
