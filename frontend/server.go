package frontend

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// Deps are the ports the frontend consumes. Admitter and Workers are
// required; the rest have documented fallbacks.
type Deps struct {
	Admitter Admitter
	Workers  WorkerView
	// Index gives prefix overlaps; nil routes without cache knowledge.
	Index PrefixIndex
	// Prompts tokenizes prompts; nil is a prompt.Registry with no
	// tokenizers (every prompt is hashed approximately).
	Prompts Prompts
	// Policy is the initial policy; nil means DefaultPolicy(). SetPolicy
	// replaces it at run time.
	Policy *Policy
	// Ready gates /readyz and the API; nil means always ready.
	Ready ReadyFunc
	// Draining, when set and true, fails /readyz (503) while the API keeps
	// serving: a replica in lame duck asks its load balancer to stop
	// sending while it still serves what arrives meanwhile.
	Draining func() bool
	// ReadyDetail, if set, adds lines to a ready /readyz answer about how
	// the replica serves (e.g. degraded mode); nil or empty adds none.
	ReadyDetail func() []string
	// ClusterInfo serves /debug/cluster; nil answers 404.
	ClusterInfo ClusterInfoFunc
	// MetricsHandler serves /metrics; nil answers 404.
	MetricsHandler http.Handler
	// AdminPages are further admin routes (ServeMux pattern → handler):
	// the operators' page's /debug/tier (opspage), behind the admin gate.
	AdminPages map[string]http.Handler
	// AdminShell are static routes served where the admin routes are but
	// without a key (HandleAdminShell): the page's HTML and assets.
	AdminShell map[string]http.Handler
	// Metrics are the request-level metrics; nil builds them on the
	// Registerer passed to New.
	Metrics *metrics.Router
	// Now is the clock (ingress times, deadlines, latencies); nil = time.Now.
	Now func() time.Time
	// TLSMetrics counts reloads of the listeners' and engine client's TLS
	// files; nil counts nothing.
	TLSMetrics *tlsconf.Metrics
	// Tenants authenticates API keys (auth.go); nil leaves the API open.
	Tenants Tenants
	// Suspects shares worker suspicion after consecutive first-byte
	// timeouts (hung.go); nil keeps the count local and marks nothing.
	Suspects Suspects
	// Sessions is the session → worker table (session.go); nil builds one
	// from Config.SessionTTL and MaxSessions, local to this Server.
	Sessions *scheduler.SessionTable
	// SessionShare gossips the sessions this replica routes; nil keeps
	// them local.
	SessionShare SessionShare
	// Admins authenticates the admin keys that open /metrics and /debug/*
	// on the API listener when keys are configured (admin.go); nil: no key
	// opens them there.
	Admins Admins
}

// Server is the OpenAI HTTP API of one router replica.
type Server struct {
	cfg     Config
	deps    Deps
	log     *zap.Logger
	m       *metrics.Router
	now     func() time.Time
	policy  atomic.Pointer[Policy]
	client  *http.Client
	tr      *http.Transport
	mux     *http.ServeMux
	idBase  string
	idSeq   atomic.Uint64
	closing atomic.Bool
	srv     atomic.Pointer[http.Server] // the one Serve runs, for CloseKeepAlives
	// graceEnd (unix nanos, 0: unset) ends Serve's shutdown grace early:
	// ShutdownBy.
	graceEnd atomic.Int64
	lis      listeners // listen.go: the admin routes and the listeners' TLS
	// inflight counts running handlers so Serve can wait for all of them;
	// once stopped is set no handler starts (a request that slipped past the
	// closed listener is refused).
	inflightMu sync.Mutex
	inflight   int
	stopped    bool
	idle       *sync.Cond
	auth       *authMetrics // with Deps.Tenants only
	hung       *hungMetrics
	suspects   *suspicion
	quality    qualityLog   // routing decisions (quality.go)
	bodies     *bodyMetrics // keys.go: bodies refused as ambiguous
	// sessions is Deps.Sessions or a local table (session.go).
	sessions       *scheduler.SessionTable
	sessionMetrics *sessionMetrics
	disagg         *disaggMetrics
	messages       *messagesMetrics // messages.go: Anthropic's Messages API
}

