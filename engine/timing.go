package engine

import (
	"math"
	"time"
)

// StepShape describes one scheduled batch to a TimingModel.
type StepShape struct {
	// PrefillTokens are new prompt (or recomputed) tokens in the step.
	PrefillTokens int
	// DecodeTokens is the number of sequences decoding one token each.
	DecodeTokens int
	// KVUsage is the fraction of KV blocks in use once the step is scheduled.
	KVUsage float64
}

// TimingModel turns a batch into the wall (or virtual) time it takes.
type TimingModel interface {
	StepTime(StepShape) time.Duration
}

// Polynomial is the design §9 model, fitted on a real engine:
//
//	prefill(T) = 4.209989e-7·T² + 0.01518344·T + 16.50142 ms
//	decode(u)  = −25.74·u² + 54.01·u + 5.74 ms
//
// A mixed step (prefill chunks and decodes together, as in chunked prefill)
// costs prefill(T + D) + (decode(u) − decode(0)): the decode tokens are D more
// tokens through the same forward pass (so the fixed per-step overhead in
// prefill's intercept is paid once), and decode's u-dependent part — reading
// the KV cache of the decoding sequences, memory bound — comes on top.
// Pure decode steps reduce to decode(u) and pure prefill steps to prefill(T).
// The result is divided by Speedup.
type Polynomial struct {
	Speedup float64
}

// PrefillMillis is prefill(T) in milliseconds.
func PrefillMillis(t int) float64 {
	x := float64(t)
	return 4.209989e-7*x*x + 0.01518344*x + 16.50142
}

// DecodeMillis is decode(u) in milliseconds.
func DecodeMillis(u float64) float64 {
	u = math.Max(0, math.Min(1, u))
	return -25.74*u*u + 54.01*u + 5.74
}

// StepTime implements TimingModel.
func (p Polynomial) StepTime(s StepShape) time.Duration {
	var ms float64
	switch {
	case s.PrefillTokens == 0 && s.DecodeTokens == 0:
		return 0
	case s.PrefillTokens == 0:
		ms = DecodeMillis(s.KVUsage)
	case s.DecodeTokens == 0:
		ms = PrefillMillis(s.PrefillTokens)
	default:
		ms = PrefillMillis(s.PrefillTokens+s.DecodeTokens) + DecodeMillis(s.KVUsage) - DecodeMillis(0)
	}
	sp := p.Speedup
	if !(sp > 0) {
		sp = 1
	}
	d := time.Duration(ms * float64(time.Millisecond) / sp)
	if d <= 0 {
		d = 1 // a step always takes some time, so virtual time advances
	}
	return d
}
