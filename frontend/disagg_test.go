package frontend

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/switchyard/switchyard/internal/testenv"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// prefillEngine answers vLLM prefill legs with answer (or status), and
// records what it received.
type prefillEngine struct {
	srv    *httptest.Server
	status atomic.Int32
	answer string
	// wait, when set, is waited on before answering (an SGLang prefill
	// that fails only after its decode server has asked for the room).
	wait   chan struct{}
	mu     sync.Mutex
	bodies []string
	ids    []string
}

func newPrefillEngine(t *testing.T, answer string) *prefillEngine {
	e := &prefillEngine{answer: answer}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		e.mu.Lock()
		e.bodies = append(e.bodies, string(b))
		e.ids = append(e.ids, r.Header.Get(HeaderRequestID))
		e.mu.Unlock()
		if e.wait != nil {
			select {
			case <-e.wait:
			case <-r.Context().Done():
				return
			}
		}
		if s := e.status.Load(); s != 0 {
			http.Error(w, `{"error":{"message":"injected"}}`, int(s))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, e.answer)
	}))
	t.Cleanup(e.srv.Close)
	return e
}

// decodeEngine is an upstream that also records the X-Request-Id.
type decodeEngine struct {
	*upstream
	srv *httptest.Server
	id  atomic.Value // string
}

func newDecodeEngine(t *testing.T, tokens int) *decodeEngine {
	d := &decodeEngine{upstream: &upstream{tokens: tokens}}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		d.id.Store(r.Header.Get(HeaderRequestID))
		d.serve(w, r)
	}))
	t.Cleanup(d.srv.Close)
	return d
}

// The kv_transfer_params of a prefill answer, with spacing and key order
// an engine may use: the decode leg must carry exactly these bytes.
const rawParams = `{"do_remote_prefill": true, "do_remote_decode":false,"remote_engine_id" : "e-1",  "remote_block_ids":[1, 2 ,3],"remote_host":"10.0.0.1","remote_port":5600,"remote_request_id":"r-9","tp_size":1,"future_key":{"x":[]}}`

const prefillAnswer = `{"id":"cmpl-p","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":"length"}],"kv_transfer_params": ` + rawParams + `}`

func pairWorkers(prefill ...*prefillEngine) staticWorkers {
	var ws staticWorkers
	for i, p := range prefill {
		ws = append(ws, WorkerEntry{ID: "p" + string(rune('1'+i)), URL: p.srv.URL, Model: "m", BlockSize: 16, Role: wire.RolePrefill, KVTransfer: wire.TransferVLLM})
	}
	return ws
}

// grantPairs grants attempt i to grants[i].
func grantPairs(rec *grantRecorder, grants ...scheduler.Grant) *fakeAdmitter {
	return &fakeAdmitter{admit: func(_ context.Context, r *scheduler.Request) (Ticket, error) {
		g := grants[min(r.Attempt, len(grants)-1)]
		g.RequestID, g.Booking = r.ID, scheduler.BookingID(r.Attempt+1)
		t := &fakeTicket{grant: g}
		rec.mu.Lock()
		defer rec.mu.Unlock()
		rec.reqs = append(rec.reqs, *r)
		rec.tickets = append(rec.tickets, t)
		return t, nil
	}}
}

func pairGrant(prefill WorkerEntry, decode WorkerEntry) scheduler.Grant {
	return scheduler.Grant{Worker: prefill.ID, WorkerURL: prefill.URL, Decision: scheduler.DecisionLong,
		Decode: scheduler.GrantDecode{Worker: decode.ID, URL: decode.URL, BlockSize: 16, Booking: 99, Transfer: 7 * time.Millisecond}}
}

