// Package metrics owns Switchyard's Prometheus vocabulary: metric names, label
// names, histogram buckets, the registry and /metrics handler, the collector
// groups the app and the frontend record into (Admission, Router), and the
// admission high-water exporter. The index, cluster and gossip adapters build
// their own collectors, under the Name* constants declared here.
//
// It is a leaf: it imports nothing of ours but internal/clock, so the
// scheduler, adapters and the app can all depend on it without cycles. Adapters that cannot import it (the
// scheduler core) publish plain snapshots; the app converts them to
// AdmissionSnapshot and feeds the Exporter.
//
// # Cardinality
//
// Every label has a bounded value set, fixed by configuration or by code:
// model and worker type (configured models), class (configured policy classes),
// reason (RejectReasons), worker (registered workers, tens), route (a fixed
// list), code (HTTP status codes). Request ids, prompt text, raw header values
// and client addresses are never labels: one series per request would grow the
// Prometheus head without bound and make every query slow. Callers that might
// receive an unexpected value map it through the helpers here (Reason, Route)
// which fold unknown values into "other".
//
// # Concurrency
//
// Collector groups are safe for concurrent use (client_golang collectors are).
// The Exporter serialises Observe, Retire and its periodic pull behind one
// mutex, so snapshots may arrive from any number of goroutines. Constructors
// start nothing; Exporter.Run owns the only goroutine-like loop here and returns
// when its context ends. Nothing registers globally: every constructor takes a
// prometheus.Registerer and builds its collectors with promauto.With(reg).
package metrics