// New builds a Server. It starts nothing: Serve or Run do.
func New(cfg Config, deps Deps, log *zap.Logger, reg prometheus.Registerer) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Admitter == nil || deps.Workers == nil {
		return nil, errors.New("frontend: Deps.Admitter and Deps.Workers are required")
	}
	if deps.Prompts == nil {
		reg, err := prompt.NewRegistry(prompt.DefaultConfig(), prompt.Deps{}, log, nil)
		if err != nil {
			return nil, fmt.Errorf("frontend: prompt registry: %w", err)
		}
		deps.Prompts = reg
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	m := deps.Metrics
	if m == nil {
		m = metrics.NewRouter(reg)
	}
	var seed [6]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, fmt.Errorf("frontend: request id seed: %w", err)
	}
	tr := &http.Transport{
		Proxy:                 nil, // workers are reached directly, never through an env proxy
		DialContext:           (&net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   cfg.MaxIdleConnsPerWorker,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bytes through; SSE must not be buffered by gzip
		ExpectContinueTimeout: 0,
		// A request goes out through this buffer: at the default 4 kB a
		// 4k-token chat's 18 kB body took five writes to the socket, with
		// 32 kB it takes one (bodies up to about 8k tokens).
		WriteBufferSize: 32 << 10,
	}
	s := &Server{
		cfg: cfg, deps: deps, log: log.Named("frontend"), m: m, now: deps.Now,
		tr: tr, client: &http.Client{Transport: tr},
		idBase: hex.EncodeToString(seed[:]),
	}
	if err := s.buildTLS(); err != nil {
		return nil, fmt.Errorf("frontend: %w", err)
	}
	p := deps.Policy
	if p == nil {
		p = DefaultPolicy()
	}
	s.policy.Store(p)
	s.idle = sync.NewCond(&s.inflightMu)
	if deps.Tenants != nil {
		s.auth = newAuthMetrics(reg)
	}
	s.hung = newHungMetrics(reg)
	s.suspects = &suspicion{after: cfg.SuspectAfter, port: deps.Suspects}
	s.bodies = newBodyMetrics(reg)
	s.sessions = deps.Sessions
	if s.sessions == nil {
		s.sessions = scheduler.NewSessionTable(cfg.MaxSessions, cfg.SessionTTL)
	}
	s.sessionMetrics = newSessionMetrics(reg, s.sessions)
	s.disagg = newDisaggMetrics(reg)
	s.messages = newMessagesMetrics(reg)
	s.mux = http.NewServeMux()
	s.mux.HandleFunc("POST /v1/chat/completions", s.instrument(metrics.RouteChatCompletions, func(w http.ResponseWriter, r *http.Request) int {
		return s.handleCompletion(w, r, endpointChat)
	}))
	s.mux.HandleFunc("POST /v1/completions", s.instrument(metrics.RouteCompletions, func(w http.ResponseWriter, r *http.Request) int {
		return s.handleCompletion(w, r, endpointCompletions)
	}))
	s.mux.HandleFunc("POST /v1/embeddings", s.instrument(metrics.RouteEmbeddings, func(w http.ResponseWriter, r *http.Request) int {
		return s.handleCompletion(w, r, endpointEmbeddings)
	}))
	s.mux.HandleFunc("POST /v1/responses", s.instrument(metrics.RouteResponses, func(w http.ResponseWriter, r *http.Request) int {
		return s.handleCompletion(w, r, endpointResponses)
	}))
	s.mux.HandleFunc("POST /v1/messages", s.handleMessagesRoute(metrics.RouteMessages, func(w http.ResponseWriter, r *http.Request) int {
		return s.handleCompletion(w, r, endpointMessages)
	}))
	s.mux.HandleFunc("POST /v1/messages/count_tokens", s.handleMessagesRoute(metrics.RouteMessagesCountTokens, s.handleCountTokens))
	s.mux.HandleFunc("/v1/messages", s.handleMessagesRoute(metrics.RouteOther, s.handleUnknown))
	s.mux.HandleFunc("/v1/messages/count_tokens", s.handleMessagesRoute(metrics.RouteOther, s.handleUnknown))
	s.mux.HandleFunc("GET /v1/models", s.instrument(metrics.RouteModels, s.handleModels))
	s.mux.HandleFunc("GET /healthz", s.instrument(metrics.RouteHealthz, s.handleHealthz))
	s.mux.HandleFunc("GET /readyz", s.instrument(metrics.RouteReadyz, s.handleReadyz))
	s.initListeners(reg) // listen.go: the admin routes' place, the API's bounds
	s.HandleAdmin("GET /debug/cluster", s.instrument(metrics.RouteDebugCluster, s.handleDebugCluster))
	if deps.MetricsHandler != nil {
		s.HandleAdmin("GET /metrics", deps.MetricsHandler)
	}
	for pattern, h := range deps.AdminPages {
		s.HandleAdmin(pattern, h)
	}
	for pattern, h := range deps.AdminShell {
		s.HandleAdminShell(pattern, h)
	}
	// Everything else gets an OpenAI-shaped 404 or 405, so clients that parse
	// error bodies never see net/http's plain-text ones.
	s.mux.HandleFunc("/", s.instrument(metrics.RouteOther, s.handleUnknown))
	return s, nil
}