func TestAVLLMPairPassesTheTransferParametersByteForByte(t *testing.T) {
	pre := newPrefillEngine(t, prefillAnswer)
	dec := newDecodeEngine(t, 4)
	ws := pairWorkers(pre)
	d := WorkerEntry{ID: "d1", URL: dec.srv.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	ws = append(ws, d)
	rec := &grantRecorder{}
	s, reg := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d)), Workers: ws})
	orig := `{"model":"m","prompt":"hello there","stream":true,"stream_options":{"include_usage":true},"min_tokens":2,"max_tokens":4}`
	status, h, body := post(t, startServer(t, s)+"/v1/completions", orig, nil)
	require.Equal(t, 200, status, body)
	assert.Equal(t, "d1", h.Get(HeaderRoutedWorker), "the decode worker served the answer")
	assert.True(t, strings.HasSuffix(strings.TrimSpace(body), "data: [DONE]"), body)

	// The prefill leg: one token, not streamed, asking for a remote decode.
	require.Len(t, pre.bodies, 1)
	var leg map[string]json.RawMessage
	require.NoError(t, json.Unmarshal([]byte(pre.bodies[0]), &leg))
	assert.JSONEq(t, `false`, string(leg["stream"]))
	assert.JSONEq(t, `1`, string(leg["max_tokens"]))
	assert.JSONEq(t, `1`, string(leg["max_completion_tokens"]))
	assert.NotContains(t, leg, "stream_options")
	assert.NotContains(t, leg, "min_tokens")
	assert.JSONEq(t, vllmPrefillParams, string(leg["kv_transfer_params"]))

	// The decode leg: the original body and the answer's parameters as sent.
	got := dec.lastBody.Load().(string)
	assert.Equal(t, orig[:len(orig)-1]+`,"kv_transfer_params":`+rawParams+`}`, got)
	assert.Equal(t, pre.ids[0], dec.id.Load(), "both legs carry one X-Request-Id")
	assert.Equal(t, h.Get(HeaderRequestID), pre.ids[0])

	tk := rec.ticket(0)
	assert.Equal(t, int32(1), tk.dispatched.Load())
	assert.Equal(t, int32(1), tk.first.Load())
	assert.Equal(t, int32(1), tk.finished.Load())
	assert.False(t, tk.aborted.Load())
	assert.Equal(t, 1.0, testutil.ToFloat64(s.disagg.decisions.WithLabelValues("m", "disaggregated", "long_prefill")))
	_ = reg
}

func TestAFailedPrefillIsRetriedOnAnotherPrefillWorker(t *testing.T) {
	bad, good := newPrefillEngine(t, prefillAnswer), newPrefillEngine(t, prefillAnswer)
	bad.status.Store(503)
	dec := newDecodeEngine(t, 2)
	ws := pairWorkers(bad, good)
	d := WorkerEntry{ID: "d1", URL: dec.srv.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	ws = append(ws, d)
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d), pairGrant(ws[1], d)), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, body)
	require.Len(t, rec.reqs, 2)
	assert.Equal(t, 1, rec.reqs[1].Attempt)
	assert.Equal(t, []string{"p2", "d1"}, rec.reqs[1].Allowed, "the failed prefill worker is excluded")
	assert.True(t, rec.ticket(0).aborted.Load(), "the failed pair's grant is freed as aborted")
	assert.False(t, rec.ticket(1).aborted.Load())
	assert.Contains(t, dec.lastBody.Load().(string), rawParams)
}

// A decode worker that cannot fetch the prompt's KV (the prefill engine
// died after answering) refuses with a kv_transfer_* error: nothing has
// reached the client, so the pair is retried without that prefill worker,
// while any other refusal of the decode leg is relayed as it is.
func TestADecodeThatCannotFetchTheKVIsRetriedWithoutItsPrefillWorker(t *testing.T) {
	p1, p2 := newPrefillEngine(t, prefillAnswer), newPrefillEngine(t, prefillAnswer)
	dec := newDecodeEngine(t, 2)
	var calls atomic.Int32
	refusal := `{"error":{"message":"cannot reach the prefill engine","type":"invalid_request_error","code":"kv_transfer_unreachable"}}`
	flaky := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, refusal)
			return
		}
		dec.srv.Config.Handler.ServeHTTP(w, r)
	}))
	t.Cleanup(flaky.Close)
	ws := pairWorkers(p1, p2)
	d := WorkerEntry{ID: "d1", URL: flaky.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	ws = append(ws, d)
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d), pairGrant(ws[1], d)), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, body)
	require.Len(t, rec.reqs, 2)
	assert.Equal(t, 1, rec.reqs[1].Attempt)
	assert.Equal(t, []string{"p2", "d1"}, rec.reqs[1].Allowed, "the prefill worker whose KV was lost is excluded")
	assert.True(t, rec.ticket(0).aborted.Load(), "the failed pair's grant is freed as aborted")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.disagg.legErrors.WithLabelValues("decode", "transfer_failed")))

	// Any other refusal is the client's answer, relayed byte for byte.
	other := `{"error":{"message":"max_tokens is too large","type":"invalid_request_error","code":"context_length_exceeded"}}`
	refuse := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusBadRequest)
		_, _ = io.WriteString(w, other)
	}))
	t.Cleanup(refuse.Close)
	d2 := WorkerEntry{ID: "d2", URL: refuse.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	ws2 := append(pairWorkers(p1), d2)
	rec2 := &grantRecorder{}
	s2, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec2, pairGrant(ws2[0], d2)), Workers: ws2})
	status, _, body = post(t, startServer(t, s2)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 400, status)
	assert.Equal(t, other, body)
	require.Len(t, rec2.reqs, 1, "not retried")
}

