package bench

import (
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/switchyard/switchyard/internal/clock"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// scriptedBody hands out one chunk per Read and advances the clock by the
// chunk's delay first, so the stream reader sees each chunk "arrive" at an
// exact fake time.
type scriptedBody struct {
	clock  *clock.Fake
	chunks []scriptedChunk
	err    error // returned after the last chunk (io.EOF if nil)
}

type scriptedChunk struct {
	after time.Duration
	data  string
}

func (s *scriptedBody) Read(p []byte) (int, error) {
	if len(s.chunks) == 0 {
		if s.err != nil {
			return 0, s.err
		}
		return 0, io.EOF
	}
	c := &s.chunks[0]
	if c.after > 0 {
		s.clock.Advance(c.after)
		c.after = 0
	}
	n := copy(p, c.data)
	c.data = c.data[n:]
	if c.data == "" {
		s.chunks = s.chunks[1:]
	}
	return n, nil
}

func readScripted(t *testing.T, err error, chunks ...scriptedChunk) (Result, error) {
	t.Helper()
	clock := newFakeClock()
	sent := clock.Now()
	var res Result
	rerr := readStream(&scriptedBody{clock: clock, chunks: chunks, err: err}, clock.Now, sent, &res)
	return res, rerr
}

func TestStreamTimingsAreTakenWhenEachContentChunkArrives(t *testing.T) {
	res, err := readScripted(t, nil,
		scriptedChunk{120 * time.Millisecond, "data: {\"choices\":[{\"text\":\"Hel\"}]}\n\n"},
		scriptedChunk{10 * time.Millisecond, ": keep-alive comment\n\n"},
		scriptedChunk{0, "data: {\"choices\":[{\"text\":\"lo\"}]}\n\n"},
		scriptedChunk{30 * time.Millisecond, "data: {\"choices\":[{\"text\":\"!\",\"finish_reason\":\"length\"}]}\n\n"},
		scriptedChunk{5 * time.Millisecond, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1100,\"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}\n\n"},
		scriptedChunk{0, "data: [DONE]\n\n"},
	)
	require.NoError(t, err)
	assert.Equal(t, Outcome(0), res.Outcome, "success is decided by the caller")
	assert.Equal(t, 120*time.Millisecond, res.TTFT)
	assert.Equal(t, []time.Duration{10 * time.Millisecond, 30 * time.Millisecond}, res.ITL)
	assert.Equal(t, 3, res.Chunks)
	assert.Equal(t, 1100, res.PromptTokens)
	assert.Equal(t, 3, res.CompletionTokens)
	assert.Equal(t, 1024, res.CachedTokens)
}

func TestStreamReaderHandlesCRLFMultiLineDataAndChatDeltas(t *testing.T) {
	res, err := readScripted(t, nil,
		scriptedChunk{0, "event: message\r\ndata: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\r\n\r\n"},
		scriptedChunk{7 * time.Millisecond, "data: {\"choices\":\r\ndata: [{\"delta\":{\"content\":\"hi\"}}]}\r\n\r\n"},
		scriptedChunk{0, "data:[DONE]\r\n\r\n"},
	)
	require.NoError(t, err)
	assert.Equal(t, 1, res.Chunks, "a role-only delta is not content")
	assert.Equal(t, 7*time.Millisecond, res.TTFT)
}

func TestStreamErrorEventsEndTheStreamWithTheirCode(t *testing.T) {
	res, err := readScripted(t, nil,
		scriptedChunk{0, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"},
		scriptedChunk{0, "data: {\"error\":{\"message\":\"worker died\",\"type\":\"server_error\",\"code\":\"worker_failed\"}}\n\n"},
		scriptedChunk{0, "data: [DONE]\n\n"},
	)
	require.NoError(t, err)
	assert.Equal(t, OutcomeStreamError, res.Outcome)
	assert.Equal(t, "worker_failed", res.ErrorCode)
	assert.Equal(t, "worker died", res.Error)

	res, err = readScripted(t, nil, scriptedChunk{0, "data: {\"error\":{\"message\":\"m\",\"type\":\"server_error\",\"code\":null}}\n\n"})
	require.NoError(t, err)
	assert.Equal(t, "server_error", res.ErrorCode, "a null code falls back to the type")

	res, err = readScripted(t, nil, scriptedChunk{0, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"})
	require.NoError(t, err)
	assert.Equal(t, OutcomeStreamError, res.Outcome)
	assert.Equal(t, "truncated", res.ErrorCode, "no [DONE]")

	res, err = readScripted(t, nil, scriptedChunk{0, "data: {not json\n\n"})
	require.NoError(t, err)
	assert.Equal(t, "bad_chunk", res.ErrorCode)
}

func TestStreamReadFailuresAreReportedAsReadErrors(t *testing.T) {
	boom := errors.New("connection reset")
	_, err := readScripted(t, boom, scriptedChunk{0, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n"})
	require.ErrorIs(t, err, errStreamRead)
	assert.ErrorIs(t, err, boom)
}

func FuzzReadStream(f *testing.F) {
	for _, s := range []string{
		"data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n",
		"data: {\"error\":{\"code\":5}}\n\n",
		"data: {\"usage\":{\"prompt_tokens\":-1}}\n\n",
		"data:\ndata:\n\n:\r\n\r\n",
		"data: " + strings.Repeat("x", 100) + "\n",
		"", "\n\n\n", "data: [DONE]",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		clock := newFakeClock()
		var res Result
		err := readStream(strings.NewReader(string(body)), clock.Now, clock.Now(), &res)
		if err != nil && !errors.Is(err, errStreamRead) {
			t.Fatalf("unexpected error kind %v", err)
		}
		if res.Outcome != 0 && res.Outcome != OutcomeStreamError {
			t.Fatalf("outcome %v", res.Outcome)
		}
		if res.Chunks > 0 && len(res.ITL) != res.Chunks-1 {
			t.Fatalf("%d chunks but %d gaps", res.Chunks, len(res.ITL))
		}
	})
}
