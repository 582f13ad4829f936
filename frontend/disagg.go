package frontend

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// The two-leg proxy of a disaggregated grant (docs/architecture.md,
// "Disaggregated prefill and decode"). The grant names the prefill worker
// (Grant.Worker) and the decode worker (Grant.Decode); the protocol is the
// prefill worker's registered KVTransfer:
//
//   - vLLM: the prefill leg is the request made non-streaming with one
//     output token and kv_transfer_params {"do_remote_decode": true, ...};
//     the top-level kv_transfer_params of its answer go, byte for byte, into
//     the original body sent to the decode worker, whose answer is relayed.
//     Both legs carry the same X-Request-Id. An answer without parameters
//     (the one token ended the sequence) would make the decode engine
//     recompute the prompt: it is counted, and the request is re-admitted
//     aggregated when a both-worker serves the model.
//   - SGLang: the same body, with bootstrap_host and bootstrap_port (the
//     prefill server's) and one random bootstrap_room, goes to both servers
//     at once; only the decode server's answer is relayed. A worker that is
//     one rank of a data-parallel server (WorkerEntry.DPSize > 1) is named
//     as SGLang's gateway names it (sglangRanks): routed_dp_rank on its own
//     leg, and, for a prefill rank, disagg_prefill_dp_rank on the decode
//     leg; the room is aligned to the prefill rank.

// vllmPrefillParams are the kv_transfer_params of a vLLM prefill leg.
const vllmPrefillParams = `{"do_remote_decode":true,"do_remote_prefill":false,"remote_engine_id":null,"remote_block_ids":null,"remote_host":null,"remote_port":null}`

// maxPrefillAnswer bounds the prefill leg's answer the router reads (one
// token and the transfer parameters).
const maxPrefillAnswer = 4 << 20

// Errors of the two-leg proxy.
var (
	errNoTransferParams = errors.New("the prefill answer carries no kv_transfer_params")
	errBodyNotObject    = errors.New("the request body is not a JSON object")
)

// pairLegs is one attempt's two-leg state on the exchange.
type pairLegs struct {
	// extra is the JSON members the decode leg's body gains (without
	// braces; "" for none).
	extra []byte
	// prefillDone is closed when an SGLang prefill leg running beside the
	// decode leg has ended (nil: none runs).
	prefillDone chan struct{}
	// exclude are workers the next attempt must avoid beside the granted
	// one (takeExcluded).
	exclude []string
	// decodeCtx is the decode leg's context beside an SGLang prefill leg:
	// the prefill leg's failure cancels it at once (the decode server
	// would wait for its room until its bootstrap timeout). prefill is
	// that leg's worker and prefillFailed its outcome, read after the
	// decode leg ended.
	decodeCtx     context.Context
	cancelDecode  context.CancelFunc
	prefill       string
	prefillFailed atomic.Bool
}

// disaggMetrics count the decider's decisions and the two legs.
type disaggMetrics struct {
	decisions  *prometheus.CounterVec // model, mode, reason
	recomputes *prometheus.CounterVec // model
	prefillLeg prometheus.Histogram
	transfer   prometheus.Histogram
	legErrors  *prometheus.CounterVec // leg (prefill, decode), kind
}

func newDisaggMetrics(reg prometheus.Registerer) *disaggMetrics {
	f := promauto.With(reg)
	m := &disaggMetrics{
		decisions: f.NewCounterVec(prometheus.CounterOpts{Name: metrics.NameDisaggDecisions,
			Help: "Grants of a model served by prefill or decode workers, by mode (disaggregated, aggregated) and the decider's reason (long_prefill, only_pairs, both_busy; short_prefill, no_pair, pinned, pair_busy, prefill_busy)."},
			[]string{metrics.LabelModel, "mode", metrics.LabelReason}),
		recomputes: f.NewCounterVec(prometheus.CounterOpts{Name: metrics.NameDisaggRecomputes,
			Help: "vLLM prefill legs answered without kv_transfer_params: the decode engine would have recomputed the prompt (the request is re-admitted aggregated when a both-worker serves the model)."},
			[]string{metrics.LabelModel}),
		prefillLeg: f.NewHistogram(prometheus.HistogramOpts{Name: metrics.NameDisaggPrefillLeg,
			Help:    "Duration of vLLM prefill legs, from the request to the answer carrying the transfer parameters.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		transfer: f.NewHistogram(prometheus.HistogramOpts{Name: metrics.NameDisaggTransfer,
			Help:    "The owner's predicted KV transfer time of disaggregated grants (setup + per-token time of the prompt tokens the decode worker does not cache).",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 14)}),
		legErrors: f.NewCounterVec(prometheus.CounterOpts{Name: metrics.NameDisaggLegErrors,
			Help: "Failed legs of disaggregated requests by leg (prefill, decode) and kind (unreachable, server_error, refused, no_params, bad_answer, transfer_failed, before_first_byte)."},
			[]string{"leg", metrics.LabelKind}),
	}
	return m
}

