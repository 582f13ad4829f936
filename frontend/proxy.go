package frontend

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/tenant"
)

// exchange is one client request being proxied; it lives on the request
// goroutine only.
type exchange struct {
	s       *Server
	w       http.ResponseWriter
	r       *http.Request
	p       *parsedRequest
	rid     string
	class   string
	ingress time.Time
	tenant  *tenant.Tenant // nil: the API is open
	attempt int            // the current attempt, from 0
	others  bool           // another worker could take a retry of the current attempt
	fb      *firstByte     // the current attempt's first-byte timer (nil: none)
	dec     *pending       // the attempt's routing decision (quality.go)
	ranks   map[string]int // data-parallel ranks by worker (dprank.go)
	// priority is the request's strict priority, passed to engines that
	// schedule by it (enginePriority).
	priority int32
	pair     pairLegs // the attempt's disaggregated legs (disagg.go)
}

// usageBody is the part of a response the router reads for metrics: the
// usage of chat, completions and embeddings, or of a Responses API answer
// (input/output tokens; in a stream, inside the response.completed event's
// response object).
type usageBody struct {
	Usage    *usage `json:"usage"`
	Response *struct {
		Usage *usage `json:"usage"`
	} `json:"response"`
}

type usage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	InputTokens         int `json:"input_tokens"`
	OutputTokens        int `json:"output_tokens"`
	PromptTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
	InputTokensDetails *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	// CacheRead are a Messages answer's cached prompt tokens, which its
	// input_tokens leave out.
	CacheRead int `json:"cache_read_input_tokens"`
}

// roundTrip is the outcome of one request to a worker.
type roundTrip struct {
	resp *http.Response
	err  error
}

// proxy marks t dispatched, sends the request to the granted worker and
// relays the answer. It finishes t exactly once on every path except retry,
// where it finishes t as aborted and reports retry = true: nothing has been
// written to the client yet, so the caller may admit the request to another
// worker.
func (x *exchange) proxy(t Ticket, g scheduler.Grant) (status int, retry bool) {
	ctx := x.r.Context()
	// The request to the worker runs under the attempt's first-byte timer
	// (hung.go); the client's own context still decides "client gone".
	x.s.disagg.decided(x.p.model, g)
	if g.Disaggregated() {
		// Two legs (disagg.go): the prefill leg runs here; the decode leg
		// is the request below, sent to the decode worker.
		defer x.pairDone()
		var stop bool
		if g, status, stop, retry = x.pairPrefill(t, g); stop {
			return status, retry
		}
		defer x.pairRetry(g.Worker, &retry)
	}
	reqCtx := x.decodeContext(ctx)
	x.fb = nil
	if d := x.firstByteTimeout(g); d > 0 {
		x.fb, reqCtx = startFirstByte(reqCtx, d)
		defer x.fb.stop()
	}
	path, body := x.upstream(g)
	body = x.pairBody(body)
	if x.priority != 0 && x.s.prioritySchedules(g.Worker) && !x.p.messages.nativeAttempt() {
		body = enginePriority(body, x.priority)
	}
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, g.WorkerURL+path, bytes.NewReader(body))
	if err != nil {
		t.Dispatched()
		t.Finish(true)
		return x.fail(http.StatusBadGateway, "bad worker url "+g.WorkerURL), false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderRequestID, x.rid)
	x.pinRank(req, g.Worker)
	if x.p.stream {
		req.Header.Set("Accept", "text/event-stream")
	}
	// The request goes out while the dispatch mark is delivered, not after:
	// with a local admitter the mark waits its turn on the admission actor,
	// behind every admission of a burst, and the worker need not wait too.
	// The round trip's goroutine is owned here: it ends when Do returns,
	// which the receive below waits for on every path.
	sent := make(chan roundTrip, 1) // size one: the single result, received below
	go func() {
		resp, err := x.s.client.Do(req) //nolint:bodyclose // handed over on sent and closed below (defer resp.Body.Close)
		sent <- roundTrip{resp, err}
	}()
	t.Dispatched()
	rt := <-sent
	resp, err := rt.resp, rt.err
	if err != nil {
		t.Finish(true)
		if ctx.Err() != nil {
			return statusClientClosed, false
		}
		if x.fb.expired() {
			return x.firstByteTimedOut(g, firstByteNoHeaders)
		}
		x.s.log.Warn("worker unreachable", zap.String("request_id", x.rid), zap.String("worker", g.Worker), zap.Error(err))
		if x.canRetry() {
			return 0, true
		}
		return x.fail(http.StatusBadGateway, "the worker is unreachable: "+err.Error()), false
	}
	defer resp.Body.Close()
	if !x.p.stream || resp.StatusCode != http.StatusOK {
		// Headers are a non-streaming request's first byte, and an error
		// status is an answer; a stream's first byte is its first event.
		if !x.fb.arrived() {
			t.Finish(true)
			return x.firstByteTimedOut(g, firstByteNoHeaders)
		}
		if resp.StatusCode == http.StatusOK {
			x.s.suspects.succeeded(g.Worker)
		}
	}
	switch {
	case resp.StatusCode >= 500:
		// The worker failed before producing output: another worker may
		// succeed. Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		t.Finish(true)
		x.s.log.Warn("worker answered with a server error", zap.String("request_id", x.rid),
			zap.String("worker", g.Worker), zap.Int("status", resp.StatusCode))
		if x.canRetry() {
			return 0, true
		}
		x.w.Header().Set(HeaderRoutedWorker, g.Worker) // the engine that failed, for the operator
		return x.fail(http.StatusBadGateway, "the worker failed: "+resp.Status), false
	case resp.StatusCode != http.StatusOK:
		// The worker refused the request itself (4xx): relay it as is,
		// unless it is a decode leg that could not fetch its KV.
		t.Finish(true)
		refused, read := x.transferRefused(resp)
		if refused && x.canRetry() {
			return 0, true
		}
		if read != nil {
			resp.Body = io.NopCloser(io.MultiReader(bytes.NewReader(read), resp.Body))
		}
		return x.relayPlain(resp, g.Worker), false
	}
	if x.p.stream {
		status, retry = x.relayStream(t, g, resp)
		if retry && x.fb.expired() {
			return x.firstByteTimedOut(g, firstByteNoEvent)
		}
		return status, retry
	}
	return x.relayBody(t, g, resp)
}

