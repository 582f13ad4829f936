package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/switchyard/switchyard/frontend"
	"github.com/switchyard/switchyard/internal/clock"
	"github.com/switchyard/switchyard/internal/tlsconf"
	"github.com/switchyard/switchyard/opspage"
	"github.com/switchyard/switchyard/prompt"
	"github.com/switchyard/switchyard/scheduler"
	"github.com/switchyard/switchyard/wire"
)

// loadReportStale is how old a worker's last load report may be before the
// page calls the worker unhealthy: workers report every 100 ms (adapters
// every scrape, 1 s by default), so three seconds is several missed reports,
// not one late one.
const loadReportStale = 3 * time.Second

// The /debug/cluster document: one replica's view of the tier, in
// snake_case JSON. The operators' page (opspage) fetches it from every
// replica and merges them; docs/operations.md describes each field's panel.
type (
	clusterDoc struct {
		Self      string              `json:"self"`
		Version   string              `json:"version"`
		At        string              `json:"at"`             // RFC 3339, this replica's clock
		State     string              `json:"state"`          // starting, ready, lame_duck, stopping
		Degraded  bool                `json:"degraded"`       // NATS unreachable: remote classes admitted here
		Modes     []string            `json:"degraded_modes"` // nats, etcd: each mode admitting locally
		NATS      string              `json:"nats"`           // the NATS connection's status
		Quotas    degradedQuotasDoc   `json:"degraded_quotas"`
		Etcd      bool                `json:"etcd_session_healthy"`
		HTTPAddr  string              `json:"http_addr"`
		AdminAddr string              `json:"admin_addr,omitempty"`
		Replicas  []replicaDoc        `json:"replicas"`
		Owners    map[string]ownerDoc `json:"owners"`
		// Owned are the classes this replica owns; Classes has the
		// actor's counters of every class it knows, and only an owner's
		// (or a degraded replica's) move.
		Owned   []string            `json:"owned"`
		Classes map[string]classDoc `json:"classes"`
		Workers []workerDoc         `json:"workers"`
		// Engines groups the workers by engine: a data-parallel engine's
		// ranks (each a worker, a routing target of its own) under one row.
		Engines    []engineDoc            `json:"engines"`
		Members    []memberDoc            `json:"gossip_members"`
		Quality    frontend.QualityTotals `json:"quality"`
		Decisions  []frontend.Decision    `json:"decisions"`
		Tokenizers []prompt.ModelInfo     `json:"tokenizers"`
		// Tenants are the keys file's tenants with their quotas and, for
		// each, its use in this replica's scheduler: what this replica
		// enforces as the owner of the classes it owns.
		Tenants []tenantDoc `json:"tenants"`
		// Sessions is how many sessions this replica's table holds
		// (routed here or learned by gossip); SessionsByWorker splits
		// them by the worker of their latest turn.
		Sessions         int            `json:"sessions"`
		SessionsByWorker map[string]int `json:"sessions_by_worker"`
	}
	tenantDoc struct {
		ID         string     `json:"id"`
		Configured bool       `json:"configured"` // in the keys file (else only seen in requests)
		Quota      quotaDoc   `json:"quota"`
		Use        *tenantUse `json:"use"` // nil: nothing queued, booked or spent here
	}
	quotaDoc struct {
		Concurrent        int `json:"concurrent"`
		RequestsPerMinute int `json:"requests_per_minute"`
		TokensPerMinute   int `json:"tokens_per_minute"`
	}
	tenantUse struct {
		InFlight int `json:"in_flight"`
		Queued   int `json:"queued"`
		// RequestsLeft and TokensLeft are the bucket levels (of
		// requests_per_minute and tokens_per_minute; absent when that
		// quota is unlimited).
		RequestsLeft *float64 `json:"requests_left,omitempty"`
		TokensLeft   *float64 `json:"tokens_left,omitempty"`
		Classes      []string `json:"classes"`
	}
	calibrationDoc struct {
		Scale      float64 `json:"scale"`
		OverheadMs float64 `json:"overhead_ms"`
		Marks      float64 `json:"marks"` // decayed first-token marks in the fit (0: never calibrated)
	}
	replicaDoc struct {
		ID         string `json:"id"`
		HTTPAddr   string `json:"http_addr"`
		AdminAddr  string `json:"admin_addr,omitempty"`
		GossipAddr string `json:"gossip_addr"`
		Version    string `json:"version"`
		Ready      bool   `json:"ready"`
	}
	// degradedQuotasDoc is what a degraded admission here enforces of
	// tenant quotas and class limits (docs/policy.md, "Degraded
	// admission: quotas"), next to degraded and degraded_modes.
	degradedQuotasDoc struct {
		Policy string `json:"policy"` // split, whole, closed
		// Divisor is the replicas last seen alive before a degraded mode
		// began (split divides by it); Frozen while one is in force.
		Divisor int                          `json:"divisor"`
		Frozen  bool                         `json:"divisor_frozen"`
		Classes map[string]degradedLimitsDoc `json:"classes"`
		Tenants map[string]degradedTenantDoc `json:"tenants"`
	}
	// degradedLimitsDoc is a class's effective queue limits while degraded
	// (-1: unlimited); Closed: the closed policy refuses the class.
	degradedLimitsDoc struct {
		Requests     int  `json:"requests"`
		ISLTokens    int  `json:"isl_tokens"`
		CachedTokens int  `json:"cached_tokens"`
		Closed       bool `json:"closed"`
	}
	// degradedTenantDoc is a tenant's effective quota while degraded (0:
	// unlimited); Closed: the closed policy refuses the tenant.
	degradedTenantDoc struct {
		Concurrent        int  `json:"concurrent"`
		RequestsPerMinute int  `json:"requests_per_minute"`
		TokensPerMinute   int  `json:"tokens_per_minute"`
		Closed            bool `json:"closed"`
	}
	ownerDoc struct {
		Replica string `json:"replica"`
		Epoch   int64  `json:"epoch"`
	}
	classDoc struct {
		QueueDepth    int               `json:"queue_depth"`
		PendingTokens int64             `json:"pending_tokens"`
		Received      uint64            `json:"received"`
		Retried       uint64            `json:"retried"`
		Admitted      uint64            `json:"admitted"`
		Cancelled     uint64            `json:"cancelled"`
		Rejected      map[string]uint64 `json:"rejected"` // by reason; due_time_passed is the deadline misses
		// QueueByPriority is queue_depth by strict priority tier (the
		// x-switchyard-priority value, as a string key).
		QueueByPriority map[string]int `json:"queue_by_priority"`
	}
	loadDoc struct {
		ActiveRequests int `json:"active_requests"`
		PrefillTokens  int `json:"prefill_tokens"`
		DecodeBlocks   int `json:"decode_blocks"`
	}
	reportDoc struct {
		Running       int     `json:"running"`
		Waiting       int     `json:"waiting"`
		KVUsage       float64 `json:"kv_usage"`
		PrefixHitRate float64 `json:"prefix_hit_rate"`
		AgeMs         int64   `json:"age_ms"`
	}
	// engineDoc is one engine: its ranks' worker ids (one, itself,
	// without data parallelism), in rank order.
	engineDoc struct {
		ID     string   `json:"id"`
		URL    string   `json:"url"`
		DPSize int      `json:"dp_size"` // 0 or 1: not data-parallel
		Ranks  []string `json:"ranks"`
	}
	workerDoc struct {
		ID  string `json:"id"`
		URL string `json:"url"`
		// Engine is the engine the worker is a rank of (its own id
		// without data parallelism); DPRank its rank of DPSize.
		Engine    string   `json:"engine"`
		DPRank    int      `json:"dp_rank"`
		DPSize    int      `json:"dp_size"`
		Model     string   `json:"model"`
		Models    []string `json:"models,omitempty"`
		BlockSize int      `json:"block_size"`
		KVBlocks  int      `json:"kv_blocks"`
		// Indexed is the KV blocks this replica's index holds for it.
		Indexed int `json:"kv_blocks_indexed"`
		// Booked is this replica's ledger; BookedElsewhere the other
		// replicas' bookings as gossiped.
		Booked          loadDoc    `json:"booked"`
		BookedElsewhere loadDoc    `json:"booked_elsewhere"`
		Reported        *reportDoc `json:"reported"` // nil: no load report yet
		// Health is healthy (a recent load report), unhealthy (none for
		// loadReportStale) or unknown (never reported: an adapter that
		// cannot scrape its engine's metrics).
		Health string `json:"health"`
		// Calibration is this replica's selector's TTFT calibration of
		// the worker (only an owner's selector calibrates it).
		Calibration calibrationDoc `json:"calibration"`
		// Cached is the cached prompt tokens this replica predicted for
		// the requests it routed here against those the engine reported.
		Cached frontend.WorkerCached `json:"cached_tokens"`
		// KVEvents is the worker's KV event path as this replica sees
		// it: off (the worker publishes none), ok, or silent (it computed
		// prompt blocks and its events stored none in the index over
		// -ingest.silent-window; docs/troubleshooting.md).
		KVEvents       string      `json:"kv_events"`
		KVEventsDetail kvEventsDoc `json:"kv_events_detail"`
	}
	// kvEventsDoc backs kv_events: since and why while silent, and the
	// cumulative figures the judgement compares.
	kvEventsDoc struct {
		Since        string `json:"since,omitempty"` // RFC 3339
		Why          string `json:"why,omitempty"`
		Batches      uint64 `json:"batches"`
		BlocksStored uint64 `json:"blocks_stored"`
		Resets       uint64 `json:"resets"`
		LastReset    string `json:"last_reset,omitempty"`
		PromptBlocks uint64 `json:"prompt_blocks_computed"`
	}
	memberDoc struct {
		Name     string `json:"name"`
		Addr     string `json:"addr"`
		HTTPAddr string `json:"http_addr"`
		Version  string `json:"version"`
	}
)

