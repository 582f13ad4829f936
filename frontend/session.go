package frontend

import (
	"fmt"
	"math"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/switchyard/switchyard/scheduler"
)

// Session affinity (docs/api.md, "Sessions"). A request names its session
// by a header (Config.SessionHeaders, first match), else by the body's
// prompt_cache_key, else by its user when the policy says user is a
// session key. The session's id is a hash of the tenant, the model and the
// key, so two tenants' "1" are different sessions and the key itself is
// never gossiped. The entry replica looks the session up in the table
// (shared between replicas through SessionShare), hands the worker of the
// previous turn to the scheduler as the request's SessionAffinity, and
// records where the grant sent the turn.

// Affinity modes a policy may name (sessions.affinity).
const (
	AffinitySoft = "soft"
	AffinityHard = "hard"
	AffinityOff  = "off"
)

// Why a session's turn did or did not run on its previous worker (the
// outcome and reason labels of the session metrics).
const (
	sessionHit        = "hit"
	sessionNew        = "new"
	sessionMoved      = "moved"
	moveSaturated     = "saturated"
	moveWorkerGone    = "worker_gone"
	moveNotEligible   = "not_eligible"
	sessionKeyHeader  = "header"
	sessionKeyPCK     = "prompt_cache_key"
	sessionKeyUser    = "user"
	maxSessionKeyLen  = 1024
	defaultMarginRate = 0.5
)

// SessionShare publishes a routing decision to the other replicas
// (gossip.Gossip.ShareSession). nil keeps the table local.
type SessionShare interface {
	ShareSession(session uint64, worker string, ttl time.Duration)
}

// SessionPolicy is how a class's or tenant's sessions are routed.
type SessionPolicy struct {
	// Affinity is soft (stay until saturated), hard (always the session's
	// worker while it is registered and eligible) or off.
	Affinity string
	// User makes the body's user field a session key (after the headers
	// and prompt_cache_key).
	User bool
	// MarginRatio and MarginMs say when soft affinity lets go: the
	// session's worker is kept while its cost is at most the best
	// worker's × (1 + MarginRatio) + MarginMs (the cost is the predicted
	// TTFT in ms under the ttft selector; under blocks MarginMs counts
	// blocks).
	MarginRatio float64
	MarginMs    float64
}

// DefaultSessionPolicy is soft affinity with a 50% margin; user is not a
// session key.
func DefaultSessionPolicy() SessionPolicy {
	return SessionPolicy{Affinity: AffinitySoft, MarginRatio: defaultMarginRate}
}

// sessionRules are a policy's session settings: the default, then per
// class, then per tenant (the tenant's setting wins over its class's).
type sessionRules struct {
	def     SessionPolicy
	classes map[string]sessionOverride
	tenants map[string]sessionOverride
}

// sessionOverride is one class's or tenant's settings; nil fields keep
// what they override.
type sessionOverride struct {
	Affinity    *string  `yaml:"affinity"`
	User        *bool    `yaml:"user"`
	MarginRatio *float64 `yaml:"margin"`
	MarginMs    *float64 `yaml:"margin_ms"`
}

// sessionsFile is the policy file's sessions section.
type sessionsFile struct {
	sessionOverride `yaml:",inline"`
	Classes         map[string]sessionOverride `yaml:"classes"`
	Tenants         map[string]sessionOverride `yaml:"tenants"`
}

func (o sessionOverride) apply(p SessionPolicy) SessionPolicy {
	if o.Affinity != nil {
		p.Affinity = *o.Affinity
	}
	if o.User != nil {
		p.User = *o.User
	}
	if o.MarginRatio != nil {
		p.MarginRatio = *o.MarginRatio
	}
	if o.MarginMs != nil {
		p.MarginMs = *o.MarginMs
	}
	return p
}

func (o sessionOverride) check(field string, bad func(string, ...any)) {
	if a := o.Affinity; a != nil && *a != AffinitySoft && *a != AffinityHard && *a != AffinityOff {
		bad("%s.affinity: %q is not soft, hard or off", field, *a)
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"margin", o.MarginRatio}, {"margin_ms", o.MarginMs}} {
		if f.v != nil && (!(*f.v >= 0) || math.IsInf(*f.v, 0)) {
			bad("%s.%s: %v, must be a finite number >= 0", field, f.name, *f.v)
		}
	}
}

// parseSessions checks the sessions section against the defined classes.
func parseSessions(f sessionsFile, p *Policy, bad func(string, ...any)) sessionRules {
	f.check("sessions", bad)
	r := sessionRules{def: f.apply(DefaultSessionPolicy()), classes: f.Classes, tenants: f.Tenants}
	for name, o := range f.Classes {
		if !p.HasClass(name) {
			bad("sessions.classes.%s: not a defined class", name)
		}
		o.check("sessions.classes."+name, bad)
	}
	for name, o := range f.Tenants {
		o.check("sessions.tenants."+name, bad)
	}
	return r
}