func TestAPrefillAnswerWithoutParametersIsRetriedAggregated(t *testing.T) {
	pre := newPrefillEngine(t, `{"id":"cmpl-p","choices":[{"index":0,"text":"","finish_reason":"stop"}],"kv_transfer_params":null}`)
	dec := newDecodeEngine(t, 2)
	both := newUpstream(t, 3)
	ws := pairWorkers(pre)
	d := WorkerEntry{ID: "d1", URL: dec.srv.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	b := WorkerEntry{ID: "b1", URL: both.URL(), Model: "m", BlockSize: 16}
	ws = append(ws, d, b)
	rec := &grantRecorder{}
	agg := scheduler.Grant{Worker: "b1", WorkerURL: both.URL(), Decision: scheduler.DecisionNoPair}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d), agg), Workers: ws})
	status, h, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, body)
	assert.Equal(t, "b1", h.Get(HeaderRoutedWorker))
	require.Len(t, rec.reqs, 2)
	assert.Equal(t, []string{"b1"}, rec.reqs[1].Allowed, "only the both-worker is left: aggregated")
	assert.Nil(t, dec.lastBody.Load(), "the decode engine never recomputed")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.disagg.recomputes.WithLabelValues("m")))
}

func TestACancelledPairStreamFinishesItsOneGrantAborted(t *testing.T) {
	pre := newPrefillEngine(t, prefillAnswer)
	dec := newDecodeEngine(t, 10)
	dec.holdAfterFirst.Store(true)
	ws := pairWorkers(pre)
	d := WorkerEntry{ID: "d1", URL: dec.srv.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferVLLM}
	ws = append(ws, d)
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d)), Workers: ws})
	base := startServer(t, s)
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hi","stream":true}`))
	require.NoError(t, err)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(line, "data: "))
	cancel()
	_ = resp.Body.Close()
	testenv.Eventually(t, 5*time.Second, func() bool {
		tk := rec.ticket(0)
		return tk != nil && tk.finished.Load() == 1
	}, "the pair's grant finished after the client left")
	assert.True(t, rec.ticket(0).aborted.Load())
	testenv.Eventually(t, 5*time.Second, func() bool { return dec.cancelled.Load() == 1 }, "the decode worker saw the cancellation")
}

func TestWithMembersKeepsTheBodyAndReplacesAClientsOwnKey(t *testing.T) {
	out, err := withMembers([]byte(` {"a": 1 , "b":[2]} `), []byte(`"kv_transfer_params":{"k" : 1}`))
	require.NoError(t, err)
	assert.Equal(t, `{"a": 1 , "b":[2],"kv_transfer_params":{"k" : 1}}`, string(out))
	out, err = withMembers([]byte(`{}`), sglangBootstrap("h", 8998, 1<<62))
	require.NoError(t, err)
	assert.JSONEq(t, `{"bootstrap_host":"h","bootstrap_port":8998,"bootstrap_room":4611686018427387904}`, string(out))
	out, err = withMembers([]byte(`{"a":1,"kv_transfer_params":{"evil":true}}`), []byte(`"kv_transfer_params":{"k":1}`))
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":1,"kv_transfer_params":{"k":1}}`, string(out))
	_, err = withMembers([]byte(`[1]`), []byte(`"x":1`))
	require.ErrorIs(t, err, errBodyNotObject)
}