// loadReports keeps each worker's last load report and when it arrived,
// for the page's reported load and health. Written by the load report
// subscription, read by /debug/cluster.
type loadReports struct {
	mu   sync.Mutex
	last map[string]reportedLoad
}

type reportedLoad struct {
	r  wire.LoadReport
	at time.Time
}

func (l *loadReports) note(r *wire.LoadReport, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.last == nil {
		l.last = map[string]reportedLoad{}
	}
	l.last[r.Worker] = reportedLoad{*r, at}
}

func (l *loadReports) get(worker string) (reportedLoad, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	v, ok := l.last[worker]
	return v, ok
}

// forget drops the reports of workers no longer registered.
func (l *loadReports) forget(keep map[string]bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.last {
		if !keep[id] {
			delete(l.last, id)
		}
	}
}

// clusterInfo serves /debug/cluster: this replica's view of the tier as one
// JSON document (clusterDoc).
func (r *replica) clusterInfo(context.Context) (json.RawMessage, error) {
	now := clock.Real{}.Now() // the load reports' arrival times are wall time too
	doc := clusterDoc{
		Self: r.cfg.ID, Version: Version(), At: now.UTC().Format(time.RFC3339Nano), State: r.state(),
		Degraded: r.client.Degraded(), Modes: r.client.DegradedModes(), NATS: strings.ToLower(r.nc.Status().String()),
		Etcd: r.session.Healthy(), HTTPAddr: r.httpAddr, AdminAddr: r.adminAddr(),
		Owners: map[string]ownerDoc{}, Classes: map[string]classDoc{}, Tokenizers: r.prompts.Info(),
	}
	if doc.Modes == nil {
		doc.Modes = []string{}
	}
	doc.Quotas = r.degradedQuotasDoc()
	for _, it := range r.replicas.Snapshot().Items {
		i := it.Info
		doc.Replicas = append(doc.Replicas, replicaDoc{ID: i.ID, HTTPAddr: i.HTTPAddr, AdminAddr: i.AdminAddr, GossipAddr: i.GossipAddr, Version: i.Build, Ready: i.Ready})
	}
	sort.Slice(doc.Replicas, func(i, j int) bool { return doc.Replicas[i].ID < doc.Replicas[j].ID })
	for class, o := range r.own.Owners() {
		doc.Owners[class] = ownerDoc{o.Replica, o.Epoch}
		if o.Replica == r.cfg.ID {
			doc.Owned = append(doc.Owned, class)
		}
	}
	sort.Strings(doc.Owned)
	snap := r.actor.Snapshot()
	for name, cs := range snap.Classes {
		cd := classDoc{QueueDepth: cs.QueueDepth, PendingTokens: cs.PendingTokens, Received: cs.Counters.Received,
			Retried: cs.Counters.Retried, Admitted: cs.Counters.Admitted, Cancelled: cs.Counters.Cancelled, Rejected: map[string]uint64{}}
		for reason, n := range cs.Counters.Rejected {
			cd.Rejected[reason.String()] = n
		}
		cd.QueueByPriority = make(map[string]int, len(cs.QueueByPriority))
		for prio, n := range cs.QueueByPriority {
			cd.QueueByPriority[strconv.Itoa(int(prio))] = n
		}
		doc.Classes[name] = cd
	}
	registered := map[string]bool{}
	for _, it := range r.workers.Snapshot().Items {
		i := it.Info
		registered[i.ID] = true
		local, remote := snap.Workers[i.ID], r.gossip.RemoteLoad(i.ID)
		wd := workerDoc{
			ID: i.ID, URL: i.URL, Engine: engineOf(i.ID, i.DPRank, i.DPSize), DPRank: i.DPRank, DPSize: i.DPSize, Model: i.Model, Models: i.Models, BlockSize: i.BlockSize, KVBlocks: i.KVBlocks,
			Indexed:         r.ix.Blocks(i.ID),
			Booked:          loadDoc{local.ActiveRequests, local.PrefillTokens, local.DecodeBlocks},
			BookedElsewhere: loadDoc{remote.ActiveRequests, remote.PrefillTokens, remote.DecodeBlocks},
			Health:          "unknown",
			Calibration:     calibrationDoc{Scale: 1},
		}
		if cal, ok := snap.Calibration[i.ID]; ok {
			wd.Calibration = calibrationDoc{Scale: cal.Scale, OverheadMs: float64(cal.Overhead) / float64(time.Millisecond), Marks: cal.Marks}
		}
		if r.fe != nil {
			wd.Cached = r.fe.WorkerCached(i.ID)
			wd.KVEventsDetail.PromptBlocks = r.fe.WorkerServedBlocks(i.ID)
		}
		wd.KVEvents = "off"
		if i.PublishesEvents {
			ec := r.ix.EventCounts(i.ID)
			d := &wd.KVEventsDetail
			d.Batches, d.BlocksStored, d.Resets, d.LastReset = ec.Batches, ec.Stored, ec.Resets, ec.LastReset
			wd.KVEvents = "ok"
			if st := r.silence.State(i.ID); st.Silent {
				wd.KVEvents, d.Since, d.Why = "silent", st.Since.UTC().Format(time.RFC3339), st.Why
			}
		}
		if rep, ok := r.reports.get(i.ID); ok {
			age := now.Sub(rep.at)
			wd.Reported = &reportDoc{Running: rep.r.Running, Waiting: rep.r.Waiting, KVUsage: rep.r.KVUsage,
				PrefixHitRate: rep.r.PrefixHitRate, AgeMs: age.Milliseconds()}
			wd.Health = "healthy"
			if age > loadReportStale {
				wd.Health = "unhealthy"
			}
		}
		doc.Workers = append(doc.Workers, wd)
	}
	r.reports.forget(registered)
	sort.Slice(doc.Workers, func(i, j int) bool { return doc.Workers[i].ID < doc.Workers[j].ID })
	doc.Engines = groupEngines(doc.Workers)
	for _, m := range r.gossip.Members() {
		doc.Members = append(doc.Members, memberDoc{Name: m.Name, Addr: m.Addr, HTTPAddr: m.Meta.HTTPAddr, Version: m.Meta.Version})
	}
	sort.Slice(doc.Members, func(i, j int) bool { return doc.Members[i].Name < doc.Members[j].Name })
	doc.Sessions, doc.SessionsByWorker = r.sessions.Len(), r.sessions.PerWorker()
	if r.fe != nil {
		doc.Quality, doc.Decisions = r.fe.QualityTotals(), r.fe.Decisions()
	}
	doc.Tenants = r.tenantDocs(snap.Tenants)
	return json.Marshal(doc)
}