// decided counts a grant's decision (none for a fleet without roles).
func (m *disaggMetrics) decided(model string, g scheduler.Grant) {
	if m == nil || g.Decision == scheduler.DecisionNone {
		return
	}
	m.decisions.WithLabelValues(model, g.Decision.Mode(), g.Decision.String()).Inc()
	if g.Disaggregated() {
		m.transfer.Observe(g.Decode.Transfer.Seconds())
	}
}

// entryOf is the worker's registration: its KV transfer protocol,
// bootstrap port and data-parallel shape (zero: not registered).
func (s *Server) entryOf(worker string) WorkerEntry {
	for _, w := range s.deps.Workers.Workers() {
		if w.ID == worker {
			return w
		}
	}
	return WorkerEntry{}
}

// roleWorkers are the prefill and decode workers serving model, and
// whether a both-worker serves it too.
func (s *Server) roleWorkers(model string) (roles []string, both bool) {
	for _, w := range s.deps.Workers.Workers() {
		if !w.Serves(model) {
			continue
		}
		switch w.Role {
		case wire.RolePrefill, wire.RoleDecode:
			roles = append(roles, w.ID)
		default:
			both = true
		}
	}
	return roles, both
}

// takeExcluded returns and clears the workers the next attempt avoids.
func (x *exchange) takeExcluded() []string {
	out := x.pair.exclude
	x.pair.exclude = nil
	return out
}

// pairBody is the decode leg's body: body with the prefill leg's members.
func (x *exchange) pairBody(body []byte) []byte {
	if len(x.pair.extra) == 0 {
		return body
	}
	out, err := withMembers(body, x.pair.extra)
	if err != nil {
		return body // parseRequest accepted only objects: not reached
	}
	return out
}

// pairRetry makes a retry after the decode leg failed avoid its worker,
// or, when an SGLang prefill leg failed and the decode leg was cancelled
// for it, the prefill worker.
func (x *exchange) pairRetry(decode string, retry *bool) {
	if *retry && x.pair.prefillFailed.Load() {
		x.pair.exclude = append(x.pair.exclude, x.pair.prefill)
		return
	}
	if *retry {
		x.pair.exclude = append(x.pair.exclude, decode)
		x.s.disagg.legErrors.WithLabelValues("decode", "before_first_byte").Inc()
	}
}

// pairDone waits for an SGLang prefill leg and clears the attempt's legs.
func (x *exchange) pairDone() {
	if x.pair.cancelDecode != nil {
		x.pair.cancelDecode()
	}
	if x.pair.prefillDone != nil {
		<-x.pair.prefillDone
	}
	x.pair.extra, x.pair.prefillDone = nil, nil
	x.pair.decodeCtx, x.pair.cancelDecode, x.pair.prefill = nil, nil, ""
	x.pair.prefillFailed.Store(false)
}

// decodeContext is the context the decode leg runs under: ctx, cancelled
// too when an SGLang prefill leg beside it fails.
func (x *exchange) decodeContext(ctx context.Context) context.Context {
	if x.pair.decodeCtx == nil {
		return ctx
	}
	return x.pair.decodeCtx
}

// pairPrefill runs a disaggregated grant's prefill leg (vLLM) or starts it
// (SGLang). It returns the grant the decode leg goes to, or stop with the
// status and retry proxy returns (the ticket then finished).
func (x *exchange) pairPrefill(t Ticket, g scheduler.Grant) (scheduler.Grant, int, bool, bool) {
	decode := g
	decode.Worker, decode.WorkerURL, decode.BlockSize = g.Decode.Worker, g.Decode.URL, g.Decode.BlockSize
	if pw := x.s.entryOf(g.Worker); pw.KVTransfer == wire.TransferSGLang {
		x.sglangPrefill(g, pw)
		return decode, 0, false, false
	}
	params, status, stop, retry := x.vllmPrefill(t, g)
	if stop {
		return g, status, true, retry
	}
	if params == nil {
		x.s.disagg.recomputes.WithLabelValues(x.p.model).Inc()
		x.s.disagg.legErrors.WithLabelValues("prefill", "no_params").Inc()
		if roles, both := x.s.roleWorkers(x.p.model); both && x.canRetry() {
			// Re-admitted aggregated: without the role workers, the
			// decider has only both-workers left.
			x.pair.exclude = append(x.pair.exclude, roles...)
			t.Dispatched()
			t.Finish(true)
			x.s.log.Info("prefill answered without transfer parameters, re-admitting aggregated",
				zap.String("request_id", x.rid), zap.String("worker", g.Worker))
			return g, 0, true, true
		}
		// No both-worker: the decode engine recomputes the prompt.
		return decode, 0, false, false
	}
	x.pair.extra = append([]byte(`"kv_transfer_params":`), params...)
	x.pair.prefill = g.Worker
	return decode, 0, false, false
}

