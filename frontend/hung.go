package frontend

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/scheduler"
)

// A hung engine (stopped, deadlocked, swapping) keeps its TCP connections
// open and answers nothing; without a bound, a request sent to it waits as
// long as the hang, although nothing has reached its client and another
// worker could serve it. The first-byte timeout turns such an attempt into
// a retry, and consecutive timeouts on one worker mark it suspect for every
// replica (Suspects) before the engine's health probes notice.

// ErrFirstByteTimeout is the cause of an attempt cancelled because its
// worker sent nothing usable within the first-byte timeout.
var ErrFirstByteTimeout = errors.New("frontend: no first byte from the worker within the first-byte timeout")

// Reasons of a first-byte timeout (the metric's reason label).
const (
	// firstByteNoHeaders: no response headers (a non-streaming request's
	// headers come with its whole answer).
	firstByteNoHeaders = "no_headers"
	// firstByteNoEvent: a stream's headers perhaps, but no data event. The
	// router holds the client's headers back until the first event, so
	// nothing reached the client either way.
	firstByteNoEvent = "no_first_event"
)

// hungMetrics are the first-byte timeout's and the suspicion's counters.
type hungMetrics struct {
	timeouts *prometheus.CounterVec
	suspects prometheus.Counter
}

func newHungMetrics(reg prometheus.Registerer) *hungMetrics {
	f := promauto.With(reg)
	m := &hungMetrics{
		timeouts: f.NewCounterVec(prometheus.CounterOpts{Name: "switchyard_router_first_byte_timeouts_total",
			Help: "Attempts cancelled because the worker sent nothing usable within the first-byte timeout, then retried on another worker, by reason (no_headers, no_first_event)."},
			[]string{"reason"}),
		suspects: f.NewCounter(prometheus.CounterOpts{Name: "switchyard_router_worker_suspicions_total",
			Help: "Times this replica marked a worker suspect for every replica after consecutive first-byte timeouts (or another one while suspect)."}),
	}
	m.timeouts.WithLabelValues(firstByteNoHeaders)
	m.timeouts.WithLabelValues(firstByteNoEvent)
	return m
}

// suspicion counts each worker's consecutive first-byte timeouts at this
// replica and tells Suspects when they reach the threshold, and when a
// request to a suspect worker succeeds. Safe for concurrent use.
type suspicion struct {
	after int      // SuspectAfter; 0: never suspect
	port  Suspects // nil: count only
	// streak is worker → *atomic.Int32, its consecutive timeouts: read on
	// every success, written on timeouts.
	streak sync.Map
}

// timedOut records a first-byte timeout on worker and reports whether it
// marked the worker suspect. A worker already at the threshold is marked
// again (the suspicion is renewed), so one more timeout after it expired
// suspects it again at once.
func (s *suspicion) timedOut(worker string) bool {
	v, _ := s.streak.LoadOrStore(worker, new(atomic.Int32))
	n := v.(*atomic.Int32).Add(1)
	if s.after <= 0 || s.port == nil || int(n) < s.after {
		return false
	}
	s.port.Suspect(worker)
	return true
}

// succeeded records a request to worker that produced its first byte.
func (s *suspicion) succeeded(worker string) {
	if v, ok := s.streak.Load(worker); ok && v.(*atomic.Int32).Load() != 0 {
		v.(*atomic.Int32).Store(0)
		if s.port != nil {
			s.port.Recovered(worker)
		}
		return
	}
	if s.port != nil && s.port.Suspected(worker) {
		s.port.Recovered(worker)
	}
}

// firstByte is one attempt's first-byte timer. Its state moves once, from
// waiting to arrived (the first byte came: the timer is stopped) or to
// expired (the timer fired first: the attempt's context is cancelled with
// ErrFirstByteTimeout); the atomic decides the race between the two.
type firstByte struct {
	state  atomic.Int32 // fbWaiting, fbArrived, fbExpired
	timer  *time.Timer
	cancel context.CancelCauseFunc
}

const (
	fbWaiting int32 = iota
	fbArrived
	fbExpired
)

// startFirstByte arms a timer of d over a child of parent, the context the
// attempt's request to the worker must use. The timer runs on wall time:
// it bounds a wait on the network, like the transport's dial timeout.
func startFirstByte(parent context.Context, d time.Duration) (*firstByte, context.Context) {
	ctx, cancel := context.WithCancelCause(parent)
	fb := &firstByte{cancel: cancel}
	fb.timer = time.AfterFunc(d, func() {
		if fb.state.CompareAndSwap(fbWaiting, fbExpired) {
			cancel(ErrFirstByteTimeout)
		}
	})
	return fb, ctx
}

// arrived stops the timer and reports true, or reports false when it
// already fired (the attempt is then cancelled). A nil firstByte (no
// timeout armed) always reports true.
func (fb *firstByte) arrived() bool {
	if fb == nil {
		return true
	}
	if fb.state.CompareAndSwap(fbWaiting, fbArrived) {
		fb.timer.Stop()
		return true
	}
	return fb.state.Load() == fbArrived
}

// expired reports whether the timer fired before the first byte.
func (fb *firstByte) expired() bool { return fb != nil && fb.state.Load() == fbExpired }

// stop releases the timer and the attempt's context once the attempt is
// over.
func (fb *firstByte) stop() {
	if fb == nil {
		return
	}
	fb.timer.Stop()
	fb.cancel(nil)
}

// firstByteTimeout is the attempt's first-byte timeout on grant g, or 0
// when none applies: the feature is off, the attempt could not move to
// another worker anyway (pinned, the last attempt, or no other eligible
// worker left: a slow answer beats none), or a non-streaming request's
// answer is unbounded (no max_tokens).
func (x *exchange) firstByteTimeout(g scheduler.Grant) time.Duration {
	c := &x.s.cfg
	if c.FirstByteCap <= 0 || !x.others || !x.canRetry() || x.attempt+1 >= c.MaxAttempts {
		return 0
	}
	d := c.FirstByteCap
	if g.PredictedTTFT > 0 {
		d = min(c.FirstByteCap, max(c.FirstByteFloor, time.Duration(float64(g.PredictedTTFT)*c.FirstByteFactor)))
	}
	if !x.p.stream {
		if x.p.maxTokens <= 0 {
			return 0
		}
		d += time.Duration(x.p.maxTokens) * c.FirstBytePerToken
	}
	return d
}

// firstByteTimedOut counts an attempt whose timer fired, feeds the
// worker's suspicion, and asks for a retry elsewhere (the ticket is
// already finished as aborted: the booking is released).
func (x *exchange) firstByteTimedOut(g scheduler.Grant, reason string) (int, bool) {
	x.s.hung.timeouts.WithLabelValues(reason).Inc()
	marked := x.s.suspects.timedOut(g.Worker)
	if marked {
		x.s.hung.suspects.Inc()
	}
	x.s.log.Warn("worker sent nothing within the first-byte timeout; retrying elsewhere", zap.String("request_id", x.rid),
		zap.String("worker", g.Worker), zap.String("reason", reason), zap.Bool("suspect", marked))
	return 0, true
}