// canRetry reports whether a pre-first-byte failure may move to another
// worker: not when the client pinned this one.
func (x *exchange) canRetry() bool { return x.p.hints.worker == "" && x.r.Context().Err() == nil }

// fail writes a proxy error before anything else was written.
func (x *exchange) fail(status int, msg string) int {
	e := &APIError{Status: status, Type: typeServer, Code: "upstream_failed", Message: msg, err: ErrUpstream}
	e.write(x.w)
	return status
}

// relayPlain relays an engine's refusal (4xx) as it is, naming the engine:
// the client asks that engine's operator why.
func (x *exchange) relayPlain(resp *http.Response, worker string) int {
	h := x.w.Header()
	h.Set("Content-Type", resp.Header.Get("Content-Type"))
	h.Set(HeaderRoutedWorker, worker)
	x.w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(x.w, io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode
}

// relayBody relays a non-streaming response. The worker's whole answer is
// the "first token" from the router's point of view.
func (x *exchange) relayBody(t Ticket, g scheduler.Grant, resp *http.Response) (int, bool) {
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Finish(true)
		if x.r.Context().Err() != nil {
			return statusClientClosed, false
		}
		if x.canRetry() {
			return 0, true
		}
		return x.fail(http.StatusBadGateway, "the worker's response broke off: "+err.Error()), false
	}
	now := x.s.now()
	h := x.w.Header()
	h.Set("Content-Type", resp.Header.Get("Content-Type"))
	h.Set(HeaderRoutedWorker, g.Worker)
	x.w.WriteHeader(http.StatusOK)
	_, werr := x.w.Write(body)
	// The first-token mark waits on the admission actor, which is busy
	// exactly when many requests arrive at once: send it after the client
	// has its answer, not before.
	t.FirstToken()
	x.firstToken(now)
	u := parseUsage(body)
	x.reportUsage(t, u)
	t.Finish(werr != nil)
	labels := []string{x.p.model, x.class}
	x.s.m.TTFT.WithLabelValues(labels...).Observe(now.Sub(x.ingress).Seconds())
	x.s.m.E2E.WithLabelValues(labels...).Observe(now.Sub(x.ingress).Seconds())
	x.recordUsage(u)
	return http.StatusOK, false
}

// maxPreamble bounds the SSE lines (comments, event:, id:) held back before
// the first data line; more are dropped.
const maxPreamble = 64 << 10

var (
	dataPrefix = []byte("data:")
	doneData   = []byte("[DONE]")
	usageKey   = []byte(`"usage"`)
	// A Responses API stream has no [DONE]: it ends with one of these
	// events, the last carrying the usage.
	responseEnds = [][]byte{[]byte(`"response.completed"`), []byte(`"response.incomplete"`), []byte(`"response.failed"`)}
)