func FuzzTransferParams(f *testing.F) {
	f.Add([]byte(prefillAnswer))
	f.Add([]byte(`{"kv_transfer_params":null}`))
	f.Add([]byte(`{"kv_transfer_params":"x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := transferParams(b)
		if err != nil {
			require.Nil(t, p)
			return
		}
		require.True(t, json.Valid(p), "params must be valid JSON: %q", p)
		out, err := withMembers([]byte(`{"model":"m"}`), append([]byte(`"kv_transfer_params":`), p...))
		require.NoError(t, err)
		require.True(t, json.Valid(out))
	})
}

// roomDecode is an SGLang decode server: its first request waits for a
// room that never fills (its prefill failed) until the router cancels it
// or its bootstrap timeout ends it (504); later requests decode.
type roomDecode struct {
	*upstream
	srv                 *httptest.Server
	calls               atomic.Int32
	cancelled, timedOut atomic.Bool
	rooms               sync.Map // bootstrap_room seen
	// first is closed when the first request has arrived.
	first     chan struct{}
	firstOnce sync.Once
}

func newRoomDecode(t *testing.T, timeout time.Duration) *roomDecode {
	d := &roomDecode{upstream: &upstream{tokens: 3}, first: make(chan struct{})}
	d.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var f struct {
			Room *uint64 `json:"bootstrap_room"`
		}
		_ = json.Unmarshal(b, &f)
		if f.Room != nil {
			d.rooms.Store(*f.Room, true)
		}
		n := d.calls.Add(1)
		d.firstOnce.Do(func() { close(d.first) })
		if n > 1 {
			r.Body = io.NopCloser(strings.NewReader(string(b)))
			d.serve(w, r)
			return
		}
		select {
		case <-r.Context().Done():
			d.cancelled.Store(true)
		case <-time.After(timeout):
			d.timedOut.Store(true)
			http.Error(w, `{"error":{"message":"kv transfer timed out"}}`, http.StatusGatewayTimeout)
		}
	}))
	t.Cleanup(d.srv.Close)
	return d
}

func TestAFailedSGLangPrefillCancelsTheDecodeLegAndRetriesElsewhere(t *testing.T) {
	bad, good := newPrefillEngine(t, `{"id":"p"}`), newPrefillEngine(t, `{"id":"p"}`)
	bad.status.Store(500)
	dec := newRoomDecode(t, 5*time.Second)
	// The prefill fails once the decode leg waits for its room: failing
	// before the decode leg is sent would cancel it unsent.
	bad.wait = dec.first
	ws := pairWorkers(bad, good)
	for i := range ws {
		ws[i].KVTransfer, ws[i].BootstrapPort = wire.TransferSGLang, 8998+i
	}
	d := WorkerEntry{ID: "d1", URL: dec.srv.URL, Model: "m", BlockSize: 16, Role: wire.RoleDecode, KVTransfer: wire.TransferSGLang}
	ws = append(ws, d)
	rec := &grantRecorder{}
	s, _ := newTestServer(t, DefaultConfig(), Deps{Admitter: grantPairs(rec, pairGrant(ws[0], d), pairGrant(ws[1], d)), Workers: ws})
	status, _, body := post(t, startServer(t, s)+"/v1/completions", `{"model":"m","prompt":"hi","stream":true}`, nil)
	require.Equal(t, 200, status, body)
	assert.True(t, dec.cancelled.Load(), "the prefill's error cancelled the waiting decode leg")
	assert.False(t, dec.timedOut.Load(), "the decode leg did not wait for its bootstrap timeout")
	require.Len(t, rec.reqs, 2)
	assert.Equal(t, []string{"p2", "d1"}, rec.reqs[1].Allowed, "the failed prefill worker is excluded, the decode kept")
	assert.True(t, rec.ticket(0).aborted.Load(), "the failed pair's grant is freed as aborted")
	assert.False(t, rec.ticket(1).aborted.Load())
	assert.EqualValues(t, 2, dec.calls.Load())
	n := 0
	dec.rooms.Range(func(any, any) bool { n++; return true })
	assert.Equal(t, 2, n, "each attempt has its own room")
	assert.Equal(t, 1.0, testutil.ToFloat64(s.disagg.legErrors.WithLabelValues("prefill", "server_error")))
}