// maxTransferRefusal bounds how much of a decode leg's refusal is read to
// find its error code.
const maxTransferRefusal = 16 << 10

// transferRefused reads a decode leg's 4xx refusal and reports whether it
// says the prompt's KV could not be fetched from the prefill worker (an
// error code starting with "kv_transfer", as the simulated worker and
// adapters answer: the prefill engine died, restarted or released the KV
// before the pull). Nothing has reached the client: the pair is retried
// without that prefill worker. Otherwise body is the refusal read so far,
// for the caller to relay.
func (x *exchange) transferRefused(resp *http.Response) (refused bool, body []byte) {
	if x.pair.prefill == "" || len(x.pair.extra) == 0 {
		return false, nil
	}
	body, _ = io.ReadAll(io.LimitReader(resp.Body, maxTransferRefusal))
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || !strings.HasPrefix(e.Error.Code, "kv_transfer") {
		return false, body
	}
	x.s.disagg.legErrors.WithLabelValues("decode", "transfer_failed").Inc()
	x.s.log.Warn("the decode worker could not fetch the prompt's KV, retrying the pair",
		zap.String("request_id", x.rid), zap.String("prefill", x.pair.prefill), zap.String("code", e.Error.Code))
	x.pair.prefillFailed.Store(true) // pairRetry then excludes the prefill worker
	return true, body
}

// vllmPrefill sends the vLLM prefill leg and returns the answer's
// kv_transfer_params as sent (nil: none).
func (x *exchange) vllmPrefill(t Ticket, g scheduler.Grant) (params []byte, status int, stop, retry bool) {
	ctx := x.r.Context()
	path, body := x.upstream(g)
	pb, err := vllmPrefillBody(body)
	if err != nil {
		t.Dispatched()
		t.Finish(true)
		return nil, x.fail(http.StatusBadGateway, "the prefill leg could not be built: "+err.Error()), true, false
	}
	legCtx := ctx
	if d := x.firstByteTimeout(g); d > 0 {
		var cancel context.CancelFunc
		legCtx, cancel = context.WithTimeout(ctx, d)
		defer cancel()
	}
	req, err := http.NewRequestWithContext(legCtx, http.MethodPost, g.WorkerURL+path, bytes.NewReader(pb))
	if err != nil {
		t.Dispatched()
		t.Finish(true)
		return nil, x.fail(http.StatusBadGateway, "bad worker url "+g.WorkerURL), true, false
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderRequestID, x.rid)
	x.pinRank(req, g.Worker)
	start := time.Now()
	resp, err := x.s.client.Do(req)
	if err != nil {
		t.Dispatched()
		t.Finish(true)
		if ctx.Err() != nil {
			return nil, statusClientClosed, true, false
		}
		x.s.disagg.legErrors.WithLabelValues("prefill", "unreachable").Inc()
		x.s.log.Warn("prefill worker unreachable", zap.String("request_id", x.rid), zap.String("worker", g.Worker), zap.Error(err))
		if x.canRetry() {
			return nil, 0, true, true
		}
		return nil, x.fail(http.StatusBadGateway, "the prefill worker is unreachable: "+err.Error()), true, false
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode >= 500:
		_, _ = io.CopyN(io.Discard, resp.Body, 4096)
		t.Dispatched()
		t.Finish(true)
		x.s.disagg.legErrors.WithLabelValues("prefill", "server_error").Inc()
		if x.canRetry() {
			return nil, 0, true, true
		}
		x.w.Header().Set(HeaderRoutedWorker, g.Worker)
		return nil, x.fail(http.StatusBadGateway, "the prefill worker failed: "+resp.Status), true, false
	case resp.StatusCode != http.StatusOK:
		t.Dispatched()
		t.Finish(true)
		x.s.disagg.legErrors.WithLabelValues("prefill", "refused").Inc()
		return nil, x.relayPlain(resp, g.Worker), true, false
	}
	answer, err := io.ReadAll(io.LimitReader(resp.Body, maxPrefillAnswer))
	if err != nil {
		t.Dispatched()
		t.Finish(true)
		if ctx.Err() != nil {
			return nil, statusClientClosed, true, false
		}
		x.s.disagg.legErrors.WithLabelValues("prefill", "unreachable").Inc()
		if x.canRetry() {
			return nil, 0, true, true
		}
		return nil, x.fail(http.StatusBadGateway, "the prefill answer was cut: "+err.Error()), true, false
	}
	x.s.disagg.prefillLeg.Observe(time.Since(start).Seconds())
	x.s.suspects.succeeded(g.Worker)
	params, err = transferParams(answer)
	if err != nil && !errors.Is(err, errNoTransferParams) {
		x.s.disagg.legErrors.WithLabelValues("prefill", "bad_answer").Inc()
	}
	return params, 0, false, false
}

