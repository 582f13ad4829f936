package opspage

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/switchyard/switchyard/internal/clock"
)

//go:embed static
var static embed.FS

// ErrInvalidConfig wraps every configuration error.
var ErrInvalidConfig = errors.New("opspage: invalid config")

// maxDocBytes bounds one peer's /debug/cluster answer.
const maxDocBytes = 8 << 20

// Config is the page's configuration.
type Config struct {
	// PeerTimeout bounds each peer's /debug/cluster fetch; a slower peer
	// is shown as unreachable.
	PeerTimeout time.Duration
}

// DefaultConfig returns the defaults.
func DefaultConfig() Config { return Config{PeerTimeout: time.Second} }

// Validate reports what is wrong with c.
func (c Config) Validate() error {
	if c.PeerTimeout <= 0 {
		return fmt.Errorf("%w: PeerTimeout %v must be positive", ErrInvalidConfig, c.PeerTimeout)
	}
	return nil
}

// Peer is another replica as the registry lists it.
type Peer struct {
	ID string
	// Addr is host:port of its /debug/cluster: the admin listener when it
	// has one, else the API's.
	Addr string
}

// Deps are what the page reads.
type Deps struct {
	// Self is this replica's id; Local its /debug/cluster document.
	Self  string
	Local func(ctx context.Context) (json.RawMessage, error)
	// Peers lists the registered replicas (Self among them or not).
	Peers func() []Peer
	// Client fetches the peers' documents; nil is a plain HTTP client.
	Client *http.Client
	// Scheme is how peers serve /debug/cluster: "http" (the default) or
	// "https" (their listener has TLS; Client must trust it).
	Scheme string
	// Clock stamps the answer; nil is wall time.
	Clock clock.Clock
}

// Page serves the operators' page and /debug/tier.
type Page struct {
	cfg    Config
	deps   Deps
	assets http.Handler
}

// New builds a Page. It starts nothing.
func New(cfg Config, deps Deps) (*Page, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Local == nil || deps.Peers == nil {
		return nil, fmt.Errorf("%w: Deps.Local and Deps.Peers are required", ErrInvalidConfig)
	}
	if deps.Client == nil {
		deps.Client = &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}}
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	switch deps.Scheme {
	case "":
		deps.Scheme = "http"
	case "http", "https":
	default:
		return nil, fmt.Errorf("%w: Deps.Scheme %q must be http or https", ErrInvalidConfig, deps.Scheme)
	}
	sub, err := fs.Sub(static, "static")
	if err != nil {
		return nil, fmt.Errorf("opspage: embedded assets: %w", err)
	}
	return &Page{cfg: cfg, deps: deps, assets: http.StripPrefix("/ops/", http.FileServerFS(sub))}, nil
}

// ShellRoutes are the page's static routes (method and path patterns of
// net/http.ServeMux): the page at / and its assets under /ops/. They hold
// no data (the page asks /debug/tier for it), so a browser may load them
// without a key; the page then asks for the admin key when /debug/tier
// answers 401 or 403.
func (p *Page) ShellRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET /{$}":  http.HandlerFunc(p.serveIndex),
		"GET /ops/": p.assets,
	}
}

// DataRoutes are the routes that answer with the tier's state (engine URLs,
// tenant ids): the merged documents at /debug/tier. They are admin routes.
func (p *Page) DataRoutes() map[string]http.Handler {
	return map[string]http.Handler{
		"GET /debug/tier": http.HandlerFunc(p.serveTier),
	}
}

func (p *Page) serveIndex(w http.ResponseWriter, _ *http.Request) {
	b, err := static.ReadFile("static/index.html")
	if err != nil { // embedded at build time: cannot happen in a built binary
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	_, _ = w.Write(b)
}

// Member is one replica's entry in the /debug/tier answer.
type Member struct {
	ID        string          `json:"id"`
	Addr      string          `json:"addr,omitempty"`
	Reachable bool            `json:"reachable"`
	Error     string          `json:"error,omitempty"`
	FetchMs   float64         `json:"fetch_ms"`
	Doc       json.RawMessage `json:"doc,omitempty"`
}

// Tier is the /debug/tier answer.
type Tier struct {
	ServedBy string   `json:"served_by"`
	At       string   `json:"at"`
	Members  []Member `json:"members"` // the serving replica first, then the peers by id
}

func (p *Page) serveTier(w http.ResponseWriter, r *http.Request) {
	t := p.Tier(r.Context(), r.Header.Get("Authorization"))
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_ = json.NewEncoder(w).Encode(t)
}

// Tier gathers this replica's document and every peer's. authorization,
// if set, is sent to the peers as is: the admin key the caller presented
// here is the tier's admin key there too.
func (p *Page) Tier(ctx context.Context, authorization string) Tier {
	start := p.deps.Clock.Now()
	t := Tier{ServedBy: p.deps.Self, At: start.UTC().Format(time.RFC3339Nano)}
	self := Member{ID: p.deps.Self, Reachable: true}
	if doc, err := p.deps.Local(ctx); err != nil {
		self.Reachable, self.Error = false, err.Error()
	} else {
		self.Doc = doc
	}
	t.Members = append(t.Members, self)
	var peers []Peer
	for _, pr := range p.deps.Peers() {
		if pr.ID != p.deps.Self {
			peers = append(peers, pr)
		}
	}
	slices.SortFunc(peers, func(a, b Peer) int { return strings.Compare(a.ID, b.ID) })
	out := make([]Member, len(peers))
	var wg sync.WaitGroup
	for i, pr := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = p.fetch(ctx, pr, authorization)
		}()
	}
	wg.Wait()
	t.Members = append(t.Members, out...)
	return t
}

// fetch gets one peer's /debug/cluster within PeerTimeout.
func (p *Page) fetch(ctx context.Context, pr Peer, authorization string) (m Member) {
	m = Member{ID: pr.ID, Addr: pr.Addr}
	if pr.Addr == "" {
		m.Error = "no address registered"
		return m
	}
	ctx, cancel := context.WithTimeout(ctx, p.cfg.PeerTimeout)
	defer cancel()
	start := p.deps.Clock.Now()
	defer func() { m.FetchMs = float64(p.deps.Clock.Now().Sub(start)) / float64(time.Millisecond) }()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.deps.Scheme+"://"+pr.Addr+"/debug/cluster", nil)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := p.deps.Client.Do(req)
	if err != nil {
		m.Error = err.Error()
		return m
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxDocBytes))
	switch {
	case err != nil:
		m.Error = err.Error()
	case resp.StatusCode != http.StatusOK:
		m.Error = fmt.Sprintf("/debug/cluster answered %s", resp.Status)
	case !json.Valid(body):
		m.Error = "/debug/cluster answered invalid JSON"
	default:
		m.Reachable, m.Doc = true, body
	}
	return m
}
