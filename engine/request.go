package engine

import (
	"fmt"
	"sync"
	"time"
)

// Request is one generation request.
type Request struct {
	// ID names the request; unique among the engine's live requests. Output
	// tokens derive from it and Config.Seed.
	ID string
	// Prompt is the tokenized prompt, used as is.
	Prompt []uint32
	// MaxTokens is the number of tokens to generate (the synthetic engine
	// has no end-of-sequence token, so every request generates exactly this
	// many unless cancelled).
	MaxTokens int
	// Priority orders the waiting queue: higher first, FIFO within equal
	// priority. Preemption picks the lowest priority, newest request.
	Priority int
	// HashSeed is the kvindex seed of the request's cache namespace; zero
	// means kvindex.BaseSeed.
	HashSeed uint64
	// Transfer, when set, makes this a decode-role request whose prompt
	// prefix arrives as KV from a prefill engine instead of being computed
	// here (transfer.go). A prefill-role request needs no field: it is an
	// ordinary request with MaxTokens 1.
	Transfer *Transfer
	// OnDelta, when set, receives every delivery synchronously inside Step
	// with the engine's lock held: it must not block and must not call the
	// Engine. The returned Stream then stays empty. A simulator uses this to
	// avoid buffering.
	OnDelta func(Delta)
}

// FinishReason says why a request ended. The zero value means "not yet".
type FinishReason uint8

// The finish reasons.
const (
	// FinishLength: MaxTokens were generated.
	FinishLength FinishReason = iota + 1
	// FinishCancelled: Cancel was called.
	FinishCancelled
	// FinishAborted: the engine stopped first.
	FinishAborted
)

func (f FinishReason) String() string {
	switch f {
	case FinishLength:
		return "length"
	case FinishCancelled:
		return "cancelled"
	case FinishAborted:
		return "aborted"
	}
	return fmt.Sprintf("finish_reason(%d)", uint8(f))
}

// Delta is one delivery to a request: a generated token, the end, or both.
type Delta struct {
	// Time is when the step that produced it ended (engine clock).
	Time time.Time
	// Token is valid when HasToken; Index is its position in the output.
	Token    uint32
	HasToken bool
	Index    int
	// PromptTokens and CachedTokens describe the prompt: CachedTokens were
	// served from the prefix cache when the request was first scheduled.
	PromptTokens int
	CachedTokens int
	// HostCachedTokens of CachedTokens were loaded back from the host tier.
	HostCachedTokens int
	// DiskCachedTokens of CachedTokens were loaded back from the disk tier.
	DiskCachedTokens int
	// TransferredTokens of the prompt arrived by Request.Transfer (not part
	// of CachedTokens, and not computed here).
	TransferredTokens int
	// Finish is non-zero on the last delivery.
	Finish FinishReason
}

// Stream buffers a request's deliveries for a consumer on another goroutine.
// The buffer is unbounded by design: it holds at most MaxTokens+1 deltas, and
// bounding it would either block the engine step or drop tokens.
type Stream struct {
	id     string
	mu     sync.Mutex
	buf    []Delta
	notify chan struct{} // size 1: a pending "something arrived" signal
}

func newStream(id string) *Stream {
	return &Stream{id: id, notify: make(chan struct{}, 1)}
}

// ID is the request id.
func (s *Stream) ID() string { return s.id }

// Notify is signalled after deliveries arrive; then call Take.
func (s *Stream) Notify() <-chan struct{} { return s.notify }

// Take appends the buffered deliveries to dst and empties the buffer.
func (s *Stream) Take(dst []Delta) []Delta {
	s.mu.Lock()
	dst = append(dst, s.buf...)
	s.buf = s.buf[:0]
	s.mu.Unlock()
	return dst
}

func (s *Stream) push(d Delta) {
	s.mu.Lock()
	s.buf = append(s.buf, d)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default: // a signal is already pending; the consumer will Take everything
	}
}
