package e2e

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	chunk  = `data: {"choices":[{"index":0,"delta":{"content":"a "},"finish_reason":null}]}` + "\n\n"
	finish = `data: {"choices":[{"index":0,"delta":{"content":"b "},"finish_reason":"length"}]}` + "\n\n"
	done   = "data: [DONE]\n\n"
	errEv  = `data: {"error":{"message":"worker went away","type":"server_error","code":"upstream_failed"}}` + "\n\n"
)

func TestDecodeStreamCallsAFinishedStreamWithDoneASuccess(t *testing.T) {
	s, err := DecodeStream(strings.NewReader(": comment\n\n" + chunk + chunk + finish + done))
	require.NoError(t, err)
	assert.Equal(t, OutcomeSuccess, s.Outcome())
	assert.Equal(t, 3, s.Chunks)
	assert.Equal(t, 1, s.FinishReasons)
}

func TestDecodeStreamCallsAnErrorEventAStreamErrorWithItsCode(t *testing.T) {
	s, err := DecodeStream(strings.NewReader(chunk + errEv))
	require.NoError(t, err)
	assert.Equal(t, OutcomeStreamError, s.Outcome())
	assert.Equal(t, "upstream_failed", s.ErrorCode)
}

func TestDecodeStreamCallsAStreamEndingWithoutATerminalEventTruncated(t *testing.T) {
	s, err := DecodeStream(strings.NewReader(chunk + chunk))
	require.NoError(t, err)
	assert.False(t, s.Complete)
	assert.Equal(t, OutcomeTruncated, s.Outcome())
}

func TestDecodeStreamRejectsStreamsWithMoreThanOneTerminalOutcome(t *testing.T) {
	for name, body := range map[string]string{
		"data after done":       chunk + finish + done + chunk,
		"error after done":      chunk + finish + done + errEv,
		"done after error":      chunk + errEv + done,
		"two finish reasons":    finish + finish + done,
		"done without a finish": chunk + done,
		"chunk is not json":     "data: {not json\n\n",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := DecodeStream(strings.NewReader(body))
			assert.ErrorIs(t, err, ErrMalformedStream)
		})
	}
}

func TestDecodeStreamRejectsALineLongerThanItsBound(t *testing.T) {
	_, err := DecodeStream(strings.NewReader("data: " + strings.Repeat("x", maxEventBytes+1) + "\n\n"))
	assert.ErrorIs(t, err, ErrMalformedStream)
}

func TestOutcomesHaveNamesAndStartAtOne(t *testing.T) {
	assert.Equal(t, "success", OutcomeSuccess.String())
	assert.Equal(t, "malformed", OutcomeMalformed.String())
	assert.Equal(t, "outcome(0)", Outcome(0).String())
}

func FuzzDecodeStream(f *testing.F) {
	for _, s := range []string{chunk + finish + done, chunk + errEv, chunk, "", "data:\n", "data: [DONE]\n\ndata: x\n", "data: {\"error\":{}}\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		s, err := DecodeStream(strings.NewReader(string(in)))
		if err != nil {
			if !errors.Is(err, ErrMalformedStream) {
				t.Fatalf("a reader that cannot fail gave %v", err)
			}
			return
		}
		// A well-formed stream has exactly one classification, and a
		// success carries exactly one finish reason.
		o := s.Outcome()
		if o == OutcomeSuccess && s.FinishReasons != 1 {
			t.Fatalf("success with %d finish reasons", s.FinishReasons)
		}
		if s.Done && s.ErrorCode != "" {
			t.Fatalf("both [DONE] and an error event accepted")
		}
	})
}