// tenantDocs lists the keys file's tenants, in file order, then the
// tenants only the scheduler knows (requests admitted under a keys file
// since replaced), each with its use here.
func (r *replica) tenantDocs(live []scheduler.TenantSnapshot) []tenantDoc {
	use := make(map[string]scheduler.TenantSnapshot, len(live))
	for _, ts := range live {
		use[ts.ID] = ts
	}
	out := []tenantDoc{}
	seen := map[string]bool{}
	if r.keys != nil {
		for _, t := range r.keys.Set().Tenants() {
			seen[t.ID] = true
			d := tenantDoc{ID: t.ID, Configured: true, Quota: quotaDoc{t.Quota.Concurrent, t.Quota.RequestsPerMinute, t.Quota.TokensPerMinute}}
			if ts, ok := use[t.ID]; ok {
				d.Use = tenantUseOf(ts)
			}
			out = append(out, d)
		}
	}
	for _, ts := range live {
		if !seen[ts.ID] {
			q := ts.Quota
			out = append(out, tenantDoc{ID: ts.ID, Quota: quotaDoc{q.Concurrent, q.RequestsPerMinute, q.TokensPerMinute}, Use: tenantUseOf(ts)})
		}
	}
	return out
}

func tenantUseOf(ts scheduler.TenantSnapshot) *tenantUse {
	u := &tenantUse{InFlight: ts.InFlight, Queued: ts.Queued, Classes: ts.Classes}
	if u.Classes == nil {
		u.Classes = []string{}
	}
	if ts.Quota.RequestsPerMinute > 0 {
		u.RequestsLeft = &ts.Requests
	}
	if ts.Quota.TokensPerMinute > 0 {
		u.TokensLeft = &ts.Tokens
	}
	return u
}

