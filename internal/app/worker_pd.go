package app

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"go.uber.org/zap"

	"github.com/switchyard/switchyard/wire"
)

// PDConfig is a worker's part in a disaggregated (prefill/decode) fleet and
// how its engine moves KV between the roles, as the real engines do:
//
//   - vLLM (NixlConnector, read in vLLM's nixl_connector.py at commit
//     002a1057): a request with kv_transfer_params.do_remote_decode runs on
//     the prefill engine with one output token; when that token capped the
//     length (not EOS or a stop string) the response carries a top-level
//     kv_transfer_params (do_remote_prefill, remote_engine_id,
//     remote_block_ids, remote_request_id, remote_host, remote_port,
//     tp_size) and the engine keeps the blocks until the decode engine pulls
//     them or a timeout (VLLM_NIXL_ABORT_REQUEST_TIMEOUT) passes. The decode
//     engine given those parameters pulls the KV from remote_host:remote_port
//     and decodes. Here the pull is an HTTP GET of the prefill worker's
//     /v1/kv_transfer/{remote_request_id} (NIXL's side channel is ZeroMQ;
//     the simulated one is the worker's HTTP API).
//   - SGLang (--disaggregation-mode, --disaggregation-bootstrap-port): the
//     router sends the same body with bootstrap_host, bootstrap_port and
//     bootstrap_room to both servers at once; the prefill server serves a
//     bootstrap port, the decode server asks it for the room and decodes once
//     the prefill of that room finished. Here the decode server long-polls
//     the prefill's GET /v1/rooms/{room} on the bootstrap port.
type PDConfig struct {
	// Role is wire.RoleBoth, wire.RolePrefill or wire.RoleDecode.
	Role string
	// KVTransfer is wire.TransferVLLM or wire.TransferSGLang.
	KVTransfer string
	// BootstrapPort is the SGLang prefill's bootstrap port (required for
	// an sglang prefill worker; 0 picks a free one in tests only when
	// BootstrapListen says so).
	BootstrapPort int
	// BootstrapListen is the bootstrap server's listen address; empty is
	// the HTTP listen host with BootstrapPort.
	BootstrapListen string
	// HoldTimeout is how long a prefill keeps a finished request's KV for
	// its decode (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT, 480 s by default;
	// shorter here so a lost decode does not hold simulated memory long).
	HoldTimeout time.Duration
	// PullTimeout bounds a decode's wait for its prefill: the vLLM pull and
	// the SGLang room.
	PullTimeout time.Duration
}

func defaultPDConfig() PDConfig {
	return PDConfig{Role: wire.RoleBoth, KVTransfer: wire.TransferVLLM, HoldTimeout: 60 * time.Second,
		PullTimeout: 30 * time.Second}
}

func (c *PDConfig) registerFlags(fs *flag.FlagSet, prefix string) {
	fs.StringVar(&c.Role, prefix+"role", c.Role, "disaggregation role: prefill, decode or both")
	fs.StringVar(&c.KVTransfer, prefix+"kv-transfer", c.KVTransfer, "KV transfer protocol of a prefill or decode worker: vllm (kv_transfer_params in two legs) or sglang (bootstrap fields to both servers)")
	fs.IntVar(&c.BootstrapPort, prefix+"bootstrap-port", c.BootstrapPort, "sglang prefill: port of the bootstrap server decode servers ask for their rooms (SGLang's --disaggregation-bootstrap-port)")
	fs.StringVar(&c.BootstrapListen, prefix+"bootstrap-listen", c.BootstrapListen, "sglang prefill: bootstrap listen address (default: the -listen host with -bootstrap-port)")
	fs.DurationVar(&c.HoldTimeout, prefix+"kv-hold-timeout", c.HoldTimeout, "prefill: how long a finished request's KV waits for its decode to pull it")
	fs.DurationVar(&c.PullTimeout, prefix+"kv-pull-timeout", c.PullTimeout, "decode: how long to wait for the prefill's KV (vLLM pull, SGLang room)")
}

