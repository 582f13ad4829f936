package bench

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"time"
)

// Outcome is how one request ended. Values start at 1; the zero value is
// invalid.
type Outcome int

const (
	// OutcomeOK: a 2xx stream that ended with [DONE] and no error event.
	OutcomeOK Outcome = iota + 1
	// OutcomeHTTPError: a non-2xx response (HTTPStatus, ErrorCode set).
	OutcomeHTTPError
	// OutcomeStreamError: the stream carried an error event, ended without
	// [DONE], or was not an event stream.
	OutcomeStreamError
	// OutcomeTransportError: connecting, sending or reading failed.
	OutcomeTransportError
	// OutcomeTimeout: the per-request timeout expired.
	OutcomeTimeout
	// OutcomeCancelled: the run was cancelled while the request was in flight.
	OutcomeCancelled
)

var outcomeNames = [...]string{
	OutcomeOK:             "ok",
	OutcomeHTTPError:      "http_error",
	OutcomeStreamError:    "stream_error",
	OutcomeTransportError: "transport_error",
	OutcomeTimeout:        "timeout",
	OutcomeCancelled:      "cancelled",
}

func (o Outcome) String() string {
	if o >= OutcomeOK && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return "Outcome(" + strconv.Itoa(int(o)) + ")"
}

// ParseOutcome is the inverse of String for valid outcomes.
func ParseOutcome(s string) (Outcome, error) {
	for o := OutcomeOK; int(o) < len(outcomeNames); o++ {
		if outcomeNames[o] == s {
			return o, nil
		}
	}
	return 0, badRecord("unknown outcome %q", truncate(s, 40))
}

// Result is the measurement of one request.
type Result struct {
	Index    int
	Session  string
	Class    string
	Priority int
	Deadline time.Duration
	// Target is the base URL the request went to; Worker the serving worker
	// as named by the response's worker header (empty when absent).
	Target string
	Worker string
	// Scheduled is when the trace said to send (scaled by the speedup) and
	// Sent when it was sent, both as offsets from the run's start. Sent >
	// Scheduled means the generator fell behind (concurrency cap, or body
	// building slower than the arrival rate).
	Scheduled time.Duration
	Sent      time.Duration
	// TTFT is the time from sending to the first content chunk (0 if none);
	// ITL the gaps between consecutive content chunks; E2E sending to the
	// end of the response.
	TTFT time.Duration
	ITL  []time.Duration
	E2E  time.Duration
	// InputTokens and MaxTokens come from the trace; PromptTokens,
	// CompletionTokens and CachedTokens from the response's usage (cached:
	// usage.prompt_tokens_details.cached_tokens). Chunks counts content
	// chunks.
	InputTokens      int
	MaxTokens        int
	PromptTokens     int
	CompletionTokens int
	CachedTokens     int
	Chunks           int
	Outcome          Outcome
	HTTPStatus       int
	// ErrorCode is the OpenAI error code (or type when the code is null).
	ErrorCode string
	Error     string
	// DeadlineMissed: the request had a deadline and was rejected with
	// deadline_exceeded or got its first token after the deadline.
	DeadlineMissed bool
}

// OutcomeLabel is the outcome with its detail, used for per-class counts:
// "ok", "http_429_queue_full", "stream_error_truncated", "timeout", ...
func (r *Result) OutcomeLabel() string {
	switch r.Outcome {
	case OutcomeHTTPError:
		l := "http_" + strconv.Itoa(r.HTTPStatus)
		if r.ErrorCode != "" {
			l += "_" + r.ErrorCode
		}
		return l
	case OutcomeStreamError:
		if r.ErrorCode != "" {
			return "stream_error_" + r.ErrorCode
		}
	}
	return r.Outcome.String()
}

