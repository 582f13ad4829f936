package prompt

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/zeebo/xxh3"
	"go.uber.org/zap"

	"github.com/switchyard/switchyard/kvindex"
	"github.com/switchyard/switchyard/metrics"
	"github.com/switchyard/switchyard/tokenizer"
	"github.com/switchyard/switchyard/wire"
)

// Source says which configuration gave a model its tokenizer.
const (
	SourceFlag   = "flag"
	SourcePolicy = "policy"
	SourceWorker = "worker"
)

// Result is a request's tokenization.
type Result struct {
	// IDs are the ids of the first (or only) prompt: what the request's
	// block hashes are computed from (SequenceHashes). A chat tokenized
	// turn by turn gets its cached history as IDs.Head, shared with the
	// tokenizer's prefix cache and read only, and its generation prompt as
	// IDs.Tail; other results have only a Head.
	IDs tokenizer.IDs
	// Total is the number of prompt tokens over every batched prompt: the
	// load the request books.
	Total int
	// Longest is the length of the longest batched prompt, for the
	// context-length check.
	Longest int
	// Path says how the ids were obtained; zero for a request whose
	// prompts are all token ids (no tokenizer was needed).
	Path Path
}

// SequenceHashes is kvindex.SequenceHashes of the ids (the sequence hash
// of every full block of blockSize ids, seeded with seed), in a new slice.
// The hashes of the blocks inside a cached history are remembered beside
// it, so that the conversation's next turn hashes only the blocks past
// them: each hash depends only on the ids up to its block's end.
func (r Result) SequenceHashes(blockSize int, seed uint64) []uint64 {
	if blockSize <= 0 || r.IDs.Len() < blockSize {
		return nil
	}
	n := r.IDs.Len() / blockSize
	key := tokenizer.MemoKey{Block: blockSize, Seed: seed}
	memo := r.IDs.Memo(key)
	out := append(make([]uint64, 0, n), memo...)
	head, tail := r.IDs.Head, r.IDs.Tail
	var stack [64]uint32 // the block that straddles head and tail, up to 64 ids
	straddle := stack[:0]
	for i := len(out); i < n; i++ {
		from, to := i*blockSize, (i+1)*blockSize
		var block []uint32
		switch {
		case to <= len(head):
			block = head[from:to]
		case from >= len(head):
			block = tail[from-len(head) : to-len(head)]
		default: // the block that starts in the head and ends in the tail
			straddle = append(append(straddle[:0], head[from:]...), tail[:to-len(head)]...)
			block = straddle
		}
		h := kvindex.BlockHash(block, seed)
		if i > 0 {
			h = kvindex.ChainHash(out[i-1], h, seed)
		}
		out = append(out, h)
	}
	if len(memo) < len(head)/blockSize {
		r.IDs.Remember(key, out)
	}
	return out
}

// Deps are the Registry's replaceable parts; zero fields take defaults.
type Deps struct {
	// LoadSpec loads a tokenizer spec; default OpenSpec.
	LoadSpec func(spec string, prefixCacheBytes int64) (*Model, error)
	// LoadFiles loads fetched tokenizer files; default OpenFiles.
	LoadFiles func(files map[string][]byte, prefixCacheBytes int64) (*Model, error)
	// Client fetches files and calls engines; default a client with no
	// proxy and TLS.
	Client *http.Client
	// TLS is the default client's TLS for https:// workers and adapters
	// (a router gives its -http.engine-tls.* settings); nil: the system's
	// roots. Unused with Client.
	TLS *tls.Config
	// Now is the clock of back-offs and retries; default time.Now.
	Now func() time.Time
}