// Validate names the first bad field.
func (c *PDConfig) Validate() error {
	switch {
	case c.Role != wire.RoleBoth && c.Role != wire.RolePrefill && c.Role != wire.RoleDecode:
		return fmt.Errorf("worker config: Role %q must be prefill, decode or both", c.Role)
	case c.KVTransfer != wire.TransferVLLM && c.KVTransfer != wire.TransferSGLang:
		return fmt.Errorf("worker config: KVTransfer %q must be vllm or sglang", c.KVTransfer)
	case c.BootstrapPort < 0 || c.BootstrapPort > 65535:
		return fmt.Errorf("worker config: BootstrapPort %d must be in [0, 65535]", c.BootstrapPort)
	case c.sglangPrefill() && c.BootstrapPort == 0 && c.BootstrapListen == "":
		return errors.New("worker config: an sglang prefill worker needs -bootstrap-port")
	case c.HoldTimeout <= 0:
		return fmt.Errorf("worker config: HoldTimeout %v must be positive", c.HoldTimeout)
	case c.PullTimeout <= 0:
		return fmt.Errorf("worker config: PullTimeout %v must be positive", c.PullTimeout)
	}
	return nil
}

func (c *PDConfig) sglangPrefill() bool {
	return c.Role == wire.RolePrefill && c.KVTransfer == wire.TransferSGLang
}