// isResponseEnd reports whether a Responses API event payload is the
// stream's terminal event.
func isResponseEnd(payload []byte) bool {
	for _, e := range responseEnds {
		if bytes.Contains(payload, e) {
			return true
		}
	}
	return false
}

// relayReaders recycles the 16 KiB upstream read buffers across streams: at
// hundreds of concurrent streams a fresh one per request was most of the
// router's allocation.
var relayReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 16<<10) }}

// relayWriteBufs recycles the buffers in which relayStream gathers the
// lines it sends to the client between two flushes.
var relayWriteBufs = sync.Pool{New: func() any { b := make([]byte, 0, 4<<10); return &b }}

// maxRelayBatch bounds the bytes relayStream gathers before writing them
// out without a flush (a burst longer than this goes out in several
// writes, as http's own buffer would have sent it).
const maxRelayBatch = 16 << 10

// relayStream passes the worker's SSE stream through. Events are gathered
// as they are read and written and flushed once the upstream has nothing
// more buffered, so a burst costs one write and a lone event (the first one
// included) is sent at once: an event goes out no later than when the read
// that delivered it is drained, the same rule as writing each line at once
// (http's buffer held those lines until the flush too). Response headers
// are held back until the worker's first event, so a worker that dies
// before producing anything is retried invisibly.
func (x *exchange) relayStream(t Ticket, g scheduler.Grant, resp *http.Response) (int, bool) {
	ctx := x.r.Context()
	flusher, _ := x.w.(http.Flusher)
	br := relayReaders.Get().(*bufio.Reader)
	br.Reset(resp.Body)
	wp := relayWriteBufs.Get().(*[]byte)
	wbuf := (*wp)[:0] // lines for the client, not written yet
	defer func() {
		br.Reset(nil) // drop the body, keep the buffer
		relayReaders.Put(br)
		if cap(wbuf) <= 4*maxRelayBatch {
			*wp = wbuf[:0]
			relayWriteBufs.Put(wp)
		}
	}()
	// send writes the gathered lines (and flushes them when flush is set).
	send := func(flush bool) error {
		if len(wbuf) > 0 {
			_, err := x.w.Write(wbuf)
			wbuf = wbuf[:0]
			if err != nil {
				return err
			}
		}
		if flush && flusher != nil {
			flusher.Flush()
		}
		return nil
	}
	labels := []string{x.p.model, x.class}
	itl := x.s.m.ITL.WithLabelValues(labels...)
	started := false
	sawDone := false
	var first, last time.Time
	// The first-token mark (and the TTFT sample, timed at the worker's first
	// event) waits for the flush that carries that event: the mark goes
	// through the admission actor, which must not delay the first event on
	// its way to the client. markFirst runs once the stream has started.
	marked := false
	markFirst := func() {
		if !marked {
			marked = true
			t.FirstToken()
			x.firstToken(first)
			x.s.m.TTFT.WithLabelValues(labels...).Observe(first.Sub(x.ingress).Seconds())
		}
	}
	var usageLine []byte
	var pending []byte // lines before the first data line (event:, id:, comments)
	// skipBlank drops the blank line ending a usage event the router
	// stripped (injectedUsage).
	skipBlank := false
	// readAt is when the line being parsed was read from the worker: the
	// clock is read once per read of the connection, not once per event
	// (the events of one read arrived together). A line not yet whole in
	// the buffer needs a read, and is timed after it.
	var readAt time.Time
	for {
		// ReadSlice reads the connection only when the buffer holds no
		// whole line; it then returns more than was buffered, or an error.
		buffered := br.Buffered()
		line, err := br.ReadSlice('\n')
		if len(line) > buffered || err != nil || readAt.IsZero() {
			readAt = x.s.now()
		}
		if errors.Is(err, bufio.ErrBufferFull) {
			// An event line longer than the buffer: assemble it.
			full := append([]byte(nil), line...)
			for errors.Is(err, bufio.ErrBufferFull) {
				line, err = br.ReadSlice('\n')
				full = append(full, line...)
			}
			line = full
		}
		if len(line) > 0 {
			out := line // what the client gets of this line; nil: nothing
			if skipBlank && len(bytes.TrimSpace(line)) == 0 {
				out, skipBlank = nil, false
			}
			payload, isData := bytes.CutPrefix(line, dataPrefix)
			if isData {
				payload = bytes.TrimSpace(payload)
				done := bytes.Equal(payload, doneData)
				// usage: the chunk carries a usage object (the latest one is
				// the stream's); usageOnly: it carries nothing else, so it is
				// no token and no inter-token gap. SGLang, and vLLM with
				// continuous_usage_stats, put "usage" in every chunk (null,
				// or a running count beside the token).
				var usage, usageOnly bool
				if x.p.messages.nativeAttempt() {
					// Messages events: message_stop ends the stream,
					// message_delta carries its usage.
					done, usage = nativeStreamEvent(payload)
					usageOnly = usage
				} else if x.p.endpoint == endpointResponses {
					// Every Responses event embeds the response object (and
					// its usage, null until the end): only the terminal
					// event is the usage line.
					done = isResponseEnd(payload)
					usage, usageOnly = done, done
				} else if !done {
					usage, usageOnly = chunkUsage(payload)
				}
				now := readAt
				if !started {
					if !x.fb.arrived() { // the first-byte timer fired: nothing was sent
						t.Finish(true)
						return 0, true
					}
					x.s.suspects.succeeded(g.Worker)
					started = true
					first = now
					h := x.w.Header()
					h.Set("Content-Type", "text/event-stream")
					h.Set("Cache-Control", "no-cache")
					h.Set(HeaderRoutedWorker, g.Worker)
					x.w.WriteHeader(http.StatusOK)
					wbuf = append(wbuf, pending...)
				} else if !done && !usageOnly {
					// Only token events: [DONE] and the trailing usage
					// chunk are not inter-token gaps.
					itl.Observe(now.Sub(last).Seconds())
				}
				if !usageOnly {
					last = now
				}
				sawDone = sawDone || done
				if usage {
					usageLine = append(usageLine[:0], payload...)
					if x.p.injectedUsage {
						// The client did not ask for usage: the router did.
						if kept, changed := withoutUsageScan(payload); kept == nil {
							out, skipBlank = nil, true
						} else if changed {
							out = append(append(append([]byte(nil), dataPrefix...), ' '), append(kept, '\n')...)
						}
					}
				}
			}
			if !started {
				if len(pending) < maxPreamble {
					pending = append(pending, line...)
				}
			} else if out != nil {
				wbuf = append(wbuf, out...)
				// Write and flush at the end of an event unless the next
				// one is already buffered; write without a flush when the
				// batch is long.
				eventEnd := len(bytes.TrimSpace(line)) == 0 && br.Buffered() == 0
				if eventEnd || len(wbuf) >= maxRelayBatch {
					if werr := send(eventEnd); werr != nil {
						markFirst()
						t.Finish(true)
						return statusClientClosed, false
					}
					if eventEnd && flusher != nil {
						markFirst()
					}
				}
			}
		}
		if err == nil {
			continue
		}
		// End of the upstream body: clean or not.
		if started {
			if werr := send(true); werr != nil {
				markFirst()
				t.Finish(true)
				return statusClientClosed, false
			}
			markFirst()
		}
		switch {
		case ctx.Err() != nil:
			t.Finish(true)
			return statusClientClosed, false
		case err == io.EOF && sawDone:
			u := parseUsage(usageLine)
			x.reportUsage(t, u)
			t.Finish(false)
			x.s.m.E2E.WithLabelValues(labels...).Observe(x.s.now().Sub(x.ingress).Seconds())
			x.recordUsage(u)
			return http.StatusOK, false
		case !started:
			t.Finish(true)
			x.s.log.Warn("worker stream ended before its first event", zap.String("request_id", x.rid),
				zap.String("worker", g.Worker), zap.Error(err))
			if x.canRetry() {
				return 0, true
			}
			return x.fail(http.StatusBadGateway, "the worker's stream ended before its first event"), false
		default:
			t.Finish(true)
			x.s.log.Warn("worker stream broke off", zap.String("request_id", x.rid),
				zap.String("worker", g.Worker), zap.Error(err))
			x.writeStreamError("the worker's stream broke off; the response is incomplete")
			return http.StatusOK, false
		}
	}
}

