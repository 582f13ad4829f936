package frontend

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
)

// countingWriter records what relayStream does to the client: its writes
// and its flushes, and the bytes each flush carried.
type countingWriter struct {
	*httptest.ResponseRecorder
	writes, flushes int
	sent            []string // the bytes between two flushes
	cur             bytes.Buffer
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.writes++
	w.cur.Write(p)
	return w.ResponseRecorder.Write(p)
}

func (w *countingWriter) Flush() {
	w.flushes++
	if w.cur.Len() == 0 {
		return // the flush at the end of the stream, after the last event's
	}
	w.sent = append(w.sent, w.cur.String())
	w.cur.Reset()
	w.ResponseRecorder.Flush()
}

// nopTicket is a ticket whose marks go nowhere.
type nopTicket struct{ finished, aborted bool }

func (*nopTicket) Grant() scheduler.Grant { return scheduler.Grant{} }
func (*nopTicket) Dispatched()            {}
func (*nopTicket) FirstToken()            {}
func (t *nopTicket) Finish(aborted bool)  { t.finished, t.aborted = true, aborted }

// chunkReader yields its chunks one Read each, as a worker's flushes
// arrive.
type chunkReader struct{ chunks []string }

func (r *chunkReader) Read(p []byte) (int, error) {
	if len(r.chunks) == 0 {
		return 0, io.EOF
	}
	n := copy(p, r.chunks[0])
	if n == len(r.chunks[0]) {
		r.chunks = r.chunks[1:]
	} else {
		r.chunks[0] = r.chunks[0][n:]
	}
	return n, nil
}

func relayFor(t testing.TB, chunks ...string) (*countingWriter, *nopTicket, int) {
	return relayOn(t, relayServer(t), chunks...)
}

func relayOn(t testing.TB, s *Server, chunks ...string) (*countingWriter, *nopTicket, int) {
	w := &countingWriter{ResponseRecorder: httptest.NewRecorder()}
	x := &exchange{s: s, w: w, r: httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil),
		p: &parsedRequest{endpoint: endpointChat, model: "m", stream: true, injectedUsage: true}, class: "default"}
	tk := &nopTicket{}
	status, retry := x.relayStream(tk, scheduler.Grant{Worker: "w1"}, &http.Response{Body: io.NopCloser(&chunkReader{chunks})})
	require.False(t, retry)
	return w, tk, status
}

// relayServer is a server whose exchanges relayStream can run on.
func relayServer(t testing.TB) *Server { return relayServerWith(t, Deps{}) }

func relayServerWith(t testing.TB, deps Deps) *Server {
	ws := staticWorkers{{ID: "w1", URL: "http://127.0.0.1:1", Model: "m", BlockSize: 16}}
	deps.Admitter, deps.Workers, deps.Prompts = grantInOrder(&grantRecorder{}, ws...), ws, toyPrompts(t, "m")
	s, err := New(DefaultConfig(), deps, zap.NewNop(), prometheus.NewRegistry())
	require.NoError(t, err)
	return s
}

func event(i int) string {
	return `data: {"id":"c","choices":[{"index":0,"delta":{"content":"t` + strconv.Itoa(i) + ` "}}]}` + "\n\n"
}

const usageEvent = "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":4,\"completion_tokens\":3}}\n\n"

// The events of one read from the worker reach the client in one write and
// one flush; each read's events are flushed before the next read, so no
// event waits for a later one.
func TestRelayWritesTheEventsOfOneReadOnceAndFlushesEachRead(t *testing.T) {
	burst := event(0) + event(1) + event(2)
	w, tk, status := relayFor(t, burst, event(3), usageEvent+"data: [DONE]\n\n")
	require.Equal(t, http.StatusOK, status)
	assert.True(t, tk.finished)
	assert.False(t, tk.aborted)
	assert.Equal(t, []string{burst, event(3), "data: [DONE]\n\n"}, w.sent, "one flush per read, the injected usage event stripped")
	assert.Equal(t, 3, w.writes, "one write per flush, not one per line")
	assert.Equal(t, burst+event(3)+"data: [DONE]\n\n", w.Body.String())
}

// An event split over two reads goes out when its end arrives; a line
// longer than the read buffer is relayed whole.
func TestRelaySendsAnEventSplitAcrossReadsWhenItEnds(t *testing.T) {
	long := "data: {\"choices\":[{\"delta\":{\"content\":\"" + strings.Repeat("x", 20<<10) + "\"}}]}\n\n"
	e := event(7)
	w, _, status := relayFor(t, e[:10], e[10:], long, "data: [DONE]\n\n")
	require.Equal(t, http.StatusOK, status)
	assert.True(t, w.Body.String() == e+long+"data: [DONE]\n\n", "the stream is relayed byte for byte")
	require.Len(t, w.sent, 3)
	assert.Equal(t, e, w.sent[0], "the split event goes out once whole")
	assert.True(t, w.sent[1] == long, "the long event goes out whole, in one flush")
}

