package anthropic

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// Writer is an http.ResponseWriter in front of a chat completions handler
// (or a proxy relaying one) that makes the response a Messages response:
// an error status gets Anthropic's error shape; translating, a chat
// completion becomes a Message and a chat stream the Messages event
// sequence; without translation (the engine answered in Messages form itself) the
// body passes, only a relayed stream error event being re-shaped
// (Configure says which). Finish must be called once the handler has
// returned.
type Writer struct {
	w         http.ResponseWriter
	translate bool
	stops     []string
	streamer  *Streamer
	status    int // 0: not started
	mode      int
	buf       []byte // the buffered body (error, JSON) or a partial line (stream)
}

const (
	modeBuffer = iota + 1 // error or JSON: the body is held until Finish
	modeStream
)

// NewWriter wraps w; its arguments are Configure's.
func NewWriter(w http.ResponseWriter, stops []string, inputTokens int, translate bool) *Writer {
	return &Writer{w: w, stops: stops, translate: translate, streamer: NewStreamer(stops, inputTokens)}
}

// Configure sets what is known only once the request is parsed and a
// worker granted: the request's stop_sequences, its prompt's token count
// (message_start's input_tokens when the engine's first chunk has none),
// and whether the worker answers in chat completions form (translate) or
// in Messages form. A proxy calls it per attempt, before anything is
// written; it is read when the response starts.
func (a *Writer) Configure(stops []string, inputTokens int, translate bool) {
	a.stops, a.translate = stops, translate
	a.streamer = NewStreamer(stops, inputTokens)
}

// Header is the wrapped writer's header map.
func (a *Writer) Header() http.Header { return a.w.Header() }

// Unwrap is the wrapped writer (for http.ResponseController).
func (a *Writer) Unwrap() http.ResponseWriter { return a.w }

// WriteHeader starts the response: a stream's headers go out at once, an
// error's or a JSON body's when Finish has the body.
func (a *Writer) WriteHeader(status int) {
	if a.status != 0 {
		return
	}
	a.status = status
	h := a.w.Header()
	if id := h.Get("X-Request-Id"); id != "" && h.Get("request-id") == "" {
		h.Set("request-id", id)
	}
	if status == http.StatusOK && strings.HasPrefix(h.Get("Content-Type"), "text/event-stream") {
		a.mode = modeStream
		a.w.WriteHeader(status)
		return
	}
	a.mode = modeBuffer
}

// Write takes the handler's bytes.
func (a *Writer) Write(b []byte) (int, error) {
	if a.status == 0 {
		a.WriteHeader(http.StatusOK)
	}
	a.buf = append(a.buf, b...)
	if a.mode != modeStream {
		return len(b), nil
	}
	for {
		i := bytes.IndexByte(a.buf, '\n')
		if i < 0 {
			break
		}
		if err := a.line(a.buf[:i+1]); err != nil {
			return 0, err
		}
		a.buf = a.buf[i+1:]
	}
	if len(a.buf) == 0 {
		a.buf = a.buf[:0:0] // let a long stream's consumed bytes go
	}
	return len(b), nil
}

// line writes one line of a stream's translation.
func (a *Writer) line(l []byte) error {
	payload, isData := bytes.CutPrefix(l, []byte("data:"))
	var out []byte
	switch {
	case a.translate && isData:
		out = a.streamer.Chunk(payload)
	case a.translate:
		return nil // blank lines and comments: the events carry their own
	case isData && bytes.HasPrefix(bytes.TrimSpace(payload), []byte(`{"error"`)):
		// The router's own error event after a native stream broke off.
		var e struct {
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(bytes.TrimSpace(payload), &e) != nil {
			out = l
			break
		}
		b, _ := json.Marshal(ErrorBody(0, e.Error)) // strings only: cannot fail
		out = AppendEvent(nil, "error", b)
		out = out[:len(out)-1] // the blank line that ends it is the stream's own
	default:
		out = l
	}
	if len(out) == 0 {
		return nil
	}
	_, err := a.w.Write(out)
	return err
}

// Flush flushes a stream.
func (a *Writer) Flush() {
	if a.mode == modeStream {
		if f, ok := a.w.(http.Flusher); ok {
			f.Flush()
		}
	}
}

// Finish writes what was held back: an error in Anthropic's shape, a chat
// completion as a Message. It does nothing for a response that never
// started (the handler wrote nothing).
func (a *Writer) Finish() {
	switch {
	case a.mode == modeStream:
		if len(a.buf) > 0 {
			_ = a.line(a.buf)
		}
	case a.mode != modeBuffer:
	case a.status != http.StatusOK:
		a.writeBody(a.status, ConvertError(a.status, a.buf))
	case !a.translate:
		a.writeBody(a.status, a.buf)
	default:
		m, err := FromChat(a.buf, a.stops)
		if err != nil {
			a.writeBody(http.StatusBadGateway, ConvertError(http.StatusBadGateway, []byte("the engine's answer is not a chat completion")))
			return
		}
		b, _ := json.Marshal(m) // our own types: cannot fail
		a.writeBody(http.StatusOK, append(b, '\n'))
	}
}

func (a *Writer) writeBody(status int, b []byte) {
	h := a.w.Header()
	h.Set("Content-Type", "application/json")
	h.Del("Content-Length")
	a.w.WriteHeader(status)
	_, _ = a.w.Write(b)
}
