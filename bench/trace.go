package bench

import (
	"errors"
	"fmt"
	"io"
	"time"
)

var (
	// ErrBadRecord is wrapped by every error about a malformed trace record.
	ErrBadRecord = errors.New("bench: bad trace record")
	// ErrInvalidConfig is wrapped by every Validate error.
	ErrInvalidConfig = errors.New("bench: invalid config")
	// ErrSimUnavailable is returned by Main for --sim when no SimMode is built in.
	ErrSimUnavailable = errors.New("bench: simulator mode (--sim) is not built into this binary yet")
)

// Default token-id vocabulary: the router's default tokenizer produces ids in
// [256, 50000) and reserves the ids below 256, so synthesized prompts stay in
// the same range and look like tokenizer output to every component.
const (
	DefaultVocabFirst = 256
	DefaultVocabLimit = 50000
)

// maxInputTokens bounds one request's prompt length. The largest public trace
// prompt is about 126k tokens; the bound keeps a corrupt record from asking for
// gigabytes of synthesized tokens.
const maxInputTokens = 1 << 22

// Vocab bounds synthesized token ids to [First, Limit).
type Vocab struct {
	First uint32
	Limit uint32
}

// DefaultVocab is the router's default tokenizer vocabulary.
func DefaultVocab() Vocab { return Vocab{First: DefaultVocabFirst, Limit: DefaultVocabLimit} }

// Validate reports an empty or inverted range.
func (v Vocab) Validate() error {
	if v.Limit <= v.First {
		return fmt.Errorf("%w: vocab: limit %d must exceed first %d", ErrInvalidConfig, v.Limit, v.First)
	}
	return nil
}

// Segment is a run of Len synthesized tokens derived from Seed. Two segments
// with the same seed produce the same tokens (the shorter one a prefix of the
// longer), whatever request or trace they appear in.
type Segment struct {
	Seed uint64 `json:"seed"`
	Len  int    `json:"len"`
}

// TraceRequest is one request of a trace, in arrival order.
type TraceRequest struct {
	// Index is the request's position in its trace, from 0.
	Index int
	// Line is the source line (1-based) for file traces, 0 for synthetic ones.
	Line int
	// Arrival is the offset from the trace's first arrival (unscaled).
	Arrival time.Duration
	// InputLength is the prompt length in tokens: the sum of Segments' lengths.
	InputLength int
	// OutputLength is the number of tokens to generate (max_tokens).
	OutputLength int
	// Segments describe the prompt's tokens; see AppendTokens.
	Segments []Segment
	// HashIDs are the trace's own prefix-block ids (Mooncake), kept for
	// analysis and for the simulator; nil for other traces.
	HashIDs []uint64
	// Class, Priority and Deadline are scheduling hints sent as headers when
	// set (empty class, zero priority, zero deadline are omitted).
	Class    string
	Priority int
	Deadline time.Duration
	// Session groups the turns of one conversation; Turn counts from 0.
	Session string
	Turn    int
}

// AppendTokens appends the prompt's token ids, synthesized from its
// segments, to dst.
func (r *TraceRequest) AppendTokens(dst []uint32, v Vocab) []uint32 {
	for _, s := range r.Segments {
		dst = appendSegment(dst, s, v)
	}
	return dst
}

// Tokens returns the prompt's token ids.
func (r *TraceRequest) Tokens(v Vocab) []uint32 {
	return r.AppendTokens(make([]uint32, 0, r.InputLength), v)
}

// appendSegment synthesizes s.Len tokens: token j is a SplitMix64 output of
// the segment seed and j, mapped into the vocabulary by a multiply-shift
// (unbiased enough for a 50k vocabulary, and branch-free).
func appendSegment(dst []uint32, s Segment, v Vocab) []uint32 {
	span := uint64(v.Limit - v.First)
	base := mix64(s.Seed)
	for j := 0; j < s.Len; j++ {
		x := mix64(base + uint64(j+1)*0x9e3779b97f4a7c15)
		dst = append(dst, v.First+uint32(((x>>32)*span)>>32))
	}
	return dst
}