// Sessions returns the session policy of a request of class admitted for
// tenant ("": none).
func (p *Policy) Sessions(class, tenant string) SessionPolicy {
	sp := p.sessions.def
	if sp.Affinity == "" { // a Policy built without ParsePolicy
		sp = DefaultSessionPolicy()
	}
	if o, ok := p.sessions.classes[class]; ok {
		sp = o.apply(sp)
	}
	if o, ok := p.sessions.tenants[tenant]; ok {
		sp = o.apply(sp)
	}
	return sp
}

// sessionKey returns the request's session key and where it came from,
// or "" when it names none.
func sessionKey(headers []string, h http.Header, p *parsedRequest, userIsKey bool) (key, source string) {
	for _, name := range headers {
		if v := h.Get(name); v != "" {
			return v, sessionKeyHeader
		}
	}
	if p.promptCacheKey != "" {
		return p.promptCacheKey, sessionKeyPCK
	}
	if userIsKey && p.user != "" {
		return p.user, sessionKeyUser
	}
	return "", ""
}

// sessionID hashes what makes a session: the tenant, the model and the
// key (a length prefix keeps the parts apart).
func sessionID(tenant, model, key string) uint64 {
	var b strings.Builder
	for _, s := range []string{tenant, model, key} {
		fmt.Fprintf(&b, "%d:%s", len(s), s)
	}
	return xxh3.HashString(b.String())
}

// sessionRoute is one request's session: looked up before admission,
// recorded after each grant.
type sessionRoute struct {
	id     uint64
	policy SessionPolicy
	source string
	// prev is the worker of the previous turn ("" when none is known or
	// it cannot be used); outcome is what the lookup already decided
	// (new, or moved for a reason), "" when the grant decides.
	prev    string
	outcome string
	reason  string
}

// lookupSession finds p's session and its previous worker, or returns nil
// when the request has no session or affinity is off.
func (s *Server) lookupSession(h http.Header, p *parsedRequest, class, tenant string, pol *Policy, rt routing) *sessionRoute {
	sp := pol.Sessions(class, tenant)
	if sp.Affinity == AffinityOff || s.sessions == nil {
		return nil
	}
	key, source := sessionKey(s.cfg.SessionHeaders, h, p, sp.User)
	if key == "" {
		return nil
	}
	if len(key) > maxSessionKeyLen {
		key = key[:maxSessionKeyLen]
	}
	sr := &sessionRoute{id: sessionID(tenant, p.model, key), policy: sp, source: source}
	w, ok := s.sessions.Lookup(sr.id, s.now())
	switch {
	case !ok:
		sr.outcome = sessionNew
	case !slices.Contains(rt.all, w):
		// The worker left the fleet: the session is free to go anywhere.
		s.sessions.Forget(sr.id)
		sr.outcome, sr.reason = sessionMoved, moveWorkerGone
	case !eligible(w, p.hints.allowed, rt) || (s.deps.Suspects != nil && s.deps.Suspects.Suspected(w)):
		sr.outcome, sr.reason = sessionMoved, moveNotEligible
	default:
		sr.prev = w
	}
	return sr
}

// eligible reports whether worker may serve the request: it serves the
// model and the client's allow-list (if any) names it.
func eligible(worker string, allowed []string, rt routing) bool {
	c := constrain(allowed, rt, nil)
	return c == nil || slices.Contains(c, worker)
}

// affinity is what the scheduler is told about the session.
func (sr *sessionRoute) affinity() scheduler.SessionAffinity {
	if sr == nil || sr.prev == "" {
		return scheduler.SessionAffinity{}
	}
	return scheduler.SessionAffinity{Worker: sr.prev, Hard: sr.policy.Affinity == AffinityHard,
		MarginRatio: sr.policy.MarginRatio, MarginCost: sr.policy.MarginMs}
}

// granted records that the session's turn was granted worker, shares the
// decision with the other replicas and counts the first attempt's outcome.
func (s *Server) granted(sr *sessionRoute, worker string, attempt int) {
	if sr == nil {
		return
	}
	now := s.now()
	ttl := s.sessions.TTL()
	s.sessions.Record(sr.id, worker, now, now.Add(ttl))
	if s.deps.SessionShare != nil {
		s.deps.SessionShare.ShareSession(sr.id, worker, ttl)
	}
	if attempt > 0 {
		return // the first attempt's outcome is the session's; a retry is counted as such elsewhere
	}
	outcome, reason := sr.outcome, sr.reason
	if outcome == "" {
		outcome = sessionHit
		if worker != sr.prev {
			outcome, reason = sessionMoved, moveSaturated
		}
	}
	s.sessionMetrics.requests.WithLabelValues(outcome, sr.source).Inc()
	if reason != "" {
		s.sessionMetrics.moves.WithLabelValues(reason).Inc()
	}
}

// SessionCount is how many sessions this replica's table holds (expired
// ones not yet swept included).
func (s *Server) SessionCount() int {
	if s.sessions == nil {
		return 0
	}
	return s.sessions.Len()
}
