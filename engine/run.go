package engine

import (
	"context"
	"time"
)

// Step drives the engine at time now. If the batch in flight ends after
// now, Step does nothing and returns its end. Otherwise it completes that
// batch (tokens are delivered stamped with its end time), schedules the next
// batch starting at now, publishes the step's KV events, and returns when
// that batch ends (or, idle, when the next KV transfer lands); the zero time
// means the engine is idle until Submit.
func (e *Engine) Step(now time.Time) time.Time {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.stopped {
		return time.Time{}
	}
	if e.inflight {
		if now.Before(e.batchEnd) {
			return e.batchEnd
		}
		e.complete(e.batchEnd)
		e.inflight = false
	}
	running, waiting := len(e.running), e.waiting.Len()
	e.schedule(now)
	e.flush()
	if running != len(e.running) || waiting != e.waiting.Len() {
		signal(e.changed)
	}
	if !e.inflight {
		return e.nextPull() // zero when idle until Submit
	}
	return e.batchEnd
}

// Run steps the engine in real time until ctx ends, then calls Stop.
func (e *Engine) Run(ctx context.Context) error {
	defer e.Stop()
	for {
		next := e.Step(e.clock.Now())
		var timer <-chan time.Time
		wake := e.wake // a Submit may also end a wait for a transfer
		if !next.IsZero() {
			d := next.Sub(e.clock.Now())
			if d <= 0 {
				if ctx.Err() != nil {
					return nil
				}
				continue
			}
			timer = e.clock.After(d)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer:
		case <-wake:
		}
	}
}
