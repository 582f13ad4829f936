package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"
)

// maxEventBytes bounds one SSE event. Completion chunks are a few hundred
// bytes; an upstream that never ends a line must not exhaust memory.
const maxEventBytes = 4 << 20

// streamChunk is the part of an OpenAI streaming chunk the runner reads:
// completions put text in choices[].text, chat in choices[].delta.content.
type streamChunk struct {
	Choices []struct {
		Text  string `json:"text"`
		Delta struct {
			Content string `json:"content"`
		} `json:"delta"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Error *apiError `json:"error"`
}

// apiError is the OpenAI error object; code may be a string, a number or
// null.
type apiError struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Code    json.RawMessage `json:"code"`
}

// code returns the error code as text, falling back to the type.
func (e *apiError) code() string {
	var s string
	if len(e.Code) > 0 && json.Unmarshal(e.Code, &s) == nil && s != "" {
		return s
	}
	if c := bytes.TrimSpace(e.Code); len(c) > 0 && !bytes.Equal(c, []byte("null")) && c[0] != '"' {
		return string(c)
	}
	return e.Type
}

// errStreamRead marks a failure reading the body (as opposed to a
// well-formed stream that reports an error).
var errStreamRead = errors.New("read stream")

// readStream consumes an SSE body, recording into res the time of each
// content chunk relative to sent (TTFT, ITL), usage, and any error event.
// It returns nil when the stream ended with [DONE]; an error wrapping
// errStreamRead when reading failed; otherwise it sets res.Outcome to
// OutcomeStreamError itself and returns nil. Times are taken with now()
// right after each event is complete, so they include no decoding work.
func readStream(body io.Reader, now func() time.Time, sent time.Time, res *Result) error {
	br := bufio.NewReaderSize(body, 32<<10)
	var data []byte
	var last time.Time
	dispatch := func(at time.Time) (done bool) {
		payload := bytes.TrimSpace(data)
		data = data[:0]
		if len(payload) == 0 {
			return false
		}
		if bytes.Equal(payload, []byte("[DONE]")) {
			return true
		}
		var c streamChunk
		if err := json.Unmarshal(payload, &c); err != nil {
			streamFailed(res, "bad_chunk", fmt.Sprintf("undecodable chunk: %v", err))
			return true
		}
		if c.Error != nil {
			streamFailed(res, c.Error.code(), c.Error.Message)
			return true
		}
		content := false
		for _, ch := range c.Choices {
			if ch.Text != "" || ch.Delta.Content != "" {
				content = true
			}
		}
		if content {
			if res.Chunks == 0 {
				res.TTFT = at.Sub(sent)
			} else {
				res.ITL = append(res.ITL, at.Sub(last))
			}
			last = at
			res.Chunks++
		}
		if c.Usage != nil {
			res.PromptTokens = c.Usage.PromptTokens
			res.CompletionTokens = c.Usage.CompletionTokens
			if c.Usage.PromptTokensDetails != nil {
				res.CachedTokens = c.Usage.PromptTokensDetails.CachedTokens
			}
		}
		return false
	}
	for {
		line, err := readLine(br)
		if len(line) == 0 && err != nil {
			if errors.Is(err, io.EOF) {
				// A final event without its blank line still counts.
				if len(data) > 0 && dispatch(now()) {
					return nil
				}
				if res.Outcome == 0 {
					streamFailed(res, "truncated", "stream ended without [DONE]")
				}
				return nil
			}
			return fmt.Errorf("%w: %w", errStreamRead, err)
		}
		switch {
		case len(line) == 0: // blank line: the event is complete
			if dispatch(now()) {
				return nil
			}
		case line[0] == ':': // comment / keep-alive
		case bytes.HasPrefix(line, []byte("data:")):
			v := line[len("data:"):]
			if len(v) > 0 && v[0] == ' ' {
				v = v[1:]
			}
			if len(data)+len(v) > maxEventBytes {
				streamFailed(res, "event_too_large", fmt.Sprintf("event larger than %d bytes", maxEventBytes))
				return nil
			}
			if len(data) > 0 {
				data = append(data, '\n')
			}
			data = append(data, v...)
		default: // event:, id:, retry: carry nothing the runner needs
		}
		if res.Outcome == OutcomeStreamError {
			return nil
		}
	}
}

// readLine returns one line without its terminator (LF or CRLF), growing
// past the buffer size up to maxEventBytes.
func readLine(br *bufio.Reader) ([]byte, error) {
	line, err := br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		buf := append([]byte(nil), line...)
		for errors.Is(err, bufio.ErrBufferFull) && len(buf) <= maxEventBytes {
			line, err = br.ReadSlice('\n')
			buf = append(buf, line...)
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, fmt.Errorf("line longer than %d bytes", maxEventBytes)
		}
		line = buf
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	return line, err
}

func streamFailed(res *Result, code, msg string) {
	res.Outcome = OutcomeStreamError
	res.ErrorCode = code
	res.Error = truncate(msg, 500)
}