// chunkUsage reports whether a chat or completions stream chunk carries a
// usage object (not null, not a "usage" string inside a token) and whether
// it carries nothing else (no choices). It scans rather than decodes: it
// runs on every chunk of every stream.
func chunkUsage(payload []byte) (usage, only bool) {
	v, ok := memberValue(payload, usageKey)
	if !ok || bytes.HasPrefix(v, nullValue) {
		return false, false
	}
	c, ok := memberValue(payload, choicesKey)
	return true, !ok || bytes.HasPrefix(c, nullValue) || isEmptyArray(c)
}

var (
	choicesKey = []byte(`"choices"`)
	nullValue  = []byte("null")
)

// memberValue returns what follows the first occurrence of key used as a
// member name (followed by a colon), leading white space trimmed. A quoted
// string equal to key that is a value (a token "usage") is followed by a
// comma or brace instead and is passed over; inside a JSON string a quote
// is escaped, so key cannot match across a string's content.
func memberValue(doc, key []byte) ([]byte, bool) {
	for {
		i := bytes.Index(doc, key)
		if i < 0 {
			return nil, false
		}
		doc = doc[i+len(key):]
		rest := bytes.TrimLeft(doc, " \t\r\n")
		if len(rest) > 0 && rest[0] == ':' {
			return bytes.TrimLeft(rest[1:], " \t\r\n"), true
		}
	}
}

