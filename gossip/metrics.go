package gossip

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Drop reasons (label values of switchyard_gossip_dropped_messages_total).
const (
	dropInboxFull      = "inbox_full"
	dropPredictionFull = "prediction_queue_full"
	dropStopped        = "stopped"
	dropExpired        = "expired"
	dropInvalidWorker  = "invalid_worker"
)

type metrics struct {
	lag            prometheus.Histogram
	messageBytes   *prometheus.HistogramVec
	stateBytes     prometheus.Histogram
	dropped        *prometheus.CounterVec
	decodeErrors   *prometheus.CounterVec
	members        prometheus.Gauge
	healthScore    prometheus.Gauge
	departing      prometheus.Gauge
	broadcastBytes prometheus.Counter
	relayed        *prometheus.CounterVec
	transportSent  *prometheus.CounterVec
	joinFailures   prometheus.Counter
	memberlistLogs *prometheus.CounterVec
	queued         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	sizeBuckets := prometheus.ExponentialBuckets(32, 2, 16) // 32 B .. 1 MiB
	return &metrics{
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "switchyard_gossip_propagation_lag_seconds",
			Help:    "Time from an origin authoring a load or prediction message to its first receipt here (author's clock vs ours).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
		}),
		messageBytes: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "switchyard_gossip_message_bytes",
			Help:    "Size of gossip messages received, by kind.",
			Buckets: sizeBuckets,
		}, []string{"kind"}),
		stateBytes: f.NewHistogram(prometheus.HistogramOpts{
			Name:    "switchyard_gossip_state_bytes",
			Help:    "Size of the full state sent on push-pull.",
			Buckets: sizeBuckets,
		}),
		dropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gossip_dropped_messages_total",
			Help: "Gossip messages dropped instead of processed, by reason.",
		}, []string{"reason"}),
		decodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gossip_decode_errors_total",
			Help: "Gossip payloads rejected by a decoder, by payload (message, state, meta).",
		}, []string{"payload"}),
		members: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gossip_members",
			Help: "Live gossip members, including this replica.",
		}),
		healthScore: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gossip_health_score",
			Help: "memberlist's awareness score: 0 is healthy; higher means this node misses probes and slows its own timers.",
		}),
		departing: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gossip_departing_origins",
			Help: "Departed replicas whose contributions wait for the grace period before removal.",
		}),
		broadcastBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gossip_broadcast_bytes_total",
			Help: "Bytes of gossip payload handed to memberlist for broadcast (each retransmission counted).",
		}),
		relayed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gossip_relayed_messages_total",
			Help: "Received messages queued again for epidemic relay, by kind.",
		}, []string{"kind"}),
		transportSent: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gossip_transport_sent_bytes_total",
			Help: "Bytes memberlist wrote to the network (UDP packets and TCP streams), all message types.",
		}, []string{"path"}),
		joinFailures: f.NewCounter(prometheus.CounterOpts{
			Name: "switchyard_gossip_join_failures_total",
			Help: "Join attempts in which no seed member could be joined.",
		}),
		memberlistLogs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "switchyard_gossip_memberlist_log_messages_total",
			Help: "Log lines written by memberlist, by level; errors include packets from foreign clusters.",
		}, []string{"level"}),
		queued: f.NewGauge(prometheus.GaugeOpts{
			Name: "switchyard_gossip_broadcast_queue",
			Help: "Broadcasts waiting in the transmit queue.",
		}),
	}
}