// mix64 is the SplitMix64 finalizer: a bijection on uint64 with good
// avalanche, so nearby seeds give unrelated tokens.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// seedOf derives a segment seed from a domain tag and parts, so that seeds of
// different traces and roles never collide by construction of their inputs.
func seedOf(domain uint64, parts ...uint64) uint64 {
	h := mix64(domain ^ 0x5348_5957_5244) // "SWYRD"
	for _, p := range parts {
		h = mix64(h ^ mix64(p+0x9e3779b97f4a7c15))
	}
	return h
}

// Seed domains, one per role of synthesized content.
const (
	domainMooncakeBlock uint64 = iota + 1
	domainAzurePrefix
	domainAzureUnique
	domainSynthPrefix
	domainSynthUser
	domainSynthReply
)

// Source yields trace requests in arrival order. Next returns io.EOF after
// the last one; any other error ends the trace.
type Source interface {
	Next() (TraceRequest, error)
}

// SliceSource replays a slice of requests.
type SliceSource struct {
	reqs []TraceRequest
	pos  int
}

// NewSliceSource returns a Source over reqs (not copied).
func NewSliceSource(reqs []TraceRequest) *SliceSource { return &SliceSource{reqs: reqs} }

// Next implements Source.
func (s *SliceSource) Next() (TraceRequest, error) {
	if s.pos >= len(s.reqs) {
		return TraceRequest{}, io.EOF
	}
	s.pos++
	return s.reqs[s.pos-1], nil
}

// ReadAll drains src, stopping after max requests when max > 0.
func ReadAll(src Source, max int) ([]TraceRequest, error) {
	var out []TraceRequest
	for max <= 0 || len(out) < max {
		r, err := src.Next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// BadLinePolicy says what a file reader does with a malformed record.
type BadLinePolicy int

const (
	// BadLineFail ends the trace with the line's error.
	BadLineFail BadLinePolicy = iota + 1
	// BadLineSkip drops the line, records its error and goes on.
	BadLineSkip
)

func (p BadLinePolicy) String() string {
	switch p {
	case BadLineFail:
		return "fail"
	case BadLineSkip:
		return "skip"
	default:
		return fmt.Sprintf("BadLinePolicy(%d)", int(p))
	}
}

// LineError locates a bad record in a trace file.
type LineError struct {
	File string
	Line int
	Err  error
}

func (e *LineError) Error() string {
	name := e.File
	if name == "" {
		name = "trace"
	}
	return fmt.Sprintf("%s:%d: %v", name, e.Line, e.Err)
}

func (e *LineError) Unwrap() error { return e.Err }

// maxKeptLineErrors bounds the skipped-line errors a reader keeps; the count
// keeps going.
const maxKeptLineErrors = 100

// skipLog records skipped lines for a reader.
type skipLog struct {
	kept  []*LineError
	count int
}

func (s *skipLog) add(e *LineError) {
	s.count++
	if len(s.kept) < maxKeptLineErrors {
		s.kept = append(s.kept, e)
	}
}

// badRecord wraps a decoding complaint in ErrBadRecord.
func badRecord(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrBadRecord, fmt.Sprintf(format, args...))
}

// LengthFilter drops requests whose prompt plus output exceed MaxTotal
// tokens (engines reject them with context_length_exceeded), keeping the
// rest of the trace, with its arrival times, unchanged. Dropped counts them.
type LengthFilter struct {
	Src      Source
	MaxTotal int
	Dropped  int
}

// Next implements Source.
func (f *LengthFilter) Next() (TraceRequest, error) {
	for {
		r, err := f.Src.Next()
		if err != nil || f.MaxTotal <= 0 || r.InputLength+r.OutputLength <= f.MaxTotal {
			return r, err
		}
		f.Dropped++
	}
}