// SetPolicy replaces the policy used for classification; requests already
// classified keep their class.
func (s *Server) SetPolicy(p *Policy) { s.policy.Store(p) }

// Policy returns the current policy.
func (s *Server) Policy() *Policy { return s.policy.Load() }

// Handler returns the HTTP handler of the API. Serve and Run use it; tests may
// mount it on their own server, then call CloseIdleConnections when done.
func (s *Server) Handler() http.Handler { return s.mux }

// CloseIdleConnections closes the keep-alive connections to workers.
func (s *Server) CloseIdleConnections() { s.tr.CloseIdleConnections() }

// Run listens on Config.Addr and serves until ctx ends (see Serve).
func (s *Server) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.cfg.Addr)
	if err != nil {
		return fmt.Errorf("frontend: listen %s: %w", s.cfg.Addr, err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves the API on ln (over TLS with Config.TLS, at most
// Config.MaxConns connections at once) until ctx ends, then shuts down gracefully: it
// stops accepting, lets in-flight requests and streams finish for up to
// Config.ShutdownGrace (or until ShutdownBy's time, if earlier), then cuts the rest (their clients see the stream end
// and their tickets are finished as aborted). It returns only after every
// handler has returned and the worker connections are closed.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	srv := s.httpServer(s.lis.bounds.bounded(s.mux), "http")
	s.srv.Store(srv)
	errc := make(chan error, 1) // size one: Serve's single result, read below
	go func() { errc <- srv.Serve(wrapListener(ln, s.cfg.MaxConns, s.lis.apiTLS)) }()
	var err error
	select {
	case err = <-errc:
		// The listener failed on its own: cut the open connections too.
		s.closing.Store(true)
		_ = srv.Close()
	case <-ctx.Done():
		s.closing.Store(true)
		end := time.Now().Add(s.cfg.ShutdownGrace)
		if by := s.graceEnd.Load(); by != 0 && by < end.UnixNano() {
			end = time.Unix(0, by)
		}
		graceCtx, cancel := context.WithDeadline(context.WithoutCancel(ctx), end)
		if shutErr := srv.Shutdown(graceCtx); shutErr != nil {
			s.log.Warn("grace period over, cutting in-flight streams", zap.Duration("grace", s.cfg.ShutdownGrace), zap.Time("grace_end", end))
			_ = srv.Close()
		}
		cancel()
		err = <-errc
	}
	s.inflightMu.Lock()
	s.stopped = true
	for s.inflight > 0 {
		s.idle.Wait()
	}
	s.inflightMu.Unlock()
	s.tr.CloseIdleConnections()
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// ShutdownBy ends the shutdown grace of Serve at t at the latest, so a
// caller that has already waited for in-flight requests (the router's lame
// duck, WaitIdle) does not make a stop wait a whole ShutdownGrace twice.
func (s *Server) ShutdownBy(t time.Time) { s.graceEnd.Store(t.UnixNano()) }

// CloseKeepAlives makes every response from now on close its connection
// and closes the idle ones, so clients stop reusing connections to a server
// that is about to stop listening (a request written on an idle connection
// just as Shutdown closes it is lost to its client with no answer). A no-op
// before Serve.
func (s *Server) CloseKeepAlives() {
	if srv := s.srv.Load(); srv != nil {
		srv.SetKeepAlivesEnabled(false)
	}
}

// WaitIdle waits until no instrumented handler (the API, /readyz, /healthz,
// /debug/cluster; not /metrics) is running, or ctx ends (its error). With
// Ready failing, new API requests are answered at once, so this waits for
// the streams and admissions already in flight.
func (s *Server) WaitIdle(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() {
		s.inflightMu.Lock()
		s.idle.Broadcast()
		s.inflightMu.Unlock()
	})
	defer stop()
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	for s.inflight > 0 {
		if err := ctx.Err(); err != nil {
			return err
		}
		s.idle.Wait()
	}
	return nil
}

// instrument counts responses by route and code and tracks in-flight
// handlers for Serve.
func (s *Server) instrument(route string, h func(http.ResponseWriter, *http.Request) int) http.HandlerFunc {
	var codes sync.Map // status code → its counter, resolved once per route and code
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.enter() {
			e := &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "shutting_down",
				Message: "the router is shutting down", err: ErrShuttingDown}
			e.write(w)
			return
		}
		defer s.leave()
		code := h(w, r)
		c, ok := codes.Load(code)
		if !ok {
			c, _ = codes.LoadOrStore(code, s.m.HTTPResponses.WithLabelValues(route, strconv.Itoa(code)))
		}
		c.(prometheus.Counter).Inc()
	}
}