// Registry maps served model names to their tokenizers and turns requests
// into token ids by the best path available (local, fetched, engine,
// approximate). Tokenize is safe for concurrent use and never blocks on a
// load or a fetch: those happen in Run, and a model whose tokenizer is not
// there yet takes the next path meanwhile.
type Registry struct {
	cfg       Config
	log       *zap.Logger
	client    *http.Client
	loadSpec  func(string, int64) (*Model, error)
	loadFiles func(map[string][]byte, int64) (*Model, error)
	now       func() time.Time
	counts    *prometheus.CounterVec
	engines   *tokenCache

	// bindings is the resolved model → tokenizer map that Tokenize reads
	// without locking; rebind replaces it under mu.
	bindings atomic.Pointer[map[string]*binding]

	mu         sync.Mutex
	static     map[string]string // from Config.Tokenizers
	policy     map[string]string
	advertised map[string][]wire.TokenizerSource
	bySpec     map[string]*loadState
	byDigest   map[string]*loadState
	fetchBytes int64
	backoff    map[string]time.Time // model → engine path skipped until
	engineDown map[string]time.Time // engine base URL → skipped until
	wake       chan struct{}        // size one: "something to load", coalesced
}

type binding struct {
	model  *Model
	path   Path
	source string
}

type loadState struct {
	model   *Model
	err     error
	retryAt time.Time
	bytes   int64
}

// NewRegistry loads every tokenizer of cfg.Tokenizers (a spec that does not
// load is a startup error naming it) and returns the registry. It starts
// nothing; Run loads the policy's and fetches the workers' tokenizers. reg
// may be nil (a worker's registry exports no metric).
func NewRegistry(cfg Config, deps Deps, log *zap.Logger, reg prometheus.Registerer) (*Registry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	r := &Registry{
		cfg: cfg, log: log.Named("prompt"), client: deps.Client, loadSpec: deps.LoadSpec, loadFiles: deps.LoadFiles, now: deps.Now,
		engines: newTokenCache(cfg.EngineCacheBytes),
		static:  map[string]string{}, advertised: map[string][]wire.TokenizerSource{},
		bySpec: map[string]*loadState{}, byDigest: map[string]*loadState{}, backoff: map[string]time.Time{}, engineDown: map[string]time.Time{},
		wake: make(chan struct{}, 1),
	}
	if r.client == nil {
		r.client = &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: deps.TLS,
			DialContext: (&net.Dialer{Timeout: 2 * time.Second}).DialContext, MaxIdleConnsPerHost: 16}}
	}
	if r.loadSpec == nil {
		r.loadSpec = OpenSpec
	}
	if r.loadFiles == nil {
		r.loadFiles = OpenFiles
	}
	if r.now == nil {
		r.now = time.Now
	}
	opts := prometheus.CounterOpts{Name: metrics.NameRouterTokenize,
		Help: "Requests tokenized, by model and path (local, fetched, engine, approximate)."}
	if reg != nil {
		r.counts = promauto.With(reg).NewCounterVec(opts, []string{metrics.LabelModel, metrics.LabelPath})
	} else {
		r.counts = prometheus.NewCounterVec(opts, []string{metrics.LabelModel, metrics.LabelPath})
	}
	names := make([]string, 0, len(cfg.Tokenizers))
	for name := range cfg.Tokenizers {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		spec := cfg.Tokenizers[name]
		if _, done := r.bySpec[spec]; !done {
			m, err := r.loadSpec(spec, cfg.PrefixCacheBytes)
			if err != nil {
				return nil, fmt.Errorf("tokenizer of model %s: %w", name, err)
			}
			r.bySpec[spec] = &loadState{model: m}
		}
		r.static[name] = spec
	}
	r.mu.Lock()
	r.rebindLocked()
	r.mu.Unlock()
	return r, nil
}

// SetPolicy replaces the policy file's tokenizers map. Specs not loaded yet
// are loaded by Run; until then their models take the next path.
func (r *Registry) SetPolicy(specs map[string]string) {
	r.mu.Lock()
	r.policy = make(map[string]string, len(specs))
	for k, v := range specs {
		r.policy[k] = v
	}
	r.rebindLocked()
	r.mu.Unlock()
	r.poke()
}

// SetAdvertised replaces what the workers' registrations advertise: per
// model name, the tokenizer sources of the workers serving it (in a stable
// order; the first usable one wins). A source's Spec is honoured only for
// tokenizers built into the binary (tiktoken:...): a worker does not get
// to make a router open paths on its own disk.
func (r *Registry) SetAdvertised(sources map[string][]wire.TokenizerSource) {
	r.mu.Lock()
	r.advertised = make(map[string][]wire.TokenizerSource, len(sources))
	for k, v := range sources {
		r.advertised[k] = append([]wire.TokenizerSource(nil), v...)
	}
	r.rebindLocked()
	r.mu.Unlock()
	r.poke()
}