// state is the replica's life stage as the page shows it.
func (r *replica) state() string {
	switch {
	case r.stopping.Load():
		return "stopping"
	case r.draining.Load():
		return "lame_duck"
	case r.serving.Load():
		return "ready"
	}
	return "starting"
}

// adminAddr is the admin listener's address as other replicas reach it:
// the advertised API host with the admin port when the listener is bound
// to every interface ("" without an admin listener).
func (r *replica) adminAddr() string {
	if r.adminLn == nil {
		return ""
	}
	host, port, err := net.SplitHostPort(r.adminLn.Addr().String())
	if err != nil {
		return r.adminLn.Addr().String()
	}
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		if h, _, err := net.SplitHostPort(r.httpAddr); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// peerPages lists the registered replicas where the operators' page
// fetches their /debug/cluster.
func (r *replica) peerPages() []opspage.Peer {
	items := r.replicas.Snapshot().Items
	out := make([]opspage.Peer, 0, len(items))
	for _, it := range items {
		addr := it.Info.AdminAddr
		if addr == "" {
			addr = it.Info.HTTPAddr
		}
		out = append(out, opspage.Peer{ID: it.Info.ID, Addr: addr})
	}
	return out
}

// opsPage builds the operators' page. Peers serve /debug/cluster as this
// replica does: over TLS when its listener for it (the admin one, else the
// API's) has TLS, verified with the engine client settings (-http.engine-tls.*:
// in `up -tls` one CA issues every certificate).
func (r *replica) opsPage(tlsMetrics *tlsconf.Metrics) (*opspage.Page, error) {
	fc := &r.cfg.Frontend
	deps := opspage.Deps{Self: r.cfg.ID, Local: r.clusterInfo, Peers: r.peerPages}
	if (fc.AdminAddr != "" && fc.AdminTLS.Enabled()) || (fc.AdminAddr == "" && fc.TLS.Enabled()) {
		tc, err := fc.EngineTLS.Build(tlsconf.Deps{Name: "peer_pages", Logger: r.log, Metrics: tlsMetrics})
		if err != nil {
			return nil, fmt.Errorf("operators' page: %w", err)
		}
		deps.Scheme = "https"
		deps.Client = &http.Client{Transport: &http.Transport{Proxy: nil, TLSClientConfig: tc, ForceAttemptHTTP2: true,
			MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}}
	}
	return opspage.New(opspage.DefaultConfig(), deps)
}

// degradedQuotasDoc shows the degraded quota policy, its divisor and the
// effective class limits and tenant quotas a degraded admission enforces.
func (r *replica) degradedQuotasDoc() degradedQuotasDoc {
	dq := r.client.DegradedQuotas()
	out := degradedQuotasDoc{Policy: dq.Policy.String(), Divisor: dq.Divisor, Frozen: dq.Frozen,
		Classes: map[string]degradedLimitsDoc{}, Tenants: map[string]degradedTenantDoc{}}
	for class, l := range dq.Limits {
		e, closed := dq.EffectiveLimits(l)
		out.Classes[class] = degradedLimitsDoc{Requests: e.Requests, ISLTokens: e.ISLTokens, CachedTokens: e.CachedTokens, Closed: closed}
	}
	if r.keys != nil {
		for _, t := range r.keys.Set().Tenants() {
			q, closed := dq.EffectiveQuota(scheduler.TenantQuota{Concurrent: t.Quota.Concurrent,
				RequestsPerMinute: t.Quota.RequestsPerMinute, TokensPerMinute: t.Quota.TokensPerMinute})
			out.Tenants[t.ID] = degradedTenantDoc{Concurrent: q.Concurrent, RequestsPerMinute: q.RequestsPerMinute,
				TokensPerMinute: q.TokensPerMinute, Closed: closed}
		}
	}
	return out
}

// engineOf is the engine a worker is a rank of: an adapter registers rank
// r of engine E as E-dp<r> (adapter.DPWorkerID) when dpSize > 1; any
// other worker is an engine of its own.
func engineOf(id string, rank, dpSize int) string {
	if dpSize <= 1 {
		return id
	}
	if e, ok := strings.CutSuffix(id, "-dp"+strconv.Itoa(rank)); ok && e != "" {
		return e
	}
	return id
}

// groupEngines lists the engines of ws (sorted by id), each with its
// ranks in rank order.
func groupEngines(ws []workerDoc) []engineDoc {
	at := map[string]int{}
	var out []engineDoc
	for _, w := range ws {
		i, ok := at[w.Engine]
		if !ok {
			i = len(out)
			at[w.Engine] = i
			out = append(out, engineDoc{ID: w.Engine, URL: w.URL, DPSize: w.DPSize})
		}
		out[i].Ranks = append(out[i].Ranks, w.ID)
	}
	rank := map[string]int{}
	for _, w := range ws {
		rank[w.ID] = w.DPRank
	}
	for _, e := range out {
		sort.Slice(e.Ranks, func(a, b int) bool { return rank[e.Ranks[a]] < rank[e.Ranks[b]] })
	}
	sort.Slice(out, func(a, b int) bool { return out[a].ID < out[b].ID })
	return out
}