func (s *Server) enter() bool {
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if s.stopped {
		return false
	}
	s.inflight++
	return true
}

func (s *Server) leave() {
	s.inflightMu.Lock()
	defer s.inflightMu.Unlock()
	if s.inflight--; s.inflight == 0 {
		s.idle.Broadcast()
	}
}

func (s *Server) handleUnknown(w http.ResponseWriter, r *http.Request) int {
	allow := ""
	switch r.URL.Path {
	case endpointChat.path(), endpointCompletions.path(), endpointEmbeddings.path(), endpointResponses.path(),
		endpointMessages.path(), "/v1/messages/count_tokens":
		allow = http.MethodPost
	case "/v1/models", "/healthz", "/readyz", "/debug/cluster", "/metrics":
		allow = http.MethodGet
	}
	e := &APIError{Status: http.StatusNotFound, Type: typeInvalidRequest, Code: "not_found",
		Message: fmt.Sprintf("unknown path %s", r.URL.Path), err: ErrBadRequest}
	if allow != "" && r.Method != allow {
		w.Header().Set("Allow", allow)
		e = &APIError{Status: http.StatusMethodNotAllowed, Type: typeInvalidRequest, Code: "method_not_allowed",
			Message: fmt.Sprintf("%s %s is not supported; use %s", r.Method, r.URL.Path, allow), err: ErrBadRequest}
	}
	e.write(w)
	return e.Status
}

func (s *Server) handleHealthz(w http.ResponseWriter, _ *http.Request) int {
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ok\n")
	return http.StatusOK
}

func (s *Server) ready() error {
	if s.closing.Load() {
		return ErrShuttingDown
	}
	if s.deps.Ready == nil {
		return nil
	}
	return s.deps.Ready()
}

func (s *Server) handleReadyz(w http.ResponseWriter, _ *http.Request) int {
	w.Header().Set("Content-Type", "text/plain")
	err := s.ready()
	if err == nil && s.deps.Draining != nil && s.deps.Draining() {
		err = errors.New("draining: the router is shutting down and serves only what still reaches it")
	}
	if err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, "not ready: "+err.Error()+"\n")
		return http.StatusServiceUnavailable
	}
	_, _ = io.WriteString(w, "ok\n")
	if s.deps.ReadyDetail != nil {
		for _, line := range s.deps.ReadyDetail() {
			_, _ = io.WriteString(w, line+"\n")
		}
	}
	return http.StatusOK
}

