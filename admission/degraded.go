package admission

import (
	"errors"
	"fmt"
	"strings"

	"github.com/switchyard/switchyard/scheduler"
)

// Degraded admission's quota policy (docs/policy.md, "degraded"). While
// this replica admits a class it does not own on its own scheduler (NATS
// unreachable, etcd unavailable, the class's owner unreachable), every
// other replica that lost the same link does the same, and each would
// enforce a tenant's quotas and a class's queue limits whole: N cut
// replicas grant N times the quota. The policy says what each of them
// enforces instead:
//
//   - split (the default): each tenant quota (concurrent, requests and
//     tokens per minute) and each class queue limit divided by the number
//     of replicas this one last saw alive before it went degraded, rounded
//     down but never below 1 (0 would mean "unlimited" for a quota and
//     "never queue" for a limit; closing is the closed policy's job). With
//     a quota of at least the divisor, the cut replicas together never
//     exceed it; below that each keeps one.
//   - whole: the quotas and limits as configured, on every replica (the
//     tier may grant up to N times them while degraded).
//   - closed: a tenant with any quota gets quota_exceeded (HTTP 429), and a
//     request of a class with any queue limit gets overloaded (HTTP 503),
//     while degraded; unlimited tenants and classes are still admitted.

// QuotaPolicy is what a replica admitting locally in a degraded mode
// enforces of tenant quotas and class queue limits.
type QuotaPolicy uint8

// The degraded quota policies.
const (
	QuotasSplit QuotaPolicy = iota
	QuotasWhole
	QuotasClosed
)

// QuotaPolicies lists the policies, in their documented order.
var QuotaPolicies = []QuotaPolicy{QuotasSplit, QuotasWhole, QuotasClosed}

// String is the policy's name in the policy file and the metric label.
func (p QuotaPolicy) String() string {
	switch p {
	case QuotasSplit:
		return "split"
	case QuotasWhole:
		return "whole"
	case QuotasClosed:
		return "closed"
	}
	return fmt.Sprintf("quota_policy(%d)", int(p))
}

// ErrBadQuotaPolicy is wrapped by ParseQuotaPolicy's error.
var ErrBadQuotaPolicy = errors.New("admission: unknown degraded quota policy")

// ParseQuotaPolicy parses a policy name; "" is the default, split.
func ParseQuotaPolicy(s string) (QuotaPolicy, error) {
	if s == "" {
		return QuotasSplit, nil
	}
	for _, p := range QuotaPolicies {
		if p.String() == s {
			return p, nil
		}
	}
	names := make([]string, len(QuotaPolicies))
	for i, p := range QuotaPolicies {
		names[i] = p.String()
	}
	return 0, fmt.Errorf("%w %q: want one of %s", ErrBadQuotaPolicy, s, strings.Join(names, ", "))
}

// SplitQuota divides one quota value among n replicas: rounded down, never
// below 1; 0 (unlimited) stays 0.
func SplitQuota(v, n int) int {
	if v <= 0 || n <= 1 {
		return v
	}
	return max(1, v/n)
}

// SplitTenantQuota divides every value of q among n replicas (SplitQuota).
func SplitTenantQuota(q scheduler.TenantQuota, n int) scheduler.TenantQuota {
	return scheduler.TenantQuota{
		Concurrent:        SplitQuota(q.Concurrent, n),
		RequestsPerMinute: SplitQuota(q.RequestsPerMinute, n),
		TokensPerMinute:   SplitQuota(q.TokensPerMinute, n),
	}
}

// DegradedQuotas is the degraded quota policy in force and its divisor, as
// /debug/cluster shows them.
type DegradedQuotas struct {
	Policy QuotaPolicy
	// Divisor is the number of replicas this replica last saw alive before
	// it went degraded (frozen while it is), at least 1: split divides by it.
	Divisor int
	// Frozen is true while a degraded mode is in force (the divisor is the
	// one sampled when it began).
	Frozen bool
	// Limits are the classes' queue limits as configured.
	Limits map[string]scheduler.Limits
}

// SetDegradedPolicy installs the degraded quota policy and the classes'
// queue limits (the policy file's; closed needs to know which classes are
// limited). It takes effect for the next degraded admission.
func (c *Client) SetDegradedPolicy(p QuotaPolicy, classes []scheduler.ClassConfig) {
	limits := make(map[string]scheduler.Limits, len(classes))
	for _, cc := range classes {
		limits[cc.Name] = cc.Limits
	}
	c.mu.Lock()
	c.quotaPolicy, c.classLimits = p, limits
	c.mu.Unlock()
}

// DegradedQuotas returns the policy in force, its divisor and the classes'
// limits as configured.
func (c *Client) DegradedQuotas() DegradedQuotas {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := DegradedQuotas{Policy: c.quotaPolicy, Divisor: max(1, c.alive),
		Frozen: c.degradedLocked(), Limits: make(map[string]scheduler.Limits, len(c.classLimits))}
	for class, l := range c.classLimits {
		out.Limits[class] = l
	}
	return out
}