// kvTransferParams is vLLM's kv_transfer_params as the NixlConnector reads
// and writes them. Unknown keys are ignored on input (versions add keys).
type kvTransferParams struct {
	DoRemoteDecode  bool    `json:"do_remote_decode"`
	DoRemotePrefill bool    `json:"do_remote_prefill"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	RemoteRequestID *string `json:"remote_request_id"`
	TPSize          int     `json:"tp_size,omitempty"`
}

// sglangBootstrap is SGLang's bootstrap fields of a disaggregated request.
type sglangBootstrap struct {
	Host string
	Port int
	Room uint64
}

// pdRequest is the disaggregation part of a request, parsed with the rest
// (parseGenRequest).
type pdRequest struct {
	KV        *kvTransferParams
	Bootstrap *sglangBootstrap
}

// parsePD validates the disaggregation fields of a request body.
func parsePD(raw *rawGenRequest) (*pdRequest, *workerAPIError) {
	var pd pdRequest
	if len(raw.KVTransferParams) > 0 && !bytes.Equal(bytes.TrimSpace(raw.KVTransferParams), []byte("null")) {
		var p kvTransferParams
		if err := json.Unmarshal(raw.KVTransferParams, &p); err != nil {
			return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params", "kv_transfer_params is malformed: "+err.Error())
		}
		if p.DoRemoteDecode && p.DoRemotePrefill {
			return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params", "do_remote_decode and do_remote_prefill are exclusive")
		}
		if p.DoRemoteDecode || p.DoRemotePrefill {
			pd.KV = &p
		}
	}
	if raw.BootstrapRoom != nil || raw.BootstrapHost != nil || raw.BootstrapPort != nil {
		switch {
		case raw.BootstrapRoom == nil || raw.BootstrapHost == nil || raw.BootstrapPort == nil:
			return nil, workerBadRequest("bootstrap_room", "invalid_bootstrap", "bootstrap_host, bootstrap_port and bootstrap_room come together")
		case *raw.BootstrapRoom > 1<<63-1:
			return nil, workerBadRequest("bootstrap_room", "invalid_bootstrap", "bootstrap_room must be in [0, 2^63-1]")
		case *raw.BootstrapPort < 1 || *raw.BootstrapPort > 65535:
			return nil, workerBadRequest("bootstrap_port", "invalid_bootstrap", "bootstrap_port must be a port")
		case *raw.BootstrapHost == "":
			return nil, workerBadRequest("bootstrap_host", "invalid_bootstrap", "bootstrap_host must not be empty")
		}
		pd.Bootstrap = &sglangBootstrap{Host: *raw.BootstrapHost, Port: int(*raw.BootstrapPort), Room: *raw.BootstrapRoom}
	}
	if pd.KV != nil && pd.Bootstrap != nil {
		return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params", "kv_transfer_params and bootstrap fields are exclusive")
	}
	if pd.KV == nil && pd.Bootstrap == nil {
		return nil, nil
	}
	return &pd, nil
}

// heldKV is what a prefill keeps of a finished request for its decode: the
// prompt (as block hashes, which the engine's transfer moves) until the
// decode pulls it or the hold expires.
type heldKV struct {
	EngineID     string `json:"engine_id"`
	RequestID    string `json:"request_id"`
	PromptTokens int    `json:"prompt_tokens"`
	BlockSize    int    `json:"block_size"`
	// NumBlocks counts the prompt's blocks, the last one partial
	// (remote_block_ids); Blocks are the full blocks' hashes.
	NumBlocks int      `json:"num_blocks"`
	Blocks    []uint64 `json:"blocks"`
	expires   time.Time
}

// kvHolds is a prefill's held KV by request id (vLLM) or room (SGLang).
// Expired entries go lazily, on the next put or take: no goroutine.
// A room taker that arrives before its prefill finished waits on ready.
type kvHolds struct {
	mu    sync.Mutex
	held  map[string]*heldKV
	ready map[string]chan struct{} // closed when held[key] appears
	now   func() time.Time
}

func newKVHolds(now func() time.Time) *kvHolds {
	return &kvHolds{held: map[string]*heldKV{}, ready: map[string]chan struct{}{}, now: now}
}

func (h *kvHolds) sweep(now time.Time) {
	for k, v := range h.held {
		if now.After(v.expires) {
			delete(h.held, k)
		}
	}
}

func (h *kvHolds) put(key string, kv *heldKV) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.now()
	h.sweep(now)
	h.held[key] = kv
	if c, ok := h.ready[key]; ok {
		close(c)
		delete(h.ready, key)
	}
}

// take removes and returns key's KV, waiting for it up to ctx's end when
// wait is set. Nil when there is none (or it expired).
func (h *kvHolds) take(ctx context.Context, key string, wait bool) *heldKV {
	for {
		h.mu.Lock()
		h.sweep(h.now())
		if kv, ok := h.held[key]; ok {
			delete(h.held, key)
			h.mu.Unlock()
			return kv
		}
		if !wait {
			h.mu.Unlock()
			return nil
		}
		c, ok := h.ready[key]
		if !ok {
			c = make(chan struct{})
			h.ready[key] = c
		}
		h.mu.Unlock()
		select {
		case <-c:
		case <-ctx.Done():
			h.mu.Lock()
			if h.ready[key] == c {
				delete(h.ready, key) // a later put finds no waiter and just holds
			}
			h.mu.Unlock()
			return nil
		}
	}
}

// The outcomes of switchyard_worker_kv_transfers_total.
const (
	kvHeld        = "held"        // a prefill answered with parameters and holds the KV
	kvNoParams    = "no_params"   // a prefill's one token ended the sequence: no parameters
	kvPulled      = "pulled"      // a decode received its KV
	kvServed      = "served"      // a prefill handed its KV to a decode
	kvMalformed   = "malformed"   // parameters a decode cannot use
	kvUnreachable = "unreachable" // the prefill named could not be reached
	kvMissing     = "missing"     // the prefill had no such KV (expired, restarted, pulled)
	kvTimeout     = "timeout"     // an SGLang room never came
	kvWrongRole   = "wrong_role"  // the request asks this worker for a role it does not have
)

// pdEngineID names this engine start in kv_transfer_params: a restarted
// worker is another engine, and its predecessor's parameters no longer pull.
func (w *worker) pdEngineID() string {
	return fmt.Sprintf("%s-%016x", w.cfg.ID, w.eng.Instance())
}

// canPrefill and canDecode say whether the worker takes the protocol's leg.
func (w *worker) canPrefill(proto string) bool {
	return w.cfg.PD.KVTransfer == proto && w.cfg.PD.Role != wire.RoleDecode
}

func (w *worker) canDecode(proto string) bool {
	return w.cfg.PD.KVTransfer == proto && w.cfg.PD.Role != wire.RolePrefill
}

// pdPrepare checks a disaggregated request against the worker's role, shapes
// its engine request (a prefill leg runs one token) and, for a decode leg,
// fetches the prefill's KV. It returns the fetched KV (nil for a prefill leg)
// or an error to answer with.
func (w *worker) pdPrepare(r *http.Request, req *genRequest) (*heldKV, *workerAPIError) {
	pd := req.PD
	count := func(o string) { w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, o).Inc() }
	wrong := func(msg string) *workerAPIError {
		count(kvWrongRole)
		return workerBadRequest("kv_transfer_params", "kv_transfer_unsupported", msg)
	}
	switch {
	case pd.KV != nil && pd.KV.DoRemoteDecode:
		if !w.canPrefill(wire.TransferVLLM) {
			return nil, wrong(fmt.Sprintf("this worker (role %s, kv transfer %s) does not prefill for a remote decode", w.cfg.PD.Role, w.cfg.PD.KVTransfer))
		}
		if req.Stream || len(req.Prompts) != 1 || req.N != 1 {
			count(kvMalformed)
			return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params", "a prefill for a remote decode takes one prompt, n=1 and stream=false")
		}
		return nil, nil
	case pd.KV != nil:
		if !w.canDecode(wire.TransferVLLM) {
			return nil, wrong(fmt.Sprintf("this worker (role %s, kv transfer %s) does not decode a remote prefill", w.cfg.PD.Role, w.cfg.PD.KVTransfer))
		}
		return w.pullVLLM(r, req)
	default:
		b := pd.Bootstrap
		if w.cfg.PD.KVTransfer != wire.TransferSGLang || w.cfg.PD.Role == wire.RoleBoth {
			return nil, wrong(fmt.Sprintf("this worker (role %s, kv transfer %s) takes no bootstrap fields", w.cfg.PD.Role, w.cfg.PD.KVTransfer))
		}
		if len(req.Prompts) != 1 || req.N != 1 {
			count(kvMalformed)
			return nil, workerBadRequest("bootstrap_room", "invalid_bootstrap", "a disaggregated request takes one prompt and n=1")
		}
		if w.cfg.PD.Role == wire.RolePrefill {
			return nil, nil
		}
		return w.pullSGLang(r, req, b)
	}
}

// pullVLLM pulls a vLLM prefill's KV named by kv_transfer_params.
func (w *worker) pullVLLM(r *http.Request, req *genRequest) (*heldKV, *workerAPIError) {
	p := req.PD.KV
	count := func(o string) { w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, o).Inc() }
	if p.RemoteEngineID == nil || p.RemoteRequestID == nil || p.RemoteHost == nil || p.RemotePort == nil ||
		len(p.RemoteBlockIDs) == 0 || *p.RemotePort < 1 || *p.RemotePort > 65535 || *p.RemoteHost == "" {
		count(kvMalformed)
		return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params",
			"do_remote_prefill needs remote_engine_id, remote_request_id, remote_host, remote_port and remote_block_ids")
	}
	u := (&url.URL{Scheme: "http", Host: net.JoinHostPort(*p.RemoteHost, strconv.Itoa(*p.RemotePort)),
		Path: "/v1/kv_transfer/" + url.PathEscape(*p.RemoteRequestID), RawQuery: url.Values{"engine_id": {*p.RemoteEngineID}}.Encode()}).String()
	kv, apiErr := w.fetchKV(r.Context(), u, w.cfg.PD.PullTimeout)
	if apiErr != nil {
		return nil, apiErr
	}
	if kv.EngineID != *p.RemoteEngineID || kv.NumBlocks != len(p.RemoteBlockIDs) {
		count(kvMalformed)
		return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params",
			fmt.Sprintf("the prefill's KV (engine %s, %d blocks) does not match the parameters (engine %s, %d blocks)",
				kv.EngineID, kv.NumBlocks, *p.RemoteEngineID, len(p.RemoteBlockIDs)))
	}
	return w.checkPulled(req, kv)
}

// pullSGLang waits for the prefill of the request's room.
func (w *worker) pullSGLang(r *http.Request, req *genRequest, b *sglangBootstrap) (*heldKV, *workerAPIError) {
	wait := w.cfg.PD.PullTimeout
	u := (&url.URL{Scheme: "http", Host: net.JoinHostPort(b.Host, strconv.Itoa(b.Port)),
		Path: "/v1/rooms/" + strconv.FormatUint(b.Room, 10), RawQuery: url.Values{"wait": {wait.String()}}.Encode()}).String()
	kv, apiErr := w.fetchKV(r.Context(), u, wait+5*time.Second)
	if apiErr != nil {
		return nil, apiErr
	}
	return w.checkPulled(req, kv)
}

// checkPulled checks the KV is this request's prompt.
func (w *worker) checkPulled(req *genRequest, kv *heldKV) (*heldKV, *workerAPIError) {
	if kv.PromptTokens != len(req.Prompts[0]) || kv.BlockSize != w.cfg.Engine.BlockSize {
		w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvMalformed).Inc()
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_mismatch",
			fmt.Sprintf("the prefill's KV is %d tokens in blocks of %d; this request's prompt is %d tokens in blocks of %d",
				kv.PromptTokens, kv.BlockSize, len(req.Prompts[0]), w.cfg.Engine.BlockSize))
	}
	w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvPulled).Inc()
	return kv, nil
}

// fetchKV GETs a prefill's held KV.
func (w *worker) fetchKV(ctx context.Context, u string, timeout time.Duration) (*heldKV, *workerAPIError) {
	count := func(o string) { w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, o).Inc() }
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hr, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		count(kvMalformed)
		return nil, workerBadRequest("kv_transfer_params", "invalid_kv_transfer_params", "the prefill's address is malformed: "+err.Error())
	}
	resp, err := w.pdClient.Do(hr)
	if err != nil {
		count(kvUnreachable)
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_unreachable", "cannot reach the prefill engine: "+err.Error())
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	switch {
	case err != nil:
		count(kvUnreachable)
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_unreachable", "reading the prefill's KV: "+err.Error())
	case resp.StatusCode == http.StatusRequestTimeout:
		count(kvTimeout)
		return nil, &workerAPIError{Status: http.StatusGatewayTimeout, Type: "server_error", Code: "kv_transfer_timeout",
			Message: "the prefill of this bootstrap room did not finish in time"}
	case resp.StatusCode == http.StatusNotFound:
		count(kvMissing)
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_missing", "the prefill engine holds no such KV (expired, pulled already, or the engine restarted)")
	case resp.StatusCode != http.StatusOK:
		count(kvUnreachable)
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_unreachable", fmt.Sprintf("the prefill engine answered %d", resp.StatusCode))
	}
	var kv heldKV
	if err := json.Unmarshal(body, &kv); err != nil {
		count(kvMalformed)
		return nil, workerBadRequest("kv_transfer_params", "kv_transfer_unreachable", "the prefill's KV is malformed: "+err.Error())
	}
	return &kv, nil
}

// pdHold records a finished prefill's KV for its decode. It returns the
// kv_transfer_params to answer with (vLLM), or nil when the sequence ended
// on its one token (vLLM returns no parameters then: the request is done).
func (w *worker) pdHold(req *genRequest, id string, finish string, hashes []uint64) json.RawMessage {
	pd := req.PD
	if pd == nil || (pd.KV == nil || !pd.KV.DoRemoteDecode) && (pd.Bootstrap == nil || w.cfg.PD.Role != wire.RolePrefill) {
		return nil
	}
	kv := &heldKV{EngineID: w.pdEngineID(), RequestID: id, PromptTokens: len(req.Prompts[0]),
		BlockSize: w.cfg.Engine.BlockSize, Blocks: hashes,
		NumBlocks: (len(req.Prompts[0]) + w.cfg.Engine.BlockSize - 1) / w.cfg.Engine.BlockSize, expires: w.now().Add(w.cfg.PD.HoldTimeout)}
	if pd.Bootstrap != nil {
		// SGLang's prefill transfers whatever ended the sequence: its decode
		// waits for the room either way.
		w.holds.put(roomKey(pd.Bootstrap.Room), kv)
		return nil
	}
	if finish != "length" {
		w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvNoParams).Inc()
		return nil
	}
	w.holds.put(id, kv)
	w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvHeld).Inc()
	host, port := w.sideChannel()
	ids := make([]int64, kv.NumBlocks)
	for i := range ids {
		ids[i] = int64(i)
	}
	b, _ := json.Marshal(map[string]any{ // our own types always encode
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": ids, "remote_engine_id": kv.EngineID, "remote_request_id": id,
		"remote_host": host, "remote_port": port, "tp_size": 1,
	})
	return b
}

func roomKey(room uint64) string { return "room/" + strconv.FormatUint(room, 10) }

// sideChannel is the host and port decodes pull from: the worker's
// advertised HTTP address.
func (w *worker) sideChannel() (string, int) {
	u, err := url.Parse(w.url)
	if err != nil {
		return "", 0
	}
	port, _ := strconv.Atoi(u.Port())
	return u.Hostname(), port
}

// handleKVPull serves a vLLM decode's pull: GET
// /v1/kv_transfer/{request_id}?engine_id=..., once.
func (w *worker) handleKVPull(rw http.ResponseWriter, r *http.Request) {
	if eid := r.URL.Query().Get("engine_id"); eid != w.pdEngineID() {
		writeWorkerError(rw, &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "kv_transfer_missing",
			Message: fmt.Sprintf("engine %q is not this engine (%s)", eid, w.pdEngineID())})
		return
	}
	kv := w.holds.take(r.Context(), r.PathValue("id"), false)
	if kv == nil {
		writeWorkerError(rw, &workerAPIError{Status: http.StatusNotFound, Type: "invalid_request_error", Code: "kv_transfer_missing",
			Message: "no KV held for this request"})
		return
	}
	w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvServed).Inc()
	writeWorkerJSON(rw, http.StatusOK, kv)
}

// bootstrapRoutes is the SGLang prefill's bootstrap server: GET
// /v1/rooms/{room}?wait=DURATION answers the room's KV once its prefill
// finished (408 when it does not within wait, at most the pull timeout).
func (w *worker) bootstrapRoutes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/rooms/{room}", func(rw http.ResponseWriter, r *http.Request) {
		room, err := strconv.ParseUint(r.PathValue("room"), 10, 63)
		if err != nil {
			writeWorkerError(rw, workerBadRequest("room", "invalid_bootstrap", "the room must be an integer in [0, 2^63-1]"))
			return
		}
		wait := w.cfg.PD.PullTimeout
		if s := r.URL.Query().Get("wait"); s != "" {
			if d, err := time.ParseDuration(s); err == nil && d >= 0 && d < wait {
				wait = d
			}
		}
		ctx, cancel := context.WithTimeout(r.Context(), wait)
		defer cancel()
		kv := w.holds.take(ctx, roomKey(room), true)
		if kv == nil {
			writeWorkerError(rw, &workerAPIError{Status: http.StatusRequestTimeout, Type: "server_error", Code: "kv_transfer_timeout",
				Message: fmt.Sprintf("room %d did not finish its prefill within %v", room, wait)})
			return
		}
		w.metrics.kvTransfers.WithLabelValues(w.cfg.PD.Role, kvServed).Inc()
		writeWorkerJSON(rw, http.StatusOK, kv)
	})
	mux.HandleFunc("GET /health", func(rw http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(rw, "ok\n") })
	return mux
}

// serveBootstrap runs the SGLang prefill's bootstrap server until ctx ends.
// It returns once the listener is bound (the server runs on wg).
func (w *worker) serveBootstrap(ctx context.Context, wg *sync.WaitGroup) (string, error) {
	addr := w.cfg.PD.BootstrapListen
	if addr == "" {
		host, _, err := net.SplitHostPort(w.cfg.Listen)
		if err != nil {
			return "", fmt.Errorf("bootstrap listen: %w", err)
		}
		addr = net.JoinHostPort(host, strconv.Itoa(w.cfg.PD.BootstrapPort))
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("bootstrap listen %s: %w", addr, err)
	}
	srv := &http.Server{Handler: w.bootstrapRoutes(), ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: zap.NewStdLog(w.log.Named("bootstrap"))}
	wg.Add(2)
	go func() {
		defer wg.Done()
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			w.log.Warn("bootstrap server stopped", zap.Error(err))
		}
	}()
	go func() {
		defer wg.Done()
		<-ctx.Done()
		_ = srv.Close() // long polls end with their clients' contexts
	}()
	return ln.Addr().String(), nil
}

// bootstrapPort is the bound bootstrap port (the configured one, or the one
// the system picked for a test's :0).
func (w *worker) bootstrapPort() int {
	_, p, err := net.SplitHostPort(w.bootstrapAddr)
	if err != nil {
		return w.cfg.PD.BootstrapPort
	}
	n, _ := strconv.Atoi(p)
	return n
}