// sglangPrefill starts the SGLang prefill leg beside the decode leg: the
// same body with the bootstrap members (and the legs' data-parallel
// ranks, sglangRanks), whose answer is drained.
func (x *exchange) sglangPrefill(g scheduler.Grant, pw WorkerEntry) {
	host := ""
	if u, err := url.Parse(g.WorkerURL); err == nil {
		host = u.Hostname()
	}
	prefillRank, prefillSize := -1, 0
	if r, ok := x.ranks[g.Worker]; ok && pw.DPSize > 1 {
		prefillRank, prefillSize = r, pw.DPSize
	}
	decodeRank := -1
	if r, ok := x.ranks[g.Decode.Worker]; ok {
		decodeRank = r
	}
	room := alignRoom(rand.Uint64()>>1, prefillRank, prefillSize)
	boot := sglangBootstrap(host, pw.BootstrapPort, room)
	pm, dm := sglangRanks(prefillRank, decodeRank)
	x.pair.extra = append(boot, dm...)
	path, body := x.upstream(g)
	pb, err := withMembers(body, append(boot[:len(boot):len(boot)], pm...))
	if err != nil {
		return
	}
	req, err := http.NewRequestWithContext(x.r.Context(), http.MethodPost, g.WorkerURL+path, bytes.NewReader(pb))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(HeaderRequestID, x.rid)
	x.pinRank(req, g.Worker)
	done := make(chan struct{})
	x.pair.prefillDone = done
	x.pair.prefill = g.Worker
	x.pair.decodeCtx, x.pair.cancelDecode = context.WithCancel(x.r.Context())
	failed := func(kind string) {
		x.s.disagg.legErrors.WithLabelValues("prefill", kind).Inc()
		if x.r.Context().Err() == nil { // not the client leaving
			x.pair.prefillFailed.Store(true)
			x.pair.cancelDecode() // the decode would wait for its room
		}
	}
	go func() { // owned by the exchange: pairDone waits for it
		defer close(done)
		resp, err := x.s.client.Do(req)
		if err != nil {
			failed("unreachable")
			return
		}
		defer resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			failed("server_error")
		}
		_, _ = io.Copy(io.Discard, resp.Body)
	}()
}

// sglangBootstrap is the bootstrap members of both SGLang legs.
func sglangBootstrap(host string, port int, room uint64) []byte {
	b := make([]byte, 0, 96)
	b = append(b, `"bootstrap_host":`...)
	hb, _ := json.Marshal(host)
	b = append(b, hb...)
	b = append(b, `,"bootstrap_port":`...)
	b = strconv.AppendInt(b, int64(port), 10)
	b = append(b, `,"bootstrap_room":`...)
	return strconv.AppendUint(b, room, 10)
}

// maxRoom is the largest bootstrap_room SGLang's gateway draws (2^63−1).
const maxRoom = 1<<63 - 1

// alignRoom makes room ≡ rank (mod size) when the prefill worker is rank
// of a data-parallel server of size ranks (size > 1): an SGLang server
// that does not read routed_dp_rank (its follow_bootstrap_room policy, or
// a version before the field) sends the request to rank room % size, and
// a decode server without disagg_prefill_dp_rank looks for the KV there
// too. Other rooms are returned unchanged.
func alignRoom(room uint64, rank, size int) uint64 {
	if size <= 1 || rank < 0 || rank >= size {
		return room
	}
	s := uint64(size)
	aligned := room - room%s + uint64(rank)
	if aligned > maxRoom {
		aligned -= s
	}
	return aligned
}