func (s *Server) handleDebugCluster(w http.ResponseWriter, r *http.Request) int {
	if s.deps.ClusterInfo == nil {
		http.NotFound(w, r)
		return http.StatusNotFound
	}
	doc, err := s.deps.ClusterInfo(r.Context())
	if err != nil {
		e := &APIError{Status: http.StatusInternalServerError, Type: typeServer, Code: "internal_error", Message: "cluster info: " + err.Error(), err: err}
		e.write(w)
		return e.Status
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(doc)
	return http.StatusOK
}

type modelList struct {
	Object string        `json:"object"`
	Data   []modelObject `json:"data"`
}

type modelObject struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"`
	// Root, Parent and MaxModelLen are the engine's (vLLM's fields),
	// passed through from the first worker whose engine gave them.
	Root        string `json:"root,omitempty"`
	Parent      string `json:"parent,omitempty"`
	MaxModelLen int    `json:"max_model_len,omitempty"`
	// Workers is how many registered workers serve the model (an extension).
	Workers int `json:"switchyard_workers"`
}

func (s *Server) handleModels(w http.ResponseWriter, r *http.Request) int {
	tn, apiErr := s.authenticate(r)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	counts := map[string]int{}
	cards := map[string]wire.ModelCard{}
	var ids []string
	for _, wk := range s.deps.Workers.Workers() {
		for _, c := range wk.Cards {
			if _, ok := cards[c.ID]; !ok {
				cards[c.ID] = c
			}
		}
		names := append([]string{wk.Model}, wk.Models...)
		for i, name := range names {
			if name == "" || slices.Contains(names[:i], name) {
				continue // a name listed twice by one worker counts once
			}
			if tn != nil && !tn.AllowsModel(name) {
				continue // a tenant sees the models it may use
			}
			if counts[name] == 0 {
				ids = append(ids, name)
			}
			counts[name]++
		}
	}
	slices.Sort(ids)
	out := modelList{Object: "list", Data: make([]modelObject, 0, len(ids))}
	for _, id := range ids {
		c := cards[id]
		out.Data = append(out.Data, modelObject{ID: id, Object: "model", OwnedBy: "switchyard", Workers: counts[id],
			Created: c.Created, Root: c.Root, Parent: c.Parent, MaxModelLen: c.MaxModelLen})
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
	return http.StatusOK
}

// nextID returns a request id unique across replicas (random per-process
// base) and cheap to make (a counter).
func (s *Server) nextID() string {
	return "sy-" + s.idBase + "-" + strconv.FormatUint(s.idSeq.Add(1), 36)
}

// routing is what the request path learns from the worker registry.
type routing struct {
	blockSize int
	// otherSizes are the serving workers' other block sizes (noteBlockSize).
	otherSizes []int
	// salt is the name the prompt is hashed under: the first serving
	// worker's (WorkerEntry.saltFor).
	salt string
	// eligible is the set of workers serving the model, when not every
	// worker does; nil when every worker serves it.
	eligible []string
	all      []string
	// engines are the base URLs of the workers serving the model (for a
	// tokenizer registry that may ask one of them).
	engines []string
	// maxModelLen is the longest context of the workers serving the model
	// (0: none says).
	maxModelLen int
	// ranks are the data-parallel ranks of the eligible workers that are
	// one (dprank.go); nil without any.
	ranks map[string]int
}

// route resolves the model against the registry. With no workers at all the
// scheduler answers no_endpoints; a model nobody serves is a 404.
func (s *Server) route(model string) (routing, *APIError) {
	ws := s.deps.Workers.Workers()
	rt := routing{blockSize: s.cfg.BlockSize}
	if len(ws) == 0 {
		return rt, nil
	}
	rt.all = make([]string, 0, len(ws))
	rt.engines = make([]string, 0, len(ws))
	found, sized := false, false
	mixed := false
	for i := range ws {
		w := &ws[i]
		rt.all = append(rt.all, w.ID)
		if w.Serves(model) {
			sized = rt.noteBlockSize(w.BlockSize, sized)
			if !found {
				rt.salt = w.saltFor(model)
			}
			found = true
			rt.engines = append(rt.engines, w.URL)
			rt.maxModelLen = max(rt.maxModelLen, w.MaxModelLen)
			rt.noteRank(w)
		} else {
			mixed = true
		}
	}
	if !found {
		return rt, &APIError{Status: http.StatusNotFound, Type: typeInvalidRequest, Param: "model", Code: "model_not_found",
			Message: fmt.Sprintf("the model %q is not served by any registered worker (see GET /v1/models)", model), err: ErrUnknownModel}
	}
	if mixed {
		for i := range ws {
			if ws[i].Serves(model) {
				rt.eligible = append(rt.eligible, ws[i].ID)
			}
		}
	}
	return rt, nil
}

// tokenize turns p's prompt into token ids for the model and checks the
// context length. The ids are returned rather than kept in p: a next turn's
// cached history is shared with the tokenizer's cache, and nothing but the
// block hashing (prompt.Result.SequenceHashes) reads them.
func (s *Server) tokenize(ctx context.Context, p *parsedRequest, rt routing) (prompt.Result, *APIError) {
	res, err := s.deps.Prompts.Tokenize(ctx, p.model, p.input, rt.engines)
	if err != nil {
		return prompt.Result{}, promptError(err)
	}
	p.promptTokens, p.longestPrompt = res.Total, res.Longest
	if res.Longest > s.cfg.MaxPromptTokens {
		return prompt.Result{}, badRequest(p.endpoint.promptParam(), "context_length_exceeded",
			fmt.Sprintf("the prompt has %d tokens, more than the maximum of %d", res.Longest, s.cfg.MaxPromptTokens))
	}
	return res, nil
}

// constrain intersects the client's allow-list with the model's workers and
// removes failed ones. nil means "any worker"; an empty non-nil result means
// no worker is left (the scheduler would read an empty list as "any", so the
// caller must not send it).
func constrain(allowed []string, rt routing, failed []string) []string {
	base := allowed
	if rt.eligible != nil {
		if len(base) == 0 {
			base = rt.eligible
		} else {
			base = intersect(base, rt.eligible)
		}
		if len(base) == 0 {
			return []string{}
		}
	}
	if len(failed) == 0 {
		return base
	}
	if len(base) == 0 {
		base = rt.all
	}
	out := make([]string, 0, len(base))
	for _, w := range base {
		if !slices.Contains(failed, w) {
			out = append(out, w)
		}
	}
	return out
}

func intersect(a, b []string) []string {
	out := []string{}
	for _, x := range a {
		if slices.Contains(b, x) {
			out = append(out, x)
		}
	}
	return out
}

// readBody reads at most MaxBodyBytes.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, *APIError) {
	if r.ContentLength > s.cfg.MaxBodyBytes {
		return nil, tooLarge(s.cfg.MaxBodyBytes)
	}
	rd := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	var body []byte
	var err error
	if n := r.ContentLength; n > 0 {
		// The size is known (and within the limit): read into one buffer
		// of that size, where io.ReadAll would grow one from 512 bytes,
		// copying a 4k-token chat's body a dozen times. One spare byte lets
		// the read see the end; a body longer than announced is net/http's
		// error, not a silent cut. streamUsageRoom more let the forwarded
		// body ask for usage without a copy (withStreamUsageAt).
		body, err = readFull(rd, make([]byte, 0, n+1+streamUsageRoom))
	} else {
		body, err = io.ReadAll(rd)
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, tooLarge(s.cfg.MaxBodyBytes)
		}
		return nil, badRequest("", "invalid_body", "reading the body failed: "+err.Error())
	}
	return body, nil
}