// EffectiveQuota returns the tenant quota a degraded admission enforces
// of q under d, and whether the closed policy refuses the tenant outright.
func (d DegradedQuotas) EffectiveQuota(q scheduler.TenantQuota) (scheduler.TenantQuota, bool) {
	switch d.Policy {
	case QuotasSplit:
		return SplitTenantQuota(q, d.Divisor), false
	case QuotasClosed:
		return q, quotaLimited(q)
	}
	return q, false
}

// EffectiveLimits returns the class queue limits a degraded admission
// enforces of l under d, and whether the closed policy refuses the class.
func (d DegradedQuotas) EffectiveLimits(l scheduler.Limits) (scheduler.Limits, bool) {
	switch d.Policy {
	case QuotasSplit:
		return l.Split(d.Divisor), false
	case QuotasClosed:
		return l, limitsLimited(l)
	}
	return l, false
}

// quotaLimited reports whether q limits anything.
func quotaLimited(q scheduler.TenantQuota) bool {
	return q.Concurrent > 0 || q.RequestsPerMinute > 0 || q.TokensPerMinute > 0
}

// limitsLimited reports whether l limits anything.
func limitsLimited(l scheduler.Limits) bool {
	return l.Requests != scheduler.Unlimited || l.ISLTokens != scheduler.Unlimited || l.CachedTokens != scheduler.Unlimited
}

// degradedLocked reports whether a degraded mode is in force: the divisor
// is frozen then. c.mu is held.
func (c *Client) degradedLocked() bool {
	return c.degraded || c.etcdDown || len(c.unreachableOwnersLocked(c.clock.Now())) > 0
}

// sampleAlive records how many replicas are alive (ClientConfig.
// ReplicasAlive) unless a degraded mode is in force: the split divisor is
// the count last seen before it began. checkConnection calls it.
func (c *Client) sampleAlive() {
	if c.cfg.ReplicasAlive == nil {
		return
	}
	n := c.cfg.ReplicasAlive()
	c.mu.Lock()
	if !c.degradedLocked() || c.alive == 0 {
		c.alive = n
	}
	c.mu.Unlock()
}

// degradedRequest returns the request a degraded admission of r enqueues
// on this replica's scheduler under the quota policy, and the policy; or,
// under closed, the rejection of a limited tenant or class. r itself is
// never changed: a request that goes back to its owner later carries its
// whole quota.
func (c *Client) degradedRequest(r *scheduler.Request) (*scheduler.Request, QuotaPolicy, error) {
	c.mu.Lock()
	p, n := c.quotaPolicy, max(1, c.alive)
	limits, known := c.classLimits[r.Class]
	c.mu.Unlock()
	switch p {
	case QuotasSplit:
		if n <= 1 {
			return r, p, nil
		}
		lr := *r
		lr.Tenant.Quota = SplitTenantQuota(r.Tenant.Quota, n)
		lr.LimitDivisor = n
		return &lr, p, nil
	case QuotasClosed:
		if r.Tenant.ID != "" && quotaLimited(r.Tenant.Quota) {
			return nil, p, &scheduler.RejectError{Reason: scheduler.ReasonQuotaExceeded, Limit: closedLimitName(r.Tenant.Quota),
				Detail: fmt.Sprintf("tenant %s has a quota and this replica admits in a degraded mode with the closed quota policy", r.Tenant.ID)}
		}
		if known && limitsLimited(limits) {
			return nil, p, &scheduler.RejectError{Reason: scheduler.ReasonOverloaded, Limit: closedLimitsName(limits),
				Detail: fmt.Sprintf("class %s has queue limits and this replica admits in a degraded mode with the closed quota policy", r.Class)}
		}
	}
	return r, p, nil
}

// closedLimitName names the first quota of q a closed policy refuses.
func closedLimitName(q scheduler.TenantQuota) string {
	switch {
	case q.Concurrent > 0:
		return scheduler.LimitTenantConcurrent
	case q.RequestsPerMinute > 0:
		return scheduler.LimitTenantRequestsPerMinute
	}
	return scheduler.LimitTenantTokensPerMinute
}

// closedLimitsName names the first queue limit of l a closed policy refuses.
func closedLimitsName(l scheduler.Limits) string {
	switch {
	case l.Requests != scheduler.Unlimited:
		return scheduler.LimitRequests
	case l.ISLTokens != scheduler.Unlimited:
		return scheduler.LimitISLTokens
	}
	return scheduler.LimitCachedTokens
}

// countDegraded counts a degraded admission's outcome under policy p: an
// admission, or a rejection by the quota policy or by a quota or limit
// (other errors are not the policy's).
func (c *Client) countDegraded(p QuotaPolicy, err error) {
	if err == nil {
		c.m.degradedQuotaAdmits.WithLabelValues(p.String()).Inc()
		return
	}
	switch reason := scheduler.ReasonOf(err); reason {
	case scheduler.ReasonQuotaExceeded, scheduler.ReasonQueueFull, scheduler.ReasonOverloaded:
		c.m.degradedQuotaRejects.WithLabelValues(p.String(), reason.String()).Inc()
	}
}