// isEmptyArray reports whether v starts with an array holding only white
// space ("[ ]").
func isEmptyArray(v []byte) bool {
	if len(v) == 0 || v[0] != '[' {
		return false
	}
	rest := bytes.TrimLeft(v[1:], " \t\r\n")
	return len(rest) > 0 && rest[0] == ']'
}

// withoutUsageScan is withoutUsage, deciding the common cases (the usage
// chunk, dropped whole; a chunk whose usage is null or absent, kept as it
// is) from one scan of the chunk's top-level members instead of decoding
// it into a map: it runs on the last chunk of every stream whose client
// did not ask for usage. A chunk the scan cannot decide (an escaped key,
// or usage beside choices, which must be re-encoded) goes to withoutUsage.
func withoutUsageScan(payload []byte) (kept []byte, changed bool) {
	var buf [8]prompt.Member
	members, ok := prompt.ScanObject(payload, buf[:0])
	if !ok {
		return withoutUsage(payload)
	}
	var usage, choices []byte
	for _, m := range members {
		if m.Escaped {
			return withoutUsage(payload)
		}
		switch string(m.Key) {
		case "usage":
			usage = m.Value // the last of duplicates, as decoding into a map
		case "choices":
			choices = m.Value
		}
	}
	switch {
	case usage == nil || string(usage) == "null":
		return payload, false
	case choices == nil || string(choices) == "[]" || string(choices) == "null":
		return nil, true
	}
	return withoutUsage(payload)
}

// withoutUsage is a stream chunk as a client that did not ask for usage
// sees it: nil for the usage chunk (no choices), the chunk without its
// usage member when it also carries choices, payload itself when its usage
// is null or absent (changed: it is not payload).
func withoutUsage(payload []byte) (kept []byte, changed bool) {
	var chunk map[string]json.RawMessage
	if json.Unmarshal(payload, &chunk) != nil {
		return payload, false
	}
	u, ok := chunk["usage"]
	if !ok || string(u) == "null" {
		return payload, false
	}
	if c := bytes.TrimSpace(chunk["choices"]); len(c) == 0 || string(c) == "[]" || string(c) == "null" {
		return nil, true
	}
	delete(chunk, "usage")
	b, err := json.Marshal(chunk)
	if err != nil {
		return payload, false
	}
	return b, true
}

// writeStreamError ends a stream that already started with an error event.
func (x *exchange) writeStreamError(msg string) {
	e := &APIError{Type: typeServer, Code: "upstream_failed", Message: msg}
	var b bytes.Buffer
	b.WriteString("data: ")
	b.Write(e.body())
	b.WriteString("\n\n")
	_, _ = x.w.Write(b.Bytes())
	if f, ok := x.w.(http.Flusher); ok {
		f.Flush()
	}
}

// parseUsage reads the usage of a response body or usage event (nil when
// it has none).
func parseUsage(doc []byte) *usage {
	if len(doc) == 0 {
		return nil
	}
	var b usageBody
	if json.Unmarshal(doc, &b) != nil {
		return nil
	}
	if b.Usage == nil && b.Response != nil {
		return b.Response.Usage
	}
	return b.Usage
}

// recordUsage adds a response's usage to the token counters.
func (x *exchange) recordUsage(u *usage) {
	x.recordRealised(u)
	if u == nil {
		return
	}
	m, labels := x.s.m, []string{x.p.model, x.class}
	m.PromptTokens.WithLabelValues(labels...).Add(float64(u.PromptTokens + u.InputTokens + u.CacheRead))
	m.CachedTokens.WithLabelValues(labels...).Add(float64(u.CacheRead))
	m.GeneratedTokens.WithLabelValues(labels...).Add(float64(u.CompletionTokens + u.OutputTokens))
	if d := u.PromptTokensDetails; d != nil {
		m.CachedTokens.WithLabelValues(labels...).Add(float64(d.CachedTokens))
	}
	if d := u.InputTokensDetails; d != nil {
		m.CachedTokens.WithLabelValues(labels...).Add(float64(d.CachedTokens))
	}
}