// resultJSON is a Result's JSONL form: durations in milliseconds.
type resultJSON struct {
	Index            int       `json:"index"`
	Session          string    `json:"session,omitempty"`
	Class            string    `json:"class,omitempty"`
	Priority         int       `json:"priority,omitempty"`
	DeadlineMs       float64   `json:"deadline_ms,omitempty"`
	Target           string    `json:"target"`
	Worker           string    `json:"worker,omitempty"`
	ScheduledMs      float64   `json:"scheduled_ms"`
	SentMs           float64   `json:"sent_ms"`
	TTFTMs           float64   `json:"ttft_ms"`
	ITLMs            []float64 `json:"itl_ms,omitempty"`
	E2EMs            float64   `json:"e2e_ms"`
	InputTokens      int       `json:"input_tokens"`
	MaxTokens        int       `json:"max_tokens"`
	PromptTokens     int       `json:"prompt_tokens"`
	CompletionTokens int       `json:"completion_tokens"`
	CachedTokens     int       `json:"cached_tokens"`
	Chunks           int       `json:"chunks"`
	Outcome          string    `json:"outcome"`
	HTTPStatus       int       `json:"http_status,omitempty"`
	ErrorCode        string    `json:"error_code,omitempty"`
	Error            string    `json:"error,omitempty"`
	DeadlineMissed   bool      `json:"deadline_missed,omitempty"`
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// fromMs converts milliseconds to a duration, rejecting values a duration
// cannot hold.
func fromMs(field string, v float64) (time.Duration, error) {
	ns := v * float64(time.Millisecond)
	if math.IsNaN(ns) || ns < 0 || ns > math.MaxInt64/2 {
		return 0, badRecord("%s %v ms out of range", field, v)
	}
	return time.Duration(ns), nil
}

// MarshalJSON writes the JSONL form.
func (r Result) MarshalJSON() ([]byte, error) {
	j := resultJSON{
		Index: r.Index, Session: r.Session, Class: r.Class, Priority: r.Priority,
		DeadlineMs: ms(r.Deadline), Target: r.Target, Worker: r.Worker,
		ScheduledMs: ms(r.Scheduled), SentMs: ms(r.Sent), TTFTMs: ms(r.TTFT), E2EMs: ms(r.E2E),
		InputTokens: r.InputTokens, MaxTokens: r.MaxTokens, PromptTokens: r.PromptTokens,
		CompletionTokens: r.CompletionTokens, CachedTokens: r.CachedTokens, Chunks: r.Chunks,
		Outcome: r.Outcome.String(), HTTPStatus: r.HTTPStatus, ErrorCode: r.ErrorCode,
		Error: r.Error, DeadlineMissed: r.DeadlineMissed,
	}
	if len(r.ITL) > 0 {
		j.ITLMs = make([]float64, len(r.ITL))
		for i, d := range r.ITL {
			j.ITLMs[i] = ms(d)
		}
	}
	return json.Marshal(j)
}

// DecodeResultLine decodes one results.jsonl line. Errors wrap ErrBadRecord.
func DecodeResultLine(line []byte) (Result, error) {
	var j resultJSON
	if err := json.Unmarshal(line, &j); err != nil {
		return Result{}, badRecord("result is not a JSON object of the results.jsonl shape: %v", err)
	}
	o, err := ParseOutcome(j.Outcome)
	if err != nil {
		return Result{}, err
	}
	r := Result{
		Index: j.Index, Session: j.Session, Class: j.Class, Priority: j.Priority,
		Target: j.Target, Worker: j.Worker, InputTokens: j.InputTokens, MaxTokens: j.MaxTokens,
		PromptTokens: j.PromptTokens, CompletionTokens: j.CompletionTokens,
		CachedTokens: j.CachedTokens, Chunks: j.Chunks, Outcome: o, HTTPStatus: j.HTTPStatus,
		ErrorCode: j.ErrorCode, Error: j.Error, DeadlineMissed: j.DeadlineMissed,
	}
	if j.PromptTokens < 0 || j.CompletionTokens < 0 || j.CachedTokens < 0 || j.Chunks < 0 {
		return Result{}, badRecord("negative token count")
	}
	for _, f := range []struct {
		name string
		v    float64
		dst  *time.Duration
	}{
		{"deadline_ms", j.DeadlineMs, &r.Deadline},
		{"scheduled_ms", j.ScheduledMs, &r.Scheduled},
		{"sent_ms", j.SentMs, &r.Sent},
		{"ttft_ms", j.TTFTMs, &r.TTFT},
		{"e2e_ms", j.E2EMs, &r.E2E},
	} {
		if *f.dst, err = fromMs(f.name, f.v); err != nil {
			return Result{}, err
		}
	}
	if len(j.ITLMs) > 0 {
		r.ITL = make([]time.Duration, len(j.ITLMs))
		for i, v := range j.ITLMs {
			if r.ITL[i], err = fromMs("itl_ms", v); err != nil {
				return Result{}, err
			}
		}
	}
	return r, nil
}

// ResultWriter appends results to a JSONL stream.
type ResultWriter struct {
	w   *bufio.Writer
	err error
}

// NewResultWriter writes to w; call Flush at the end.
func NewResultWriter(w io.Writer) *ResultWriter { return &ResultWriter{w: bufio.NewWriter(w)} }

// Write appends one result line. The first error sticks.
func (rw *ResultWriter) Write(r Result) error {
	if rw.err != nil {
		return rw.err
	}
	b, err := json.Marshal(r)
	if err == nil {
		b = append(b, '\n')
		_, err = rw.w.Write(b)
	}
	if err != nil {
		rw.err = fmt.Errorf("write result %d: %w", r.Index, err)
	}
	return rw.err
}

// Flush flushes buffered lines and reports the first error.
func (rw *ResultWriter) Flush() error {
	if rw.err != nil {
		return rw.err
	}
	if err := rw.w.Flush(); err != nil {
		rw.err = fmt.Errorf("flush results: %w", err)
	}
	return rw.err
}

// ReadResults reads a results.jsonl stream; a bad line fails with its line
// number.
func ReadResults(r io.Reader, name string) ([]Result, error) {
	lr := newLineReader(r, name)
	var out []Result
	for {
		line, err := lr.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
		res, err := DecodeResultLine(line)
		if err != nil {
			return out, &LineError{File: name, Line: lr.line, Err: err}
		}
		out = append(out, res)
	}
}