// The events of one read share its clock reading, and an event whose
// line was not whole in the buffer is timed after the read that completes
// it: its inter-token gap is not lost.
func TestRelayTimesEachEventAtTheReadThatCompletesIt(t *testing.T) {
	var calls int
	t0 := time.Unix(1_000_000, 0)
	clock := func() time.Time { calls++; return t0.Add(time.Duration(calls) * time.Second) }
	m := metrics.NewRouter(nil)
	s := relayServerWith(t, Deps{Now: clock, Metrics: m})
	e1 := event(1)
	// read 1: event 0 and the start of event 1; read 2: the rest of event 1
	// and event 2 (already whole when its turn comes); read 3: [DONE].
	_, _, status := relayOn(t, s, event(0)+e1[:12], e1[12:]+event(2), "data: [DONE]\n\n")
	require.Equal(t, http.StatusOK, status)
	var d dto.Metric
	require.NoError(t, m.ITL.WithLabelValues("m", "default").(prometheus.Metric).Write(&d))
	assert.Equal(t, uint64(2), d.GetHistogram().GetSampleCount(), "three tokens, two gaps")
	assert.Positive(t, d.GetHistogram().GetSampleSum(), "event 1 needed a second read: its gap is that read's")
}

// FuzzForwardedBodyAsksForUsageAsWithStreamUsage: the body parseRequest
// forwards for a stream that did not ask for usage (stream_options set
// from the decode's own scan) is byte for byte what withStreamUsage, which
// scans the body again, makes of it.
func FuzzForwardedBodyAsksForUsageAsWithStreamUsage(f *testing.F) {
	for _, seed := range []string{
		`{"model":"m","prompt":"hi","stream":true}`,
		`{"model":"m","prompt":"hi","stream":true,"stream_options":null}`,
		`{"model":"m","prompt":"hi","stream":true,"stream_options":{"continuous_usage_stats":true}}`,
		`{"model":"m","prompt":"hi","stream":true,"stream_options":{"include_usage":false,"x":1}}`,
		`{"model":"m","prompt":"hi","stream":true,"stream_options":{}}`,
		` { "stream" : true , "model":"m","messages":[{"role":"user","content":"a"}] } `,
		`{"model":"m","prompt":"hi","stream":true,"switchyard":{"class":"a"}}`,
		`{"model":"m","prompt":"hi","stream":true,"str\u0065am_options":{}}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		// As readBody leaves it: room for the member after the body, which
		// parseRequest may use (and body stays the fuzzer's).
		owned := append(make([]byte, 0, len(body)+1+streamUsageRoom), body...)
		p, apiErr := parseRequest(endpointCompletions, owned, http.Header{})
		if apiErr != nil || !p.injectedUsage || bytes.Contains(body, []byte("switchyard")) {
			return
		}
		want, err := withStreamUsage(slices.Clone(body)[:len(body):len(body)])
		require.NoError(t, err)
		require.Equal(t, string(want), string(p.forward))
	})
}

// BenchmarkParseRequest is parseRequest alone on the 4k-token chat of the
// scale benchmark (a stream that did not ask for usage, so the router
// adds stream_options).
func BenchmarkParseRequest(b *testing.B) {
	body := []byte(chatBody(b, 4096))
	// parseRequest takes its body over (it adds stream_options in the room
	// readBody leaves after it): every iteration gets the body afresh, with
	// that room.
	buf := make([]byte, 0, len(body)+1+streamUsageRoom)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	c0 := cpuTime()
	for b.Loop() {
		buf = append(buf[:0], body...)
		if _, e := parseRequest(endpointChat, buf, http.Header{}); e != nil {
			b.Fatal(e)
		}
	}
	reportCPU(b, c0)
}

// reportCPU reports the process CPU time per iteration since c0: on a
// machine shared with other work, wall time per op measures the queue for
// a core more than the code.
func reportCPU(b *testing.B, c0 time.Duration) {
	b.ReportMetric(float64(cpuTime()-c0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkRelayStream is relayStream alone: a 64-token chat stream, its
// usage chunk (stripped) and [DONE], read from memory one event per read
// (as a worker flushing every token delivers them) and written to a
// client writer that costs what the server's does: the write-deadline
// wrapper over a 2 KiB buffered writer.
func BenchmarkRelayStream(b *testing.B) {
	chunks := make([]string, 0, 66)
	for i := range 64 {
		chunks = append(chunks, event(i))
	}
	chunks = append(chunks, usageEvent, "data: [DONE]\n\n")
	s := relayServer(b)
	r := httptest.NewRequest(http.MethodPost, "/v1/chat/completions", nil)
	g := scheduler.Grant{Worker: "w1"}
	b.ReportAllocs()
	c0 := cpuTime()
	for b.Loop() {
		df := &discardFlusher{h: http.Header{}, bw: bufio.NewWriterSize(io.Discard, 2<<10)}
		w := &deadlineWriter{ResponseWriter: df, rc: http.NewResponseController(df), d: time.Minute}
		x := &exchange{s: s, w: w, r: r, p: &parsedRequest{endpoint: endpointChat, model: "m", stream: true, injectedUsage: true}, class: "default"}
		if status, _ := x.relayStream(&nopTicket{}, g, &http.Response{Body: io.NopCloser(&chunkReader{slicesClone(chunks)})}); status != http.StatusOK {
			b.Fatal(status)
		}
	}
	reportCPU(b, c0)
}

// discardFlusher is a client that costs what http's buffered response
// writer does, without the socket.
type discardFlusher struct {
	h  http.Header
	bw *bufio.Writer
}

func (w *discardFlusher) Header() http.Header         { return w.h }
func (w *discardFlusher) WriteHeader(int)             {}
func (w *discardFlusher) Write(p []byte) (int, error) { return w.bw.Write(p) }
func (w *discardFlusher) Flush()                      { _ = w.bw.Flush() }

func slicesClone(s []string) []string { return append([]string(nil), s...) }