// readFull appends everything r yields to buf, growing it only when r
// yields more than its capacity.
func readFull(r io.Reader, buf []byte) ([]byte, error) {
	for {
		if len(buf) == cap(buf) {
			buf = append(buf, 0)[:len(buf)]
		}
		n, err := r.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return buf, err
		}
	}
}

func tooLarge(limit int64) *APIError {
	return &APIError{Status: http.StatusRequestEntityTooLarge, Type: typeInvalidRequest, Code: "request_too_large",
		Message: fmt.Sprintf("the request body is larger than %d bytes", limit), err: ErrTooLarge}
}

// handleCompletion is the request path (design §4 steps 1-5) on the request
// goroutine. It returns the HTTP status it sent (499 when the client left).
func (s *Server) handleCompletion(w http.ResponseWriter, r *http.Request, ep endpoint) int {
	ingress := s.now()
	rid := s.nextID()
	w.Header().Set(HeaderRequestID, rid)
	if err := s.ready(); err != nil {
		e := &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "not_ready",
			Message: "the router is not ready: " + err.Error(), RetryAfter: s.retryAfter(), err: ErrNotReady}
		e.write(w)
		return e.Status
	}
	tn, apiErr := s.authenticate(r)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	body, apiErr := s.readBody(w, r)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	p, apiErr := parseRequest(ep, body, r.Header)
	if apiErr != nil {
		s.bodies.count(apiErr)
		s.messages.count(ep, apiErr)
		apiErr.write(w)
		return apiErr.Status
	}
	pol := s.policy.Load()
	class := p.hints.class
	if tn != nil {
		// Before routing: a tenant learns nothing about models it may not use.
		if class, apiErr = s.authorize(tn, p.model, class, pol); apiErr != nil {
			apiErr.write(w)
			return apiErr.Status
		}
	}
	rt, apiErr := s.route(p.model)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	ids, apiErr := s.tokenize(r.Context(), p, rt)
	if apiErr != nil {
		apiErr.write(w)
		return apiErr.Status
	}
	if class == "" {
		class = pol.Classify(p.model, p.user, r.Header)
		if tn != nil {
			class = s.tenantClass(tn, class, pol)
		}
	} else if !pol.HasClass(class) {
		e := badRequest("x-switchyard-class", "unknown_class", fmt.Sprintf("unknown class %q (classes: %v)", class, pol.ClassNames()))
		e.write(w)
		return e.Status
	}
	def := pol.Defaults(class)
	salt := rt.salt
	if salt == "" {
		salt = p.model // no worker registered: the scheduler answers no_endpoints
	}
	seed := kvindex.ModelSeed(salt)
	req := scheduler.Request{
		ID:                   rid,
		Class:                class,
		StrictPriority:       def.Priority,
		PriorityJump:         def.PriorityJump,
		Ingress:              ingress,
		PromptTokens:         p.promptTokens,
		BlockHashes:          ids.SequenceHashes(rt.blockSize, seed),
		SizedHashes:          rt.sizedHashes(ids, seed),
		Pinned:               p.hints.worker,
		ExpectedOutputTokens: p.maxTokens, // bookOutput completes it
	}
	s.bookOutput(&req, p, rt)
	if tn != nil {
		req.Tenant = schedTenant(tn)
	}
	if p.hints.priority != nil {
		req.StrictPriority = *p.hints.priority
	}
	deadline := def.Deadline
	if p.hints.deadline != nil {
		deadline = *p.hints.deadline
	}
	if deadline > 0 {
		req.Due = ingress.Add(deadline)
	}
	if s.deps.Index != nil && len(req.BlockHashes) > 0 {
		req.Overlaps = s.overlaps(&req)
	}
	sess := s.lookupSession(r.Header, p, class, req.Tenant.ID, pol, rt)
	req.Session = sess.affinity()
	x := &exchange{s: s, w: w, r: r, p: p, rid: rid, class: class, ingress: ingress, tenant: tn, priority: req.StrictPriority, ranks: rt.ranks}
	var failed []string
	for attempt := 0; ; attempt++ {
		req.Attempt, x.attempt = attempt, attempt
		req.Allowed = constrain(p.hints.allowed, rt, failed)
		if req.Allowed != nil && len(req.Allowed) == 0 && failed == nil {
			e := &APIError{Status: http.StatusBadRequest, Type: typeInvalidRequest, Code: "invalid_constraint", Param: "x-switchyard-allowed-workers",
				Message: fmt.Sprintf("none of the allowed workers serves model %q", p.model), err: ErrBadRequest}
			e.write(w)
			return e.Status
		}
		if req.Allowed != nil && len(req.Allowed) == 0 {
			e := &APIError{Status: http.StatusBadGateway, Type: typeServer, Code: "upstream_failed",
				Message: "every eligible worker failed before responding", err: ErrUpstream}
			w.Header().Set(HeaderRoutedWorker, failed[len(failed)-1]) // the last engine that failed
			e.write(w)
			return e.Status
		}
		attemptReq := req // the admitter may keep the pointer; each attempt gets its own
		t, err := s.deps.Admitter.Admit(r.Context(), &attemptReq)
		if err != nil {
			if r.Context().Err() != nil {
				return statusClientClosed
			}
			e := admissionError(err, s.retryAfter())
			if tn != nil && errors.Is(err, scheduler.ErrQuotaExceeded) {
				s.auth.rejected.WithLabelValues(tn.ID, "quota_exceeded").Inc()
			}
			if e == nil { // withdrawn although the client is still here: say so
				e = &APIError{Status: http.StatusServiceUnavailable, Type: typeUnavailable, Code: "admission_cancelled",
					Message: "the admission was withdrawn before a worker was granted; retry", RetryAfter: s.retryAfter(), err: err}
			}
			e.write(w)
			return e.Status
		}
		g := t.Grant()
		s.granted(sess, g.Worker, attempt)
		bs := rt.blockSize
		if g.BlockSize > 0 {
			bs = g.BlockSize
		}
		x.decided(&req, g, bs)
		if hashes := req.HashesFor(bs); s.deps.Index != nil && len(hashes) > 0 {
			s.deps.Index.Predict(g.Worker, hashes)
		}
		if g.CachedTokens > 0 {
			s.m.PredictedCachedTokens.WithLabelValues(p.model, class).Add(float64(g.CachedTokens))
		}
		x.others = len(constrain(p.hints.allowed, rt, append(slices.Clip(failed), g.Worker))) > 0
		status, retry := x.proxy(t, g)
		if !retry {
			return status
		}
		failed = append(failed, g.Worker)
		failed = append(failed, x.takeExcluded()...) // disagg.go
		if attempt+1 >= s.cfg.MaxAttempts {
			e := &APIError{Status: http.StatusBadGateway, Type: typeServer, Code: "upstream_failed",
				Message: fmt.Sprintf("%d workers failed before responding", len(failed)), err: ErrUpstream}
			w.Header().Set(HeaderRoutedWorker, g.Worker) // the last engine that failed
			e.write(w)
			return e.Status
		}
		s.log.Info("worker failed before first byte, re-admitting",
			zap.String("request_id", rid), zap.String("worker", g.Worker), zap.Int("attempt", attempt+1))
	}
}

// bookOutput sets what req books and charges for its output: each of its
// sequences (n, best_of) is booked its max_tokens, or DefaultMaxTokens
// when it has none, and charged to its tenant's tokens bucket up to its
// max_tokens, or up to what the model's context leaves after the prompt:
// an absent max_tokens lets the engine generate that much, and a stream
// reports its usage only at its end.
func (s *Server) bookOutput(req *scheduler.Request, p *parsedRequest, rt routing) {
	seqs := max(1, p.sequences)
	per, bound := p.maxTokens, p.maxTokens
	if per == 0 {
		per = s.cfg.DefaultMaxTokens
		ctx := rt.maxModelLen
		if ctx == 0 {
			ctx = s.cfg.MaxPromptTokens // no worker says: the router's own prompt bound
		}
		bound = max(1, ctx-p.longestPrompt)
	}
	req.Sequences = seqs
	req.ExpectedOutputTokens = per * seqs
	req.OutputBound = bound * seqs
}

// statusClientClosed is recorded (never sent) when the client went away.
const statusClientClosed = 499

func (s *Server) retryAfter() int { return int(s.cfg.RetryAfter / time.Second) }
