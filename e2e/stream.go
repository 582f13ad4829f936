package e2e

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
)

// Outcome is the terminal outcome of one request as the client saw it.
// Every request the driver sends ends in exactly one of them.
type Outcome int

const (
	// OutcomeSuccess: 200, a stream with exactly one finish_reason, then [DONE].
	OutcomeSuccess Outcome = iota + 1
	// OutcomeRejected: an HTTP error status with an OpenAI error body.
	OutcomeRejected
	// OutcomeStreamError: 200, then the stream ended with an error event
	// (the worker failed after the first byte).
	OutcomeStreamError
	// OutcomeTruncated: 200, then the connection ended without [DONE] or an
	// error event (the entry router died mid-stream).
	OutcomeTruncated
	// OutcomeTransport: no HTTP response at all (connection refused or reset).
	OutcomeTransport
	// OutcomeTimeout: the client's deadline passed first.
	OutcomeTimeout
	// OutcomeMalformed: the response broke the protocol (two terminal events,
	// data after [DONE], an unparsable chunk, several finish reasons).
	OutcomeMalformed
)

var outcomeNames = [...]string{"", "success", "rejected", "stream_error", "truncated", "transport_error", "timeout", "malformed"}

func (o Outcome) String() string {
	if o > 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// ErrMalformedStream is wrapped by DecodeStream when a stream breaks the
// OpenAI streaming protocol.
var ErrMalformedStream = errors.New("malformed stream")

// maxEventBytes bounds one SSE line; a longer one is malformed.
const maxEventBytes = 1 << 20

// StreamSummary is what DecodeStream saw in one SSE body.
type StreamSummary struct {
	Chunks        int    // data events with choices
	FinishReasons int    // choices with a non-null finish_reason
	Done          bool   // [DONE] arrived
	ErrorCode     string // code of the error event, if one arrived
	Complete      bool   // the stream ended with a terminal event
}

type chunkDoc struct {
	Choices []struct {
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Error *struct {
		Code    any    `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// DecodeStream reads an OpenAI SSE body to its end. It returns the summary
// and, when the body broke the protocol, an error wrapping
// ErrMalformedStream. A read error (the connection died) is returned as is
// with Complete false. It never panics, whatever the input.
func DecodeStream(r io.Reader) (StreamSummary, error) {
	var s StreamSummary
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxEventBytes)
	terminal := false
	for sc.Scan() {
		line := sc.Bytes()
		if len(line) == 0 || line[0] == ':' {
			continue // event separator or comment
		}
		data, ok := bytes.CutPrefix(line, []byte("data:"))
		if !ok {
			continue // event:, id:, retry: fields carry nothing we check
		}
		data = bytes.TrimSpace(data)
		if terminal {
			return s, fmt.Errorf("%w: data after the terminal event", ErrMalformedStream)
		}
		if bytes.Equal(data, []byte("[DONE]")) {
			s.Done, terminal, s.Complete = true, true, true
			continue
		}
		var c chunkDoc
		if err := json.Unmarshal(data, &c); err != nil {
			return s, fmt.Errorf("%w: chunk is not JSON: %v", ErrMalformedStream, err)
		}
		if c.Error != nil {
			s.ErrorCode = fmt.Sprint(c.Error.Code)
			if s.ErrorCode == "" || s.ErrorCode == "<nil>" {
				s.ErrorCode = "unknown"
			}
			terminal, s.Complete = true, true
			continue
		}
		if len(c.Choices) > 0 {
			s.Chunks++
		}
		for _, ch := range c.Choices {
			if ch.FinishReason != nil && *ch.FinishReason != "" {
				s.FinishReasons++
			}
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return s, fmt.Errorf("%w: line longer than %d bytes", ErrMalformedStream, maxEventBytes)
		}
		return s, err
	}
	if s.Done && s.FinishReasons != 1 {
		return s, fmt.Errorf("%w: %d finish reasons before [DONE]", ErrMalformedStream, s.FinishReasons)
	}
	return s, nil
}

// Outcome classifies a summary that DecodeStream returned without a
// transport error.
func (s StreamSummary) Outcome() Outcome {
	switch {
	case s.ErrorCode != "":
		return OutcomeStreamError
	case s.Done:
		return OutcomeSuccess
	default:
		return OutcomeTruncated
	}
}
