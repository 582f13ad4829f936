package gossip

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	// Imported under another name: this package's collector set is the
	// type metrics.
	metricnames "github.com/switchyard/switchyard/metrics"
)

// Drop reasons (label values of switchyard_gossip_dropped_messages_total).
// Every one is exported at zero from the start (newMetrics), so rate() sees
// the first drop and dashboards show "no drops" rather than "no data".
const (
	dropInboxFull      = "inbox_full"
	dropPredictionFull = "prediction_queue_full"
	dropStopped        = "stopped"
	dropExpired        = "expired"
	dropInvalidWorker  = "invalid_worker"
	dropSessionFull    = "session_queue_full"
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
	fetches        *prometheus.CounterVec
	fetchedEntries *prometheus.CounterVec
}

var dropReasons = []string{dropInboxFull, dropPredictionFull, dropStopped, dropExpired, dropInvalidWorker, dropSessionFull}

func newMetrics(reg prometheus.Registerer) *metrics {
	f := promauto.With(reg)
	sizeBuckets := prometheus.ExponentialBuckets(32, 2, 16) // 32 B .. 1 MiB
	m := &metrics{
		lag: f.NewHistogram(prometheus.HistogramOpts{
			Name:    metricnames.NameGossipPropagationLag,
			Help:    "Time from an origin authoring a load or prediction message to its first receipt here (author's clock vs ours).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14), // 1 ms .. 8 s
		}),
		messageBytes: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    metricnames.NameGossipMessageBytes,
			Help:    "Size of gossip messages received, by kind.",
			Buckets: sizeBuckets,
		}, []string{"kind"}),
		stateBytes: f.NewHistogram(prometheus.HistogramOpts{
			Name:    metricnames.NameGossipStateBytes,
			Help:    "Size of the push-pull payload sent: the per-origin digest (the full state before codec version 4).",
			Buckets: sizeBuckets,
		}),
		dropped: f.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.NameGossipDroppedMessages,
			Help: "Gossip messages dropped instead of processed, by reason.",
		}, []string{"reason"}),
		decodeErrors: f.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.NameGossipDecodeErrors,
			Help: "Gossip payloads rejected by a decoder, by payload (message, state, meta).",
		}, []string{"payload"}),
		members: f.NewGauge(prometheus.GaugeOpts{
			Name: metricnames.NameGossipMembers,
			Help: "Live gossip members, including this replica.",
		}),
		healthScore: f.NewGauge(prometheus.GaugeOpts{
			Name: metricnames.NameGossipHealthScore,
			Help: "memberlist's awareness score: 0 is healthy; higher means this node misses probes and slows its own timers.",
		}),
		departing: f.NewGauge(prometheus.GaugeOpts{
			Name: metricnames.NameGossipDepartingOrigins,
			Help: "Departed replicas whose contributions wait for the grace period before removal.",
		}),
		broadcastBytes: f.NewCounter(prometheus.CounterOpts{
			Name: metricnames.NameGossipBroadcastBytes,
			Help: "Bytes of gossip payload handed to memberlist for broadcast (each retransmission counted).",
		}),
		relayed: f.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.NameGossipRelayedMessages,
			Help: "Received messages queued again for epidemic relay, by kind.",
		}, []string{"kind"}),
		transportSent: f.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.NameGossipTransportSentBytes,
			Help: "Bytes memberlist wrote to the network (UDP packets and TCP streams), all message types.",
		}, []string{"path"}),
		joinFailures: f.NewCounter(prometheus.CounterOpts{
			Name: metricnames.NameGossipJoinFailures,
			Help: "Join attempts in which no seed member could be joined.",
		}),
		memberlistLogs: f.NewCounterVec(prometheus.CounterOpts{
			Name: metricnames.NameGossipMemberlistLogMessages,
			Help: "Log lines written by memberlist, by level; errors include packets from foreign clusters.",
		}, []string{"level"}),
		queued: f.NewGauge(prometheus.GaugeOpts{
			Name: metricnames.NameGossipBroadcastQueue,
			Help: "Broadcasts waiting in the transmit queue.",
		}),
	}
	m.fetches = f.NewCounterVec(prometheus.CounterOpts{
		Name: metricnames.NameGossipFetches,
		Help: "Repair fetches after a push-pull digest differed, by event (requested, answered, received, send_error, queue_full).",
	}, []string{"event"})
	m.fetchedEntries = f.NewCounterVec(prometheus.CounterOpts{
		Name: metricnames.NameGossipFetchedEntries,
		Help: "Entries received in fetch answers, by outcome: new (joined), known (already held or older), own (claims about this replica).",
	}, []string{"outcome"})
	for _, e := range fetchEvents {
		m.fetches.WithLabelValues(e)
	}
	for _, o := range []string{"new", "known", "own"} {
		m.fetchedEntries.WithLabelValues(o)
	}
	for _, r := range dropReasons {
		m.dropped.WithLabelValues(r)
	}
	return m
}