// sglangRanks are the data-parallel members of the SGLang legs, as
// SGLang's gateway sets them (sgl-model-gateway's PD router): the prefill
// leg names its rank in routed_dp_rank; the decode leg names its own rank
// in routed_dp_rank and the prefill's, where the KV waits, in
// disagg_prefill_dp_rank. A rank of -1 is a worker that is no rank: its
// members are left out (both are empty for a pair of plain servers).
// Each member starts with a comma: they follow the bootstrap members.
func sglangRanks(prefillRank, decodeRank int) (prefill, decode []byte) {
	if prefillRank >= 0 {
		prefill = strconv.AppendInt(append(prefill, `,"routed_dp_rank":`...), int64(prefillRank), 10)
		decode = strconv.AppendInt(append(decode, `,"disagg_prefill_dp_rank":`...), int64(prefillRank), 10)
	}
	if decodeRank >= 0 {
		decode = strconv.AppendInt(append(decode, `,"routed_dp_rank":`...), int64(decodeRank), 10)
	}
	return prefill, decode
}

// vllmPrefillBody is a vLLM prefill leg's body: body without streaming
// and min_tokens, with one output token and the prefill transfer
// parameters.
func vllmPrefillBody(body []byte) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil || m == nil {
		return nil, errBodyNotObject
	}
	delete(m, "stream_options")
	delete(m, "min_tokens")
	m["stream"] = json.RawMessage("false")
	m["max_tokens"] = json.RawMessage("1")
	m["max_completion_tokens"] = json.RawMessage("1")
	m["kv_transfer_params"] = json.RawMessage(vllmPrefillParams)
	return json.Marshal(m)
}

// transferParams is the top-level kv_transfer_params of a prefill answer,
// exactly as the engine wrote them (nil and errNoTransferParams when
// absent or null).
func transferParams(answer []byte) ([]byte, error) {
	var a struct {
		KV json.RawMessage `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(answer, &a); err != nil {
		return nil, err
	}
	v := bytes.TrimSpace(a.KV)
	if len(v) == 0 || bytes.Equal(v, []byte("null")) {
		return nil, errNoTransferParams
	}
	if v[0] != '{' {
		return nil, errors.New("kv_transfer_params is not an object")
	}
	return a.KV, nil
}

// withMembers appends members (JSON "key":value pairs) to the object
// body, keeping body's bytes; members the body already has are removed
// first, so that no key appears twice.
func withMembers(body, members []byte) ([]byte, error) {
	body = bytes.TrimSpace(body)
	if len(body) < 2 || body[0] != '{' || body[len(body)-1] != '}' {
		return nil, errBodyNotObject
	}
	if keys := memberKeys(members); len(keys) > 0 && containsAnyKey(body, keys) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(body, &m); err != nil {
			return nil, errBodyNotObject
		}
		for _, k := range keys {
			delete(m, k)
		}
		var err error
		if body, err = json.Marshal(m); err != nil {
			return nil, err
		}
	}
	inner := bytes.TrimSpace(body[1 : len(body)-1])
	out := make([]byte, 0, len(body)+len(members)+2)
	out = append(out, '{')
	out = append(out, inner...)
	if len(inner) > 0 {
		out = append(out, ',')
	}
	out = append(out, members...)
	return append(out, '}'), nil
}

// memberKeys are the keys of the members the proxy adds.
func memberKeys(members []byte) []string {
	switch {
	case bytes.HasPrefix(members, []byte(`"kv_transfer_params"`)):
		return []string{"kv_transfer_params"}
	case bytes.HasPrefix(members, []byte(`"bootstrap_host"`)):
		keys := []string{"bootstrap_host", "bootstrap_port", "bootstrap_room"}
		for _, k := range sglangRankKeys {
			if bytes.Contains(members, []byte(`"`+k+`":`)) {
				keys = append(keys, k)
			}
		}
		if slices.Contains(keys, "routed_dp_rank") {
			// SGLang's deprecated name for routed_dp_rank: a client's
			// would contradict the router's rank.
			keys = append(keys, "data_parallel_rank")
		}
		return keys
	}
	return nil
}

// sglangRankKeys are the data-parallel members sglangRanks adds.
var sglangRankKeys = []string{"routed_dp_rank", "disagg_prefill_dp_rank"}

func containsAnyKey(body []byte, keys []string) bool {
	for _, k := range keys {
		if bytes.Contains(body, []byte(`"`+k+`"`)) {
			return true
		}
	}
	return false
}