func (r *Registry) poke() {
	select {
	case r.wake <- struct{}{}:
	default: // a wake-up is already pending; it sees this change too
	}
}

// Run loads policy specs and fetches advertised files as they appear,
// retrying failures every RetryInterval, until ctx ends.
func (r *Registry) Run(ctx context.Context) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		next := r.work(ctx)
		if ctx.Err() != nil {
			return nil
		}
		wait := time.Hour
		if !next.IsZero() {
			wait = max(next.Sub(r.now()), 10*time.Millisecond)
		}
		timer.Reset(wait)
		select {
		case <-ctx.Done():
			return nil
		case <-r.wake:
		case <-timer.C:
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
}

// job is one pending load: a spec, or one model's advertised files.
type job struct {
	spec    string
	digest  string
	sources []wire.TokenizerSource // same digest, several workers' URLs
}

// work runs every due job and returns when the next failed one is due
// (zero: none).
func (r *Registry) work(ctx context.Context) time.Time {
	jobs := r.pending()
	var next time.Time
	for _, j := range jobs {
		if ctx.Err() != nil {
			return time.Time{}
		}
		if j.spec != "" {
			m, err := r.loadSpec(j.spec, r.cfg.PrefixCacheBytes)
			r.finish(r.bySpec, j.spec, m, err, 0)
			continue
		}
		var err error
		done := false
		for _, src := range j.sources {
			var files map[string][]byte
			r.mu.Lock()
			room := r.cfg.FetchMaxBytes - r.fetchBytes
			r.mu.Unlock()
			if files, err = r.fetchFiles(ctx, src, room); err != nil {
				r.log.Warn("fetch tokenizer", zap.String("url", src.URL), zap.Error(err))
				continue
			}
			var size int64
			for _, b := range files {
				size += int64(len(b))
			}
			var m *Model
			if m, err = r.loadFiles(files, r.cfg.PrefixCacheBytes); err == nil {
				m.Spec, m.Digest = "fetched:"+src.URL, j.digest
			}
			r.finish(r.byDigest, j.digest, m, err, size)
			done = true
			break
		}
		if !done {
			r.finish(r.byDigest, j.digest, nil, err, 0)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, st := range r.bySpec {
		if st.err != nil && (next.IsZero() || st.retryAt.Before(next)) {
			next = st.retryAt
		}
	}
	for _, st := range r.byDigest {
		if st.err != nil && (next.IsZero() || st.retryAt.Before(next)) {
			next = st.retryAt
		}
	}
	return next
}

func (r *Registry) finish(states map[string]*loadState, key string, m *Model, err error, size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.log.Warn("tokenizer unavailable; its models use the next path", zap.String("tokenizer", key), zap.Error(err))
		states[key] = &loadState{err: err, retryAt: r.now().Add(r.cfg.RetryInterval)}
	} else {
		states[key] = &loadState{model: m, bytes: size}
		r.fetchBytes += size
		r.log.Info("tokenizer loaded", zap.String("tokenizer", key), zap.String("describe", m.Describe))
	}
	r.rebindLocked()
}

// pending lists the loads due now.
func (r *Registry) pending() []job {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	due := func(st *loadState) bool { return st == nil || (st.err != nil && !now.Before(st.retryAt)) }
	var jobs []job
	seen := map[string]bool{}
	for _, spec := range sortedValues(r.policy) {
		if !seen[spec] && due(r.bySpec[spec]) {
			seen[spec] = true
			jobs = append(jobs, job{spec: spec})
		}
	}
	var digests []string
	sources := map[string][]wire.TokenizerSource{}
	for _, model := range sortedKeys(r.advertised) {
		for _, src := range r.advertised[model] {
			switch {
			case src.Spec != "":
				if BuiltinSpec(src.Spec) && !seen[src.Spec] && due(r.bySpec[src.Spec]) {
					seen[src.Spec] = true
					jobs = append(jobs, job{spec: src.Spec})
				}
			case len(src.SHA256) == 64 && due(r.byDigest[src.SHA256]):
				if sources[src.SHA256] == nil {
					digests = append(digests, src.SHA256)
				}
				sources[src.SHA256] = append(sources[src.SHA256], src)
			}
		}
	}
	for _, d := range digests {
		jobs = append(jobs, job{digest: d, sources: sources[d]})
	}
	return jobs
}

// rebindLocked recomputes the model → tokenizer map: flag, then policy,
// then what the workers advertise (a built-in spec, then fetched files).
func (r *Registry) rebindLocked() {
	out := map[string]*binding{}
	bind := func(model string, st *loadState, path Path, source string) {
		if _, done := out[model]; !done && st != nil && st.model != nil {
			out[model] = &binding{model: st.model, path: path, source: source}
		}
	}
	for model, spec := range r.static {
		bind(model, r.bySpec[spec], PathLocal, SourceFlag)
	}
	for model, spec := range r.policy {
		bind(model, r.bySpec[spec], PathLocal, SourcePolicy)
	}
	for model, srcs := range r.advertised {
		for _, src := range srcs {
			if src.Spec != "" {
				if BuiltinSpec(src.Spec) {
					bind(model, r.bySpec[src.Spec], PathLocal, SourceWorker)
				}
				continue
			}
			bind(model, r.byDigest[src.SHA256], PathFetched, SourceWorker)
		}
	}
	r.bindings.Store(&out)
}

// Model returns the tokenizer model name resolves to and its path, or nil
// when it has none (yet).
func (r *Registry) Model(name string) (*Model, Path) {
	if b := (*r.bindings.Load())[name]; b != nil {
		return b.model, b.path
	}
	return nil, 0
}

// Tokenize returns in's token ids for model by the best path available:
// the model's own tokenizer (local or fetched), else one of engines (base
// URLs of the workers serving it; vLLM's POST /tokenize, cached), else
// approximate pseudo-tokens. Only a malformed prompt or a template that
// fails on it is an error (ErrBadRequest, ErrRender).
func (r *Registry) Tokenize(ctx context.Context, model string, in *Input, engines []string) (Result, error) {
	if allIDs(in) {
		return idsResult(in), nil
	}
	if b := (*r.bindings.Load())[model]; b != nil {
		res, err := tokenizeWith(b.model, in)
		if err != nil {
			return Result{}, err
		}
		res.Path = b.path
		r.counts.WithLabelValues(model, b.path.String()).Inc()
		return res, nil
	}
	if len(engines) > 0 && r.engineAllowed(model) {
		if res, ok := r.viaEngine(ctx, model, in, engines); ok {
			r.counts.WithLabelValues(model, PathEngine.String()).Inc()
			return res, nil
		}
	}
	res, err := approximate(in)
	if err != nil {
		return Result{}, err
	}
	r.counts.WithLabelValues(model, PathApproximate.String()).Inc()
	return res, nil
}

func allIDs(in *Input) bool {
	if in.IsChat() {
		return false
	}
	for _, p := range in.Prompts {
		if !p.IsIDs {
			return false
		}
	}
	return true
}

func idsResult(in *Input) Result {
	res := Result{IDs: tokenizer.IDs{Head: in.Prompts[0].IDs}}
	for _, p := range in.Prompts {
		res.Total += len(p.IDs)
		res.Longest = max(res.Longest, len(p.IDs))
	}
	return res
}

// tokenizeWith tokenizes in with a loaded model: chats rendered with its
// template and encoded without adding BOS (the template writes it), text
// prompts encoded with BOS prepended when the tokenizer adds one and the
// request asks for special tokens (vLLM's behaviour), token ids as they are.
func tokenizeWith(m *Model, in *Input) (Result, error) {
	if in.IsChat() {
		if m.turns != nil {
			if ids, ok := m.turns.encode(in); ok {
				return Result{IDs: ids, Total: ids.Len(), Longest: ids.Len()}, nil
			}
		}
		text, err := m.Template.Render(in)
		if err != nil {
			return Result{}, fmt.Errorf("%w: %v", ErrRender, err)
		}
		ids := m.encodeChat(text)
		return Result{IDs: tokenizer.IDs{Head: ids}, Total: len(ids), Longest: len(ids)}, nil
	}
	var res Result
	for i, p := range in.Prompts {
		ids := p.IDs
		if !p.IsIDs {
			enc := m.Encode(p.Text)
			if in.AddSpecial && len(m.BOS) > 0 {
				ids = make([]uint32, 0, len(m.BOS)+len(enc))
				ids = append(append(ids, m.BOS...), enc...)
			} else {
				ids = enc
			}
		}
		if i == 0 {
			res.IDs = tokenizer.IDs{Head: ids}
		}
		res.Total += len(ids)
		res.Longest = max(res.Longest, len(ids))
	}
	return res, nil
}

// approximate hashes the rendered text in pseudo-tokens.
func approximate(in *Input) (Result, error) {
	if in.IsChat() {
		text, err := PlainChat{}.Render(in)
		if err != nil {
			return Result{}, err
		}
		ids := approxTokens(text)
		return Result{IDs: tokenizer.IDs{Head: ids}, Total: len(ids), Longest: len(ids), Path: PathApproximate}, nil
	}
	res := Result{Path: PathApproximate}
	for i, p := range in.Prompts {
		n := len(p.IDs)
		if !p.IsIDs {
			n = approxCount(p.Text)
		}
		if i == 0 {
			res.IDs = tokenizer.IDs{Head: p.IDs}
			if !p.IsIDs {
				res.IDs = tokenizer.IDs{Head: approxTokens(p.Text)}
			}
		}
		res.Total += n
		res.Longest = max(res.Longest, n)
	}
	return res, nil
}

func (r *Registry) engineAllowed(model string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.backoff[model]
	return !ok || !r.now().Before(until)
}

// viaEngine tokenizes in's first prompt (or its chat) on one of engines,
// through the cache. Other batched prompts are counted at the first one's
// bytes-per-token ratio: only the first one is hashed.
func (r *Registry) viaEngine(ctx context.Context, model string, in *Input, engines []string) (Result, bool) {
	key := xxh3.HashStringSeed(model, in.key())
	ids, _, ok := r.engines.get(key)
	if !ok {
		var err error
		ids, err = r.tokenizeOnEngines(ctx, key, model, in, engines)
		if err != nil {
			if ctx.Err() == nil {
				r.mu.Lock()
				r.backoff[model] = r.now().Add(r.cfg.EngineBackoff)
				r.mu.Unlock()
				r.log.Debug("engine tokenization failed; approximating", zap.String("model", model), zap.Error(err))
			}
			return Result{}, false
		}
		r.engines.put(key, ids, len(ids))
	}
	res := Result{IDs: tokenizer.IDs{Head: ids}, Total: len(ids), Longest: len(ids), Path: PathEngine}
	if in.IsChat() || len(in.Prompts) == 1 {
		return res, true
	}
	first := max(len(in.Prompts[0].Text), 1)
	for _, p := range in.Prompts[1:] {
		n := len(p.IDs)
		if !p.IsIDs {
			n = (len(p.Text)*len(ids) + first - 1) / first
		}
		res.Total += n
		res.Longest = max(res.Longest, n)
	}
	return res, true
}

// tokenizeOnEngines asks the model's engines in turn, from the prompt's
// hash on (one prompt keeps to one engine while it answers), at most
// EngineAttempts of them, skipping those that failed within EngineBackoff.
// Only when every attempt fails does the caller put the model on the
// approximate path.
func (r *Registry) tokenizeOnEngines(ctx context.Context, key uint64, model string, in *Input, engines []string) ([]uint32, error) {
	n := uint64(len(engines))
	tried := 0
	var last error
	for i := uint64(0); i < n && tried < r.cfg.EngineAttempts; i++ {
		base := engines[(key+i)%n]
		if r.engineSkipped(base) {
			continue
		}
		tried++
		ids, err := r.engineTokenize(ctx, base, model, in)
		if err == nil {
			return ids, nil
		}
		if ctx.Err() != nil {
			return nil, err
		}
		last = err
		r.markEngineDown(base)
		r.log.Debug("engine tokenization failed; trying the next engine", zap.String("model", model), zap.String("engine", base), zap.Error(err))
	}
	if last == nil {
		last = fmt.Errorf("%w: every engine of %q failed within the backoff", ErrEngine, model)
	}
	return nil, last
}

func (r *Registry) engineSkipped(base string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	until, ok := r.engineDown[base]
	return ok && r.now().Before(until)
}

// markEngineDown skips base for EngineBackoff. Expired marks are dropped
// here, so the map holds at most the engines that failed recently.
func (r *Registry) markEngineDown(base string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	for e, until := range r.engineDown {
		if !now.Before(until) {
			delete(r.engineDown, e)
		}
	}
	r.engineDown[base] = now.Add(r.cfg.EngineBackoff)
}

// ModelInfo is one model's tokenizer as /debug/cluster shows it.
type ModelInfo struct {
	Model  string `json:"model"`
	Source string `json:"source,omitempty"` // flag, policy, worker
	Spec   string `json:"spec,omitempty"`
	Path   string `json:"path"` // local, fetched, or "engine|approximate" while it has none
	Digest string `json:"digest,omitempty"`
	// Describe summarises the tokenizer (kind, vocabulary size).
	Describe string `json:"describe,omitempty"`
	// Error is the last failure to load or fetch a configured or
	// advertised tokenizer of the model.
	Error string `json:"error,omitempty"`
}

// Info describes every model the registry knows of (configured or
// advertised), sorted by name.
func (r *Registry) Info() []ModelInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := map[string]bool{}
	for m := range r.static {
		names[m] = true
	}
	for m := range r.policy {
		names[m] = true
	}
	for m := range r.advertised {
		names[m] = true
	}
	bindings := *r.bindings.Load()
	out := make([]ModelInfo, 0, len(names))
	for _, name := range sortedKeys(names) {
		mi := ModelInfo{Model: name, Path: "engine|approximate"}
		if b := bindings[name]; b != nil {
			mi.Source, mi.Spec, mi.Path, mi.Digest, mi.Describe = b.source, b.model.Spec, b.path.String(), b.model.Digest, b.model.Describe
		}
		var errs []error
		if spec, ok := r.policy[name]; ok {
			if st := r.bySpec[spec]; st != nil && st.err != nil {
				errs = append(errs, st.err)
			}
		}
		for _, src := range r.advertised[name] {
			if st := r.byDigest[src.SHA256]; src.Spec == "" && st != nil && st.err != nil {
				errs = append(errs, st.err)
			}
			if src.Spec != "" && !BuiltinSpec(src.Spec) {
				errs = append(errs, fmt.Errorf("%w: advertised spec %q is not built in; ignored", ErrBadSpec, src.Spec))
			}
		}
		if err := errors.Join(errs...); err != nil {
			mi.Error = err.Error()
		}
		out = append(out, mi)
	}
	return out
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func sortedValues(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for _, k := range sortedKeys(m) {
		out = append(out, m[k])
	}
	return out
}

// TokenizeEach returns the ids of every prompt of in (a chat is one) as an
// engine computes them: with the model's tokenizer when it has one, else as
// approximate pseudo-tokens. The simulated engine uses it, so its KV blocks
// are the ones routers hash by Tokenize.
func (r *Registry) TokenizeEach(model string, in *Input) ([][]uint32, error) {
	m, _ := r.Model(model)
	if in.IsChat() {
		var res Result
		var err error
		if m != nil {
			res, err = tokenizeWith(m, in)
		} else {
			res, err = approximate(in)
		}
		if err != nil {
			return nil, err
		}
		return [][]uint32{res.IDs.Slice()}, nil
	}
	out := make([][]uint32, len(in.Prompts))
	for i, p := range in.Prompts {
		one := &Input{Kind: in.Kind, Prompts: []Prompt{p}, AddSpecial: in.AddSpecial}
		var res Result
		var err error
		if m != nil {
			res, err = tokenizeWith(m, one)
		} else {
			res, err = approximate(one)
		}
		if err != nil {
			return nil, err
		}
		out[i] = res.IDs.Slice()
	}
	return out, nil
}
