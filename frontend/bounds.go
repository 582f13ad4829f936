package frontend

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// ErrOverloaded marks a request refused because the replica holds as many
// requests, or as many buffered body bytes, as it may (HTTP 503).
var ErrOverloaded = errors.New("frontend: overloaded")

// Reasons of switchyard_router_overload_rejected_total.
const (
	overloadInflight  = "inflight"
	overloadBodyBytes = "body_bytes"
)

// ingressBounds bound what the API's requests hold in one replica, over
// every connection and protocol: -http.max-conns counts connections, and
// one HTTP/2 connection carries up to MaxConcurrentStreams requests, each
// allowed a MaxBodyBytes body held in memory until it ends (it is kept for
// retries on other workers). Counters are atomics: a request books, checks,
// and backs out when over, so the bounds are never exceeded (two requests
// racing at the bound may both be refused).
type ingressBounds struct {
	maxInflight, maxBytes, maxBody int64 // 0: unbounded (maxBody: Config.MaxBodyBytes)
	inflight, bytes                atomic.Int64
	refusedInflight, refusedBytes  prometheus.Counter
	retryAfter                     int
}

func newIngressBounds(cfg Config, reg prometheus.Registerer) *ingressBounds {
	b := &ingressBounds{maxInflight: int64(cfg.MaxInflight), maxBytes: cfg.MaxBufferedBodyBytes, maxBody: cfg.MaxBodyBytes,
		retryAfter: int(cfg.RetryAfter.Seconds())}
	f := promauto.With(reg)
	v := f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_overload_rejected_total",
		Help: "API requests refused with 503 because the replica was at a bound, by reason (inflight: -http.max-inflight; body_bytes: -http.max-buffered-body-bytes)."},
		[]string{"reason"})
	b.refusedInflight, b.refusedBytes = v.WithLabelValues(overloadInflight), v.WithLabelValues(overloadBodyBytes)
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "switchyard_router_inflight_requests",
		Help: "API requests (POST) being served by this replica, streams included."}, func() float64 { return float64(b.inflight.Load()) })
	f.NewGaugeFunc(prometheus.GaugeOpts{Name: "switchyard_router_buffered_body_bytes",
		Help: "Request body bytes booked by the API requests being served (a body of unknown length books -http.max-body-bytes)."},
		func() float64 { return float64(b.bytes.Load()) })
	return b
}

// bodyBooking is what a request books against maxBytes: its announced
// length, or MaxBodyBytes when it announces none (chunked, or HTTP/2
// without content-length); a body announced over MaxBodyBytes is refused
// with 413 before it is read and books nothing.
func (b *ingressBounds) bodyBooking(r *http.Request) int64 {
	switch n := r.ContentLength; {
	case n < 0:
		return b.maxBody
	case n > b.maxBody:
		return 0
	default:
		return n
	}
}

// enter books r, or returns the reason it is refused.
func (b *ingressBounds) enter(r *http.Request) (int64, string) {
	if n := b.inflight.Add(1); b.maxInflight > 0 && n > b.maxInflight {
		b.inflight.Add(-1)
		b.refusedInflight.Inc()
		return 0, overloadInflight
	}
	body := b.bodyBooking(r)
	if n := b.bytes.Add(body); b.maxBytes > 0 && body > 0 && n > b.maxBytes {
		b.bytes.Add(-body)
		b.inflight.Add(-1)
		b.refusedBytes.Inc()
		return 0, overloadBodyBytes
	}
	return body, ""
}

func (b *ingressBounds) leave(body int64) {
	b.bytes.Add(-body)
	b.inflight.Add(-1)
}

// bounded applies the bounds to the API's requests (POST: they carry the
// bodies and hold the streams); GET routes (health, readiness, models,
// admin) stay reachable when the replica is full. Over a bound: 503 with
// Retry-After, before the body is read or anything is admitted, so the
// client may retry anywhere.
func (b *ingressBounds) bounded(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			h.ServeHTTP(w, r)
			return
		}
		body, reason := b.enter(r)
		if reason != "" {
			e := &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "overloaded",
				Message: b.refusal(reason), RetryAfter: b.retryAfter, err: ErrOverloaded}
			e.write(w)
			return
		}
		defer b.leave(body)
		h.ServeHTTP(w, r)
	})
}

func (b *ingressBounds) refusal(reason string) string {
	if reason == overloadInflight {
		return "the router is serving as many requests as it may (" + strconv.FormatInt(b.maxInflight, 10) + "); retry"
	}
	return fmt.Sprintf("the router holds as many request body bytes as it may (%d); retry", b.maxBytes)
}

// h2OverMaxStreams is net/http's name for a stream refused because the
// client opened more than the server's SETTINGS allow.
const h2OverMaxStreams = "stream_PROTOCOL_ERROR_over_max_streams"

// http2Errors counts the HTTP/2 errors net/http reports (a client opening
// more streams than MaxConcurrentStreams allows is refused by the
// protocol, counted as h2OverMaxStreams).
func http2Errors(reg prometheus.Registerer) *prometheus.CounterVec {
	v := promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_http2_errors_total",
		Help: "HTTP/2 protocol errors on the router's listeners, by net/http's error type (stream_PROTOCOL_ERROR_over_max_streams: a client past -http.max-concurrent-streams)."},
		[]string{"type"})
	v.WithLabelValues(h2OverMaxStreams)
	return v
}
